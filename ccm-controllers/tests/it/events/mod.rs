//! Events are queued and written by one writer with a bounded number of writes in flight:
//! recording never waits for the events API, the queue is bounded (overflow is dropped and
//! counted), Events are correlated as client-go's `EventCorrelator` (identical ones counted on
//! one Event, similar ones combined, spam held back), failed writes are retried as client-go
//! retries them (up to the last try, not on errors a retry cannot fix), and stopping flushes
//! what is queued within a deadline that retries do not extend.
//!
//! The controller tests make every Event write hang: the in-process API server answers the
//! next Event create with `429` and `Retry-After: 3600`, which kube's client honours by waiting
//! an hour before it retries. A controller that awaited its Events would stop there; these show
//! the object work finishing anyway. They need fault injection, so they run on the in-process
//! API server only; the queue tests also run against a real cluster (`CCM_TEST_KUBECONFIG`).

use std::time::Duration;

use ccm_controllers::MetricsRegistry;
use ccm_controllers::{EventBroadcaster, EventRecorder, EventWriter, NormalEventBudget};
use ccm_testing::TestCluster;
use ccm_testing::wait::eventually;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams, ObjectMeta};

mod bursts;
mod controllers;
mod correlation;
mod queue;
mod retries;

const WAIT: Duration = Duration::from_secs(20);
/// Long enough that a hung Event write never finishes during a test.
const HANG: Duration = Duration::from_secs(3600);

/// A Service object to hang Events on (it need not exist).
fn subject(ns: &str, name: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(ns.to_owned()),
            uid: Some(format!("uid-{name}")),
            ..ObjectMeta::default()
        },
        ..Service::default()
    }
}

/// The Events regarding `name` in `ns`.
async fn events_of(client: &Client, ns: &str, name: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    let mut events: Vec<Event> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect();
    events.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    events
}

fn reasons(events: &[Event]) -> Vec<String> {
    let mut r: Vec<String> = events
        .iter()
        .map(|e| e.reason.clone().unwrap_or_default())
        .collect();
    r.sort();
    r
}

async fn wait_events(client: &Client, ns: &str, name: &str, n: usize) -> Vec<Event> {
    let arrived = eventually(WAIT, || async {
        events_of(client, ns, name).await.len() >= n
    })
    .await;
    let events = events_of(client, ns, name).await;
    assert!(arrived, "want {n} events on {ns}/{name}, have {events:#?}");
    events
}

/// `event_recorder_events_total{result="<result>"}`.
fn counted(metrics: &MetricsRegistry, result: &str) -> u64 {
    let text = metrics.encode().unwrap();
    let prefix = format!("event_recorder_events_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or_else(|| panic!("no {prefix} in {text}"))
}

/// `event_recorder_normal_events_not_written_total{component="test-controller",reason,cause}`.
fn not_written(metrics: &MetricsRegistry, reason: &str, cause: &str) -> u64 {
    let text = metrics.encode().unwrap();
    let prefix = format!(
        "event_recorder_normal_events_not_written_total{{component=\"test-controller\",reason=\"{reason}\",cause=\"{cause}\"}} "
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// The default Normal Event budget with repeats patched at once: for the tests of what
/// happens to a repeat's write, not of its window.
fn repeats_at_once() -> NormalEventBudget {
    NormalEventBudget::default().with_series_interval(Duration::ZERO)
}

/// One Event writer test: a cluster, a broadcaster, a recorder and a subject to hang Events
/// on; `start` also returns the broadcaster's writer, not yet running.
struct WriterTest {
    cluster: TestCluster,
    ns: String,
    name: String,
    metrics: std::sync::Arc<MetricsRegistry>,
    events: EventBroadcaster,
    recorder: EventRecorder,
    object: Service,
}

impl WriterTest {
    /// With the default queue size, or `capacity`.
    async fn start(capacity: Option<usize>) -> (WriterTest, EventWriter) {
        let cluster = TestCluster::start().await;
        let ns = cluster.namespace().await;
        let name = cluster.unique_name("subject");
        let metrics = MetricsRegistry::new();
        let (events, writer) = match capacity {
            Some(n) => EventBroadcaster::with_capacity(cluster.client(), "t", &metrics, n),
            None => EventBroadcaster::new(cluster.client(), "t", &metrics),
        };
        let recorder = events.recorder("test-controller");
        let object = subject(&ns, &name);
        let t = WriterTest {
            cluster,
            ns,
            name,
            metrics,
            events,
            recorder,
            object,
        };
        (t, writer)
    }

    /// The Events regarding the subject now.
    async fn events_now(&self) -> Vec<Event> {
        events_of(&self.cluster.client(), &self.ns, &self.name).await
    }

    /// Waits for `n` Events regarding the subject.
    async fn wait_events(&self, n: usize) -> Vec<Event> {
        wait_events(&self.cluster.client(), &self.ns, &self.name, n).await
    }

    /// `event_recorder_events_total{result="<result>"}`.
    fn counted(&self, result: &str) -> u64 {
        counted(&self.metrics, result)
    }

    /// Normal Events of `reason` not written for `cause`.
    fn not_written(&self, reason: &str, cause: &str) -> u64 {
        not_written(&self.metrics, reason, cause)
    }

    /// Waits until `event_recorder_events_total{result="<result>"}` is `n`.
    async fn wait_counted(&self, result: &str, n: u64) {
        assert!(
            eventually(WAIT, || async { self.counted(result) == n }).await,
            "{result} never reached {n}: {}",
            self.metrics.encode().unwrap()
        );
    }
}

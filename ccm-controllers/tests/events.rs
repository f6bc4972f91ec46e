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
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod node_common;
mod service_common;

use std::time::Duration;

use ccm_controllers::controllers::cloud_node::{self, CloudNodeConfig};
use ccm_controllers::{Builder, ControllerContext, MetricsRegistry};
use ccm_controllers::{
    EventBroadcaster, EventRecorder, EventWriter, MAX_IN_FLIGHT, MAX_TRIES_PER_EVENT,
};
use ccm_testing::TestCluster;
use ccm_testing::apiserver::ApiServer;
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use ccm_testing::fake_cloud::{FakeCloud, Fault};
use ccm_testing::wait::{eventually, wait_for};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams, ObjectMeta};
use tokio_util::sync::CancellationToken;

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

    /// Waits until `event_recorder_events_total{result="<result>"}` is `n`.
    async fn wait_counted(&self, result: &str, n: u64) {
        assert!(
            eventually(WAIT, || async { self.counted(result) == n }).await,
            "{result} never reached {n}: {}",
            self.metrics.encode().unwrap()
        );
    }
}

#[tokio::test]
async fn events_arrive_with_their_type_reason_note_and_reporter_and_repeats_fold() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let name = cluster.unique_name("subject");
    let (ctx, mut tasks) =
        ControllerContext::standalone(cluster.client(), FakeCloud::default().provider(), "k");
    let recorder = ctx.recorder("test-controller");
    let object = subject(&ns, &name);
    recorder.normal(&object, "EnsuringLoadBalancer", "Ensuring load balancer");
    recorder.warning(&object, "SyncLoadBalancerFailed", "Error syncing: boom");

    let events = wait_events(&cluster.client(), &ns, &name, 2).await;
    let normal = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("EnsuringLoadBalancer"))
        .unwrap();
    assert_eq!(normal.type_.as_deref(), Some("Normal"));
    assert_eq!(normal.note.as_deref(), Some("Ensuring load balancer"));
    assert_eq!(normal.action.as_deref(), Some("EnsuringLoadBalancer"));
    assert_eq!(
        normal.reporting_controller.as_deref(),
        Some("test-controller")
    );
    assert_eq!(normal.reporting_instance.as_deref(), Some("standalone"));
    let warning = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("SyncLoadBalancerFailed"))
        .unwrap();
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    assert_eq!(warning.note.as_deref(), Some("Error syncing: boom"));

    // A repeat is folded into the first Event's series (kube's Recorder), not a new Event.
    recorder.normal(&object, "EnsuringLoadBalancer", "Ensuring load balancer");
    let folded = eventually(WAIT, || async {
        events_of(&cluster.client(), &ns, &name)
            .await
            .iter()
            .any(|e| e.series.as_ref().is_some_and(|s| s.count == 2))
    })
    .await;
    let events = events_of(&cluster.client(), &ns, &name).await;
    assert!(folded, "no series of 2: {events:#?}");
    assert_eq!(events.len(), 2, "{events:#?}");
    assert_eq!(counted(&ctx.metrics, "written"), 3);
    assert_eq!(counted(&ctx.metrics, "dropped"), 0);

    ctx.shutdown.cancel();
    while tasks.join_next().await.is_some() {}
    cluster.cleanup().await;
}

#[tokio::test]
async fn a_full_queue_drops_new_events_and_counts_them() {
    // The writer is not running yet: nothing leaves the queue.
    let (t, writer) = WriterTest::start(Some(2)).await;
    for i in 1..=5 {
        t.recorder
            .normal(&t.object, &format!("Reason{i}"), format!("event {i}"));
    }
    assert_eq!(t.events.queued(), 2);
    assert_eq!(t.counted("dropped"), 3);

    // As client-go's DropIfChannelFull: the queued ones are kept, the newer ones dropped.
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), Duration::from_secs(5)));
    let written = t.wait_events(2).await;
    assert_eq!(reasons(&written), ["Reason1", "Reason2"]);
    t.wait_counted("written", 2).await;
    // Room again: the next one is written.
    t.recorder.normal(&t.object, "Reason6", "event 6");
    let written = t.wait_events(3).await;
    assert_eq!(reasons(&written), ["Reason1", "Reason2", "Reason6"]);
    assert_eq!(t.counted("dropped"), 3);

    stop.cancel();
    task.await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn stopping_flushes_the_queue_and_later_events_are_dropped() {
    let (t, writer) = WriterTest::start(None).await;
    for i in 1..=3 {
        t.recorder
            .warning(&t.object, &format!("Reason{i}"), format!("event {i}"));
    }
    // Told to stop before it wrote anything: it still writes what is queued, then returns.
    let stop = CancellationToken::new();
    stop.cancel();
    writer.run(stop, WAIT).await;
    t.events.stopped().await;
    let written = t.events_now().await;
    assert_eq!(reasons(&written), ["Reason1", "Reason2", "Reason3"]);
    assert_eq!(t.counted("written"), 3);

    // Nothing is written any more; what is recorded now is counted as dropped.
    t.recorder
        .normal(&t.object, "TooLate", "after the writer stopped");
    assert_eq!(t.counted("dropped"), 1);
    assert_eq!(t.events.queued(), 0);
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn a_hung_write_is_abandoned_at_the_flush_deadline_and_counted() {
    let (t, writer) = WriterTest::start(None).await;
    let Some(server) = t.cluster.api_server() else {
        return; // needs fault injection
    };
    server.fail_next("create", "events", 1, 429, Some(HANG));
    t.recorder
        .normal(&t.object, "Hangs", "the first write hangs");
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), Duration::from_millis(200)));
    // The first write is in flight (answered 429, the client waits an hour to retry).
    assert!(
        eventually(WAIT, || async {
            server
                .requests()
                .iter()
                .any(|r| r.resource == "events" && r.status == 429)
        })
        .await
    );
    // Another Event is written meanwhile: the hung write holds one slot, not the writer.
    t.recorder.normal(&t.object, "Passes", "written beside it");
    let written = t.wait_events(1).await;
    assert_eq!(reasons(&written), ["Passes"]);
    stop.cancel();
    // Bounded by the flush deadline, not by the hour.
    tokio::time::timeout(WAIT, task)
        .await
        .expect("the writer stops at the flush deadline")
        .unwrap();
    assert_eq!(t.counted("dropped"), 1);
    assert_eq!(t.counted("written"), 1);
    assert_eq!(reasons(&t.events_now().await), ["Passes"]);
    t.cluster.cleanup().await;
}

/// A short sleep between tries, so that retry tests run fast.
const QUICK: Duration = Duration::from_millis(20);

/// The statuses the server answered to Event creates, in order.
fn event_creates(server: &ApiServer) -> Vec<u16> {
    server
        .requests()
        .iter()
        .filter(|r| r.resource == "events" && r.verb == "create")
        .map(|r| r.status)
        .collect()
}

#[tokio::test]
async fn a_server_error_is_retried_and_does_not_hold_up_other_events() {
    let (t, writer) = WriterTest::start(None).await;
    let Some(server) = t.cluster.api_server() else {
        return; // needs fault injection
    };
    let writer = writer.with_retries(MAX_TRIES_PER_EVENT, QUICK);
    server.fail_next("create", "events", 1, 500, None);
    t.recorder
        .normal(&t.object, "First", "refused once with 500");
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), WAIT));
    t.wait_counted("written", 1).await;
    t.recorder.normal(&t.object, "Second", "recorded after it");

    let written = t.wait_events(2).await;
    assert_eq!(reasons(&written), ["First", "Second"], "{written:#?}");
    t.wait_counted("written", 2).await;
    assert_eq!(t.counted("retried"), 1);
    assert_eq!(t.counted("failed"), 0);
    // One refused create and its retry; each Event written once.
    assert_eq!(event_creates(server), [500, 201, 201]);

    stop.cancel();
    task.await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn an_event_the_server_rejects_with_a_client_error_is_not_retried() {
    let (t, writer) = WriterTest::start(None).await;
    let Some(server) = t.cluster.api_server() else {
        return; // needs fault injection
    };
    let writer = writer.with_retries(MAX_TRIES_PER_EVENT, QUICK);
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), WAIT));
    // Bad request, AlreadyExists, Forbidden (e.g. the namespace is terminating), Invalid.
    let statuses = [400, 409, 403, 422];
    for (i, status) in statuses.into_iter().enumerate() {
        server.fail_next("create", "events", 1, status, None);
        t.recorder
            .warning(&t.object, &format!("Rejected{status}"), "refused for good");
        // Given up on, not retried (a retry would meet no fault and be written).
        t.wait_counted("failed", i as u64 + 1).await;
    }
    // A retry would be made before the next queued Event is written.
    t.recorder.normal(&t.object, "Accepted", "written");
    let written = t.wait_events(1).await;
    assert_eq!(reasons(&written), ["Accepted"], "{written:#?}");
    assert_eq!(event_creates(server), [400, 409, 403, 422, 201]);
    assert_eq!(t.counted("retried"), 0);
    assert_eq!(t.counted("failed"), 4);
    assert_eq!(t.counted("written"), 1);

    stop.cancel();
    task.await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn an_event_that_keeps_failing_is_given_up_after_the_last_try() {
    let (t, writer) = WriterTest::start(None).await;
    let Some(server) = t.cluster.api_server() else {
        return; // needs fault injection
    };
    let writer = writer.with_retries(MAX_TRIES_PER_EVENT, QUICK);
    let tries = MAX_TRIES_PER_EVENT as usize;
    // One failure more than the tries: the extra one would be seen by a 13th try.
    server.fail_next("create", "events", tries + 1, 500, None);
    t.recorder.normal(&t.object, "Doomed", "refused every time");
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), WAIT));
    t.wait_counted("failed", 1).await;
    assert_eq!(t.counted("retried"), tries as u64 - 1);
    assert_eq!(event_creates(server), vec![500; tries]);
    // The writer goes on with the next Event (which meets the one fault left over).
    t.recorder
        .normal(&t.object, "Next", "written after one retry");
    let written = t.wait_events(1).await;
    assert_eq!(reasons(&written), ["Next"], "{written:#?}");
    assert_eq!(t.counted("failed"), 1);
    assert_eq!(t.counted("retried"), tries as u64);

    stop.cancel();
    task.await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn a_repeat_whose_series_event_is_gone_is_created_anew() {
    let (t, writer) = WriterTest::start(None).await;
    let writer = writer.with_retries(MAX_TRIES_PER_EVENT, QUICK);
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), WAIT));
    t.recorder
        .normal(&t.object, "Synced", "Node synced successfully");
    let first = t.wait_events(1).await;
    let api: Api<Event> = Api::namespaced(t.cluster.client(), &t.ns);
    api.delete(
        first[0].metadata.name.as_deref().unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    assert!(eventually(WAIT, || async { t.events_now().await.is_empty() }).await);
    // The repeat's PATCH of the series meets 404: as client-go, the Event is created anew,
    // under its name and with its count.
    t.recorder
        .normal(&t.object, "Synced", "Node synced successfully");
    let again = t.wait_events(1).await;
    assert_eq!(reasons(&again), ["Synced"]);
    assert_eq!(again[0].metadata.name, first[0].metadata.name);
    assert_eq!(again[0].series.as_ref().map(|s| s.count), Some(2));
    t.wait_counted("written", 2).await;
    assert_eq!(t.counted("retried"), 1);
    assert_eq!(t.counted("failed"), 0);

    stop.cancel();
    task.await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn stopping_during_a_retry_sleep_ends_at_the_flush_deadline_and_flushes_the_rest() {
    let (t, writer) = WriterTest::start(None).await;
    let Some(server) = t.cluster.api_server() else {
        return; // needs fault injection
    };
    // Sleeps of up to an hour between tries: a retry never comes during the test.
    let writer = writer.with_retries(MAX_TRIES_PER_EVENT, HANG);
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), Duration::from_secs(2)));
    t.recorder
        .normal(&t.object, "Retrying", "written, then its repeat is refused");
    t.wait_counted("written", 1).await;
    // The repeat is a PATCH of the series. Two failures: should the random first sleep be
    // short, the second try fails too and the writer sleeps the full hour. Creates (the Event
    // queued behind) meet no fault.
    server.fail_next("patch", "events", 2, 500, None);
    t.recorder
        .normal(&t.object, "Retrying", "written, then its repeat is refused");
    t.recorder.normal(&t.object, "Queued", "written meanwhile");
    assert!(
        eventually(WAIT, || async {
            server
                .requests()
                .iter()
                .any(|r| r.resource == "events" && r.verb == "patch" && r.status == 500)
        })
        .await
    );
    stop.cancel();
    // Bounded by the flush deadline, not by the hour.
    tokio::time::timeout(WAIT, task)
        .await
        .expect("the writer stops at the flush deadline")
        .unwrap();
    // The retrying Event is given up on (it was refused); the other one is written.
    assert_eq!(t.counted("failed"), 1);
    assert_eq!(t.counted("dropped"), 0);
    assert_eq!(t.counted("written"), 2);
    let written = t.events_now().await;
    assert_eq!(reasons(&written), ["Queued", "Retrying"], "{written:#?}");
    assert!(written.iter().all(|e| e.series.is_none()), "{written:#?}");
    t.cluster.cleanup().await;
}

/// Object `i` of a burst: each its own Event (the spam filter allows 25 per object).
fn burst_subject(t: &WriterTest, i: usize) -> Service {
    subject(&t.ns, &format!("{}-{i}", t.name))
}

/// All Events in the test's namespace.
async fn all_events(t: &WriterTest) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(t.cluster.client(), &t.ns);
    api.list(&ListParams::default()).await.unwrap().items
}

#[tokio::test]
async fn a_burst_as_large_as_the_queue_is_written_in_full() {
    let (t, writer) = WriterTest::start(None).await;
    let n = t.events.capacity();
    // Queued before the writer runs: the whole queue at once, nothing dropped.
    for i in 0..n {
        t.recorder
            .normal(&burst_subject(&t, i), "Synced", "Node synced successfully");
    }
    assert_eq!(t.events.queued(), n);
    assert_eq!(t.counted("dropped"), 0);
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), WAIT));
    t.wait_counted("written", n as u64).await;
    let events = all_events(&t).await;
    assert_eq!(events.len(), n);
    let mut objects: Vec<String> = events
        .iter()
        .map(|e| e.regarding.as_ref().unwrap().name.clone().unwrap())
        .collect();
    objects.sort();
    objects.dedup();
    assert_eq!(objects.len(), n, "one Event per object");
    assert_eq!(t.counted("dropped"), 0);
    assert_eq!(t.counted("failed"), 0);
    stop.cancel();
    task.await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn the_writer_keeps_max_in_flight_writes_in_flight() {
    let (t, writer) = WriterTest::start(None).await;
    let Some(server) = t.cluster.api_server() else {
        return; // needs fault injection
    };
    let n = MAX_IN_FLIGHT + 8;
    // Every create hangs (the client waits an hour to retry the 429): each holds its slot.
    server.fail_next("create", "events", n, 429, Some(HANG));
    for i in 0..n {
        t.recorder
            .normal(&burst_subject(&t, i), "Synced", "Node synced successfully");
    }
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), Duration::from_millis(500)));
    let hung = || {
        server
            .requests()
            .iter()
            .filter(|r| r.resource == "events" && r.status == 429)
            .count()
    };
    assert!(eventually(WAIT, || async { hung() == MAX_IN_FLIGHT }).await);
    // The rest wait in the queue for a slot: no further write is made.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(hung(), MAX_IN_FLIGHT);
    assert_eq!(t.events.queued(), n - MAX_IN_FLIGHT);
    stop.cancel();
    tokio::time::timeout(WAIT, task)
        .await
        .expect("the writer stops at the flush deadline")
        .unwrap();
    assert_eq!(t.counted("dropped"), n as u64);
    assert_eq!(t.counted("written"), 0);
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn identical_events_are_one_event_with_their_count() {
    let (t, writer) = WriterTest::start(None).await;
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), WAIT));
    for _ in 0..5 {
        t.recorder
            .normal(&t.object, "EnsuredLoadBalancer", "Ensured load balancer");
    }
    t.wait_counted("written", 5).await;
    let events = t.events_now().await;
    assert_eq!(events.len(), 1, "{events:#?}");
    let event = &events[0];
    assert_eq!(
        event.series.as_ref().map(|s| s.count),
        Some(5),
        "{event:#?}"
    );
    assert_eq!(event.note.as_deref(), Some("Ensured load balancer"));
    // Named as client-go names Events: the object's name, a dot, hex nanoseconds.
    let name = event.metadata.name.as_deref().unwrap();
    let suffix = name.strip_prefix(&format!("{}.", t.name)).unwrap();
    assert!(u64::from_str_radix(suffix, 16).is_ok(), "{name}");
    stop.cancel();
    task.await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn a_flood_of_similar_events_is_combined_into_one() {
    let (t, writer) = WriterTest::start(None).await;
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), WAIT));
    for i in 0..15 {
        t.recorder.warning(
            &t.object,
            "SyncLoadBalancerFailed",
            format!("Error syncing load balancer: attempt {i}"),
        );
    }
    t.wait_counted("written", 15).await;
    let events = t.events_now().await;
    // Nine Events with their own notes, then one combining the tenth to the fifteenth.
    assert_eq!(events.len(), 10, "{events:#?}");
    let combined: Vec<&Event> = events
        .iter()
        .filter(|e| {
            e.note
                .as_deref()
                .is_some_and(|n| n.starts_with("(combined from similar events): "))
        })
        .collect();
    assert_eq!(combined.len(), 1, "{events:#?}");
    assert_eq!(
        combined[0].note.as_deref(),
        Some("(combined from similar events): Error syncing load balancer: attempt 9")
    );
    assert_eq!(combined[0].series.as_ref().map(|s| s.count), Some(6));
    assert_eq!(combined[0].type_.as_deref(), Some("Warning"));
    assert_eq!(t.counted("dropped"), 0);
    stop.cancel();
    task.await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn the_spam_filter_holds_back_events_past_the_burst_per_object() {
    let (t, writer) = WriterTest::start(None).await;
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), WAIT));
    for i in 0..30 {
        t.recorder
            .normal(&t.object, &format!("Reason{i}"), "one of many");
    }
    t.wait_counted("filtered", 5).await;
    t.wait_counted("written", 25).await;
    let events = t.events_now().await;
    assert_eq!(events.len(), 25);
    // Only this object's bucket is empty.
    let other = subject(&t.ns, &format!("{}-other", t.name));
    t.recorder.normal(&other, "Reason0", "another object");
    t.wait_counted("written", 26).await;
    stop.cancel();
    task.await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn hung_event_writes_do_not_hold_up_load_balancers() {
    use service_common::{
        TIMEOUT, cloud_lbs, create_node, has_ingress, key, services, start, test_config,
        wait_event, wait_until,
    };
    let cluster = TestCluster::start().await;
    let Some(server) = cluster.api_server() else {
        return; // needs fault injection
    };
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let n1 = cluster.unique_name("n");
    create_node(&cluster, &n1).await;
    let running = start(&cluster, &ns, fake.provider(), test_config()).await;
    let api = services(&cluster, &ns);
    let first = cluster.unique_name("web");
    cluster
        .create(&load_balancer_service(&ns, &first).build())
        .await;
    let svc = wait_for(&api, &first, TIMEOUT, has_ingress).await.unwrap();
    let k = key(&svc);
    wait_event(&cluster, &ns, &first, "EnsuredLoadBalancer").await;

    // From here on the Event writer is stuck on its next create.
    server.fail_next("create", "events", 1, 429, Some(HANG));
    // Node changes: each update_load_balancer records UpdatedLoadBalancer while the Service's
    // entry is locked; the second update needs the first one's lock released.
    for _ in 0..2 {
        let n = cluster.unique_name("n");
        create_node(&cluster, &n).await;
        wait_until(&format!("{n} in the load balancer of {k}"), || async {
            cloud_lbs(&fake, &ns)
                .get(&k)
                .is_some_and(|lb| lb.hosts.contains(&n))
        })
        .await;
    }
    // A new Service: EnsuringLoadBalancer is recorded before the cloud call.
    let second = cluster.unique_name("web");
    cluster
        .create(&load_balancer_service(&ns, &second).build())
        .await;
    wait_for(&api, &second, TIMEOUT, has_ingress).await.unwrap();
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.resource == "events" && r.status == 429),
        "the Event write was never held up"
    );

    running.stop().await.unwrap();
    cluster.cleanup().await;
}

#[tokio::test]
async fn hung_event_writes_do_not_hold_up_node_initialisation() {
    use node_common::{RUN_LABEL, TIMEOUT, Test};
    let t = Test::start().await;
    let Some(server) = t.cluster.api_server() else {
        return; // needs fault injection
    };
    let fake = FakeCloud::default();
    // The first sync fails: SyncFailed is recorded before the node is retried.
    fake.inject("instance_metadata", Fault::FailNext(1));
    server.fail_next("create", "events", 1, 429, Some(HANG));
    let config = CloudNodeConfig {
        status_update_frequency: Duration::from_secs(3600),
        ..CloudNodeConfig::default()
    };
    let running = t
        .start_controller(fake.provider(), cloud_node::NAME, move |ctx| {
            cloud_node::run(ctx, config.clone())
        })
        .await;
    let name = t.name("hung");
    t.create(&kubelet_node(&name).label(RUN_LABEL, &t.run).build())
        .await;
    let initialised = wait_for(&t.nodes, &name, TIMEOUT, |n: &Node| {
        n.spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .is_some_and(|p| p == format!("fake://{name}"))
            && !n
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|ts| ts.iter().any(|t| t.key.contains("uninitialized")))
    })
    .await;
    assert!(initialised.is_ok(), "{initialised:?}");
    assert_eq!(fake.call_count("instance_metadata"), 2);
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.resource == "events" && r.status == 429),
        "the Event write was never held up"
    );
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn the_runtime_writes_the_events_of_work_that_finishes_during_shutdown() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let name = cluster.unique_name("subject");
    let connection = match cluster.api_server() {
        Some(server) => format!("--master={}", server.url()),
        None => format!(
            "--kubeconfig={}",
            std::env::var(ccm_testing::KUBECONFIG_ENV).unwrap()
        ),
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (started_tx, started) = tokio::sync::oneshot::channel::<()>();
    let started_tx = std::sync::Mutex::new(Some(started_tx));
    let object = subject(&ns, &name);
    let runtime = tokio::spawn(
        Builder::new()
            .without_builtin_controllers()
            .provider(FakeCloud::default().provider())
            .listener(listener)
            // In-flight work that ends after the shutdown signal and records an Event.
            .controller("drainer", move |ctx: ControllerContext| {
                let object = object.clone();
                let started = started_tx.lock().unwrap().take();
                async move {
                    let recorder = ctx.recorder("drainer");
                    recorder.normal(&object, "Started", "before the signal");
                    if let Some(started) = started {
                        let _ = started.send(());
                    }
                    ctx.shutdown.cancelled().await;
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    recorder.normal(&object, "Finished", "after the signal");
                    Ok(())
                }
            })
            .args([
                "ccm".to_owned(),
                connection,
                "--leader-elect=false".to_owned(),
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics".to_owned(),
            ])
            .shutdown_signal(async {
                let _ = stop_rx.await;
            })
            .run_async(),
    );
    tokio::time::timeout(WAIT, started)
        .await
        .expect("the controller starts")
        .unwrap();
    stop.send(()).unwrap();
    let code = tokio::time::timeout(WAIT, runtime)
        .await
        .expect("the runtime stops")
        .unwrap();
    assert_eq!(code, 0);
    // Written before the runtime returned, the last one after the controller had drained.
    let written = events_of(&cluster.client(), &ns, &name).await;
    assert_eq!(reasons(&written), ["Finished", "Started"], "{written:#?}");
    cluster.cleanup().await;
}

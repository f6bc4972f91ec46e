//! [`describe_all`]'s pacing: calls spread evenly over the period given, or all at once; and the
//! [`Coalescer`]'s grouping: a window for a quiet system, batches that grow while its calls are
//! in flight, full batches that do not wait for the window but for a free call.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ccm_core::{
    CloudProvider, CloudResult, InstanceAnswer, InstanceAnswers, InstanceMetadata, InstancesBatch,
    InstancesV2, Node, NodeView,
};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::plan::Lookup;
use super::{Coalescer, describe_all};

fn nodes(n: usize) -> Vec<Arc<Node>> {
    (0..n)
        .map(|i| {
            let mut node = Node::default();
            node.metadata.name = Some(format!("n{i}"));
            Arc::new(node)
        })
        .collect()
}

/// The offset of each call's start, sorted, and the number of Nodes answered: 10 Nodes, 2 per
/// call, answered at once.
async fn run(spread: Duration) -> (Vec<Duration>, usize) {
    let cloud = Slow::new(2, Duration::ZERO);
    let answers = describe_all(
        cloud.as_ref(),
        nodes(10),
        0,
        spread,
        &CancellationToken::new(),
    )
    .await
    .unwrap_or_default();
    let offsets = cloud.calls().into_iter().map(|(at, _)| at).collect();
    (offsets, answers.len())
}

#[tokio::test(start_paused = true)]
async fn calls_start_evenly_over_the_spread() {
    // 10 Nodes, 2 per call: 5 calls over 10 s start at 0, 2, 4, 6 and 8 s.
    let (offsets, answered) = run(Duration::from_secs(10)).await;
    assert_eq!(answered, 10);
    let secs: Vec<u64> = offsets.iter().map(Duration::as_secs).collect();
    assert_eq!(secs, [0, 2, 4, 6, 8]);
}

#[tokio::test(start_paused = true)]
async fn without_a_spread_the_calls_go_out_at_once() {
    let (offsets, answered) = run(Duration::ZERO).await;
    assert_eq!(answered, 10);
    assert_eq!(offsets, [Duration::ZERO; 5]);
}

const WINDOW: Duration = Duration::from_millis(100);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Answers every Node `Found` after `latency`, at most `max` Nodes per call, recording each
/// call's start (from `origin`) and size. A call that asks about the Node `hang` never answers.
struct Slow {
    max: usize,
    latency: Duration,
    origin: Instant,
    calls: Mutex<Vec<(Duration, usize)>>,
}

impl Slow {
    fn new(max: usize, latency: Duration) -> Arc<Slow> {
        Arc::new(Slow {
            max,
            latency,
            origin: Instant::now(),
            calls: Mutex::new(Vec::new()),
        })
    }

    /// The calls so far as (start, Nodes), in order of start (then size).
    fn calls(&self) -> Vec<(Duration, usize)> {
        let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone();
        calls.sort();
        calls
    }
}

impl CloudProvider for Slow {
    fn provider_name(&self) -> &str {
        "slow"
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }
    fn instances_batch(&self) -> Option<&dyn InstancesBatch> {
        Some(self)
    }
}

#[async_trait]
impl InstancesV2 for Slow {
    async fn instance_exists(&self, _node: &NodeView) -> CloudResult<bool> {
        Ok(true)
    }
    async fn instance_shutdown(&self, _node: &NodeView) -> CloudResult<bool> {
        Ok(false)
    }
    async fn instance_metadata(&self, _node: &NodeView) -> CloudResult<InstanceMetadata> {
        Ok(InstanceMetadata::default())
    }
}

#[async_trait]
impl InstancesBatch for Slow {
    fn max_batch_size(&self) -> usize {
        self.max
    }
    async fn describe_instances(&self, nodes: &[NodeView]) -> CloudResult<InstanceAnswers> {
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((Instant::now() - self.origin, nodes.len()));
        if nodes.iter().any(|n| n.name() == "hang") {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(self.latency).await;
        Ok(nodes
            .iter()
            .map(|n| {
                let name = n.name().to_owned();
                (name, InstanceAnswer::Found(InstanceMetadata::default()))
            })
            .collect())
    }
}

fn start(cloud: &Arc<Slow>) -> (Arc<Coalescer>, CancellationToken) {
    let shutdown = CancellationToken::new();
    let cloud: Arc<dyn CloudProvider> = cloud.clone();
    let coalescer = Coalescer::start(cloud, WINDOW, shutdown.clone());
    (
        Arc::new(coalescer.unwrap_or_else(|| panic!("the provider batches"))),
        shutdown,
    )
}

/// Asks about Node `name` at `at` (from `origin`); yields when it was answered (from
/// `origin`) and whether the answer was `Found`.
fn ask(
    coalescer: &Arc<Coalescer>,
    origin: Instant,
    name: &str,
    at: Duration,
) -> JoinHandle<(Duration, bool)> {
    let coalescer = coalescer.clone();
    let mut node = Node::default();
    node.metadata.name = Some(name.to_owned());
    tokio::spawn(async move {
        tokio::time::sleep_until(origin + at).await;
        let lookup = coalescer.lookup(Arc::new(node)).await;
        let found = matches!(lookup, Lookup::Answer(InstanceAnswer::Found(_)));
        (Instant::now() - origin, found)
    })
}

/// The answers of `asks`, in order; fails when one is not answered within a minute (of the
/// paused clock: at once, in real time).
async fn answers(asks: Vec<JoinHandle<(Duration, bool)>>) -> Vec<(Duration, bool)> {
    let mut answers = Vec::new();
    for (i, ask) in asks.into_iter().enumerate() {
        let answer = tokio::time::timeout(Duration::from_secs(60), ask).await;
        let Ok(answer) = answer else {
            panic!("lookup {i} was not answered within a minute");
        };
        answers.push(answer.unwrap_or_else(|e| panic!("ask: {e}")));
    }
    answers
}

#[tokio::test(start_paused = true)]
async fn lookups_arriving_while_the_calls_are_in_flight_go_out_together_in_one_call() {
    let cloud = Slow::new(100, Duration::from_secs(1));
    let (coalescer, shutdown) = start(&cloud);
    let origin = cloud.origin;
    // n0 goes out at 100 ms, n1 at 250 ms: both calls are in flight until 1.1 s and 1.25 s.
    let mut asks = vec![
        ask(&coalescer, origin, "n0", ms(0)),
        ask(&coalescer, origin, "n1", ms(150)),
    ];
    // Six lookups 150 ms apart while both are out: one batch, sent when n0's call answers.
    for i in 0..6 {
        asks.push(ask(
            &coalescer,
            origin,
            &format!("n{}", i + 2),
            ms(300 + 150 * i),
        ));
    }
    let answered = answers(asks).await;
    assert_eq!(cloud.calls(), [(ms(100), 1), (ms(250), 1), (ms(1100), 6)]);
    assert!(answered.iter().all(|(_, found)| *found), "{answered:?}");
    let times: Vec<Duration> = answered.iter().map(|(at, _)| *at).collect();
    assert_eq!(
        times,
        [
            ms(1100),
            ms(1250),
            ms(2100),
            ms(2100),
            ms(2100),
            ms(2100),
            ms(2100),
            ms(2100)
        ]
    );
    shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_lone_lookup_on_an_idle_coalescer_goes_out_after_one_window() {
    let cloud = Slow::new(100, Duration::from_secs(1));
    let (coalescer, shutdown) = start(&cloud);
    let origin = cloud.origin;
    // Alone; alone again after it was answered; alone while one call is out (a permit is free).
    let asks = vec![
        ask(&coalescer, origin, "n0", ms(0)),
        ask(&coalescer, origin, "n1", ms(2000)),
        ask(&coalescer, origin, "n2", ms(2200)),
    ];
    let answered = answers(asks).await;
    assert_eq!(cloud.calls(), [(ms(100), 1), (ms(2100), 1), (ms(2300), 1)]);
    assert_eq!(
        answered,
        [(ms(1100), true), (ms(3100), true), (ms(3300), true)]
    );
    shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_full_batch_does_not_wait_for_the_window_but_for_a_free_call() {
    let cloud = Slow::new(3, Duration::from_secs(1));
    let (coalescer, shutdown) = start(&cloud);
    let origin = cloud.origin;
    // Ten at once, three per call: two full calls at once, the third full one when they
    // answer (1 s), and the tenth lookup then too, its window (from its arrival) long past.
    let asks = (0..10)
        .map(|i| ask(&coalescer, origin, &format!("n{i}"), ms(0)))
        .collect();
    let answered = answers(asks).await;
    assert_eq!(
        cloud.calls(),
        [(ms(0), 3), (ms(0), 3), (ms(1000), 1), (ms(1000), 3)]
    );
    assert!(answered.iter().all(|(_, found)| *found), "{answered:?}");
    let mut times: Vec<Duration> = answered.iter().map(|(at, _)| *at).collect();
    times.sort();
    assert_eq!(times, [[ms(1000); 6].as_slice(), &[ms(2000); 4]].concat());
    shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_hanging_call_holds_one_permit_and_the_other_still_serves() {
    let cloud = Slow::new(100, Duration::from_secs(1));
    let (coalescer, shutdown) = start(&cloud);
    let origin = cloud.origin;
    let _hanging = ask(&coalescer, origin, "hang", ms(0));
    // n1 gets the other permit at 300 ms; n2 and n3 wait for it and go together at 1.3 s.
    let asks = vec![
        ask(&coalescer, origin, "n1", ms(200)),
        ask(&coalescer, origin, "n2", ms(500)),
        ask(&coalescer, origin, "n3", ms(700)),
    ];
    let answered = answers(asks).await;
    assert_eq!(cloud.calls(), [(ms(100), 1), (ms(300), 1), (ms(1300), 2)]);
    assert_eq!(
        answered,
        [(ms(1300), true), (ms(2300), true), (ms(2300), true)]
    );
    shutdown.cancel();
}

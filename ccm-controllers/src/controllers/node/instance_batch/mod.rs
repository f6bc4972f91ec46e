//! Batched instance lookups ([`InstancesBatch`](ccm_core::InstancesBatch)) shared by the
//! cloud-node and node-lifecycle controllers: many Nodes in one `describe_instances` call
//! instead of one `InstancesV2` call per Node, with single calls wherever the provider does not
//! batch (no capability, no `instances_v2`, or the call answers `NotImplemented`).
//!
//! Two ways to ask:
//! - [`describe_all`]: a known set of Nodes (the periodic address refresh, one monitor pass of
//!   the lifecycle controller), split into calls of at most `max_batch_size` Nodes;
//! - [`Coalescer`]: Nodes that arrive one by one (initialisation by the queue's workers): the
//!   lookups asked within [`Coalescer`]'s window, or while its calls are in flight, go out
//!   together.
//!
//! The per-Node reading of an answer, and the contract's rules, are in [`plan`].

pub(crate) mod plan;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ccm_core::{CloudError, CloudProvider, Node};
use futures::{Stream, StreamExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use self::plan::{Lookup, copy_lookup, distribute, group};

/// `describe_instances` calls of one [`describe_all`] in flight at once (the cloud-call budget
/// limits the rate; this only bounds the answers held in memory before they are used).
const CALLS_IN_FLIGHT: usize = 4;

/// Whether the framework batches for this provider: the contract uses `instances_batch` only
/// together with `instances_v2`.
pub(crate) fn batches(cloud: &dyn CloudProvider) -> bool {
    cloud.instances_v2().is_some() && cloud.instances_batch().is_some()
}

fn node_name(node: &Node) -> String {
    node.metadata.name.clone().unwrap_or_default()
}

/// One `describe_instances` call for `nodes` (1 to `max_batch_size`, each name once), read per
/// Node. A whole-call `Retry` is retried after its delay up to `retries` times (the whole batch
/// waits; no Node is asked alone meanwhile), then reported for every Node.
async fn describe(
    cloud: &dyn CloudProvider,
    nodes: &[Arc<Node>],
    retries: usize,
    shutdown: &CancellationToken,
) -> Vec<(String, Lookup)> {
    let names: Vec<String> = nodes.iter().map(|n| node_name(n)).collect();
    let Some(batch) = cloud.instances_batch() else {
        return distribute(&names, Err(CloudError::NotImplemented));
    };
    let views: Vec<ccm_core::NodeView> = nodes
        .iter()
        .map(|n| ccm_core::NodeView::from_node(n))
        .collect();
    let mut attempt = 0;
    loop {
        let result = batch.describe_instances(&views).await;
        match &result {
            Err(CloudError::Retry { after, message }) if attempt < retries => {
                tracing::info!(nodes = nodes.len(), ?after, %message, "cloud provider asked to retry the batch");
                attempt += 1;
                tokio::select! {
                    () = shutdown.cancelled() => return distribute(&names, result),
                    () = tokio::time::sleep(*after) => continue,
                }
            }
            Err(CloudError::NotImplemented) => {}
            Err(error) => {
                tracing::warn!(nodes = nodes.len(), %error, "describe_instances failed");
            }
            Ok(_) => {}
        }
        return distribute(&names, result);
    }
}

/// Looks up `nodes` in calls of at most `max_batch_size` Nodes, and yields each call's Nodes
/// with their answers as the call answers, so that no more than [`CALLS_IN_FLIGHT`] calls'
/// answers are held at once. Every requested Node comes with an answer (an unknown one as
/// [`Lookup::Missing`] or [`Lookup::CallFailed`]), unless `shutdown` fires first. For a
/// provider that [`batches`]; otherwise every Node is answered [`Lookup::Unsupported`].
///
/// The calls start evenly over `spread` (call `i` of `n` at `spread × i / n`), so a refresh
/// that is not urgent never sends its calls as one burst, which a cloud's quota would reject
/// in part; `Duration::ZERO` sends them at once (at most [`CALLS_IN_FLIGHT`] in flight).
pub(crate) fn describe_batches<'a>(
    cloud: &'a dyn CloudProvider,
    nodes: Vec<Arc<Node>>,
    retries: usize,
    spread: Duration,
    shutdown: &'a CancellationToken,
) -> impl Stream<Item = Vec<(Arc<Node>, Lookup)>> + Send + 'a {
    let max = cloud.instances_batch().map_or(1, |b| b.max_batch_size());
    let calls = group(nodes, max);
    let start = tokio::time::Instant::now();
    let count = calls.len().max(1) as f64;
    futures::stream::iter(calls.into_iter().enumerate())
        .map(move |(i, call)| async move {
            let at = start + spread.mul_f64(i as f64 / count);
            tokio::select! {
                () = shutdown.cancelled() => return Vec::new(),
                () = tokio::time::sleep_until(at) => {}
            }
            let mut answers: HashMap<String, Lookup> = describe(cloud, &call, retries, shutdown)
                .await
                .into_iter()
                .collect();
            call.into_iter()
                .filter_map(|node| {
                    let answer = answers.remove(&node_name(&node))?;
                    Some((node, answer))
                })
                .collect()
        })
        .buffer_unordered(CALLS_IN_FLIGHT)
}

/// [`describe_batches`] of `nodes` into one map by Node name; `None` when the provider does
/// not batch (ask with single calls).
pub(crate) async fn describe_all(
    cloud: &dyn CloudProvider,
    nodes: Vec<Arc<Node>>,
    retries: usize,
    spread: Duration,
    shutdown: &CancellationToken,
) -> Option<HashMap<String, Lookup>> {
    if !batches(cloud) {
        return None;
    }
    let answers = describe_batches(cloud, nodes, retries, spread, shutdown)
        .flat_map(futures::stream::iter)
        .map(|(node, answer)| (node_name(&node), answer))
        .collect()
        .await;
    Some(answers)
}

/// `describe_instances` calls of a [`Coalescer`] in flight at once. While that many are out,
/// new lookups gather in the next batch, which goes out as soon as one of them answers (group
/// commit): the batch grows with the cloud's latency, so a slow cloud gets fewer and larger
/// calls, while a quiet system still answers after one window.
///
/// Two rather than one so that one slow or hanging call does not hold every initialisation:
/// the other permit keeps serving. A stuck call keeps its permit until the budget's per-call
/// timeout (`--cloud-api-timeout`, default 30 s) drops it, or, with that timeout off, until the
/// provider's own (its SDK's) timeout fails it.
const COALESCER_CALLS_IN_FLIGHT: usize = 2;

struct Request {
    node: Arc<Node>,
    reply: oneshot::Sender<Lookup>,
    /// When the lookup was asked: a batch's window starts at its first lookup's arrival, also
    /// when that lookup waited in the channel behind a full batch.
    arrived: Instant,
}

/// Groups lookups that arrive one by one (e.g. from the cloud-node controller's workers) into
/// `describe_instances` calls. A batch goes out when `window` has passed since its first
/// lookup, or at once when `max_batch_size` Nodes are waiting, and in both cases only when
/// fewer than [`COALESCER_CALLS_IN_FLIGHT`] calls are out; lookups arriving meanwhile join
/// it (up to `max_batch_size`; later ones wait for the next batch). Once a call answers
/// `NotImplemented`, every later lookup answers [`Lookup::Unsupported`] at once.
pub(crate) struct Coalescer {
    requests: mpsc::UnboundedSender<Request>,
    unsupported: Arc<AtomicBool>,
}

impl Coalescer {
    /// Starts the grouping task (it stops with `shutdown`); `None` when the provider does not
    /// batch.
    pub(crate) fn start(
        cloud: Arc<dyn CloudProvider>,
        window: Duration,
        shutdown: CancellationToken,
    ) -> Option<Coalescer> {
        if !batches(cloud.as_ref()) {
            return None;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let unsupported = Arc::new(AtomicBool::new(false));
        tokio::spawn(collect(cloud, window, shutdown, rx, unsupported.clone()));
        Some(Coalescer {
            requests: tx,
            unsupported,
        })
    }

    /// The batch answer for `node`; [`Lookup::Unsupported`] when the provider turned out not
    /// to batch or the controller is shutting down (ask with a single call).
    pub(crate) async fn lookup(&self, node: Arc<Node>) -> Lookup {
        if self.unsupported.load(Ordering::Relaxed) {
            return Lookup::Unsupported;
        }
        let (reply, answer) = oneshot::channel();
        let request = Request {
            node,
            reply,
            arrived: Instant::now(),
        };
        if self.requests.send(request).is_err() {
            return Lookup::Unsupported;
        }
        answer.await.unwrap_or(Lookup::Unsupported)
    }
}

/// The lookups waiting for the next call of a [`Coalescer`].
#[derive(Default)]
struct Batch {
    /// The arrival of its first lookup (`None`: empty).
    since: Option<Instant>,
    /// The Nodes to ask about, each name once.
    nodes: Vec<Arc<Node>>,
    /// Who waits for each Node's answer (a Node asked twice has two waiters).
    waiting: HashMap<String, Vec<oneshot::Sender<Lookup>>>,
}

impl Batch {
    fn add(&mut self, request: Request) {
        self.since.get_or_insert(request.arrived);
        let waiters = self.waiting.entry(node_name(&request.node)).or_default();
        if waiters.is_empty() {
            self.nodes.push(request.node);
        }
        waiters.push(request.reply);
    }
}

/// Resolves with a call permit once a batch whose first lookup arrived at `since` may go out:
/// its window has passed (or it is `full`) and a permit is free. Never, for an empty batch.
async fn ready(
    since: Option<Instant>,
    full: bool,
    window: Duration,
    permits: Arc<Semaphore>,
) -> Option<OwnedSemaphorePermit> {
    let Some(since) = since else {
        return std::future::pending().await;
    };
    if !full {
        tokio::time::sleep_until(since + window).await;
    }
    permits.acquire_owned().await.ok()
}

/// The grouping task of a [`Coalescer`].
async fn collect(
    cloud: Arc<dyn CloudProvider>,
    window: Duration,
    shutdown: CancellationToken,
    mut requests: mpsc::UnboundedReceiver<Request>,
    unsupported: Arc<AtomicBool>,
) {
    let permits = Arc::new(Semaphore::new(COALESCER_CALLS_IN_FLIGHT));
    let mut batch = Batch::default();
    loop {
        let max = cloud
            .instances_batch()
            .map_or(1, |b| b.max_batch_size().max(1));
        let full = batch.nodes.len() >= max;
        // Biased: lookups already asked join the batch before it goes (up to `max`).
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            request = requests.recv(), if !full => match request {
                Some(request) => batch.add(request),
                None => break,
            },
            permit = ready(batch.since, full, window, permits.clone()) => {
                let Some(permit) = permit else { break };
                let batch = std::mem::take(&mut batch);
                tokio::spawn(call(
                    cloud.clone(),
                    batch,
                    permit,
                    shutdown.clone(),
                    unsupported.clone(),
                ));
            }
        }
    }
}

/// One call of a [`Coalescer`] for `batch`, holding `permit` until the provider answers.
async fn call(
    cloud: Arc<dyn CloudProvider>,
    batch: Batch,
    permit: OwnedSemaphorePermit,
    shutdown: CancellationToken,
    unsupported: Arc<AtomicBool>,
) {
    let Batch {
        nodes, mut waiting, ..
    } = batch;
    // A whole-call Retry is not retried here: every Node of the call gets it, and the
    // controller requeues them all after its delay (they come back together).
    let answers = if unsupported.load(Ordering::Relaxed) {
        let names: Vec<String> = nodes.iter().map(|n| node_name(n)).collect();
        distribute(&names, Err(CloudError::NotImplemented))
    } else {
        describe(cloud.as_ref(), &nodes, 0, &shutdown).await
    };
    drop(permit);
    for (name, lookup) in answers {
        if matches!(lookup, Lookup::Unsupported) && !unsupported.swap(true, Ordering::Relaxed) {
            tracing::info!(
                "describe_instances answered NotImplemented: looking Nodes up one by one"
            );
        }
        let Some(mut waiters) = waiting.remove(&name) else {
            continue;
        };
        let last = waiters.pop();
        for waiter in waiters {
            let _ = waiter.send(copy_lookup(&lookup));
        }
        if let Some(waiter) = last {
            let _ = waiter.send(lookup);
        }
    }
}

#[cfg(test)]
mod tests;

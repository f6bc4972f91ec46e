//! Batched instance lookups ([`InstancesBatch`](ccm_core::InstancesBatch)) shared by the
//! cloud-node and node-lifecycle controllers: many Nodes in one `describe_instances` call
//! instead of one `InstancesV2` call per Node, with single calls wherever the provider does not
//! batch (no capability, no `instances_v2`, or the call answers `NotImplemented`).
//!
//! Two ways to ask:
//! - [`describe_all`]: a known set of Nodes (the periodic address refresh, one monitor pass of
//!   the lifecycle controller), split into calls of at most `max_batch_size` Nodes;
//! - [`Coalescer`]: Nodes that arrive one by one (initialisation by the queue's workers): the
//!   lookups asked within [`Coalescer`]'s window go out together.
//!
//! The per-Node reading of an answer, and the contract's rules, are in [`plan`].

pub(crate) mod plan;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ccm_core::{CloudError, CloudProvider, Node};
use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, oneshot};
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
    let mut attempt = 0;
    loop {
        let result = batch.describe_instances(nodes).await;
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

struct Request {
    node: Arc<Node>,
    reply: oneshot::Sender<Lookup>,
}

/// Groups lookups that arrive one by one (e.g. from the cloud-node controller's workers) into
/// `describe_instances` calls: a call goes out when `max_batch_size` lookups are waiting, or
/// `window` after the first of them. Calls run concurrently (the cloud-call budget limits
/// their rate). Once a call answers `NotImplemented`, every later lookup answers
/// [`Lookup::Unsupported`] at once.
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
        if self.requests.send(Request { node, reply }).is_err() {
            return Lookup::Unsupported;
        }
        answer.await.unwrap_or(Lookup::Unsupported)
    }
}

/// The grouping task of a [`Coalescer`].
async fn collect(
    cloud: Arc<dyn CloudProvider>,
    window: Duration,
    shutdown: CancellationToken,
    mut requests: mpsc::UnboundedReceiver<Request>,
    unsupported: Arc<AtomicBool>,
) {
    loop {
        let first = tokio::select! {
            () = shutdown.cancelled() => break,
            request = requests.recv() => match request {
                Some(r) => r,
                None => break,
            },
        };
        let max = cloud
            .instances_batch()
            .map_or(1, |b| b.max_batch_size().max(1));
        let deadline = tokio::time::Instant::now() + window;
        let mut waiting: HashMap<String, Vec<oneshot::Sender<Lookup>>> = HashMap::new();
        let mut nodes = Vec::new();
        let mut next = Some(first);
        while let Some(request) = next.take() {
            let waiters = waiting.entry(node_name(&request.node)).or_default();
            if waiters.is_empty() {
                nodes.push(request.node);
            }
            waiters.push(request.reply);
            if nodes.len() < max
                && let Ok(Some(request)) = tokio::time::timeout_at(deadline, requests.recv()).await
            {
                next = Some(request);
            }
        }
        let (cloud, shutdown, unsupported) = (cloud.clone(), shutdown.clone(), unsupported.clone());
        tokio::spawn(async move {
            // A whole-call Retry is not retried here: every Node of the call gets it, and the
            // controller requeues them all after its delay (they come back together).
            for (name, lookup) in describe(cloud.as_ref(), &nodes, 0, &shutdown).await {
                if matches!(lookup, Lookup::Unsupported)
                    && !unsupported.swap(true, Ordering::Relaxed)
                {
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
        });
    }
}

#[cfg(test)]
mod tests;

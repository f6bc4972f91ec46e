//! The async shell of the cloud-node controller: reads the cache, calls the cloud, writes.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ccm_core::well_known::TAINT_UNINITIALIZED;
use ccm_core::{CloudError, InstanceMetadata, Node, NodeView};
use kube::api::Api;

use super::cloud::{self, FetchError, Fetched, RefreshAnswer};
use super::metrics::CloudNodeMetrics;
use super::plan::{self, InitError, Step};
use crate::controllers::node::instance_batch::Coalescer;
use crate::controllers::node::instance_batch::plan::{Lookup, MetadataLookup, metadata_lookup};
use crate::controllers::node::node_provider_id;
use crate::controllers::node::patch::{self, PatchError};
use crate::controllers::node::spec::SpecUpdate;
use crate::machinery::context::ControllerContext;
use crate::machinery::events::EventRecorder;
use crate::machinery::workqueue::Outcome;
use crate::machinery::write_pacing::{NODE_INITIALISATION_WRITES, WritePacer, WritePermit};

/// Event reason of a successful initialisation (Go's).
pub(crate) const REASON_SYNCED: &str = "Synced";
/// Event reason of a failed initialisation step (not in Go, which only logs).
pub(crate) const REASON_SYNC_FAILED: &str = "SyncFailed";

/// State shared by the workers and the periodic refresh.
pub(crate) struct Reconciler {
    pub(crate) ctx: ControllerContext,
    pub(crate) api: Api<Node>,
    pub(crate) recorder: EventRecorder,
    pub(crate) metrics: CloudNodeMetrics,
    /// Nodes this controller untainted whose untainted copy the cache has not shown yet. A
    /// tainted cached copy of such a node is a stale view (our write has not reached the cache
    /// yet), so it is not initialised a second time.
    initialized: Mutex<HashMap<String, Untainted>>,
    /// Shadow mode: the initialised Nodes whose initialisation was re-planned, by UID, with a
    /// digest of the fields it sets (re-planned when they change).
    pub(crate) verified: Mutex<HashMap<String, u64>>,
    /// Nodes whose provider answered `CloudError::Retry`: name → earliest next cloud call. A
    /// node update arriving meanwhile must not bring the call forward (the queue's own
    /// delayed add brings the node back at that time).
    retry_not_before: Mutex<HashMap<String, Instant>>,
    /// Groups the initialisation lookups of a burst into `describe_instances` calls; `None`
    /// when the provider does not batch.
    init_batch: Option<Coalescer>,
    /// Uninitialised Nodes without a provider ID whose instance our cloud does not know, by
    /// name, with their UID: told once (a `SyncFailed` Event), then asked again with
    /// backoff in silence. Such a Node may be another cloud's, waiting for its own CCM.
    unknown: Mutex<HashMap<String, String>>,
    /// `--reconcile-cloud-labels`: the periodic refresh also brings the cloud's labels in
    /// step (`plan::plan_cloud_labels`).
    reconcile_cloud_labels: bool,
    /// How many initialisations write at once: up to the workers, fewer while the API server
    /// is queueing (its writes' latency; `machinery/write_pacing`), so that a Node burst's
    /// registrations go first.
    init_writes: WritePacer,
}

/// A Node this controller untainted (see [`Reconciler::sync_node`]).
struct Untainted {
    /// The Node's UID (a Node re-created under the same name is another Node).
    uid: String,
    /// When the taint removal was written.
    at: Instant,
}

/// How long after our taint removal a tainted cached copy of the Node is taken for stale and
/// put off, rather than read from the API server: the event of our own write normally
/// arrives well within it.
const STALE_COPY_RECHECK: Duration = Duration::from_secs(2);

/// With a batching provider, how long the first Node of an initialisation burst waits for
/// others to be looked up in the same `describe_instances` call (a call goes out earlier when
/// `max_batch_size` Nodes are waiting, and later while the coalescer's calls are all in
/// flight: then the batch grows until one answers).
pub(crate) const INIT_BATCH_WINDOW: Duration = Duration::from_millis(100);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs one write under `slot` and feeds it back: its latency when it succeeded, the API
/// server's overload when it answered `429` or `5xx` (another failure, e.g. a 404 for a
/// deleted Node, says nothing of the API server's queue).
async fn timed<T, E: AsApiStatus>(
    slot: &WritePermit<'_>,
    write: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let started = tokio::time::Instant::now();
    let result = write.await;
    match &result {
        Ok(_) => slot.observe(started.elapsed(), false),
        Err(e) if e.api_code().is_some_and(|c| c == 429 || c >= 500) => {
            slot.observe(started.elapsed(), true);
        }
        Err(_) => {}
    }
    result
}

/// The API server's status code in a write's error, if it answered.
trait AsApiStatus {
    fn api_code(&self) -> Option<u16>;
}

impl AsApiStatus for kube::Error {
    fn api_code(&self) -> Option<u16> {
        match self {
            kube::Error::Api(s) => Some(s.code),
            _ => None,
        }
    }
}

impl<E: std::error::Error + 'static> AsApiStatus for PatchError<E> {
    fn api_code(&self) -> Option<u16> {
        match self {
            PatchError::Kube(e) => e.api_code(),
            _ => None,
        }
    }
}

fn uid(node: &Node) -> String {
    node.metadata.uid.clone().unwrap_or_default()
}

impl Reconciler {
    pub(crate) fn new(
        ctx: ControllerContext,
        recorder: EventRecorder,
        metrics: CloudNodeMetrics,
        reconcile_cloud_labels: bool,
        workers: usize,
    ) -> Self {
        Reconciler {
            reconcile_cloud_labels,
            init_writes: WritePacer::new(
                workers,
                NODE_INITIALISATION_WRITES,
                metrics.init_write_limit(),
            ),
            api: Api::all(ctx.client.clone()),
            recorder,
            metrics,
            initialized: Mutex::new(HashMap::new()),
            verified: Mutex::new(HashMap::new()),
            retry_not_before: Mutex::new(HashMap::new()),
            unknown: Mutex::new(HashMap::new()),
            init_batch: Coalescer::start(
                ctx.cloud.clone(),
                INIT_BATCH_WINDOW,
                ctx.shutdown.clone(),
            ),
            ctx,
        }
    }

    /// Forgets what is remembered about a deleted node.
    pub(crate) fn forget(&self, name: &str) {
        lock(&self.initialized).remove(name);
        lock(&self.retry_not_before).remove(name);
        lock(&self.unknown).remove(name);
    }

    /// When this controller untainted `node` (a tainted copy), if it did.
    fn untainted_by_us(&self, node: &Node) -> Option<Instant> {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        lock(&self.initialized)
            .get(name)
            .filter(|e| e.uid == uid(node))
            .map(|e| e.at)
    }

    /// Processes one node key from the work queue.
    ///
    /// A tainted cached copy of a Node this controller untainted is normally a stale view: the
    /// event of our own write is still on its way (the address write, which lands first, sends
    /// the Node back to the queue). Watch events arrive in order, so that event will sync the
    /// Node again: until [`STALE_COPY_RECHECK`] after our write, such copies (there may be
    /// several: kubelet's status write too) are put off without any request. Still tainted
    /// after that (e.g. re-tainted while the watch was re-listing), the Node is
    /// read (one GET) and, if it really is tainted again, initialised again, as Go would.
    pub(crate) async fn sync_node(&self, name: String) -> Outcome {
        let Some(cached) = self.ctx.nodes.get(&name) else {
            return Outcome::Done;
        };
        if !self.ctx.ownership().owns(&cached) {
            // Another cloud's Node (machinery/ownership.rs): never initialised, no cloud call.
            return Outcome::Done;
        }
        let mut node = cached.to_node();
        if !plan::has_uninitialized_taint(&node) {
            // The cache has caught up with our write (or never needed to).
            lock(&self.initialized).remove(&name);
        } else if let Some(at) = self.untainted_by_us(&node) {
            let recheck = (at + STALE_COPY_RECHECK).saturating_duration_since(Instant::now());
            if !recheck.is_zero() {
                return Outcome::RequeueAfter(recheck);
            }
            node = match self.api.get(&name).await {
                Ok(fresh) => fresh,
                Err(kube::Error::Api(s)) if s.code == 404 => return Outcome::Done,
                Err(error) => {
                    tracing::warn!(node = %name, %error, "failed to read node");
                    return Outcome::Failed;
                }
            };
            lock(&self.initialized).remove(&name);
        }
        if plan::has_uninitialized_taint(&node) {
            {
                let mut gates = lock(&self.retry_not_before);
                match gates.get(&name) {
                    // Too early: the delayed add of the Retry outcome is still pending.
                    // `Done` only resets the failure count, which a Retry does not use.
                    Some(t) if Instant::now() < *t => return Outcome::Done,
                    Some(_) => {
                        gates.remove(&name);
                    }
                    None => {}
                }
            }
            let outcome = self.initialize(node).await;
            if let Some(shadow) = self.ctx.shadow() {
                match outcome {
                    Outcome::Done => shadow.compared("Node", &name),
                    _ => shadow.not_compared(
                        "Node",
                        &name,
                        "the initialisation did not complete (see the log)",
                    ),
                }
            }
            outcome
        } else if let Some(shadow) = self.ctx.shadow() {
            let outcome = self.reconcile_labels(node.clone()).await;
            match self.verify_initialized(node).await {
                Ok(()) => {
                    shadow.compared("Node", &name);
                    outcome
                }
                // Not compared: retried with backoff, listed in the one-shot report meanwhile.
                Err(error) => {
                    shadow.not_compared("Node", &name, error);
                    Outcome::Failed
                }
            }
        } else {
            self.reconcile_labels(node).await
        }
    }

    fn warn(&self, node: &Node, step: Step, error: &(dyn std::fmt::Display + Send + Sync)) {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        tracing::warn!(node = %name, step = step.as_str(), %error, "failed to sync node");
        let note = match step {
            Step::Metadata => format!("Failed to get instance metadata for node {name}: {error}"),
            Step::ProviderId => format!("Failed to get providerID for node {name}: {error}"),
            Step::NodeIp => format!("Failed to apply the provided node IP of node {name}: {error}"),
            Step::Update => format!("Failed to update node {name}: {error}"),
            Step::Addresses => format!("Failed to update the addresses of node {name}: {error}"),
        };
        self.recorder.warning(node, REASON_SYNC_FAILED, note);
    }

    /// Our cloud does not know the instance of `node`, an uninitialised Node without a provider
    /// ID. It may be another cloud's Node whose own CCM has not initialised it yet, or ours
    /// before the cloud shows it: the first time, a Warning `SyncFailed` Event (and its log
    /// line); after that, retries with backoff without a word (no warning loop). The node-lifecycle
    /// controller never deletes such a Node (`machinery/ownership.rs`, `deletion_evidence`).
    fn not_known(&self, node: &Node, step: Step) {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let first = lock(&self.unknown).insert(name.to_owned(), uid(node)) != Some(uid(node));
        if first {
            // The Warning Event is logged too (one WARN line), so no log line of our own.
            self.recorder.warning(
                node,
                REASON_SYNC_FAILED,
                format!(
                    "The cloud provider does not know the instance of node {name} ({} step); the node stays uninitialised and is asked again with backoff (another cloud's node? leave it out with --managed-node-selector)",
                    step.as_str()
                ),
            );
        } else {
            tracing::debug!(node = %name, "the cloud provider still does not know this node's instance");
        }
    }

    /// Initialises a tainted node: metadata from the cloud (one call with `InstancesV2`), then
    /// two writes and one event.
    ///
    /// Why two writes and not one: labels, providerID and taints live in the main resource,
    /// `status.addresses` in the `status` subresource, and the API server ignores status in a
    /// write to the main resource (and everything but status in a write to `/status`). So:
    /// 1. one merge patch of `status.addresses` (skipped when they are already right);
    /// 2. one guarded JSON patch with providerID, labels and the taint removal;
    /// 3. the `Synced` event.
    ///
    /// The addresses go first and the taint comes off last (**differs from Go**, which removes
    /// the taint first and only logs a failed address write): an untainted Node is
    /// schedulable, and must not be so without its cloud addresses. A failed address write
    /// leaves the Node tainted and is retried like any failed initialisation.
    async fn initialize(&self, node: Node) -> Outcome {
        let started = Instant::now();
        let outcome = self.initialize_inner(node).await;
        let result = match outcome {
            Outcome::Done => "success",
            Outcome::RequeueAfter(_) => "retry",
            Outcome::Failed => "error",
        };
        self.metrics
            .reconciled("initialize", result, started.elapsed());
        outcome
    }

    /// The node's metadata: from a batch call when the provider batches (Nodes initialised
    /// within [`INIT_BATCH_WINDOW`] share one call), else, and for a Node the batch left
    /// unknown, from the single lookup.
    pub(super) async fn fetch_metadata(&self, node: &Node) -> Result<Fetched, FetchError> {
        if let Some(batch) = &self.init_batch {
            match metadata_lookup(batch.lookup(NodeView::from_node(node)).await) {
                MetadataLookup::Metadata(meta) => {
                    return Ok(Fetched {
                        meta,
                        require_provider_id: true,
                    });
                }
                MetadataLookup::Failed(source) => {
                    return Err(FetchError {
                        step: Step::Metadata,
                        source,
                    });
                }
                MetadataLookup::AskSingle => {}
            }
        }
        cloud::fetch_metadata(self.ctx.cloud.as_ref(), node).await
    }

    async fn initialize_inner(&self, node: Node) -> Outcome {
        let name = node.metadata.name.clone().unwrap_or_default();
        let fetched = match self.fetch_metadata(&node).await {
            Ok(f) => f,
            Err(FetchError {
                source: CloudError::Retry { after, message },
                ..
            }) => {
                tracing::info!(node = %name, ?after, %message, "cloud provider asked to retry");
                lock(&self.retry_not_before).insert(name, Instant::now() + after);
                return Outcome::RequeueAfter(after);
            }
            Err(e)
                if matches!(e.source, CloudError::InstanceNotFound)
                    && node_provider_id(&node).is_empty() =>
            {
                self.not_known(&node, e.step);
                return Outcome::Failed;
            }
            Err(e) => {
                self.warn(&node, e.step, &e.source);
                return Outcome::Failed;
            }
        };
        lock(&self.unknown).remove(&name);
        // Validate before writing anything: a failing rule keeps the node tainted.
        let addresses = match plan::plan_init(&node, &fetched.meta, fetched.require_provider_id) {
            Ok(p) => {
                for discarded in &p.discarded_labels {
                    tracing::warn!(node = %name, label = %discarded, "discarding label from the cloud provider");
                }
                p.addresses
            }
            Err(e) => {
                self.warn(&node, e.step(), &e);
                return Outcome::Failed;
            }
        };

        // The writes wait for a slot while the API server is queueing (module docs of
        // `machinery/write_pacing`); each successful write's latency sets the slots.
        let slot = self.init_writes.acquire().await;

        // Write 1: addresses, while the node is still tainted (so not schedulable).
        let node = match addresses {
            None => node,
            Some(addresses) => {
                match timed(&slot, patch::patch_addresses(&self.api, &node, &addresses)).await {
                    Ok(updated) => updated,
                    // Deleted, or re-created under the same name (the UID precondition failed):
                    // the new Node gets its own sync.
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
                        return Outcome::Done;
                    }
                    Err(e) => {
                        self.warn(&node, Step::Addresses, &e);
                        return Outcome::Failed;
                    }
                }
            }
        };

        // Write 2: providerID, labels, taint removal; re-planned on every conflict.
        let meta = &fetched.meta;
        let require = fetched.require_provider_id;
        let result = timed(
            &slot,
            patch::patch_node_spec(&self.api, node.clone(), |current| {
                if !plan::has_uninitialized_taint(current) {
                    // Initialised meanwhile (by another writer): nothing left for us to change.
                    return Ok::<_, InitError>(SpecUpdate::default());
                }
                plan::plan_init(current, meta, require).map(|p| p.spec)
            }),
        )
        .await;
        drop(slot);
        let updated = match result {
            Ok((updated, true)) => updated,
            // Untainted by another writer between our read and our write: nothing to do.
            Ok((_, false)) => return Outcome::Done,
            Err(PatchError::NotFound) => return Outcome::Done,
            Err(PatchError::Plan(e)) => {
                self.warn(&node, e.step(), &e);
                return Outcome::Failed;
            }
            Err(e) => {
                self.warn(&node, Step::Update, &e);
                return Outcome::Failed;
            }
        };
        lock(&self.initialized).insert(
            name.clone(),
            Untainted {
                uid: uid(&updated),
                at: Instant::now(),
            },
        );
        self.metrics.taint_removed(&updated);
        tracing::info!(node = %name, "node synced");
        self.recorder
            .normal(&updated, REASON_SYNCED, "Node synced successfully");
        self.metrics.initial_sync_done(&updated);
        Outcome::Done
    }

    /// Beta → GA label reconcile with a guarded patch. Writes nothing when the labels agree.
    pub(crate) async fn reconcile_labels(&self, node: Node) -> Outcome {
        if plan::plan_label_reconcile(&node).is_empty() {
            return Outcome::Done;
        }
        let started = Instant::now();
        let name = node.metadata.name.clone().unwrap_or_default();
        let result = patch::patch_node_spec(&self.api, node, |current| {
            Ok::<_, std::convert::Infallible>(plan::label_reconcile_update(current))
        })
        .await;
        let outcome = match result {
            Ok(_) | Err(PatchError::NotFound) => Outcome::Done,
            Err(error) => {
                tracing::warn!(node = %name, %error, "failed to reconcile node labels");
                Outcome::Failed
            }
        };
        let result = if outcome == Outcome::Done {
            "success"
        } else {
            "error"
        };
        self.metrics.reconciled("labels", result, started.elapsed());
        outcome
    }

    /// The node's cloud answer for the refresh: from its batch answer when there is one
    /// (`None`: no batching), else, and when the batch left it unknown, a single lookup.
    async fn refresh_answer(
        &self,
        node: &NodeView,
        batch_answer: Option<Lookup>,
    ) -> Result<RefreshAnswer, CloudError> {
        match batch_answer.map(metadata_lookup) {
            Some(MetadataLookup::Metadata(meta)) => Ok(RefreshAnswer {
                meta,
                labels_known: true,
            }),
            Some(MetadataLookup::Failed(error)) => Err(error),
            Some(MetadataLookup::AskSingle) | None => {
                cloud::fetch_refresh(self.ctx.cloud.as_ref(), node).await
            }
        }
    }

    /// The periodic refresh of one initialised node's addresses (errors are logged, as in Go;
    /// the next period tries again) and, with `--reconcile-cloud-labels`, its labels, from the
    /// same answer. `batch_answer` is the node's answer from the refresh's
    /// `describe_instances` calls, `None` when the provider does not batch.
    pub(crate) async fn refresh_addresses(&self, view: &NodeView, batch_answer: Option<Lookup>) {
        if view.has_taint(TAINT_UNINITIALIZED) {
            return;
        }
        let started = Instant::now();
        let name = view.name();
        // Shadow mode: the lifecycle controller would delete this Node (its instance is gone)
        // and re-examines it; asking the cloud for its addresses would only repeat that.
        if self.ctx.shadow().is_some_and(|s| s.would_delete(name)) {
            return;
        }
        let answer = self.refresh_answer(view, batch_answer).await;
        let result = match &answer {
            Err(error) => {
                tracing::warn!(node = %name, %error, "failed to get node addresses from the cloud provider");
                if error.retry_after().is_some() {
                    "retry"
                } else {
                    "error"
                }
            }
            // No addresses from the cloud: nothing to write (no copy of the Node needed).
            Ok(answer) if answer.meta.node_addresses.is_empty() => "success",
            Ok(answer) => {
                let cloud_addresses = &answer.meta.node_addresses;
                // The planner and the patch read the full Node: a copy of the cached view.
                let node = view.to_node();
                match plan::plan_address_refresh(&node, cloud_addresses) {
                    Err(error) => {
                        tracing::warn!(node = %name, %error, "failed to update node addresses");
                        "error"
                    }
                    Ok(None) => "success",
                    Ok(Some(addresses)) => {
                        match patch::patch_addresses(&self.api, &node, &addresses).await {
                            Ok(_) => "success",
                            // Deleted or re-created meanwhile (UID precondition): nothing to do.
                            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => "success",
                            Err(error) => {
                                tracing::warn!(node = %name, %error, "failed to patch node addresses");
                                "error"
                            }
                        }
                    }
                }
            }
        };
        self.metrics
            .reconciled("addresses", result, started.elapsed());
        if let Ok(answer) = answer
            && self.reconcile_cloud_labels
            && answer.labels_known
        {
            self.reconcile_cloud_labels(view, &answer.meta).await;
        }
    }

    /// Brings the Node's zone, region, instance type and additional labels in step with the
    /// cloud's answer (`plan::plan_cloud_labels`): planned on the cached view (no copy, no
    /// write when they agree), written with a guarded patch re-planned on conflict. One INFO
    /// line per changed Node; each changed label counted.
    async fn reconcile_cloud_labels(&self, view: &NodeView, meta: &InstanceMetadata) {
        if plan::plan_cloud_labels(|k| view.label(k), meta).is_empty() {
            return;
        }
        let started = Instant::now();
        let name = view.name();
        let mut changed = Vec::new();
        let result = patch::patch_node_spec(&self.api, view.to_node(), |current| {
            let update = plan::cloud_labels_update(current, meta);
            changed = update
                .labels
                .iter()
                .map(|(k, v)| {
                    let old = crate::controllers::node::label(current, k).map(str::to_owned);
                    (k.clone(), old, v.clone())
                })
                .collect();
            Ok::<_, std::convert::Infallible>(update)
        })
        .await;
        let result = match result {
            Ok((_, true)) => {
                let summary: Vec<String> = changed
                    .iter()
                    .map(|(k, old, new)| match old {
                        Some(old) => format!("{k}: {old} -> {new}"),
                        None => format!("{k}: (none) -> {new}"),
                    })
                    .collect();
                tracing::info!(node = %name, labels = %summary.join(", "), "brought node labels in step with the cloud");
                for (key, _, _) in &changed {
                    self.metrics
                        .cloud_label_updated(plan::cloud_label_metric_key(key));
                }
                "success"
            }
            Ok((_, false)) | Err(PatchError::NotFound) => "success",
            Err(error) => {
                tracing::warn!(node = %name, %error, "failed to bring node labels in step with the cloud");
                "error"
            }
        };
        self.metrics
            .reconciled("cloud_labels", result, started.elapsed());
    }
}

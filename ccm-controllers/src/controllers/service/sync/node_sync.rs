//! The node-sync side of the service controller: Node changes become node-sync triggers,
//! the [`NodeSyncTimer`] says when a pass runs, and a pass gives each load balancer whose
//! eligible hosts changed its new hosts: one `update_load_balancer` each, or, with the
//! provider's [`LoadBalancerHostsBatch`], `max_batch_size` load balancers per
//! `update_load_balancer_hosts` call. A Service with a backend selector
//! (`plan/backends.rs`) gets the eligible hosts its selector matches; a batch carries only load
//! balancers of one selector (one host list per call).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccm_core::well_known::TAINT_UNINITIALIZED;
use ccm_core::{CloudError, LoadBalancerHostsBatch, NodeView};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use tokio::sync::mpsc;

use super::{Entry, Reconciler};
use crate::controllers::service::NAME;
use crate::controllers::service::classes::class_of;
use crate::controllers::service::classes::note_with_class;
use crate::controllers::service::cloud::{self, CallError};
use crate::controllers::service::metrics::ServiceMetrics;
use crate::controllers::service::plan::{self, HostChange, HostKey, NodeSyncTimer};
use crate::machinery::informer::{Change, Subscription};
use crate::machinery::label_selector::SelectorError;
use crate::machinery::ownership::Ownership;

/// The eligible hosts at one generation of the Node informer, built once and shared by every
/// load balancer synced while the Nodes do not change.
///
/// The provider takes the store's own [`NodeView`]s (where Go passes `[]*v1.Node` from the
/// informer cache), so a host set costs one pointer per host, never a copy of a Node: cloning
/// every eligible Node for every `ensure_load_balancer`/`update_load_balancer` call cost
/// 5 million Node clones (and 1.4 GB of resident memory) to ensure 1,000 load balancers over
/// 5,000 Nodes (`docs/performance.md`, steady). The host keys every Service remembers are one
/// shared `Arc<[HostKey]>` while the set is the same.
#[derive(Clone)]
pub(super) struct HostSet {
    generation: u64,
    /// The backend selector (its text) these hosts were chosen by; `None`: every eligible host.
    selector: Option<Arc<str>>,
    pub(super) nodes: Arc<[NodeView]>,
    pub(super) keys: Arc<[HostKey]>,
    /// The last host list compared with `keys`, and whether it was sufficiently equal: most
    /// load balancers remember the same list, so a node-sync pass over 10,000 load balancers
    /// compares each distinct list once (O(hosts)), not once per load balancer.
    compared: Arc<std::sync::Mutex<Option<Compared>>>,
    /// The subsets of these hosts by backend selector text, built once per generation and
    /// shared by every Service with that selector.
    subsets: Arc<Mutex<Subsets>>,
}

/// [`HostSet`]s of one generation by backend selector text, or why the text is no selector.
type Subsets = HashMap<Arc<str>, Result<HostSet, SelectorError>>;

/// A host list compared with a [`HostSet`]'s keys, and whether it was sufficiently equal.
type Compared = (Arc<[HostKey]>, bool);

impl HostSet {
    fn new(
        generation: u64,
        selector: Option<Arc<str>>,
        nodes: Arc<[NodeView]>,
        keys: Arc<[HostKey]>,
    ) -> Self {
        HostSet {
            generation,
            selector,
            nodes,
            keys,
            compared: Arc::default(),
            subsets: Arc::default(),
        }
    }

    /// The hosts of these that the backend selector `text` matches, or why `text` is no
    /// selector.
    fn selected(&self, text: &str) -> Result<HostSet, SelectorError> {
        let mut subsets = self.subsets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(subset) = subsets.get(text) {
            return subset.clone();
        }
        let text: Arc<str> = text.into();
        let subset = plan::parse_selector(&text).map(|selector| {
            let nodes = plan::selected_hosts(&self.nodes, &selector);
            let keys = plan::host_keys(&nodes);
            HostSet::new(
                self.generation,
                Some(text.clone()),
                nodes.into(),
                keys.into(),
            )
        });
        subsets.insert(text, subset.clone());
        subset
    }

    /// Whether a load balancer last given `last` has these hosts (Go's
    /// `nodesSufficientlyEqual`).
    pub(super) fn same_hosts(&self, last: &Arc<[HostKey]>) -> bool {
        if Arc::ptr_eq(last, &self.keys) {
            return true;
        }
        let mut memo = self.compared.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((seen, equal)) = memo.as_ref()
            && Arc::ptr_eq(seen, last)
        {
            return *equal;
        }
        let equal = plan::nodes_sufficiently_equal(last, &self.keys);
        *memo = Some((last.clone(), equal));
        equal
    }
}

/// What the node-sync loop hears of the Nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum NodeSyncTrigger {
    /// A change that can change a host list.
    Hosts(HostChange),
    /// Whether some of this CCM's Nodes await their initialisation (carry the uninitialised
    /// taint) now: more additions are coming ([`NodeSyncTimer::joining`]).
    Joining(bool),
}

/// This CCM's Nodes that still carry the uninitialised taint, by name.
#[derive(Debug, Default)]
struct AwaitingInitialisation(HashSet<String>);

impl AwaitingInitialisation {
    /// Takes `node` as it is now (ours or not).
    fn update(&mut self, ownership: &Ownership, node: &NodeView) {
        if ownership.owns(node) && node.has_taint(TAINT_UNINITIALIZED) {
            if !self.0.contains(node.name()) {
                self.0.insert(node.name().to_string());
            }
        } else {
            self.0.remove(node.name());
        }
    }

    /// Forgets a deleted Node.
    fn forget(&mut self, node: &NodeView) {
        self.0.remove(node.name());
    }

    fn any(&self) -> bool {
        !self.0.is_empty()
    }
}

/// Turns Node changes that can change a host list (§4.4) into node-sync triggers, and tells the
/// loop when Nodes start and stop awaiting their initialisation.
pub(super) async fn node_events(
    shared: Arc<Reconciler>,
    mut changes: Subscription<NodeView>,
    trigger: mpsc::UnboundedSender<NodeSyncTrigger>,
) {
    let mut awaiting = AwaitingInitialisation::default();
    let mut joining = false;
    loop {
        let change = tokio::select! {
            () = shared.ctx.shutdown.cancelled() => return,
            change = changes.recv() => change,
        };
        let Some(change) = change else { return };
        let ownership = shared.ctx.ownership();
        fn ours<'a>(o: &Ownership, node: Option<&'a NodeView>) -> Option<&'a NodeView> {
            node.filter(|n| o.owns(*n))
        }
        // A foreign Node (machinery/ownership.rs) is never a host: to the host sets, a Node
        // becoming foreign leaves and one becoming ours joins.
        let host_change = match &change {
            Change::Applied { old, new } => {
                awaiting.update(ownership, new);
                match (ours(ownership, old.as_ref()), ours(ownership, Some(new))) {
                    (None, None) => None,
                    // A label change moves a host in or out of a backend selector: relevant
                    // only while some Service has one.
                    (Some(old), Some(new)) => {
                        plan::host_change(Some(old), Some(new)).or_else(|| {
                            plan::selector_host_change(old, new, &shared.backend_selectors())
                        })
                    }
                    (old, new) => plan::host_change(old, new),
                }
            }
            Change::Deleted(gone) => {
                awaiting.forget(gone);
                ours(ownership, Some(gone)).and_then(|g| plan::host_change(Some(g), None))
            }
            Change::Resync => {
                awaiting = AwaitingInitialisation::default();
                for node in shared.ctx.nodes.list() {
                    awaiting.update(ownership, &node);
                }
                Some(HostChange::Removal)
            }
        };
        // The host change first: an initialised Node's addition arrives before the news that
        // none awaits any more, so the pass that follows carries it.
        if let Some(host_change) = host_change
            && trigger.send(NodeSyncTrigger::Hosts(host_change)).is_err()
        {
            return;
        }
        if awaiting.any() != joining {
            joining = awaiting.any();
            if trigger.send(NodeSyncTrigger::Joining(joining)).is_err() {
                return;
            }
        }
    }
}

/// Runs one node-sync pass when the [`NodeSyncTimer`] says so: removals within
/// `node_sync_window`, additions over a window widening up to `node_sync_max_window` while
/// Nodes keep joining. A pass covers every change received before it (it reads the current
/// node store).
pub(super) async fn node_sync_loop(
    shared: Arc<Reconciler>,
    mut triggers: mpsc::UnboundedReceiver<NodeSyncTrigger>,
) {
    let shutdown = shared.ctx.shutdown.clone();
    let mut timer = NodeSyncTimer::new(
        shared.config.node_sync_window,
        shared.config.node_sync_max_window,
    );
    // In flight while a pass is pending or running (the test harness's `settled()` waits for it).
    let mut busy = None;
    loop {
        let due = timer.due();
        if due.is_some() {
            busy.get_or_insert_with(|| shared.ctx.activity().begin());
        } else {
            busy = None;
        }
        tokio::select! {
            biased;
            // Pending node changes are dropped on shutdown: the next leader ensures every
            // load balancer with the then-current hosts anyway.
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)), if due.is_some() => {
                timer.passed(tokio::time::Instant::now());
                // Every change received so far is in the store the pass reads; whether Nodes
                // await their initialisation is kept.
                while let Ok(trigger) = triggers.try_recv() {
                    if let NodeSyncTrigger::Joining(joining) = trigger {
                        timer.joining(joining);
                    }
                }
                let retry = shared.node_sync_pass().await;
                timer.finished(tokio::time::Instant::now());
                if let Some(after) = retry {
                    timer.retry_at(tokio::time::Instant::now() + after);
                }
                timer.passes_are_cheap(
                    shared
                        .batched_pass_calls()
                        .is_some_and(|calls| calls <= plan::CHEAP_BATCHED_PASS_CALLS),
                );
            }
            trigger = triggers.recv() => match trigger {
                Some(NodeSyncTrigger::Hosts(change)) => {
                    timer.change(change, tokio::time::Instant::now());
                }
                Some(NodeSyncTrigger::Joining(joining)) => timer.joining(joining),
                None => return,
            },
        }
    }
}

impl Reconciler {
    /// The eligible hosts and their keys, rebuilt only when the Node store changed.
    pub(super) fn eligible_hosts(&self) -> HostSet {
        // Read the generation before the store: a change landing in between makes the next
        // call rebuild, never serves stale hosts under a newer generation.
        let generation = self.ctx.nodes.generation();
        let previous = self
            .host_set
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(set) = previous.as_ref().filter(|s| s.generation == generation) {
            return set.clone();
        }
        let mut nodes = self.ctx.nodes.list();
        nodes.retain(|n| self.ctx.ownership().owns(n));
        let hosts = plan::eligible_hosts(&nodes);
        let keys = plan::host_keys(&hosts);
        // Keep sharing the previous key list when only irrelevant fields of Nodes changed.
        let keys: Arc<[HostKey]> = match previous {
            Some(p) if *p.keys == *keys => p.keys,
            _ => keys.into(),
        };
        let set = HostSet::new(generation, None, hosts.into(), keys);
        *self.host_set.lock().unwrap_or_else(|e| e.into_inner()) = Some(set.clone());
        set
    }

    /// The hosts of `service`: the eligible hosts its backend selector matches (all of them
    /// without one), or why its selector is invalid.
    pub(super) fn hosts_for(&self, service: &Service) -> Result<HostSet, SelectorError> {
        self.hosts_selected_by(plan::selector_text(service))
    }

    /// The eligible hosts that the backend selector `text` matches (all without one).
    fn hosts_selected_by(&self, text: Option<&str>) -> Result<HostSet, SelectorError> {
        let all = self.eligible_hosts();
        match text {
            None => Ok(all),
            Some(text) => all.selected(text),
        }
    }

    /// One node-sync pass: every load balancer whose eligible host set changed gets its new
    /// hosts, with one `update_load_balancer` each on `workers` parallel workers, or, when the
    /// provider offers [`LoadBalancerHostsBatch`], in `update_load_balancer_hosts` calls of up
    /// to its `max_batch_size` load balancers. Returns the delay after which the pass must run
    /// again when the provider answered a whole batch with `Retry`.
    ///
    /// Load balancers are batched by the implementation serving their class (a batch call
    /// never mixes two provider classes); a class whose implementation has no batch gets
    /// single calls. When several batches answer `Retry`, the longest delay is returned.
    pub(super) async fn node_sync_pass(self: &Arc<Self>) -> Option<Duration> {
        let started = Instant::now();
        let mut retry: Option<Duration> = None;
        tracing::debug!(
            controller = NAME,
            hosts = self.eligible_hosts().nodes.len(),
            "node-sync pass starting"
        );
        for ((provider_class, selector), keys) in self.node_sync_groups() {
            let batch = provider_class.and_then(|c| self.hosts_batch(c.as_deref()));
            match batch {
                Some(batch) => {
                    if let Some(after) = self
                        .batched_node_sync(batch, selector.as_deref(), keys)
                        .await
                    {
                        retry = Some(retry.map_or(after, |r| r.max(after)));
                    }
                }
                None => self.single_node_sync(keys).await,
            }
        }
        ServiceMetrics::observe(&self.metrics.nodesync_latency, started.elapsed());
        tracing::debug!(controller = NAME, elapsed = ?started.elapsed(), ?retry, "node-sync pass done");
        retry
    }

    /// The entries' keys grouped by the provider class serving their Service's class
    /// (`None`: a Service gone or not served, left to [`Reconciler::needs_hosts`], which
    /// skips it) and by their backend selector's text (`None`: every eligible host): the load
    /// balancers one hosts batch may carry together.
    fn node_sync_groups(&self) -> BTreeMap<NodeSyncGroup, Vec<String>> {
        let mut groups: BTreeMap<NodeSyncGroup, Vec<String>> = BTreeMap::new();
        for key in self.entry_keys() {
            let service = key
                .split_once('/')
                .and_then(|(namespace, name)| self.ctx.services.get_namespaced(namespace, name))
                .filter(|s| plan::is_load_balancer(s));
            let provider_class = service.as_ref().and_then(|s| {
                self.classes
                    .provider_class(class_of(s))
                    .map(|c| c.map(str::to_owned))
            });
            let selector = service
                .as_ref()
                .and_then(|s| plan::selector_text(s).map(str::to_owned));
            groups
                .entry((provider_class, selector))
                .or_default()
                .push(key);
        }
        groups
    }

    /// The load balancers of `keys` updated with one `update_load_balancer` each, on
    /// `workers` parallel workers.
    async fn single_node_sync(self: &Arc<Self>, keys: impl IntoIterator<Item = String>) {
        futures::stream::iter(keys)
            .for_each_concurrent(self.config.workers, |key| {
                let shared = self.clone();
                async move { shared.sync_hosts(&key).await }
            })
            .await;
    }

    /// The `update_load_balancer_hosts` calls a pass over every load balancer costs, or
    /// `None` without the batch capability (one call per load balancer).
    fn batched_pass_calls(&self) -> Option<usize> {
        let mut calls = 0;
        for ((provider_class, _), keys) in self.node_sync_groups() {
            // Entries of Services without a load balancer can only make the count larger:
            // the old, widening behaviour.
            let batch = provider_class.and_then(|c| self.hosts_batch(c.as_deref()))?;
            calls += plan::batched_pass_calls(keys.len(), batch.max_batch_size());
        }
        Some(calls)
    }

    /// The batch capability of the implementation for `provider_class`, unless a batch
    /// answered `NotImplemented` before (then single calls for every class until restart).
    fn hosts_batch(&self, provider_class: Option<&str>) -> Option<&dyn LoadBalancerHostsBatch> {
        if self.hosts_batch_unsupported.load(Ordering::Relaxed) {
            return None;
        }
        self.ctx
            .cloud
            .load_balancer_hosts_batch_for_class(provider_class)
    }

    /// Go's `nodeSyncService` + `lockedUpdateLoadBalancerHosts` for one Service.
    async fn sync_hosts(&self, key: &str) {
        let Some(entry) = self.entries().get(key).cloned() else {
            return;
        };
        {
            let mut entry = entry.lock().await;
            // The hosts of the Service's selector as cached now; [`Self::needs_hosts`] checks
            // it is still the Service's. An invalid one: no call, the hosts stay as they are.
            let selector = key
                .split_once('/')
                .and_then(|(namespace, name)| self.ctx.services.get_namespaced(namespace, name))
                .and_then(|s| plan::selector_text(&s).map(str::to_owned));
            if let Ok(host_set) = self.hosts_selected_by(selector.as_deref())
                && let Some(service) = self.needs_hosts(key, &entry, &host_set)
            {
                self.update_hosts(key, &mut entry, &service, &host_set)
                    .await;
            }
        }
        drop(entry);
        self.release(key);
    }

    /// The Service to update when its load balancer's hosts differ from `host_set`: the
    /// freshest copy, still the one handled and still wanting a load balancer (anything else
    /// is the service worker's business), not waiting for a `Retry` delay.
    fn needs_hosts(&self, key: &str, entry: &Entry, host_set: &HostSet) -> Option<Arc<Service>> {
        let (Some(handled), Some(last)) = (entry.handled.as_ref(), entry.last_hosts.as_ref())
        else {
            return None;
        };
        if entry.retry_not_before.is_some_and(|t| Instant::now() < t) {
            // A full sync is queued for when the provider asked to be called again.
            return None;
        }
        let (namespace, name) = key.split_once('/')?;
        let service = self.ctx.services.get_namespaced(namespace, name)?;
        if service.metadata.uid != handled.metadata.uid
            || !plan::wants_load_balancer(&service, &self.classes)
            || plan::is_being_deleted(&service)
            // Its backend selector changed since `host_set` was chosen: that Service update
            // queued a full sync, which passes the hosts of the new selector.
            || plan::selector_text(&service) != host_set.selector.as_deref()
        {
            return None;
        }
        if host_set.same_hosts(last) {
            return None;
        }
        Some(service)
    }

    /// One `update_load_balancer` of `service` with `host_set`, and what its answer calls for.
    async fn update_hosts(
        &self,
        key: &str,
        entry: &mut Entry,
        service: &Arc<Service>,
        host_set: &HostSet,
    ) {
        let Some(lb) = self.lb_serving(service) else {
            return;
        };
        let last = entry.last_hosts.replace(host_set.keys.clone());
        self.metrics.loadbalancer_sync.inc();
        let started = Instant::now();
        let result = cloud::update(lb, self.cluster(), service, &host_set.nodes).await;
        ServiceMetrics::observe(&self.metrics.update_host_latency, started.elapsed());
        self.hosts_updated(key, entry, service, last, host_set, result)
            .await;
    }

    /// What follows one load balancer's host update (single or batch): an Event on success, a
    /// full sync after the provider's delay on `Retry` (the hosts it had are kept, so the sync
    /// passes the then-current ones), or, on failure of a load balancer that still exists, an
    /// `UpdateLoadBalancerFailed` Event and a full ensure at once (as Go does).
    async fn hosts_updated(
        &self,
        key: &str,
        entry: &mut Entry,
        service: &Service,
        last: Option<Arc<[HostKey]>>,
        host_set: &HostSet,
        result: Result<(), CallError>,
    ) {
        let Some(lb) = self.lb_serving(service) else {
            return;
        };
        let class = class_of(service);
        let retry = |entry: &mut Entry, after: Duration| {
            self.metrics.operation(class, "update", "retry");
            self.metrics.nodesync_error.inc();
            entry.last_hosts = last.clone();
            entry.retry_not_before = Some(Instant::now() + after);
            self.queue.add_after(key.to_owned(), after);
        };
        let error = match result {
            Ok(()) => {
                self.metrics.operation(class, "update", "success");
                if host_set.nodes.is_empty() {
                    self.recorder.warning(
                        service,
                        "UnAvailableLoadBalancer",
                        "There are no available nodes for LoadBalancer",
                    );
                } else {
                    self.recorder.normal(
                        service,
                        "UpdatedLoadBalancer",
                        note_with_class("Updated load balancer with new hosts", service),
                    );
                }
                return;
            }
            Err(CallError::Elsewhere) => {
                self.metrics.operation(class, "update", "success");
                return;
            }
            Err(CallError::Retry(after)) => return retry(entry, after),
            Err(CallError::Failed(error)) => error,
        };
        // It is only an error if the load balancer still exists.
        match cloud::exists(lb, self.cluster(), service).await {
            Ok(false) => return,
            Ok(true) => {}
            Err(CallError::Retry(after)) => return retry(entry, after),
            Err(get_error) => {
                tracing::warn!(controller = NAME, %key, error = %get_error, "failed to check if load balancer exists");
            }
        }
        self.metrics.nodesync_error.inc();
        self.metrics.operation(class, "update", "error");
        tracing::warn!(controller = NAME, %key, %error, "failed to update load balancer hosts; falling back to a full ensure");
        self.recorder.warning(
            service,
            "UpdateLoadBalancerFailed",
            plan::update_failed_note(&host_set.keys, &error.to_string()),
        );
        // Falls back to a full ensure of this Service, at once (not rate limited), as Go does.
        self.queue.add(key.to_owned());
    }

    /// A node-sync pass through the provider's [`LoadBalancerHostsBatch`]: the load balancers
    /// whose hosts differ are locked and updated `max_batch_size` at a time, one batch after
    /// the other. Only entries nobody holds are batched: one a service worker is busy with (an
    /// ensure, which passes the then-current hosts itself) must not hold up the others, so it
    /// gets a single update at the end of the pass, waiting for its lock alone. A `Retry` of a
    /// whole batch ends the pass (the load balancers not updated keep their old hosts, so the
    /// next pass finds them) and returns the provider's delay.
    async fn batched_node_sync(
        self: &Arc<Self>,
        batch: &dyn LoadBalancerHostsBatch,
        selector: Option<&str>,
        keys: Vec<String>,
    ) -> Option<Duration> {
        let max = batch.max_batch_size().max(1);
        let mut busy = Vec::new();
        let mut keys = keys.into_iter().peekable();
        while keys.peek().is_some() {
            // An invalid selector: no call, these load balancers keep their hosts.
            let host_set = self.hosts_selected_by(selector).ok()?;
            let mut held = Vec::new();
            for key in keys.by_ref() {
                let Some(entry) = self.entries().get(&key).cloned() else {
                    continue;
                };
                let Ok(entry) = entry.try_lock_owned() else {
                    busy.push(key);
                    continue;
                };
                match self.needs_hosts(&key, &entry, &host_set) {
                    Some(service) => held.push(Held {
                        key,
                        entry,
                        service,
                    }),
                    None => {
                        drop(entry);
                        self.release(&key);
                    }
                }
                if held.len() == max {
                    break;
                }
            }
            // The hosts as of the call: when the Nodes changed while the batch was put
            // together, a load balancer that has the new hosts already is left out (checked
            // again only then: comparing host sets is O(hosts) per load balancer).
            let Ok(fresh) = self.hosts_selected_by(selector) else {
                self.release_held(held);
                return None;
            };
            let host_set = if fresh.generation == host_set.generation {
                host_set
            } else {
                let current: Vec<Held>;
                (held, current) = held
                    .into_iter()
                    .partition(|h| self.needs_hosts(&h.key, &h.entry, &fresh).is_some());
                self.release_held(current);
                fresh
            };
            if held.is_empty() {
                continue;
            }
            let retry = self.update_batch(batch, &mut held, &host_set).await;
            self.release_held(held);
            if retry.is_some() {
                return retry;
            }
            if self.hosts_batch_unsupported.load(Ordering::Relaxed) {
                // The batch answered NotImplemented: the rest of the pass goes out singly.
                self.single_node_sync(keys.chain(busy)).await;
                return None;
            }
        }
        self.single_node_sync(busy).await;
        None
    }

    /// Unlocks the entries of `held`, dropping those that hold nothing any more.
    fn release_held(&self, held: Vec<Held>) {
        for Held { key, entry, .. } in held {
            drop(entry);
            self.release(&key);
        }
    }

    /// One `update_load_balancer_hosts` call for the load balancers in `held`, and each one's
    /// answer handled as its single `update_load_balancer` answer would be.
    async fn update_batch(
        &self,
        batch: &dyn LoadBalancerHostsBatch,
        held: &mut [Held],
        host_set: &HostSet,
    ) -> Option<Duration> {
        let services: Vec<Arc<Service>> = held.iter().map(|h| h.service.clone()).collect();
        let attempts = held.len() as u64;
        self.metrics.loadbalancer_sync.inc_by(attempts);
        let started = Instant::now();
        let answer = batch
            .update_load_balancer_hosts(self.cluster(), &services, &host_set.nodes)
            .await;
        ServiceMetrics::observe(&self.metrics.update_host_latency, started.elapsed());
        let mut answers = match answer {
            Ok(answers) => answers,
            Err(CloudError::Retry { after, message }) => {
                self.metrics.nodesync_error.inc_by(attempts);
                tracing::info!(controller = NAME, load_balancers = held.len(), ?after, %message, "cloud provider asked to retry the load-balancer batch; the node sync resumes after the delay");
                return Some(after);
            }
            Err(error) => {
                if matches!(error, CloudError::NotImplemented) {
                    self.hosts_batch_unsupported.store(true, Ordering::Relaxed);
                    tracing::info!(
                        controller = NAME,
                        "update_load_balancer_hosts is not implemented; single update_load_balancer calls until the controller restarts"
                    );
                } else {
                    self.metrics.nodesync_error.inc_by(attempts);
                    tracing::warn!(controller = NAME, load_balancers = held.len(), %error, "update_load_balancer_hosts failed; updating these load balancers one by one");
                }
                self.update_each(held, host_set).await;
                return None;
            }
        };
        let mut left_out = Vec::new();
        for h in held.iter_mut() {
            let Some(result) = answers.remove(&h.key) else {
                // Not updated (the contract's rule for a Service missing from the answer).
                left_out.push(h);
                continue;
            };
            let last = h.entry.last_hosts.replace(host_set.keys.clone());
            self.hosts_updated(
                &h.key,
                &mut h.entry,
                &h.service,
                last,
                host_set,
                result.map_err(CallError::from),
            )
            .await;
        }
        self.update_each(left_out, host_set).await;
        None
    }

    /// A single `update_load_balancer` for each of `held`, on `workers` parallel workers.
    async fn update_each<'h>(
        &self,
        held: impl IntoIterator<Item = &'h mut Held>,
        host_set: &HostSet,
    ) {
        futures::stream::iter(held)
            .for_each_concurrent(self.config.workers, |h| async move {
                self.update_hosts(&h.key, &mut h.entry, &h.service, host_set)
                    .await;
            })
            .await;
    }
}

/// The load balancers one hosts batch may carry together: the provider class serving their
/// class (see [`Reconciler::node_sync_groups`]) and their backend selector's text.
type NodeSyncGroup = (Option<Option<String>>, Option<String>);

/// A load balancer locked for a batch of host updates.
struct Held {
    key: String,
    entry: tokio::sync::OwnedMutexGuard<Entry>,
    service: Arc<Service>,
}

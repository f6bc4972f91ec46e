//! The node-sync side of the service controller: Node changes become node-sync triggers,
//! the [`NodeSyncTimer`] says when a pass runs, and a pass gives each load balancer whose
//! eligible hosts changed one `update_load_balancer`.

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use tokio::sync::mpsc;

use super::{Entry, Reconciler};
use crate::controllers::service::NAME;
use crate::controllers::service::cloud::{self, CallError};
use crate::controllers::service::metrics::ServiceMetrics;
use crate::controllers::service::plan::{self, HostChange, HostKey, NodeSyncTimer};
use crate::machinery::informer::{Change, Subscription};

/// The eligible hosts at one generation of the Node informer, built once and shared by every
/// load balancer synced while the Nodes do not change.
///
/// The provider takes the store's own `Arc<Node>`s (as Go passes `[]*v1.Node` from the
/// informer cache), so a host set costs one pointer per host, never a copy of a Node: cloning
/// every eligible Node for every `ensure_load_balancer`/`update_load_balancer` call cost
/// 5 million Node clones (and 1.4 GB of resident memory) to ensure 1,000 load balancers over
/// 5,000 Nodes (`docs/performance.md`, steady). The host keys every Service remembers are one
/// shared `Arc<[HostKey]>` while the set is the same.
#[derive(Clone)]
pub(super) struct HostSet {
    generation: u64,
    pub(super) nodes: Arc<[Arc<Node>]>,
    pub(super) keys: Arc<[HostKey]>,
}

/// Turns Node changes that can change a host list (§4.4) into node-sync triggers.
pub(super) async fn node_events(
    shared: Arc<Reconciler>,
    mut changes: Subscription<Node>,
    trigger: mpsc::UnboundedSender<HostChange>,
) {
    loop {
        let change = tokio::select! {
            () = shared.ctx.shutdown.cancelled() => return,
            change = changes.recv() => change,
        };
        let Some(change) = change else { return };
        let host_change = match &change {
            Change::Applied { old, new } => plan::host_change(old.as_deref(), Some(new)),
            Change::Deleted(gone) => plan::host_change(Some(gone), None),
            Change::Resync => Some(HostChange::Removal),
        };
        if let Some(host_change) = host_change
            && trigger.send(host_change).is_err()
        {
            return;
        }
    }
}

/// Runs one node-sync pass when the [`NodeSyncTimer`] says so: removals within
/// `node_sync_window`, additions over a window widening up to `node_sync_max_window` while
/// Nodes keep joining. A pass covers every change received before it (it reads the current
/// node store).
pub(super) async fn node_sync_loop(
    shared: Arc<Reconciler>,
    mut triggers: mpsc::UnboundedReceiver<HostChange>,
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
                // Every change received so far is in the store the pass reads.
                while triggers.try_recv().is_ok() {}
                shared.node_sync_pass().await;
            }
            change = triggers.recv() => match change {
                Some(change) => timer.change(change, tokio::time::Instant::now()),
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
        let hosts = plan::eligible_hosts(&self.ctx.nodes.list());
        let keys = plan::host_keys(&hosts);
        // Keep sharing the previous key list when only irrelevant fields of Nodes changed.
        let keys: Arc<[HostKey]> = match previous {
            Some(p) if *p.keys == *keys => p.keys,
            _ => keys.into(),
        };
        let set = HostSet {
            generation,
            nodes: hosts.into(),
            keys,
        };
        *self.host_set.lock().unwrap_or_else(|e| e.into_inner()) = Some(set.clone());
        set
    }

    /// One node-sync pass: every load balancer whose eligible host set changed gets one
    /// `update_load_balancer`, on `workers` parallel workers.
    pub(super) async fn node_sync_pass(self: &Arc<Self>) {
        let started = Instant::now();
        let keys = self.entry_keys();
        futures::stream::iter(keys)
            .for_each_concurrent(self.config.workers, |key| {
                let shared = self.clone();
                async move { shared.sync_hosts(&key).await }
            })
            .await;
        ServiceMetrics::observe(&self.metrics.nodesync_latency, started.elapsed());
    }

    /// Go's `nodeSyncService` + `lockedUpdateLoadBalancerHosts` for one Service.
    async fn sync_hosts(&self, key: &str) {
        let Some(entry) = self.entries().get(key).cloned() else {
            return;
        };
        {
            let mut entry = entry.lock().await;
            self.sync_hosts_locked(key, &mut entry).await;
        }
        drop(entry);
        self.release(key);
    }

    async fn sync_hosts_locked(&self, key: &str, entry: &mut Entry) {
        let (Some(handled), Some(last)) = (entry.handled.clone(), entry.last_hosts.clone()) else {
            return;
        };
        if entry.retry_not_before.is_some_and(|t| Instant::now() < t) {
            // A full sync is queued for when the provider asked to be called again.
            return;
        }
        let Some((namespace, name)) = key.split_once('/') else {
            return;
        };
        // The freshest copy; anything but "same Service, still wanting a load balancer" is
        // the service worker's business.
        let Some(service) = self.ctx.services.get_namespaced(namespace, name) else {
            return;
        };
        if service.metadata.uid != handled.metadata.uid
            || !plan::wants_load_balancer(&service)
            || plan::is_being_deleted(&service)
        {
            return;
        }
        let Some(lb) = self.lb() else { return };
        let host_set = self.eligible_hosts();
        if Arc::ptr_eq(&last, &host_set.keys)
            || plan::nodes_sufficiently_equal(&last, &host_set.keys)
        {
            return;
        }
        let hosts: &[Arc<Node>] = &host_set.nodes;
        let keys = host_set.keys.clone();
        entry.last_hosts = Some(keys.clone());
        self.metrics.loadbalancer_sync.inc();
        let started = Instant::now();
        let result = cloud::update(lb, self.cluster(), &service, hosts).await;
        ServiceMetrics::observe(&self.metrics.update_host_latency, started.elapsed());
        let error = match result {
            Ok(()) => {
                if hosts.is_empty() {
                    self.recorder.warning(
                        &*service,
                        "UnAvailableLoadBalancer",
                        "There are no available nodes for LoadBalancer",
                    );
                } else {
                    self.recorder.normal(
                        &*service,
                        "UpdatedLoadBalancer",
                        "Updated load balancer with new hosts",
                    );
                }
                return;
            }
            Err(CallError::Elsewhere) => return,
            Err(CallError::Retry(after)) => {
                // Retried as a full ensure (which passes the then-current hosts) after exactly
                // the provider's delay.
                self.metrics.nodesync_error.inc();
                entry.last_hosts = Some(last);
                entry.retry_not_before = Some(Instant::now() + after);
                self.queue.add_after(key.to_owned(), after);
                return;
            }
            Err(CallError::Failed(error)) => error,
        };
        // It is only an error if the load balancer still exists.
        match cloud::exists(lb, self.cluster(), &service).await {
            Ok(false) => return,
            Ok(true) => {}
            Err(CallError::Retry(after)) => {
                self.metrics.nodesync_error.inc();
                entry.last_hosts = Some(last);
                entry.retry_not_before = Some(Instant::now() + after);
                self.queue.add_after(key.to_owned(), after);
                return;
            }
            Err(get_error) => {
                tracing::warn!(controller = NAME, %key, error = %get_error, "failed to check if load balancer exists");
            }
        }
        self.metrics.nodesync_error.inc();
        tracing::warn!(controller = NAME, %key, %error, "failed to update load balancer hosts; falling back to a full ensure");
        self.recorder.warning(
            &*service,
            "UpdateLoadBalancerFailed",
            plan::update_failed_note(&keys, &error.to_string()),
        );
        // Falls back to a full ensure of this Service, at once (not rate limited), as Go does.
        self.queue.add(key.to_owned());
    }
}

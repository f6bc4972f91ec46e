//! The route controller's reconciler: lists the routes, plans, runs the plan's cloud calls and
//! writes the Nodes' `NetworkUnavailable` condition.

use ccm_core::NodeView;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use ccm_core::Route;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use tokio::sync::{RwLock, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::machinery::context::ControllerContext;
use crate::machinery::events::EventRecorder;
use crate::machinery::informer::{Change, Subscription};
use crate::machinery::workqueue::{Activity, Outcome, WorkQueue};

use super::cloud::{Calls, create_route, execute, failed_create_message};
use super::metrics::RouteMetrics;
use super::patch::{self, ConditionWrite};
use super::plan::{DesiredCondition, NodeInfo, RouteCreate, RouteKey};
use super::*;

/// The reconciler: one full route reconcile at a time, and the per-route create retries.
pub(super) struct Reconciler {
    pub(super) ctx: ControllerContext,
    pub(super) config: RouteConfig,
    pub(super) recorder: EventRecorder,
    pub(super) metrics: RouteMetrics,
    /// Cloud create/delete calls in flight (reconciles and retries together).
    pub(super) ops: Arc<Semaphore>,
    /// Per-route create retries.
    pub(super) retries: WorkQueue<RouteKey>,
    /// A reconcile holds it exclusively; retries share it, so a retry never races a
    /// reconcile's view of which creates failed.
    pub(super) reconcile_lock: RwLock<()>,
    /// Creates that failed in the last reconcile and have not succeeded since.
    pub(super) pending: Mutex<HashSet<RouteKey>>,
    /// Conditions written whose watch event the Node informer has not delivered yet, by Node
    /// name: without them a reconcile right after a write would see the old condition in the
    /// cache and write it again.
    pub(super) written: Mutex<HashMap<String, Written>>,
}

/// A `NetworkUnavailable` write, and the resourceVersion of the cached Node it was decided on.
#[derive(Debug)]
pub(super) struct Written {
    decided_on: Option<String>,
    desired: DesiredCondition,
}

impl Reconciler {
    fn pending(&self) -> MutexGuard<'_, HashSet<RouteKey>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this controller's route calls reach the cloud (shadow mode: the guard keeps them).
    fn calls(&self) -> Calls {
        if self.ctx.is_shadow() {
            Calls::Shadowed
        } else {
            Calls::Sent
        }
    }

    /// One full reconcile (§5.3).
    pub(super) async fn reconcile(&self) -> Outcome {
        let _exclusive = self.reconcile_lock.write().await;
        let started = Instant::now();
        let outcome = self.reconcile_locked().await;
        self.metrics
            .duration
            .observe(started.elapsed().as_secs_f64());
        outcome
    }

    async fn reconcile_locked(&self) -> Outcome {
        self.metrics.syncs.inc();
        let Some(routes) = self.ctx.cloud.routes() else {
            return Outcome::Done;
        };
        let cluster_name = self.ctx.cluster_name.as_str();
        let listed = match routes.list_routes(cluster_name).await {
            Ok(listed) => listed,
            Err(error) => {
                tracing::warn!(%error, "could not list routes");
                return match error.retry_after() {
                    Some(after) => Outcome::RequeueAfter(after),
                    None => Outcome::Failed,
                };
            }
        };
        let mut nodes = self.ctx.nodes.list();
        nodes.sort_by(|a, b| a.name_arc().cmp(&b.name_arc()));
        let ownership = self.ctx.ownership();
        let infos: Vec<NodeInfo> = nodes
            .iter()
            .map(|n| NodeInfo {
                managed: ownership.owns(n),
                ..NodeInfo::from_view(n)
            })
            .collect();
        let plan = plan::plan(&infos, &listed, &self.config.cluster_cidrs);
        tracing::debug!(
            routes = listed.len(),
            nodes = infos.len(),
            deletes = plan.deletes.len(),
            creates = plan.creates.len(),
            "route reconcile planned"
        );
        let result = execute(routes, cluster_name, &plan, &self.ops, self.calls()).await;

        // Failed creates: an event (unless the provider asked for a retry), and a per-route retry.
        let mut failed: HashSet<RouteKey> = HashSet::new();
        let mut events = Vec::new();
        for (create, error, took) in &result.failed_creates {
            let key = create.key();
            failed.insert(key.clone());
            match error.retry_after() {
                Some(after) => self.retries.add_after(key, after),
                None => {
                    self.retries.add_rate_limited(key);
                    if let Some(node) = nodes.iter().find(|n| {
                        n.name_arc()
                            .is_some_and(|name| **name == *create.route.target_node)
                    }) {
                        events.push((node.to_node(), failed_create_message(create, *took, error)));
                    }
                }
            }
        }
        {
            let mut pending = self.pending();
            for key in pending.iter() {
                if !failed.contains(key) {
                    self.retries.forget(key);
                }
            }
            *pending = failed.clone();
        }
        for (node, note) in events {
            self.recorder
                .warning(&node, REASON_FAILED_TO_CREATE_ROUTE, note);
        }

        // Conditions.
        self.prune_written();
        let updates = plan::condition_updates(&plan, &failed);
        futures::stream::iter(updates)
            .for_each_concurrent(CONDITION_WRITERS, |(name, desired)| async move {
                self.set_condition(&name, desired).await;
            })
            .await;

        if let Some(after) = result.delete_retry_after {
            Outcome::RequeueAfter(after)
        } else if result.failed_deletes > 0 {
            Outcome::Failed
        } else {
            Outcome::Done
        }
    }

    /// Retries one failed create, unless a reconcile settled it meanwhile.
    pub(super) async fn retry_create(&self, key: RouteKey) -> Outcome {
        let _shared = self.reconcile_lock.read().await;
        if !self.pending().contains(&key) {
            return Outcome::Done;
        }
        let Some(routes) = self.ctx.cloud.routes() else {
            return Outcome::Done;
        };
        // A Node that became foreign meanwhile gets no route (machinery/ownership.rs).
        let node = self
            .ctx
            .nodes
            .get(&key.node)
            .filter(|n| self.ctx.ownership().owns(n));
        let info = node.as_ref().map(NodeInfo::from_view);
        let raw_cidr = info
            .as_ref()
            .and_then(|i| {
                i.pod_cidrs
                    .iter()
                    .find(|c| plan::normalize_cidr(c) == key.cidr)
            })
            .cloned();
        let (Some(node), Some(info), Some(raw_cidr)) = (node, info, raw_cidr) else {
            // The Node or its CIDR is gone: nothing to create (the reconcile its change
            // triggered cleans up).
            self.pending().remove(&key);
            return Outcome::Done;
        };
        let create = RouteCreate {
            name_hint: info.uid.clone(),
            route: Route {
                name: String::new(),
                target_node: info.name.clone(),
                enable_node_addresses: false,
                target_node_addresses: info.addresses.clone(),
                destination_cidr: raw_cidr,
                blackhole: false,
            },
        };
        let started = Instant::now();
        match create_route(
            routes,
            &self.ctx.cluster_name,
            &create,
            &self.ops,
            self.calls(),
        )
        .await
        {
            Ok(()) => {
                let others_pending = {
                    let mut pending = self.pending();
                    pending.remove(&key);
                    pending.iter().any(|k| k.node == key.node)
                };
                // Every other CIDR of the Node was routed in the last reconcile (only failed
                // creates are pending), so the Node is now fully routed.
                if !others_pending
                    && DesiredCondition::ROUTE_CREATED
                        .differs_from(info.network_unavailable.as_ref())
                {
                    self.set_condition(&info.name, DesiredCondition::ROUTE_CREATED)
                        .await;
                }
                Outcome::Done
            }
            Err(error) => match error.retry_after() {
                Some(after) => Outcome::RequeueAfter(after),
                None => {
                    let note = failed_create_message(&create, started.elapsed(), &error);
                    self.recorder
                        .warning(&node.to_node(), REASON_FAILED_TO_CREATE_ROUTE, note);
                    Outcome::Failed
                }
            },
        }
    }

    /// Writes the `NetworkUnavailable` condition through the status subresource
    /// ([`patch::write_condition`]), decided on the informer's cached Node, without reading it
    /// first (see [`plan::condition_patch`] for `lastTransitionTime` and when the patch tests
    /// the condition it was decided on). A conflict is decided again on a fresh read; other
    /// failures are retried from the cache (Go: 5 attempts, 100 ms apart).
    async fn set_condition(&self, name: &str, desired: DesiredCondition) {
        let api: Api<Node> = Api::all(self.ctx.client.clone());
        let mut fresh: Option<Arc<Node>> = None;
        for attempt in 0..CONDITION_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(CONDITION_RETRY_DELAY).await;
            }
            let full = fresh.is_some();
            let node = match fresh.take() {
                Some(node) => node,
                None => {
                    let Some(cached) = self.ctx.nodes.get(name) else {
                        // Deleted (the reconcile its deletion triggers cleans up).
                        return;
                    };
                    if self.written_since(&cached, desired) {
                        return;
                    }
                    // The patch is decided on the whole cached Node: a copy of the view.
                    Arc::new(cached.to_node())
                }
            };
            let now = Time(jiff::Timestamp::now());
            match patch::write_condition(&api, &node, full, &desired, &now).await {
                Ok(ConditionWrite::Unneeded | ConditionWrite::Gone) => return,
                Ok(ConditionWrite::Written) => {
                    tracing::info!(
                        node = name,
                        status = desired.status,
                        reason = desired.reason,
                        "set NetworkUnavailable"
                    );
                    self.remember_written(&node, desired);
                    return;
                }
                Ok(ConditionWrite::Conflict(error)) => {
                    tracing::debug!(
                        node = name,
                        "conflict setting NetworkUnavailable; deciding again on a fresh read"
                    );
                    tracing::debug!(node = name, %error, "conflicting NetworkUnavailable write");
                    match api.get_opt(name).await {
                        Ok(Some(current)) => fresh = Some(Arc::new(current)),
                        Ok(None) => return,
                        Err(error) => {
                            tracing::warn!(node = name, %error, "could not read node to set its NetworkUnavailable condition");
                        }
                    }
                }
                Err(error) => {
                    tracing::warn!(node = name, %error, "could not set NetworkUnavailable");
                }
            }
        }
        tracing::warn!(
            node = name,
            "giving up setting NetworkUnavailable for now; the next reconcile tries again"
        );
    }

    fn written(&self) -> MutexGuard<'_, HashMap<String, Written>> {
        self.written.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this controller already wrote `desired` on the Node after the version `cached`
    /// is (the informer has not delivered the write yet): writing it again would only repeat
    /// it. Once the cache has moved on, the entry is dropped and the cache decides.
    fn written_since(&self, cached: &NodeView, desired: DesiredCondition) -> bool {
        let name = cached.name();
        let mut written = self.written();
        match written.get(name) {
            Some(w) if w.decided_on.as_deref() == cached.resource_version() => w.desired == desired,
            Some(_) => {
                written.remove(name);
                false
            }
            None => false,
        }
    }

    /// Remembers a successful write decided on `node` (see [`RouteController::written_since`]).
    fn remember_written(&self, node: &Node, desired: DesiredCondition) {
        if let Some(name) = node.metadata.name.clone() {
            self.written().insert(
                name,
                Written {
                    decided_on: node.metadata.resource_version.clone(),
                    desired,
                },
            );
        }
    }

    /// Drops the remembered writes the informer has delivered by now (or whose Node is gone),
    /// so the map holds only writes in flight through the watch.
    fn prune_written(&self) {
        self.written().retain(|name, w| {
            self.ctx
                .nodes
                .get(name)
                .is_some_and(|n| n.resource_version() == w.decided_on.as_deref())
        });
    }
}

/// Whether a Node change can change the routes: added, deleted, its pod CIDRs or its
/// addresses changed, or the subscriber missed changes.
fn is_relevant(change: &Change<NodeView>) -> bool {
    match change {
        Change::Applied { old: None, .. } | Change::Deleted(_) | Change::Resync => true,
        Change::Applied {
            old: Some(old),
            new,
        } => {
            let (o, n) = (NodeInfo::from_view(old), NodeInfo::from_view(new));
            o.pod_cidrs != n.pod_cidrs || o.addresses != n.addresses || o.uid != n.uid
        }
    }
}

/// Turns relevant Node changes into reconciles: the first relevant change opens a window of
/// `debounce`; everything arriving in it is folded into one reconcile.
pub(super) async fn watch_nodes(
    mut changes: Subscription<NodeView>,
    activity: Activity,
    queue: WorkQueue<()>,
    debounce: Duration,
    shutdown: CancellationToken,
) {
    loop {
        let change = tokio::select! {
            () = shutdown.cancelled() => return,
            c = changes.recv() => c,
        };
        let Some(change) = change else { return };
        if !is_relevant(&change) {
            continue;
        }
        // In flight until the reconcile is queued (the queue counts from then on).
        let _busy = activity.begin();
        let window = tokio::time::sleep(debounce);
        tokio::pin!(window);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = &mut window => break,
                c = changes.recv() => if c.is_none() { return },
            }
        }
        queue.add(());
    }
}

/// The periodic safety net: a full reconcile every `period` (not sliding: a slow reconcile
/// does not push the next one back, as Go's `NonSlidingUntil`), the first one at once.
pub(super) async fn tick(queue: WorkQueue<()>, period: Duration, shutdown: CancellationToken) {
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = interval.tick() => queue.add(()),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn only_cidr_address_and_membership_changes_are_relevant() {
        use k8s_openapi::api::core::v1::{NodeAddress, NodeCondition, NodeSpec, NodeStatus};
        let base = Node {
            metadata: kube::api::ObjectMeta {
                name: Some("a".into()),
                uid: Some("u".into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                pod_cidrs: Some(vec!["10.244.1.0/24".into()]),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(vec![NodeAddress {
                    type_: "InternalIP".into(),
                    address: "10.0.0.1".into(),
                }]),
                ..Default::default()
            }),
        };
        let applied = |old: &Node, new: &Node| Change::Applied {
            old: Some(NodeView::from_node(old)),
            new: NodeView::from_node(new),
        };
        assert!(is_relevant(&Change::Applied {
            old: None,
            new: NodeView::from_node(&base)
        }));
        assert!(is_relevant(&Change::Deleted(NodeView::from_node(&base))));
        assert!(is_relevant(&Change::Resync));

        let mut labels = base.clone();
        labels.metadata.labels = Some([("x".to_owned(), "y".to_owned())].into());
        labels
            .status
            .as_mut()
            .unwrap()
            .conditions
            .get_or_insert_default()
            .push(NodeCondition {
                type_: "NetworkUnavailable".into(),
                status: "False".into(),
                ..Default::default()
            });
        assert!(!is_relevant(&applied(&base, &labels)));

        let mut cidrs = base.clone();
        cidrs.spec.as_mut().unwrap().pod_cidrs =
            Some(vec!["10.244.1.0/24".into(), "fd00::/64".into()]);
        assert!(is_relevant(&applied(&base, &cidrs)));

        let mut addrs = base.clone();
        addrs.status.as_mut().unwrap().addresses = None;
        assert!(is_relevant(&applied(&base, &addrs)));
    }

    #[tokio::test(start_paused = true)]
    async fn node_changes_within_the_debounce_window_make_one_reconcile() {
        // Drives watch_nodes from a real informer fed by a channel.
        use kube::runtime::watcher::Event;
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let shutdown = CancellationToken::new();
        let (informer, driver) = crate::machinery::informer::Informer::nodes_from_stream(
            rx,
            crate::machinery::informer::strip_node,
            shutdown.clone(),
        );
        tokio::spawn(driver);
        tx.unbounded_send(Ok(Event::Init)).unwrap();
        tx.unbounded_send(Ok(Event::InitDone)).unwrap();
        let sub = informer.subscribe().await.unwrap();
        let queue: WorkQueue<()> = WorkQueue::new("t", Backoff::CONTROLLER, None);
        let watcher = tokio::spawn(watch_nodes(
            sub,
            Activity::new(),
            queue.clone(),
            Duration::from_millis(200),
            shutdown.clone(),
        ));
        let node = |name: &str| Node {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                resource_version: Some("1".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        for i in 0..10 {
            tx.unbounded_send(Ok(Event::Apply(node(&format!("n{i}")))))
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(queue.is_empty());
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(queue.len(), 1);
        let () = queue.get().await.unwrap();
        queue.done(&());
        // An irrelevant change (same node, same fields) triggers nothing.
        let mut same = node("n1");
        same.metadata.resource_version = Some("2".into());
        tx.unbounded_send(Ok(Event::Apply(same))).unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(queue.is_empty());
        shutdown.cancel();
        watcher.await.unwrap();
    }
}

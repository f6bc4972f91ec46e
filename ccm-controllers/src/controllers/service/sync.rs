//! The async shell of the service controller: the run loop, the Service event loop and the
//! service worker (ensure and delete). The node-sync side is in `sync/node_sync.rs`, the
//! finalizer and status writes in `patch.rs`, the cloud calls in `cloud.rs`; decisions come
//! from [`super::plan`].

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccm_core::LoadBalancer;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Service};
use kube::ResourceExt;
use kube::api::Api;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::classes::{ServedClasses, class_of, note_with_class};
use super::cloud::{self, CallError};
use super::metrics::{ServedClassLabels, ServiceMetrics};
use super::patch::{self, MAX_CONFLICT_ATTEMPTS, WriteError};
use super::plan::{self, Decision, HostKey, LoadBalancerState, SelectorsInUse};
use super::{EVENT_COMPONENT, NAME, QUEUE_NAME, ServiceConfig};
use crate::machinery::budget::lanes::{Lane, in_lane};
use crate::machinery::context::ControllerContext;
use crate::machinery::error::ControllerError;
use crate::machinery::events::EventRecorder;
use crate::machinery::informer::{Change, Subscription};
use crate::machinery::workqueue::{Backoff, Outcome, WorkQueue};

mod node_sync;

use self::node_sync::{HostSet, node_events, node_sync_loop};

/// What the controller remembers about one Service (by `namespace/name`), like Go's
/// `serviceCache`. Guarded by a per-Service async lock that every cloud call for the Service
/// holds, so calls for one load balancer never overlap.
#[derive(Default)]
struct Entry {
    /// The Service as last handled as a load balancer (ensure or a not yet finished delete).
    /// `None` once cleaned up. Used to delete the load balancer of a Service that vanished or
    /// was re-created under the same name.
    handled: Option<Arc<Service>>,
    /// The hosts last passed to the cloud for this Service (Go's `lastSyncedNodes`). Reconciler
    /// with every other Service synced against the same host set (see [`HostSet`]).
    last_hosts: Option<Arc<[HostKey]>>,
    /// The provider answered `CloudError::Retry` for this load balancer: no node-sync update
    /// before this instant. The full sync queued for that instant passes the then-current
    /// hosts, so an update in between would only call the cloud before it asked to be called.
    retry_not_before: Option<Instant>,
}

impl Entry {
    fn forget(&mut self) {
        self.handled = None;
        self.last_hosts = None;
        self.retry_not_before = None;
    }

    fn is_empty(&self) -> bool {
        self.handled.is_none() && self.last_hosts.is_none()
    }
}

type EntryLock = Arc<tokio::sync::Mutex<Entry>>;

/// Why one step of a sync did not complete. Failure events are emitted where the failure
/// happens, before this is returned.
enum Step {
    /// The provider asked to be called again after this delay.
    Retry(Duration),
    /// Failed (event emitted); retry with backoff.
    Failed,
    /// The Service changed under us (write conflict); decide again on this fresh copy.
    Restart(Arc<Service>),
    /// The Service no longer exists; the deletion path takes over.
    Gone,
    /// The Service's backend selector is invalid (Event and condition written): nothing to do
    /// until the annotation changes, which queues the Service again.
    InvalidSelector,
}

struct Reconciler {
    ctx: ControllerContext,
    config: ServiceConfig,
    /// The load-balancer classes served, each with its provider implementation.
    classes: ServedClasses,
    queue: WorkQueue<String>,
    recorder: EventRecorder,
    metrics: ServiceMetrics,
    entries: Mutex<HashMap<String, EntryLock>>,
    /// The eligible hosts, built once per change of the Node store (see [`HostSet`]).
    host_set: Mutex<Option<HostSet>>,
    /// The backend selectors of the Services served, for the Node updates they make relevant.
    selectors: Mutex<SelectorsInUse>,
    /// The provider's `update_load_balancer_hosts` answered `NotImplemented`: single calls
    /// from then on.
    hosts_batch_unsupported: AtomicBool,
}

fn key_of(service: &Service) -> String {
    format!(
        "{}/{}",
        service.namespace().unwrap_or_default(),
        service.name_any()
    )
}

pub(super) async fn run(
    ctx: ControllerContext,
    config: ServiceConfig,
    classes: ServedClasses,
) -> Result<(), ControllerError> {
    // Every Service in the store at start arrives once, as an add, on its subscription: each
    // LoadBalancer Service is ensured and each pending cleanup runs, once. The Nodes at start
    // need no node sync: every ensure passes the then-current hosts.
    let subscriptions = tokio::select! {
        () = ctx.shutdown.cancelled() => return Ok(()),
        subscriptions = async {
            Some((ctx.services.subscribe().await?, ctx.nodes.subscribe().await?))
        } => subscriptions,
    };
    let Some((service_changes, mut node_changes)) = subscriptions else {
        return Err(ControllerError::NotSynced(NAME));
    };
    node_changes.skip_initial();
    let metrics = ServiceMetrics::register(&ctx.metrics);
    for (class, provider_class) in classes.routes() {
        metrics
            .served_classes
            .get_or_create(&ServedClassLabels {
                class: class.unwrap_or_default().to_owned(),
                provider_class: provider_class.unwrap_or_default().to_owned(),
            })
            .set(1);
    }
    let shared = Arc::new(Reconciler {
        classes,
        queue: ctx.queue(QUEUE_NAME, Backoff::SERVICE),
        recorder: ctx.recorder(EVENT_COMPONENT),
        metrics,
        entries: Mutex::new(HashMap::new()),
        host_set: Mutex::new(None),
        selectors: Mutex::new(SelectorsInUse::default()),
        hosts_batch_unsupported: AtomicBool::new(false),
        config,
        ctx,
    });
    tracing::info!(
        controller = NAME,
        workers = shared.config.workers,
        node_sync_window = ?shared.config.node_sync_window,
        load_balancer_classes = %shared.classes.describe(),
        "starting"
    );

    let (node_tx, node_rx) = mpsc::unbounded_channel();
    let mut tasks = JoinSet::new();
    tasks.spawn(service_events(shared.clone(), service_changes));
    tasks.spawn(node_events(shared.clone(), node_changes, node_tx));
    tasks.spawn(node_sync_loop(shared.clone(), node_rx));

    let workers = shared.config.workers;
    let handler_shared = shared.clone();
    shared
        .queue
        .run_workers(workers, shared.ctx.shutdown.clone(), move |key| {
            let shared = handler_shared.clone();
            async move { shared.sync_key(key).await }
        })
        .await;
    // The event loops stop on shutdown; the node-sync loop finishes its running pass.
    while tasks.join_next().await.is_some() {}
    tracing::info!(controller = NAME, "stopped");
    Ok(())
}

/// Queues Services per Go's add and update handlers, plus Services that vanished while the
/// controller had a record of their load balancer.
async fn service_events(shared: Arc<Reconciler>, mut changes: Subscription<Arc<Service>>) {
    loop {
        let change = tokio::select! {
            () = shared.ctx.shutdown.cancelled() => return,
            change = changes.recv() => change,
        };
        let Some(change) = change else { return };
        match &change {
            Change::Applied { new, .. } => shared.note_backends(new),
            Change::Deleted(gone) => shared.forget_backends(gone),
            Change::Resync => {
                shared.selectors().clear();
                for service in shared.ctx.services.list() {
                    shared.note_backends(&service);
                }
            }
        }
        match change {
            Change::Applied { old: None, new } => {
                if plan::should_enqueue_add(&new, &shared.classes) {
                    shared.expect_comparison(&new);
                    shared.queue.add(key_of(&new));
                }
            }
            Change::Applied {
                old: Some(old),
                new,
            } => {
                if let Some(trigger) = plan::update_trigger(&old, &new, &shared.classes) {
                    if let Some((reason, note)) = trigger.event {
                        shared.recorder.normal(&*new, reason, note);
                    }
                    shared.queue.add(key_of(&new));
                } else if plan::needs_cleanup(&new, &shared.classes) {
                    shared.queue.add(key_of(&new));
                }
            }
            Change::Deleted(gone) => {
                let key = key_of(&gone);
                if shared.has_entry(&key) {
                    shared.queue.add(key);
                }
            }
            Change::Resync => {
                for service in shared.ctx.services.list() {
                    if plan::should_enqueue_add(&service, &shared.classes) {
                        shared.expect_comparison(&service);
                        shared.queue.add(key_of(&service));
                    }
                }
                for key in shared.entry_keys() {
                    shared.queue.add(key);
                }
            }
        }
    }
}

impl Reconciler {
    fn selectors(&self) -> std::sync::MutexGuard<'_, SelectorsInUse> {
        self.selectors.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records `service`'s backend selector among those in use (none when it is not served).
    fn note_backends(&self, service: &Service) {
        let selector = plan::wants_load_balancer(service, &self.classes)
            .then(|| plan::selector_text(service))
            .flatten()
            .and_then(|text| plan::parse_selector(text).ok());
        self.selectors().set(&key_of(service), selector);
    }

    fn forget_backends(&self, service: &Service) {
        self.selectors().set(&key_of(service), None);
    }

    /// The distinct backend selectors of the Services served.
    pub(super) fn backend_selectors(
        &self,
    ) -> Arc<[crate::machinery::label_selector::ManagedNodeSelector]> {
        self.selectors().snapshot()
    }

    /// Shadow mode: `service` is queued to be compared (`machinery/shadow/progress.rs`).
    fn expect_comparison(&self, service: &Service) {
        if let Some(shadow) = self.ctx.shadow() {
            shadow.expect("Service", &key_of(service));
        }
    }

    /// The provider's implementation for its declared `provider_class`.
    fn lb_for(&self, provider_class: Option<&str>) -> Option<&dyn LoadBalancer> {
        self.ctx.cloud.load_balancer_for_class(provider_class)
    }

    /// The implementation serving `service`'s class, if this controller serves it.
    pub(super) fn lb_serving(&self, service: &Service) -> Option<&dyn LoadBalancer> {
        self.lb_for(self.classes.provider_class(class_of(service))?)
    }

    /// The implementations that may hold the load balancer of `service`, being cleaned up
    /// ([`ServedClasses::cleanup_provider_classes`]).
    fn lbs_for_cleanup(
        &self,
        service: &Service,
        handled: Option<&Service>,
    ) -> Vec<&dyn LoadBalancer> {
        self.classes
            .cleanup_provider_classes(service, handled)
            .into_iter()
            .filter_map(|c| self.lb_for(c))
            .collect()
    }

    fn cluster(&self) -> &str {
        &self.ctx.cluster_name
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, EntryLock>> {
        // The map is consistent between statements; a poisoned lock means a panic elsewhere.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn entry(&self, key: &str) -> EntryLock {
        self.entries().entry(key.to_owned()).or_default().clone()
    }

    fn has_entry(&self, key: &str) -> bool {
        self.entries().contains_key(key)
    }

    fn entry_keys(&self) -> Vec<String> {
        self.entries().keys().cloned().collect()
    }

    /// Drops the entry of `key` if it holds nothing and nobody else uses it. Every clone of an
    /// entry is taken under the map lock, so a strong count of 1 under that lock means no one
    /// else holds or can get it.
    fn release(&self, key: &str) {
        let mut entries = self.entries();
        let unused = entries
            .get(key)
            .is_some_and(|e| Arc::strong_count(e) == 1 && e.try_lock().is_ok_and(|g| g.is_empty()));
        if unused {
            entries.remove(key);
        }
    }

    fn api(&self, namespace: &str) -> Api<Service> {
        Api::namespaced(self.ctx.client.clone(), namespace)
    }

    /// The service worker: one full sync of one Service key.
    async fn sync_key(self: &Arc<Self>, key: String) -> Outcome {
        let Some((namespace, name)) = key.split_once('/') else {
            tracing::warn!(controller = NAME, %key, "ignoring malformed service key");
            return Outcome::Done;
        };
        let entry = self.entry(&key);
        let result = {
            let mut entry = entry.lock().await;
            entry.retry_not_before = None;
            let result = match self.ctx.services.get_namespaced(namespace, name) {
                None => self.process_deletion(&mut entry).await,
                Some(service) => self.process_create_or_update(&mut entry, service).await,
            };
            if let Err(Step::Retry(after)) = &result {
                entry.retry_not_before = Some(Instant::now() + *after);
            }
            result
        };
        drop(entry);
        self.release(&key);
        if let Some(shadow) = self.ctx.shadow() {
            match &result {
                Ok(()) => shadow.compared("Service", &key),
                Err(Step::Gone) => shadow.forget_object("Service", &key),
                Err(Step::InvalidSelector) => shadow.not_compared(
                    "Service",
                    &key,
                    "its backend-node-selector annotation is invalid, so no hosts were planned",
                ),
                Err(_) => shadow.not_compared(
                    "Service",
                    &key,
                    "the load-balancer comparison did not complete (see the log)",
                ),
            }
        }
        match result {
            Ok(()) | Err(Step::Gone) | Err(Step::InvalidSelector) => Outcome::Done,
            Err(Step::Retry(after)) => {
                tracing::info!(controller = NAME, %key, ?after, "provider asked to retry");
                Outcome::RequeueAfter(after)
            }
            Err(Step::Failed) => Outcome::Failed,
            Err(Step::Restart(_)) => Outcome::Failed,
        }
    }

    /// The Service is gone from the cache (Go's `processServiceDeletion`): delete the load
    /// balancer the controller still has a record of.
    async fn process_deletion(&self, entry: &mut Entry) -> Result<(), Step> {
        if let Some(handled) = entry.handled.clone() {
            self.delete_load_balancer_of(&handled).await?;
        }
        entry.forget();
        Ok(())
    }

    /// Go's `processLoadBalancerDelete`: delete the load balancer of a Service object that is
    /// no longer current (vanished, or replaced by a new UID).
    async fn delete_load_balancer_of(&self, service: &Service) -> Result<(), Step> {
        let lbs = self.lbs_for_cleanup(service, Some(service));
        if lbs.is_empty() {
            return Err(Step::Failed);
        }
        self.recorder.normal(
            service,
            "DeletingLoadBalancer",
            note_with_class("Deleting load balancer", service),
        );
        for lb in lbs {
            match cloud::delete(lb, self.cluster(), service).await {
                Ok(()) | Err(CallError::Elsewhere) => {}
                Err(CallError::Retry(after)) => {
                    self.metrics.operation(class_of(service), "delete", "retry");
                    return Err(Step::Retry(after));
                }
                Err(CallError::Failed(error)) => {
                    self.metrics.operation(class_of(service), "delete", "error");
                    return Err(self.delete_failed(service, error));
                }
            }
        }
        self.metrics
            .operation(class_of(service), "delete", "success");
        self.recorder.normal(
            service,
            "DeletedLoadBalancer",
            note_with_class("Deleted load balancer", service),
        );
        Ok(())
    }

    /// Go's `processServiceCreateOrUpdate` + `syncLoadBalancerIfNeeded`.
    async fn process_create_or_update(
        &self,
        entry: &mut Entry,
        service: Arc<Service>,
    ) -> Result<(), Step> {
        let mut service = service;
        for _ in 0..MAX_CONFLICT_ATTEMPTS {
            if let Some(old) = entry.handled.clone()
                && old.metadata.uid != service.metadata.uid
            {
                // Deleted and re-created under the same name without us seeing the deletion
                // through the finalizer: the old load balancer goes first.
                self.delete_load_balancer_of(&old).await?;
                entry.forget();
            }
            let step = match plan::decide(&service, entry.handled.is_some(), &self.classes) {
                Decision::Skip => {
                    entry.forget();
                    return Ok(());
                }
                Decision::Ensure => {
                    entry.handled = Some(service.clone());
                    self.ensure(entry, &service).await
                }
                Decision::Delete => {
                    // The class it was handled under says which implementation holds its
                    // load balancer; the record keeps that class until the cleanup is done.
                    let handled = match entry.handled.take() {
                        Some(old) if plan::wants_load_balancer(&old, &self.classes) => old,
                        _ => service.clone(),
                    };
                    entry.handled = Some(handled.clone());
                    let result = self.delete(&service, &handled).await;
                    if result.is_ok() {
                        entry.forget();
                    }
                    result
                }
            };
            match step {
                Err(Step::Restart(fresh)) => service = fresh,
                other => return other,
            }
        }
        self.recorder
            .warning(
                &*service,
                "SyncLoadBalancerFailed",
                "Error syncing load balancer: the Service kept changing while its finalizer was being written",
            );
        Err(Step::Failed)
    }

    fn sync_failed(&self, service: &Service, error: impl std::fmt::Display) -> Step {
        self.recorder.warning(
            service,
            "SyncLoadBalancerFailed",
            format!("Error syncing load balancer: {error}"),
        );
        Step::Failed
    }

    fn delete_failed(&self, service: &Service, error: impl std::fmt::Display) -> Step {
        self.recorder.warning(
            service,
            "DeleteLoadBalancerFailed",
            format!("Error deleting load balancer: {error}"),
        );
        Step::Failed
    }

    /// Counts an ensure or delete outcome by the Service's class.
    fn count(&self, service: &Service, operation: &'static str, result: &Result<(), Step>) {
        let result = match result {
            Ok(()) | Err(Step::Gone) => "success",
            Err(Step::Retry(_)) => "retry",
            Err(Step::Failed) | Err(Step::InvalidSelector) => "error",
            Err(Step::Restart(_)) => return,
        };
        self.metrics.operation(class_of(service), operation, result);
    }

    /// The ensure branch.
    async fn ensure(&self, entry: &mut Entry, service: &Arc<Service>) -> Result<(), Step> {
        let result = self.ensure_inner(entry, service).await;
        self.count(service, "ensure", &result);
        result
    }

    async fn ensure_inner(&self, entry: &mut Entry, service: &Arc<Service>) -> Result<(), Step> {
        let Some(lb) = self.lb_serving(service) else {
            return Err(Step::Failed);
        };
        // The backends first: with an invalid selector nothing is ensured, so the load
        // balancer keeps the hosts it has.
        if let Err(error) = self.hosts_for(service) {
            return Err(self.invalid_selector(service, &error).await);
        }
        self.recorder.normal(
            &**service,
            "EnsuringLoadBalancer",
            note_with_class("Ensuring load balancer", service),
        );
        // The finalizer goes on before anything exists in the cloud.
        let api = self.api(&service.namespace().unwrap_or_default());
        let service = match patch::add_finalizer(&api, service, &self.classes).await {
            Ok(s) => s,
            Err(WriteError::Gone) => return Err(Step::Gone),
            Err(WriteError::Changed(fresh)) => return Err(Step::Restart(fresh)),
            Err(WriteError::Failed(e)) => {
                return Err(self.sync_failed(
                    service,
                    format!("failed to add load balancer cleanup finalizer: {e}"),
                ));
            }
        };
        let host_set = match self.hosts_for(&service) {
            Ok(set) => set,
            Err(error) => return Err(self.invalid_selector(&service, &error).await),
        };
        let hosts: &[ccm_core::NodeView] = &host_set.nodes;
        if hosts.is_empty() {
            self.recorder.warning(
                &*service,
                "UnAvailableLoadBalancer",
                "There are no available nodes for LoadBalancer",
            );
        }
        // Remembered before the call, as Go does: a node sync compares against what the cloud
        // was last asked for.
        entry.last_hosts = Some(host_set.keys.clone());
        // A Service's first load balancer goes ahead of a burst of Node initialisations under
        // a cloud quota (`machinery/budget/lanes.rs`); a re-ensure waits its turn.
        let ensure = cloud::ensure(lb, self.cluster(), &service, hosts);
        let ensured = if has_ingress(&service) {
            ensure.await
        } else {
            in_lane(Lane::FirstEnsure, ensure).await
        };
        let status = match ensured {
            Ok(status) => status,
            Err(CallError::Elsewhere) => {
                tracing::debug!(controller = NAME, service = %key_of(&service), "load balancer implemented elsewhere");
                return Ok(());
            }
            Err(CallError::Retry(after)) => return Err(Step::Retry(after)),
            Err(CallError::Failed(error)) => {
                let message = format!("failed to ensure load balancer: {error}");
                let step = self.sync_failed(&service, &message);
                // The failure in the Service's status too (the ingress as it is); a failed
                // write of it changes nothing about the retry.
                let current = service
                    .status
                    .as_ref()
                    .and_then(|s| s.load_balancer.clone())
                    .unwrap_or_default();
                let failed = LoadBalancerState::Failed(message);
                if self.config.status_conditions
                    && let Err(e) = patch::write_status(&api, &service, &current, &failed).await
                {
                    tracing::warn!(controller = NAME, service = %key_of(&service), error = %e, "writing the load balancer's condition failed");
                }
                return Err(step);
            }
        };
        self.recorder.normal(
            &*service,
            "EnsuredLoadBalancer",
            note_with_class("Ensured load balancer", &service),
        );
        let status = self.with_ip_modes(&service, status);
        self.write_status(&service, &status, &LoadBalancerState::Provisioned)
            .await
    }

    /// An invalid backend selector on `service`: a Warning Event, a log line and, with
    /// `--load-balancer-status-conditions`, the condition `False` (the ingress as it is). No
    /// cloud call: the load balancer keeps its hosts.
    async fn invalid_selector(
        &self,
        service: &Service,
        error: &crate::machinery::label_selector::SelectorError,
    ) -> Step {
        let note = plan::invalid_selector_note(error);
        tracing::warn!(controller = NAME, service = %key_of(service), %error, "invalid backend node selector; the load balancer is left as it is");
        self.recorder.warning(
            service,
            plan::REASON_INVALID_BACKEND_NODE_SELECTOR,
            note.clone(),
        );
        if self.config.status_conditions {
            let api = self.api(&service.namespace().unwrap_or_default());
            let current = service
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.clone())
                .unwrap_or_default();
            let state = LoadBalancerState::InvalidBackendSelector(note);
            if let Err(e) = patch::write_status(&api, service, &current, &state).await {
                tracing::warn!(controller = NAME, service = %key_of(service), error = %e, "writing the load balancer's condition failed");
            }
        }
        Step::InvalidSelector
    }

    /// The delete branch. `handled` is the Service as last handled as a load balancer (its
    /// class says which implementation holds the load balancer), else `service` itself.
    async fn delete(&self, service: &Arc<Service>, handled: &Service) -> Result<(), Step> {
        let result = self.delete_inner(service, handled).await;
        self.count(handled, "delete", &result);
        result
    }

    async fn delete_inner(&self, service: &Arc<Service>, handled: &Service) -> Result<(), Step> {
        let lbs = self.lbs_for_cleanup(service, Some(handled));
        if lbs.is_empty() {
            return Err(Step::Failed);
        }
        for lb in lbs {
            match cloud::exists(lb, self.cluster(), service).await {
                Ok(false) => {}
                Ok(true) => {
                    self.recorder.normal(
                        &**service,
                        "DeletingLoadBalancer",
                        note_with_class("Deleting load balancer", handled),
                    );
                    match cloud::delete(lb, self.cluster(), service).await {
                        Ok(()) | Err(CallError::Elsewhere) => {}
                        Err(CallError::Retry(after)) => return Err(Step::Retry(after)),
                        Err(CallError::Failed(error)) => {
                            return Err(self.delete_failed(
                                service,
                                format!("failed to delete load balancer: {error}"),
                            ));
                        }
                    }
                }
                Err(CallError::Retry(after)) => return Err(Step::Retry(after)),
                Err(error) => {
                    return Err(self.delete_failed(
                        service,
                        format!("failed to check if load balancer exists before cleanup: {error}"),
                    ));
                }
            }
        }
        let api = self.api(&service.namespace().unwrap_or_default());
        let gone = match patch::remove_finalizer(&api, service, &self.classes).await {
            Ok(gone) => gone,
            Err(WriteError::Gone) => return Err(Step::Gone),
            Err(WriteError::Changed(fresh)) => return Err(Step::Restart(fresh)),
            Err(WriteError::Failed(e)) => {
                return Err(self.delete_failed(
                    service,
                    format!("failed to remove load balancer cleanup finalizer: {e}"),
                ));
            }
        };
        self.recorder.normal(
            &**service,
            "DeletedLoadBalancer",
            note_with_class("Deleted load balancer", handled),
        );
        if gone {
            // Go patches the status anyway and ignores the 404.
            return Ok(());
        }
        match self
            .write_status(
                service,
                &LoadBalancerStatus::default(),
                &LoadBalancerState::NotServed,
            )
            .await
        {
            Err(Step::Gone) => Ok(()),
            other => other,
        }
    }

    /// `status` as the provider returned it, with the `ipMode` of each entry set by the rule
    /// of [`plan::with_ip_modes`]; a refused `service.ccm-rs.io/ip-mode` annotation is a
    /// Warning Event.
    fn with_ip_modes(&self, service: &Service, status: LoadBalancerStatus) -> LoadBalancerStatus {
        let Some(class) = self.classes.provider_class(class_of(service)) else {
            return status;
        };
        let modes = self.ctx.cloud.load_balancer_ip_modes(class);
        let request = plan::ip_mode_request(service, modes);
        if let plan::IpModeRequest::Refused(note) = &request {
            self.recorder
                .warning(service, plan::REASON_IP_MODE_NOT_ALLOWED, note.clone());
        }
        plan::with_ip_modes(status, &request, modes)
    }

    /// Writes `status.loadBalancer.ingress` through the status subresource when it changed.
    /// A Service that no longer exists is not an error.
    async fn write_status(
        &self,
        service: &Service,
        status: &LoadBalancerStatus,
        state: &LoadBalancerState,
    ) -> Result<(), Step> {
        let api = self.api(&service.namespace().unwrap_or_default());
        // Without --load-balancer-status-conditions the condition is left as it is (Go's writes).
        let state = if self.config.status_conditions {
            state
        } else {
            &LoadBalancerState::Untouched
        };
        match patch::write_status(&api, service, status, state).await {
            Ok(()) => Ok(()),
            Err(e) => Err(self.sync_failed(
                service,
                format!("failed to update load balancer status: {e}"),
            )),
        }
    }
}

/// Whether the Service's status has an ingress point (a load balancer was made for it before).
fn has_ingress(service: &Service) -> bool {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|ingress| !ingress.is_empty())
}

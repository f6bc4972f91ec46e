//! The cloud-node-lifecycle controller (`cloud-node-lifecycle-controller`, Go alias
//! `cloud-node-lifecycle`): every `--node-monitor-period` it looks at the Nodes whose `Ready`
//! condition is not `True` and asks the cloud about their instances. A gone instance gets its
//! Node deleted; a shut-down one gets the `node.cloudprovider.kubernetes.io/shutdown:NoSchedule`
//! taint, removed once the Node is `Ready` again.
//!
//! Deliberate differences from Go's `controllers/nodelifecycle`:
//! - **Safe deletion**: a Node is deleted only after its instance was reported gone on two
//!   checks at least [`NodeLifecycleConfig::deletion_grace_period`] apart (default 30 s; zero
//!   restores Go's delete-on-first-answer). Errors never delete and never confirm; see
//!   `plan.rs` for the exact rule. The delete carries a UID precondition, so a Node re-created
//!   under the same name is never deleted by a decision about its predecessor.
//! - **Parallel checks**: the NotReady nodes of one pass are checked concurrently, at most
//!   [`NodeLifecycleConfig::workers`] at a time (Go: one after another).
//! - **Batched checks**: with a provider offering
//!   [`InstancesBatch`](ccm_core::InstancesBatch), the NotReady Nodes of one pass are asked in
//!   `describe_instances` calls of up to `max_batch_size` Nodes (existence and shutdown in one
//!   answer) instead of one or two calls per Node. The deletion rule is the same; a Node
//!   missing from an answer, an `Error` answer and a failed call are errors (the Node is
//!   skipped for this pass, never deleted).
//! - **Legacy providers**: a node without providerID gets `<provider>://<instance_id>` passed
//!   to `instance_exists_by_provider_id` (Go passes the bare instance ID); an empty instance ID
//!   is an error, not "gone" (Go assumes the instance is gone); a node that has a providerID is
//!   not looked up by name for the shutdown check (Go always is).
//! - Taint writes are guarded JSON patches re-planned from a fresh read on conflict, as in the
//!   cloud-node controller.

pub(crate) mod plan;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ccm_core::{CloudError, CloudProvider, Node};
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Preconditions};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use tokio::time::{Instant, MissedTickBehavior};

use crate::cloud_node::cloud::legacy_provider_id;
use crate::cloud_node::patch::{self, PatchError};
use crate::cloud_node::plan::SpecUpdate;
use crate::context::ControllerContext;
use crate::error::ControllerError;
use crate::events::EventRecorder;
use crate::instance_batch::{self, plan::lifecycle_lookup};
use crate::metrics::MetricsRegistry;

use self::plan::{Answer, ExistsStep, ReadyStep};

/// The controller's canonical name.
pub const CONTROLLER_NAME: &str = "cloud-node-lifecycle-controller";
/// The component name of its Events (Go's).
pub const EVENT_COMPONENT: &str = "cloud-node-lifecycle-controller";
/// Event reason (Normal) emitted before deleting a Node whose instance is gone.
pub const REASON_DELETING_NODE: &str = "DeletingNode";
/// Event reason (Warning) emitted when that deletion fails.
pub const REASON_DELETING_NODE_FAILED: &str = "DeletingNodeFailed";
/// Default of [`NodeLifecycleConfig::workers`].
pub const DEFAULT_WORKERS: usize = 20;

/// Configuration of the node-lifecycle controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeLifecycleConfig {
    /// `--node-monitor-period`: time between two passes over the NotReady Nodes. Default 5 s;
    /// zero is an error.
    pub monitor_period: Duration,
    /// `--node-deletion-grace-period`: a Node is deleted only when its instance was reported
    /// gone on two checks at least this far apart. Default 30 s; zero deletes on the first
    /// "gone" answer (Go's behaviour).
    pub deletion_grace_period: Duration,
    /// Nodes checked concurrently within one pass. Default [`DEFAULT_WORKERS`]; zero is an
    /// error.
    pub workers: usize,
}

impl Default for NodeLifecycleConfig {
    fn default() -> Self {
        NodeLifecycleConfig {
            monitor_period: Duration::from_secs(5),
            deletion_grace_period: Duration::from_secs(30),
            workers: DEFAULT_WORKERS,
        }
    }
}

impl NodeLifecycleConfig {
    /// Checks the configuration, naming the offending setting.
    pub fn validate(&self) -> Result<(), ControllerError> {
        if self.monitor_period.is_zero() {
            return Err(ControllerError::Config {
                controller: CONTROLLER_NAME,
                message: "--node-monitor-period must be greater than 0".into(),
            });
        }
        if self.workers == 0 {
            return Err(ControllerError::Config {
                controller: CONTROLLER_NAME,
                message: "node lifecycle workers must be at least 1 (0 would never check a node)"
                    .into(),
            });
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Clone, Debug)]
struct LifecycleMetrics {
    checks: Family<OutcomeLabel, Counter>,
    pass_duration: Histogram,
}

impl LifecycleMetrics {
    fn register(registry: &MetricsRegistry) -> Self {
        let m = LifecycleMetrics {
            checks: Family::default(),
            pass_duration: Histogram::new(exponential_buckets(0.001, 4.0, 10)),
        };
        registry.register(
            "node_lifecycle_controller_checks",
            "Node checks of the cloud-node-lifecycle controller by outcome (ready, shutdown_taint_removed, exists, shutdown_taint_added, gone_first, gone_awaiting_confirmation, deleted, delete_failed, error).",
            m.checks.clone(),
        );
        registry.register(
            "node_lifecycle_controller_monitor_duration_seconds",
            "Duration of one pass of the cloud-node-lifecycle controller over all nodes.",
            m.pass_duration.clone(),
        );
        m
    }

    fn count(&self, outcome: &'static str) {
        self.checks.get_or_create(&OutcomeLabel { outcome }).inc();
    }
}

struct Lifecycle {
    ctx: ControllerContext,
    api: Api<Node>,
    recorder: EventRecorder,
    config: NodeLifecycleConfig,
    metrics: LifecycleMetrics,
    /// When each node's instance was first reported gone: name → (UID, when).
    first_gone: Mutex<HashMap<String, (String, Instant)>>,
}

/// A Node's `instance_exists` and `instance_shutdown` answers read from a batch call.
type BatchAnswer = (Result<bool, CloudError>, Result<bool, CloudError>);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn uid(node: &Node) -> String {
    node.metadata.uid.clone().unwrap_or_default()
}

fn provider_id(node: &Node) -> &str {
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .unwrap_or_default()
}

/// Whether the instance exists (Go's `ensureNodeExistsByProviderID`). On the legacy path an
/// `InstanceNotFound` from the provider-ID lookup means "gone"; from the exists call itself,
/// like any error, it means "unknown".
async fn instance_exists(cloud: &dyn CloudProvider, node: &Node) -> Result<bool, CloudError> {
    if let Some(v2) = cloud.instances_v2() {
        return v2.instance_exists(node).await;
    }
    let Some(instances) = cloud.instances() else {
        return Err(CloudError::msg(
            "instances interface not supported in the cloud provider",
        ));
    };
    let mut id = provider_id(node).to_owned();
    if id.is_empty() {
        id = match legacy_provider_id(cloud, instances, &node.name_any()).await {
            Ok(id) => id,
            Err(CloudError::InstanceNotFound) => return Ok(false),
            Err(e) => return Err(e),
        };
    }
    instances.instance_exists_by_provider_id(&id).await
}

/// Whether the instance is shut down (Go's `shutdownInCloudProvider`); `NotImplemented`, and an
/// `InstanceNotFound` from the legacy provider-ID lookup, mean "not shut down".
async fn instance_shutdown(cloud: &dyn CloudProvider, node: &Node) -> Result<bool, CloudError> {
    let result = if let Some(v2) = cloud.instances_v2() {
        v2.instance_shutdown(node).await
    } else if let Some(instances) = cloud.instances() {
        let mut id = provider_id(node).to_owned();
        if id.is_empty() {
            id = match legacy_provider_id(cloud, instances, &node.name_any()).await {
                Ok(id) => id,
                Err(CloudError::InstanceNotFound) => return Ok(false),
                Err(e) => return Err(e),
            };
        }
        instances.instance_shutdown_by_provider_id(&id).await
    } else {
        Err(CloudError::msg("cloud provider does not support instances"))
    };
    match result {
        Err(CloudError::NotImplemented) => Ok(false),
        other => other,
    }
}

impl Lifecycle {
    fn first_gone(&self, node: &Node) -> Option<Instant> {
        lock(&self.first_gone)
            .get(&node.name_any())
            .filter(|(u, _)| *u == uid(node))
            .map(|(_, t)| *t)
    }

    fn forget(&self, node: &Node) {
        lock(&self.first_gone).remove(&node.name_any());
    }

    /// One pass over every node in the cache, at most `workers` checks at a time.
    async fn monitor(&self) {
        let started = Instant::now();
        let nodes = self.ctx.nodes.list();
        {
            // Forget "gone" records of nodes that were deleted or replaced.
            let present: HashMap<String, String> =
                nodes.iter().map(|n| (n.name_any(), uid(n))).collect();
            lock(&self.first_gone).retain(|name, (u, _)| present.get(name) == Some(u));
        }
        // With a batching provider, the Nodes to check are asked in `describe_instances`
        // calls of up to `max_batch_size` Nodes (existence and shutdown in one answer). A
        // whole-call Retry is not retried within the pass: every Node of that call is skipped
        // and asked again in the next pass.
        let to_check: Vec<_> = nodes
            .iter()
            .filter(|n| plan::plan_ready(n) == ReadyStep::CheckExists)
            .cloned()
            .collect();
        let mut answers = if to_check.is_empty() {
            None
        } else {
            instance_batch::describe_all(self.ctx.cloud.as_ref(), to_check, 0, &self.ctx.shutdown)
                .await
        };
        let nodes: Vec<_> = nodes
            .into_iter()
            .map(|node| {
                let answer = answers
                    .as_mut()
                    .and_then(|a| a.remove(&node.name_any()))
                    .and_then(lifecycle_lookup);
                (node, answer)
            })
            .collect();
        futures::stream::iter(nodes)
            .for_each_concurrent(self.config.workers, |(node, answer)| async move {
                self.check(&node, answer).await;
            })
            .await;
        self.metrics
            .pass_duration
            .observe(started.elapsed().as_secs_f64());
    }

    /// Checks one Node. `batch_answer` holds the answers of `instance_exists` and
    /// `instance_shutdown` read from a batch call, `None` to ask them with single calls.
    async fn check(&self, node: &Node, batch_answer: Option<BatchAnswer>) {
        let name = node.name_any();
        match plan::plan_ready(node) {
            ReadyStep::Nothing => {
                self.forget(node);
                self.metrics.count("ready");
            }
            ReadyStep::RemoveShutdownTaint => {
                self.forget(node);
                self.patch_taints(node, false).await;
            }
            ReadyStep::CheckExists => {
                let (exists, batch_shutdown) = match batch_answer {
                    Some((exists, shutdown)) => (exists, Some(shutdown)),
                    None => (instance_exists(self.ctx.cloud.as_ref(), node).await, None),
                };
                if let Err(error) = &exists {
                    tracing::warn!(node = %name, %error, "error checking if node exists");
                }
                let step = plan::plan_exists(
                    Answer::from(&exists),
                    self.first_gone(node),
                    Instant::now(),
                    self.config.deletion_grace_period,
                );
                match step {
                    ExistsStep::Skip => self.metrics.count("error"),
                    ExistsStep::RecordFirstGone => {
                        tracing::info!(
                            node = %name,
                            grace_period = ?self.config.deletion_grace_period,
                            "cloud provider reports the node's instance gone; deleting the node if confirmed after the grace period"
                        );
                        lock(&self.first_gone).insert(name, (uid(node), Instant::now()));
                        self.metrics.count("gone_first");
                    }
                    ExistsStep::AwaitConfirmation => {
                        self.metrics.count("gone_awaiting_confirmation")
                    }
                    ExistsStep::Delete => self.delete(node).await,
                    ExistsStep::CheckShutdown => {
                        self.forget(node);
                        let shutdown = match batch_shutdown {
                            Some(shutdown) => shutdown,
                            None => instance_shutdown(self.ctx.cloud.as_ref(), node).await,
                        };
                        if let Err(error) = &shutdown {
                            tracing::warn!(node = %name, %error, "error checking if node is shutdown");
                        }
                        if plan::plan_shutdown(&shutdown, node) {
                            self.patch_taints(node, true).await;
                        } else {
                            self.metrics
                                .count(if shutdown.is_err() { "error" } else { "exists" });
                        }
                    }
                }
            }
        }
    }

    /// Adds (`add`) or removes the shutdown taint with a guarded patch, re-checking the
    /// `Ready` condition on every fresh read.
    async fn patch_taints(&self, node: &Node, add: bool) {
        let name = node.name_any();
        let result = patch::patch_node_spec(&self.api, node.clone(), |current| {
            let taints = match (add, plan::is_ready(current)) {
                (true, false) => plan::with_shutdown_taint(current),
                (false, true) => plan::without_shutdown_taint(current),
                _ => None,
            };
            Ok::<_, std::convert::Infallible>(SpecUpdate {
                taints,
                ..Default::default()
            })
        })
        .await;
        match result {
            Ok((_, wrote)) => {
                if wrote {
                    tracing::info!(node = %name, add, "updated the shutdown taint");
                }
                self.metrics.count(if add {
                    "shutdown_taint_added"
                } else {
                    "shutdown_taint_removed"
                });
            }
            Err(PatchError::NotFound) => {}
            Err(error) => {
                tracing::warn!(node = %name, add, %error, "failed to update the shutdown taint");
                self.metrics.count("error");
            }
        }
    }

    /// Deletes a node whose instance is gone: `DeletingNode` event, then a delete guarded by
    /// the node's UID; `DeletingNodeFailed` when the API refuses.
    async fn delete(&self, node: &Node) {
        let name = node.name_any();
        let Some(uid) = node.metadata.uid.clone() else {
            tracing::warn!(node = %name, "node has no UID; not deleting it");
            self.metrics.count("error");
            return;
        };
        tracing::info!(node = %name, "deleting node since it is no longer present in cloud provider");
        self.recorder.normal(
            node,
            REASON_DELETING_NODE,
            format!("Deleting node {name} because it does not exist in the cloud provider"),
        );
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self.api.delete(&name, &params).await {
            Ok(_) => {
                self.forget(node);
                self.metrics.count("deleted");
            }
            Err(kube::Error::Api(s)) if s.code == 404 => self.forget(node),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                // The UID precondition failed: the node was re-created under the same name.
                tracing::info!(node = %name, "node was replaced by a new one; not deleting it");
                self.forget(node);
            }
            Err(error) => {
                tracing::warn!(node = %name, %error, "unable to delete node");
                self.recorder.warning(
                    node,
                    REASON_DELETING_NODE_FAILED,
                    format!("Failed to delete node {name}: {error}"),
                );
                self.metrics.count("delete_failed");
            }
        }
    }
}

/// Runs the node-lifecycle controller until `ctx.shutdown` fires, then lets the pass in
/// progress finish.
///
/// Fails at once when the configuration is invalid or the provider offers neither
/// `instances_v2` nor `instances`; returns `Ok` when shut down (also before the informers
/// synced).
pub async fn run(
    ctx: ControllerContext,
    config: NodeLifecycleConfig,
) -> Result<(), ControllerError> {
    config.validate()?;
    if ctx.cloud.instances_v2().is_none() && ctx.cloud.instances().is_none() {
        return Err(ControllerError::MissingCapability {
            controller: CONTROLLER_NAME,
            capability: "instances_v2 or instances",
        });
    }
    let synced = tokio::select! {
        () = ctx.shutdown.cancelled() => return Ok(()),
        synced = ctx.nodes.wait_until_synced() => synced,
    };
    if !synced {
        return Err(ControllerError::NotSynced(CONTROLLER_NAME));
    }
    let lifecycle = Arc::new(Lifecycle {
        api: Api::all(ctx.client.clone()),
        recorder: ctx.recorder(EVENT_COMPONENT),
        metrics: LifecycleMetrics::register(&ctx.metrics),
        first_gone: Mutex::new(HashMap::new()),
        config: config.clone(),
        ctx: ctx.clone(),
    });
    tracing::info!(
        monitor_period = ?config.monitor_period,
        deletion_grace_period = ?config.deletion_grace_period,
        workers = config.workers,
        "starting {CONTROLLER_NAME}"
    );
    let mut ticker = tokio::time::interval(config.monitor_period);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = ctx.shutdown.cancelled() => break,
            _ = ticker.tick() => {}
        }
        let _busy = ctx.activity().begin();
        lifecycle.monitor().await;
    }
    tracing::info!("{CONTROLLER_NAME} stopped");
    Ok(())
}

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
//! - **Marks beyond Go, each off by default** (`marks.rs`, rules in `plan/marks.rs`): the
//!   `CloudProviderInstanceNotFound` condition while a "gone" answer is held
//!   ([`NodeLifecycleConfig::instance_not_found_condition`]), a mode that marks gone Nodes and
//!   never deletes them ([`GoneNodeAction::Mark`]), and the
//!   `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute` taint on a Node shut down and
//!   NotReady for longer than [`NodeLifecycleConfig::out_of_service_after`].
//! - Taint writes are guarded JSON patches re-planned from a fresh read on conflict, as in the
//!   cloud-node controller.
//! - **Shadow mode**: a Node it would delete is held, not checked again until it changes or
//!   60 monitor periods pass (`shadow.rs`); its log lines say "would delete node (shadow)".

mod cloud;
mod marks;
mod metrics;
pub(crate) mod plan;
mod shadow;
mod sync;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::MissedTickBehavior;

use crate::machinery::budget::lanes::{Lane, in_lane};
use crate::machinery::context::ControllerContext;
use crate::machinery::error::ControllerError;

use self::sync::Reconciler;

/// The controller's canonical name.
pub const NAME: &str = "cloud-node-lifecycle-controller";
/// The short name `--controllers` also accepts (and the `running_managed_controllers` label).
pub const ALIAS: &str = "cloud-node-lifecycle";
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
#[non_exhaustive]
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
    /// `--node-instance-not-found-condition`: while a "gone" answer is held (the grace period
    /// not over), the Node carries the condition `CloudProviderInstanceNotFound=True` (reason
    /// `InstanceNotFound`), set back to `False` (reason `InstanceFound`) when the instance
    /// exists again or the Node is Ready. Default off (Go shows nothing).
    pub instance_not_found_condition: bool,
    /// `--node-deletion-mode`: what a confirmed "gone" does. Default
    /// [`GoneNodeAction::Delete`] (Go).
    pub gone_nodes: GoneNodeAction,
    /// `--node-out-of-service-after`: when set, a Node whose instance the cloud has reported
    /// shut down for at least this long, and whose `Ready` condition has not been `True` for
    /// as long, gets `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`; it comes off
    /// when the instance runs again or the Node is Ready. Default `None`: off (Go).
    pub out_of_service_after: Option<Duration>,
}

/// What the controller does with a Node whose instance is confirmed gone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum GoneNodeAction {
    /// Delete it (Go's behaviour, after the grace period here).
    #[default]
    Delete,
    /// Never delete it: it carries the `CloudProviderInstanceNotFound` condition instead, for
    /// operators who delete Nodes through their own tooling.
    Mark,
}

impl Default for NodeLifecycleConfig {
    fn default() -> Self {
        NodeLifecycleConfig {
            monitor_period: Duration::from_secs(5),
            deletion_grace_period: Duration::from_secs(30),
            workers: DEFAULT_WORKERS,
            instance_not_found_condition: false,
            gone_nodes: GoneNodeAction::Delete,
            out_of_service_after: None,
        }
    }
}

impl NodeLifecycleConfig {
    /// Checks the configuration, naming the offending setting.
    pub fn validate(&self) -> Result<(), ControllerError> {
        if self.monitor_period.is_zero() {
            return Err(ControllerError::Config {
                controller: NAME,
                message: "--node-monitor-period must be greater than 0".into(),
            });
        }
        if self.workers == 0 {
            return Err(ControllerError::Config {
                controller: NAME,
                message: "node lifecycle workers must be at least 1 (0 would never check a node)"
                    .into(),
            });
        }
        if self.out_of_service_after.is_some_and(|d| d.is_zero()) {
            return Err(ControllerError::Config {
                controller: NAME,
                message: "--node-out-of-service-after must be greater than 0 (leave it unset to turn the out-of-service taint off)".into(),
            });
        }
        Ok(())
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
            controller: NAME,
            capability: "instances_v2 or instances",
        });
    }
    let synced = tokio::select! {
        () = ctx.shutdown.cancelled() => return Ok(()),
        synced = ctx.nodes.wait_until_synced() => synced,
    };
    if !synced {
        return Err(ControllerError::NotSynced(NAME));
    }
    let lifecycle = Arc::new(Reconciler::new(ctx.clone(), config.clone()));
    tracing::info!(
        monitor_period = ?config.monitor_period,
        deletion_grace_period = ?config.deletion_grace_period,
        workers = config.workers,
        instance_not_found_condition = config.instance_not_found_condition,
        gone_nodes = ?config.gone_nodes,
        out_of_service_after = ?config.out_of_service_after,
        "starting {NAME}"
    );
    let mut ticker = tokio::time::interval(config.monitor_period);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = ctx.shutdown.cancelled() => break,
            _ = ticker.tick() => {}
        }
        let _busy = ctx.activity().begin();
        // Its cloud calls go after initialisation, before the address refresh.
        in_lane(Lane::Lifecycle, lifecycle.monitor()).await;
    }
    tracing::info!("{NAME} stopped");
    Ok(())
}

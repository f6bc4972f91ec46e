//! The writes of what the lifecycle controller shows on a Node beyond Go, each off unless
//! turned on (rules: `plan/marks.rs`): the `CloudProviderInstanceNotFound` condition, and the
//! record of when each Node's instance was first reported shut down (for the out-of-service
//! taint, written with the shutdown taint by the reconciler's taint patch).
//!
//! In shadow mode these writes are dry runs like every other, so the runtime's write guard
//! reports a condition or taint the incumbent does not carry as a divergence; nothing reaches
//! the Node.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use ccm_core::{Node, NodeView};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use tokio::time::Instant;

use super::GoneNodeAction;
use super::NodeLifecycleConfig;
use super::metrics::LifecycleMetrics;
use super::plan::marks::{self, TaintIntent};
use crate::controllers::node::taints;
use crate::machinery::lean_node::lean_api;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The settings of the marks and what they remember between passes.
pub(super) struct Marks {
    api: Api<Node>,
    /// Whether the `CloudProviderInstanceNotFound` condition is written.
    condition: bool,
    /// `--node-out-of-service-after`, when set.
    out_of_service_after: Option<Duration>,
    /// When each Node's instance was first reported shut down in an unbroken run of such
    /// answers: name → (UID, when).
    first_shutdown: Mutex<HashMap<String, (String, Instant)>>,
}

impl Marks {
    pub(super) fn new(api: Api<Node>, config: &NodeLifecycleConfig) -> Self {
        Marks {
            api,
            condition: config.instance_not_found_condition
                || config.gone_nodes == GoneNodeAction::Mark,
            out_of_service_after: config.out_of_service_after,
            first_shutdown: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a Ready Node still carries a mark to take off (the condition set to `True`,
    /// or our out-of-service taint), read from the cached view: nearly always false, with no
    /// allocation, so the monitor's sweep over Ready Nodes stays cheap.
    pub(super) fn ready_has_marks(&self, node: &NodeView) -> bool {
        (self.condition && marks::condition_status(node) == Some("True"))
            || (self.out_of_service_after.is_some()
                && marks::has_out_of_service_taint(node.taints()))
    }

    /// Forgets the shutdown record of a Node that left the cluster or is no longer shut down.
    pub(super) fn forget(&self, name: &str) {
        lock(&self.first_shutdown).remove(name);
    }

    /// Keeps only the shutdown records of Nodes still present under the same UID.
    pub(super) fn retain(&self, present: impl Fn(&str, &str) -> bool) {
        lock(&self.first_shutdown).retain(|name, (uid, _)| present(name, uid));
    }

    /// Whether any shutdown record is held (the monitor builds its name → UID map only then).
    pub(super) fn has_records(&self) -> bool {
        !lock(&self.first_shutdown).is_empty()
    }

    /// What the out-of-service taint calls for after a shutdown answer: `Ok(true)` records the
    /// first such answer and adds the taint once due; `Ok(false)` (running again) forgets it
    /// and removes the taint; an error, or an answer that is not the cloud's own (`known`
    /// false: `NotImplemented` read as "not shut down"), leaves both. `None` when the feature
    /// is off.
    pub(super) fn out_of_service_intent<E>(
        &self,
        node: &NodeView,
        shutdown: &Result<bool, E>,
        known: bool,
    ) -> Option<bool> {
        let delay = self.out_of_service_after?;
        if !known {
            return None;
        }
        match shutdown {
            Ok(true) => {
                let uid = node.uid().unwrap_or_default();
                let since = {
                    let mut records = lock(&self.first_shutdown);
                    let entry = records
                        .entry(node.name().to_owned())
                        .or_insert_with(|| (uid.to_owned(), Instant::now()));
                    if entry.0 != uid {
                        *entry = (uid.to_owned(), Instant::now());
                    }
                    entry.1
                };
                let due = marks::out_of_service_due(
                    since.elapsed(),
                    marks::not_ready_for(node, jiff::Timestamp::now()),
                    delay,
                );
                due.then_some(true)
            }
            Ok(false) => {
                self.forget(node.name());
                Some(false)
            }
            Err(_) => None,
        }
    }

    /// The intent for a Ready Node: the shutdown taint off (Go), and ours too when turned on.
    pub(super) fn ready_intent(&self) -> TaintIntent {
        TaintIntent {
            shutdown: Some(false),
            out_of_service: self.out_of_service_after.map(|_| false),
        }
    }

    /// Writes the condition for `gone` when it changes its status (`plan/marks.rs`,
    /// `condition_write`); nothing when the condition is off.
    pub(super) async fn write_condition(
        &self,
        node: &NodeView,
        gone: bool,
        metrics: &LifecycleMetrics,
    ) {
        if !self.condition {
            return;
        }
        let Some(status) = marks::condition_write(marks::condition_status(node), gone) else {
            return;
        };
        let now = Time(jiff::Timestamp::now());
        let patch = marks::condition_patch(node.uid(), status, &now);
        let name = node.name();
        match lean_api(&self.api)
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
        {
            Ok(_) => {
                tracing::info!(
                    node = %name,
                    condition = ccm_core::well_known::CONDITION_CLOUD_PROVIDER_INSTANCE_NOT_FOUND,
                    status,
                    "updated the node's instance-not-found condition"
                );
                metrics.count(if status {
                    "instance_not_found_condition_set"
                } else {
                    "instance_not_found_condition_cleared"
                });
            }
            // Deleted, or re-created under the same name (the UID precondition): nothing to do.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(error) => {
                tracing::warn!(node = %name, %error, "failed to update the node's instance-not-found condition");
                metrics.count("error");
            }
        }
    }
}

/// Whether the cached view carries our out-of-service taint.
pub(super) fn has_out_of_service(node: &NodeView) -> bool {
    marks::has_out_of_service_taint(node.taints())
}

/// Whether the Node's taints already match `intent` (no write needed), from the cached view.
pub(super) fn taints_match(node: &NodeView, intent: TaintIntent) -> bool {
    marks::taints_after(node.taints(), intent).is_none()
}

/// The intent re-checked against the `Ready` condition of a fresh copy: taints are added only
/// to a NotReady Node; the shutdown taint comes off only a Ready one (Go), ours also when the
/// instance runs again.
pub(super) fn intent_for(
    current: &Node,
    intent: TaintIntent,
) -> Option<Vec<k8s_openapi::api::core::v1::Taint>> {
    let ready = super::plan::is_ready(current);
    let checked = TaintIntent {
        shutdown: match intent.shutdown {
            Some(true) if ready => None,
            Some(false) if !ready => None,
            other => other,
        },
        out_of_service: match intent.out_of_service {
            Some(true) if ready => None,
            other => other,
        },
    };
    marks::taints_after(taints(current), checked)
}

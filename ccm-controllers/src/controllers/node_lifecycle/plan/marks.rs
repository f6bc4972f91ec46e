//! Pure rules of what the node-lifecycle controller shows on a Node beyond Go, each off unless
//! an operator turns it on (docs/controllers.md, "Marks the lifecycle controller puts on a
//! Node"):
//!
//! - the `CloudProviderInstanceNotFound` condition while the cloud reports the instance gone
//!   ([`condition_write`]);
//! - the `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute` taint on a Node whose
//!   instance has been shut down, and the Node NotReady, for longer than a delay
//!   ([`out_of_service_due`], [`taints_after`]).
//!
//! Neither is ever planned for a Node that is not ours: the monitor looks only at owned Nodes
//! with deletion evidence before it asks the cloud (`machinery/ownership.rs`), and both need
//! a cloud answer about the instance; an error never adds nor removes either.

use std::time::Duration;

use ccm_core::NodeView;
use ccm_core::well_known::{
    CONDITION_CLOUD_PROVIDER_INSTANCE_NOT_FOUND, CONDITION_READY, TAINT_OUT_OF_SERVICE,
};
use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{SHUTDOWN_EFFECT, has_shutdown_taint, shutdown_taint};
use ccm_core::well_known::TAINT_SHUTDOWN;

/// The value of the out-of-service taint (Kubernetes' documented `nodeshutdown`).
pub(crate) const OUT_OF_SERVICE_VALUE: &str = "nodeshutdown";
/// The effect of the out-of-service taint.
pub(crate) const OUT_OF_SERVICE_EFFECT: &str = "NoExecute";
/// Reason of the condition while the instance is reported gone.
pub(crate) const REASON_INSTANCE_NOT_FOUND: &str = "InstanceNotFound";
/// Reason of the condition once the instance is found again (or the Node is Ready).
pub(crate) const REASON_INSTANCE_FOUND: &str = "InstanceFound";

/// The `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute` taint.
pub(crate) fn out_of_service_taint() -> Taint {
    Taint {
        key: TAINT_OUT_OF_SERVICE.to_owned(),
        value: Some(OUT_OF_SERVICE_VALUE.to_owned()),
        effect: OUT_OF_SERVICE_EFFECT.to_owned(),
        ..Default::default()
    }
}

/// Whether `t` is the out-of-service taint this controller adds (key, value and effect).
fn is_out_of_service(t: &Taint) -> bool {
    t.key == TAINT_OUT_OF_SERVICE
        && t.value.as_deref() == Some(OUT_OF_SERVICE_VALUE)
        && t.effect == OUT_OF_SERVICE_EFFECT
}

/// Whether the taints hold the out-of-service taint this controller adds.
pub(crate) fn has_out_of_service_taint(taints: &[Taint]) -> bool {
    taints.iter().any(is_out_of_service)
}

/// What the controller wants of the shutdown and out-of-service taints after a check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TaintIntent {
    /// The shutdown taint: `Some(true)` add, `Some(false)` remove, `None` leave.
    pub(crate) shutdown: Option<bool>,
    /// The out-of-service taint: `Some(true)` add, `Some(false)` remove, `None` leave.
    pub(crate) out_of_service: Option<bool>,
}

/// The node's new taint list for `intent`, or `None` when it already matches. Other taints
/// keep their order; an added taint goes last.
pub(crate) fn taints_after(current: &[Taint], intent: TaintIntent) -> Option<Vec<Taint>> {
    let mut out = current.to_vec();
    let mut changed = false;
    match intent.shutdown {
        Some(true) if !has_shutdown_taint(&out) => {
            out.push(shutdown_taint());
            changed = true;
        }
        Some(false) if has_shutdown_taint(&out) => {
            out.retain(|t| !(t.key == TAINT_SHUTDOWN && t.effect == SHUTDOWN_EFFECT));
            changed = true;
        }
        _ => {}
    }
    match intent.out_of_service {
        Some(true) if !has_out_of_service_taint(&out) => {
            out.push(out_of_service_taint());
            changed = true;
        }
        Some(false) if has_out_of_service_taint(&out) => {
            out.retain(|t| !is_out_of_service(t));
            changed = true;
        }
        _ => {}
    }
    changed.then_some(out)
}

/// Whether the out-of-service taint is due: the instance has been reported shut down since
/// `shutdown_for` ago (this process's first such answer in an unbroken run of them) **and**
/// the Node's `Ready` condition has been other than `True` since `not_ready_for` ago (from
/// its `lastTransitionTime`), both at least `delay`. A Node whose `Ready` condition carries no
/// transition time (`None`) is never due: nothing shows how long it has been down.
pub(crate) fn out_of_service_due(
    shutdown_for: Duration,
    not_ready_for: Option<Duration>,
    delay: Duration,
) -> bool {
    shutdown_for >= delay && not_ready_for.is_some_and(|d| d >= delay)
}

/// How long the Node's `Ready` condition has been other than `True`, read from its
/// `lastTransitionTime` against `now` (`None`: Ready, no condition, or no transition time).
pub(crate) fn not_ready_for(node: &NodeView, now: jiff::Timestamp) -> Option<Duration> {
    let ready = node.condition(CONDITION_READY)?;
    if ready.status() == "True" {
        return None;
    }
    let since: &Time = ready.last_transition_time()?;
    let elapsed = now.duration_since(since.0);
    Some(Duration::try_from(elapsed).unwrap_or(Duration::ZERO))
}

/// The `CloudProviderInstanceNotFound` condition's status on the Node (`"True"`, `"False"`,
/// ...), `None` when it has none.
pub(crate) fn condition_status(node: &NodeView) -> Option<&str> {
    node.condition(CONDITION_CLOUD_PROVIDER_INSTANCE_NOT_FOUND)
        .map(|c| c.status())
}

/// The status to write for the condition, `None` to write nothing: `gone` (the cloud reports
/// the instance gone) wants `True`, written unless it is already `True`; not gone (the
/// instance exists, or the Node is Ready) clears a `True` condition to `False` and never adds
/// a condition to a Node that has none (no write for the Nodes that never had it).
pub(crate) fn condition_write(current: Option<&str>, gone: bool) -> Option<bool> {
    match (gone, current) {
        (true, Some("True")) => None,
        (true, _) => Some(true),
        (false, Some("True")) => Some(false),
        (false, _) => None,
    }
}

/// The strategic-merge patch of the `status` subresource that sets the condition to
/// `status` (merged by `type`, so no other condition is touched), carrying the Node's UID as
/// a precondition. The condition is only written when its status changes, so its
/// `lastTransitionTime` is always `now`.
pub(crate) fn condition_patch(uid: Option<&str>, status: bool, now: &Time) -> serde_json::Value {
    let (value, reason, message) = if status {
        (
            "True",
            REASON_INSTANCE_NOT_FOUND,
            "The cloud provider reports this Node's instance gone",
        )
    } else {
        (
            "False",
            REASON_INSTANCE_FOUND,
            "The cloud provider reports this Node's instance present",
        )
    };
    let mut patch = serde_json::json!({ "status": { "conditions": [{
        "type": CONDITION_CLOUD_PROVIDER_INSTANCE_NOT_FOUND,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
        "lastHeartbeatTime": now,
    }] } });
    if let Some(uid) = uid {
        patch["metadata"] = serde_json::json!({ "uid": uid });
    }
    patch
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.map(Into::into),
            effect: effect.into(),
            ..Default::default()
        }
    }

    #[test]
    fn out_of_service_taint_added_and_removed_alone() {
        let other = taint("a", None, "NoSchedule");
        let add = TaintIntent {
            shutdown: None,
            out_of_service: Some(true),
        };
        let added = taints_after(std::slice::from_ref(&other), add).unwrap();
        assert_eq!(added, vec![other.clone(), out_of_service_taint()]);
        assert_eq!(taints_after(&added, add), None);
        let remove = TaintIntent {
            shutdown: None,
            out_of_service: Some(false),
        };
        assert_eq!(taints_after(&added, remove), Some(vec![other.clone()]));
        assert_eq!(taints_after(std::slice::from_ref(&other), remove), None);
        // A taint of the same key with another value or effect is not ours: never removed.
        let manual = taint(TAINT_OUT_OF_SERVICE, Some("maintenance"), "NoExecute");
        assert_eq!(taints_after(std::slice::from_ref(&manual), remove), None);
        assert!(!has_out_of_service_taint(&[manual]));
    }

    #[test]
    fn both_taints_in_one_list() {
        let both = TaintIntent {
            shutdown: Some(true),
            out_of_service: Some(true),
        };
        let added = taints_after(&[], both).unwrap();
        assert_eq!(added, vec![shutdown_taint(), out_of_service_taint()]);
        let neither = TaintIntent {
            shutdown: Some(false),
            out_of_service: Some(false),
        };
        assert_eq!(taints_after(&added, neither), Some(vec![]));
        let leave = TaintIntent {
            shutdown: None,
            out_of_service: None,
        };
        assert_eq!(taints_after(&added, leave), None);
    }

    #[test]
    fn out_of_service_needs_both_durations() {
        let d = Duration::from_secs(60);
        let s = Duration::from_secs;
        assert!(out_of_service_due(s(60), Some(s(60)), d));
        assert!(out_of_service_due(s(600), Some(s(61)), d));
        assert!(!out_of_service_due(s(59), Some(s(600)), d));
        assert!(!out_of_service_due(s(600), Some(s(59)), d));
        // No transition time: never.
        assert!(!out_of_service_due(s(600), None, d));
    }

    fn view(ready: &str, since: Option<&str>) -> NodeView {
        NodeView::from(Node {
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: CONDITION_READY.into(),
                    status: ready.into(),
                    last_transition_time: since.map(|t| Time(t.parse().unwrap())),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    #[test]
    fn not_ready_duration_from_the_transition_time() {
        let now: jiff::Timestamp = "2026-01-01T00:10:00Z".parse().unwrap();
        assert_eq!(
            not_ready_for(&view("False", Some("2026-01-01T00:00:00Z")), now),
            Some(Duration::from_secs(600))
        );
        assert_eq!(
            not_ready_for(&view("Unknown", Some("2026-01-01T00:09:00Z")), now),
            Some(Duration::from_secs(60))
        );
        // A transition in the future (clock skew) counts as just now.
        assert_eq!(
            not_ready_for(&view("False", Some("2026-01-01T01:00:00Z")), now),
            Some(Duration::ZERO)
        );
        assert_eq!(
            not_ready_for(&view("True", Some("2026-01-01T00:00:00Z")), now),
            None
        );
        assert_eq!(not_ready_for(&view("False", None), now), None);
        assert_eq!(not_ready_for(&NodeView::from(Node::default()), now), None);
    }

    #[test]
    fn condition_written_only_on_a_change_of_status() {
        assert_eq!(condition_write(None, true), Some(true));
        assert_eq!(condition_write(Some("False"), true), Some(true));
        assert_eq!(condition_write(Some("True"), true), None);
        assert_eq!(condition_write(Some("True"), false), Some(false));
        // Never added to a Node that has none, nor rewritten when already cleared.
        assert_eq!(condition_write(None, false), None);
        assert_eq!(condition_write(Some("False"), false), None);
    }

    #[test]
    fn condition_patch_merges_one_condition_under_a_uid() {
        let now = Time("2026-01-01T00:00:00Z".parse().unwrap());
        let p = condition_patch(Some("u1"), true, &now);
        assert_eq!(p["metadata"]["uid"], "u1");
        let c = &p["status"]["conditions"][0];
        assert_eq!(c["type"], CONDITION_CLOUD_PROVIDER_INSTANCE_NOT_FOUND);
        assert_eq!(c["status"], "True");
        assert_eq!(c["reason"], REASON_INSTANCE_NOT_FOUND);
        assert_eq!(p["status"]["conditions"].as_array().unwrap().len(), 1);
        let cleared = condition_patch(None, false, &now);
        assert!(cleared.get("metadata").is_none());
        assert_eq!(cleared["status"]["conditions"][0]["status"], "False");
        assert_eq!(
            cleared["status"]["conditions"][0]["reason"],
            REASON_INSTANCE_FOUND
        );
    }
}

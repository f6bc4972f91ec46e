//! Pure decisions of the node-lifecycle controller (Go's `MonitorNodes`, reference §3), plus
//! the safe-deletion rule Go lacks: a Node is deleted only after its instance was reported
//! gone on two checks at least the grace period apart.
//!
//! A check is staged, because each stage needs the cloud's answer to the previous one:
//! 1. [`plan_ready`]: from the `Ready` condition, either handle a Ready node (remove the
//!    shutdown taint if present, no cloud call) or ask the cloud whether the instance exists;
//! 2. [`plan_exists`]: from that answer and when "gone" was first seen, delete, record, wait,
//!    go on to the shutdown check, or skip;
//! 3. [`plan_shutdown`]: from the shutdown answer, whether to add the shutdown taint.
//!
//! How errors count: an error (any `Err`, `InstanceNotFound` from an exists call included)
//! tells nothing about the instance. It never deletes, never confirms an earlier "gone", and
//! does not reset it either: "gone, error, gone" with the two "gone" answers at least the
//! grace period apart deletes. Only an "exists" answer, the Node becoming Ready, or the Node
//! being replaced (new UID) forgets a first "gone".

pub(crate) mod marks;

use ccm_core::well_known::TAINT_SHUTDOWN;
use ccm_core::{Node, NodeView};

use k8s_openapi::api::core::v1::Taint;
use std::time::Duration;
use tokio::time::Instant;

/// The effect of the shutdown taint.
pub(crate) const SHUTDOWN_EFFECT: &str = "NoSchedule";

/// The `node.cloudprovider.kubernetes.io/shutdown:NoSchedule` taint.
pub(crate) fn shutdown_taint() -> Taint {
    Taint {
        key: TAINT_SHUTDOWN.to_owned(),
        effect: SHUTDOWN_EFFECT.to_owned(),
        ..Default::default()
    }
}

/// Whether the node's `Ready` condition is `True` (a missing condition counts as `Unknown`).
pub(crate) fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// Whether the node carries the shutdown taint (matched on key and effect, as Go's
/// `MatchTaint`).
pub(crate) fn has_shutdown_taint(taints: &[Taint]) -> bool {
    taints
        .iter()
        .any(|t| t.key == TAINT_SHUTDOWN && t.effect == SHUTDOWN_EFFECT)
}

/// Stage 1, from the node alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadyStep {
    /// Ready: nothing to do (and forget any first "gone").
    Nothing,
    /// Ready with the shutdown taint: remove it (and forget any first "gone").
    RemoveShutdownTaint,
    /// Not Ready: ask the cloud whether the instance exists.
    CheckExists,
    /// Not Ready, but nothing shows the Node was ours (uninitialised, no provider ID of our
    /// scheme: `machinery/ownership.rs`, `deletion_evidence`): it is never deleted, and the
    /// uninitialized taint already keeps pods off it, so the cloud is not asked at all.
    NoEvidence,
}

/// Stage 1: what the `Ready` condition and the taints call for (read from the cached view:
/// every Node, every monitor period). `deletion_evidence`: whether the Node may be deleted if
/// its instance is gone.
pub(crate) fn plan_ready(node: &NodeView, deletion_evidence: bool) -> ReadyStep {
    match (node.is_ready(), has_shutdown_taint(node.taints())) {
        (true, true) => ReadyStep::RemoveShutdownTaint,
        (true, false) => ReadyStep::Nothing,
        (false, _) if !deletion_evidence => ReadyStep::NoEvidence,
        (false, _) => ReadyStep::CheckExists,
    }
}

/// The cloud's answer to "does the instance exist?".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// `Ok(true)`.
    Yes,
    /// `Ok(false)`.
    No,
    /// Any error.
    Error,
}

impl<E> From<&Result<bool, E>> for Answer {
    fn from(r: &Result<bool, E>) -> Self {
        match r {
            Ok(true) => Answer::Yes,
            Ok(false) => Answer::No,
            Err(_) => Answer::Error,
        }
    }
}

/// Stage 2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ExistsStep {
    /// Gone, confirmed: emit `DeletingNode` and delete the Node.
    Delete,
    /// Gone for the first time: remember when, delete on a later confirmation.
    RecordFirstGone,
    /// Gone again, but the grace period has not passed since the first "gone".
    AwaitConfirmation,
    /// Exists: forget any first "gone" and ask whether it is shut down.
    CheckShutdown,
    /// The cloud could not tell: change nothing.
    Skip,
}

/// Stage 2: what the exists answer calls for, given when "gone" was first seen for this node
/// (same UID), the time now and `--node-deletion-grace-period` (zero: Go's behaviour, delete
/// on the first "gone").
pub(crate) fn plan_exists(
    answer: Answer,
    first_gone: Option<Instant>,
    now: Instant,
    grace: Duration,
) -> ExistsStep {
    match answer {
        Answer::Yes => ExistsStep::CheckShutdown,
        Answer::Error => ExistsStep::Skip,
        Answer::No if grace.is_zero() => ExistsStep::Delete,
        Answer::No => match first_gone {
            None => ExistsStep::RecordFirstGone,
            Some(first) if now.saturating_duration_since(first) >= grace => ExistsStep::Delete,
            Some(_) => ExistsStep::AwaitConfirmation,
        },
    }
}

/// Stage 3: whether to add the shutdown taint, from the shutdown answer (`NotImplemented`
/// already mapped to `Ok(false)` by the caller) and the node.
pub(crate) fn plan_shutdown<E>(shutdown: &Result<bool, E>, node: &NodeView) -> bool {
    matches!(shutdown, Ok(true)) && !has_shutdown_taint(node.taints())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::node::taints;
    use ccm_core::ObjectMeta;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus};

    fn node(ready: Option<&str>, taints: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: (!taints.is_empty()).then(|| {
                    taints
                        .iter()
                        .map(|(k, e)| Taint {
                            key: (*k).into(),
                            effect: (*e).into(),
                            ..Default::default()
                        })
                        .collect()
                }),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                conditions: ready.map(|s| {
                    vec![
                        NodeCondition {
                            type_: "MemoryPressure".into(),
                            status: "True".into(),
                            ..Default::default()
                        },
                        NodeCondition {
                            type_: "Ready".into(),
                            status: s.into(),
                            ..Default::default()
                        },
                    ]
                }),
                ..Default::default()
            }),
        }
    }

    fn view(ready: Option<&str>, taints: &[(&str, &str)]) -> NodeView {
        NodeView::from(node(ready, taints))
    }

    #[test]
    fn ready_condition() {
        assert!(is_ready(&node(Some("True"), &[])));
        assert!(!is_ready(&node(Some("False"), &[])));
        assert!(!is_ready(&node(Some("Unknown"), &[])));
        assert!(!is_ready(&node(None, &[])));
        assert!(!is_ready(&Node::default()));
    }

    #[test]
    fn stage_one_without_evidence_asks_nothing() {
        for s in [Some("False"), Some("Unknown"), None] {
            assert_eq!(plan_ready(&view(s, &[]), false), ReadyStep::NoEvidence);
        }
        // Ready: the shutdown taint still comes off.
        assert_eq!(
            plan_ready(
                &view(Some("True"), &[(TAINT_SHUTDOWN, "NoSchedule")]),
                false
            ),
            ReadyStep::RemoveShutdownTaint
        );
    }

    #[test]
    fn stage_one() {
        let plan_ready = |n: &NodeView| plan_ready(n, true);
        assert_eq!(plan_ready(&view(Some("True"), &[])), ReadyStep::Nothing);
        assert_eq!(
            plan_ready(&view(Some("True"), &[(TAINT_SHUTDOWN, "NoSchedule")])),
            ReadyStep::RemoveShutdownTaint
        );
        // Same key, other effect: not our taint.
        assert_eq!(
            plan_ready(&view(Some("True"), &[(TAINT_SHUTDOWN, "NoExecute")])),
            ReadyStep::Nothing
        );
        for s in [Some("False"), Some("Unknown"), None] {
            assert_eq!(plan_ready(&view(s, &[])), ReadyStep::CheckExists);
            assert_eq!(
                plan_ready(&view(s, &[(TAINT_SHUTDOWN, "NoSchedule")])),
                ReadyStep::CheckExists
            );
        }
    }

    #[test]
    fn stage_two_exists_and_errors() {
        let now = Instant::now();
        let grace = Duration::from_secs(30);
        for first in [None, Some(now - Duration::from_secs(60))] {
            assert_eq!(
                plan_exists(Answer::Yes, first, now, grace),
                ExistsStep::CheckShutdown
            );
            // An error never deletes, even long after a first "gone".
            assert_eq!(
                plan_exists(Answer::Error, first, now, grace),
                ExistsStep::Skip
            );
            assert_eq!(
                plan_exists(Answer::Error, first, now, Duration::ZERO),
                ExistsStep::Skip
            );
        }
    }

    #[test]
    fn stage_two_grace_period() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(30);
        assert_eq!(
            plan_exists(Answer::No, None, t0, grace),
            ExistsStep::RecordFirstGone
        );
        assert_eq!(
            plan_exists(Answer::No, Some(t0), t0 + Duration::from_secs(5), grace),
            ExistsStep::AwaitConfirmation
        );
        assert_eq!(
            plan_exists(
                Answer::No,
                Some(t0),
                t0 + Duration::from_millis(29_999),
                grace
            ),
            ExistsStep::AwaitConfirmation
        );
        assert_eq!(
            plan_exists(Answer::No, Some(t0), t0 + grace, grace),
            ExistsStep::Delete
        );
        assert_eq!(
            plan_exists(Answer::No, Some(t0), t0 + Duration::from_secs(3600), grace),
            ExistsStep::Delete
        );
        // A clock that went "backwards" (first in the future) never deletes.
        assert_eq!(
            plan_exists(Answer::No, Some(t0 + grace), t0, grace),
            ExistsStep::AwaitConfirmation
        );
    }

    #[test]
    fn stage_two_zero_grace_is_go_behaviour() {
        let t0 = Instant::now();
        assert_eq!(
            plan_exists(Answer::No, None, t0, Duration::ZERO),
            ExistsStep::Delete
        );
        assert_eq!(
            plan_exists(Answer::No, Some(t0), t0, Duration::ZERO),
            ExistsStep::Delete
        );
    }

    #[test]
    fn answers_from_results() {
        assert_eq!(Answer::from(&Ok::<_, ()>(true)), Answer::Yes);
        assert_eq!(Answer::from(&Ok::<_, ()>(false)), Answer::No);
        assert_eq!(Answer::from(&Err::<bool, _>(())), Answer::Error);
    }

    #[test]
    fn stage_three() {
        let plain = view(Some("False"), &[("other", "NoSchedule")]);
        let tainted = view(Some("False"), &[(TAINT_SHUTDOWN, "NoSchedule")]);
        assert!(plan_shutdown(&Ok::<_, ()>(true), &plain));
        assert!(!plan_shutdown(&Ok::<_, ()>(true), &tainted));
        assert!(!plan_shutdown(&Ok::<_, ()>(false), &plain));
        assert!(!plan_shutdown(&Err::<bool, _>(()), &plain));
    }

    #[test]
    fn taint_lists() {
        use marks::{TaintIntent, taints_after};
        let add = TaintIntent {
            shutdown: Some(true),
            out_of_service: None,
        };
        let remove = TaintIntent {
            shutdown: Some(false),
            out_of_service: None,
        };
        let plain = node(Some("False"), &[("other", "NoSchedule")]);
        let added = taints_after(taints(&plain), add).unwrap();
        assert_eq!(added.len(), 2);
        assert_eq!(added[0].key, "other");
        assert_eq!(added[1], shutdown_taint());
        assert_eq!(taints_after(taints(&plain), remove), None);
        let tainted = node(
            Some("True"),
            &[
                ("a", "NoSchedule"),
                (TAINT_SHUTDOWN, "NoSchedule"),
                (TAINT_SHUTDOWN, "NoExecute"),
            ],
        );
        assert_eq!(taints_after(taints(&tainted), add), None);
        let removed = taints_after(taints(&tainted), remove).unwrap();
        assert_eq!(
            removed
                .iter()
                .map(|t| (t.key.as_str(), t.effect.as_str()))
                .collect::<Vec<_>>(),
            vec![("a", "NoSchedule"), (TAINT_SHUTDOWN, "NoExecute")]
        );
        let only = node(Some("True"), &[(TAINT_SHUTDOWN, "NoSchedule")]);
        assert_eq!(taints_after(taints(&only), remove), Some(vec![]));
        assert_eq!(
            taints_after(taints(&node(None, &[])), add),
            Some(vec![shutdown_taint()])
        );
    }
}

//! The load balancer's state in the Service's `status.conditions` (beyond Go, which reports it
//! only in Events): the condition [`CONDITION_LOAD_BALANCER_PROVISIONED`], `True` with reason
//! [`REASON_PROVISIONED`] once the provider ensured the load balancer, `False` with reason
//! [`REASON_SYNC_FAILED`] and the error's message when ensuring it failed (or with reason
//! [`REASON_INVALID_BACKEND_NODE_SELECTOR`] when the Service's backend selector is invalid and
//! the load balancer is left as it is), and removed when the Service is no longer served. Pure:
//! no I/O.
//!
//! `status.conditions` of a Service is merged by `type` in a strategic-merge patch, so the
//! patch names this one condition and no other writer's condition is touched.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::{Value, json};

use super::backends::REASON_INVALID_BACKEND_NODE_SELECTOR;
pub(crate) use crate::machinery::shadow::fields::CONDITION_LOAD_BALANCER_PROVISIONED;
/// Reason of the `True` condition: the provider ensured the load balancer.
pub(crate) const REASON_PROVISIONED: &str = "Provisioned";
/// Reason of the `False` condition: ensuring the load balancer failed (the message says why).
pub(crate) const REASON_SYNC_FAILED: &str = "SyncLoadBalancerFailed";

/// What the controller knows of the Service's load balancer after a sync.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LoadBalancerState {
    /// Ensured: the condition is `True`.
    Provisioned,
    /// Ensuring failed with this message: the condition is `False`.
    Failed(String),
    /// The Service's backend selector is invalid (this message says why), so the load balancer
    /// was left as it is: the condition is `False` with reason
    /// [`REASON_INVALID_BACKEND_NODE_SELECTOR`].
    InvalidBackendSelector(String),
    /// The Service is no longer served (or its load balancer was deleted): no condition.
    NotServed,
    /// The condition is not the controller's to write (`--load-balancer-status-conditions` off).
    Untouched,
}

fn current(service: &Service) -> Option<&Condition> {
    service
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
        .iter()
        .find(|c| c.type_ == CONDITION_LOAD_BALANCER_PROVISIONED)
}

/// The entry of `status.conditions` (strategic-merge, merge key `type`) that brings the
/// Service's condition to `state`, or `None` when it already says so (status, reason and
/// message; `observedGeneration` alone is no reason to write). `lastTransitionTime` is `now`
/// when the status changes and kept otherwise.
pub(crate) fn condition_entry(
    service: &Service,
    state: &LoadBalancerState,
    now: &Time,
) -> Option<Value> {
    let existing = current(service);
    let (status, reason, message) = match state {
        LoadBalancerState::NotServed => {
            return existing
                .map(|_| json!({"type": CONDITION_LOAD_BALANCER_PROVISIONED, "$patch": "delete"}));
        }
        LoadBalancerState::Untouched => return None,
        LoadBalancerState::Provisioned => ("True", REASON_PROVISIONED, String::new()),
        LoadBalancerState::Failed(message) => ("False", REASON_SYNC_FAILED, message.clone()),
        LoadBalancerState::InvalidBackendSelector(message) => (
            "False",
            REASON_INVALID_BACKEND_NODE_SELECTOR,
            message.clone(),
        ),
    };
    if let Some(c) = existing
        && c.status == status
        && c.reason == reason
        && c.message == message
    {
        return None;
    }
    let transition = match existing {
        Some(c) if c.status == status => &c.last_transition_time,
        _ => now,
    };
    let mut entry = json!({
        "type": CONDITION_LOAD_BALANCER_PROVISIONED,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition,
    });
    if let Some(generation) = service.metadata.generation {
        entry["observedGeneration"] = json!(generation);
    }
    Some(entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ServiceStatus;

    fn at(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    fn with(condition: Value) -> Service {
        Service {
            status: Some(ServiceStatus {
                conditions: Some(vec![serde_json::from_value(condition).unwrap()]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn set_on_success_and_failure_kept_when_unchanged_removed_when_not_served() {
        let now = at("2026-02-01T00:00:00Z");
        let none = Service::default();
        assert_eq!(
            condition_entry(&none, &LoadBalancerState::NotServed, &now),
            None
        );
        let ok = condition_entry(&none, &LoadBalancerState::Provisioned, &now).unwrap();
        assert_eq!(
            ok,
            json!({"type": "LoadBalancerProvisioned", "status": "True", "reason": "Provisioned", "message": "", "lastTransitionTime": "2026-02-01T00:00:00Z"})
        );
        let provisioned = with(ok);
        assert_eq!(
            condition_entry(&provisioned, &LoadBalancerState::Provisioned, &now),
            None
        );
        let failed = LoadBalancerState::Failed("quota exceeded".into());
        let later = at("2026-02-02T00:00:00Z");
        let entry = condition_entry(&provisioned, &failed, &later).unwrap();
        assert_eq!(entry["status"], "False");
        assert_eq!(entry["reason"], "SyncLoadBalancerFailed");
        assert_eq!(entry["message"], "quota exceeded");
        assert_eq!(entry["lastTransitionTime"], "2026-02-02T00:00:00Z");
        // Another message, same status: the transition time is kept.
        let failing = with(entry);
        let other = LoadBalancerState::Failed("still no quota".into());
        let entry = condition_entry(&failing, &other, &at("2026-02-03T00:00:00Z")).unwrap();
        assert_eq!(entry["lastTransitionTime"], "2026-02-02T00:00:00Z");
        assert_eq!(
            condition_entry(&failing, &LoadBalancerState::NotServed, &now).unwrap(),
            json!({"type": "LoadBalancerProvisioned", "$patch": "delete"})
        );
    }
}

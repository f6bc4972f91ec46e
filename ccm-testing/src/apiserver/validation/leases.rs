//! Lease rules (coordination.k8s.io/v1).

use serde_json::Value;

use crate::apiserver::status::FieldError;

/// Lease validation: non-negative durations and transitions.
pub(crate) fn validate_lease(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(d) = obj
        .pointer("/spec/leaseDurationSeconds")
        .and_then(Value::as_i64)
        && d <= 0
    {
        errs.push(FieldError::invalid(
            "spec.leaseDurationSeconds",
            &d.to_string(),
            "must be greater than 0",
        ));
    }
    if let Some(t) = obj
        .pointer("/spec/leaseTransitions")
        .and_then(Value::as_i64)
        && t < 0
    {
        errs.push(FieldError::invalid(
            "spec.leaseTransitions",
            &t.to_string(),
            "must be greater than or equal to 0",
        ));
    }
    errs
}

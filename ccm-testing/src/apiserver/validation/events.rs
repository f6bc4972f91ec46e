//! Event rules, for core/v1 Events and events.k8s.io/v1 Events.

use serde_json::Value;

use super::{qualified_name_errors, str_at};
use crate::apiserver::status::FieldError;

/// `legacyValidateEvent`, which every Event write passes through (both APIs; stored core
/// form): an Event about a cluster-scoped object (no `involvedObject.namespace`) lives in
/// `default` (or `kube-system` when it has an `eventTime`), any other in its object's
/// namespace; Events with an `eventTime` need `reportingComponent`, `reportingInstance`,
/// `action` and `reason`.
pub(crate) fn validate_event(obj: &Value, events_v1: bool) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let ns = str_at(obj, "/metadata/namespace").unwrap_or_default();
    let involved_ns = str_at(obj, "/involvedObject/namespace").unwrap_or_default();
    let mismatch = || {
        FieldError::invalid(
            "involvedObject.namespace",
            involved_ns,
            "does not match event.namespace",
        )
    };
    let has_time = obj.get("eventTime").is_some_and(|v| !v.is_null());
    if !has_time {
        let ok = if involved_ns.is_empty() {
            ns.is_empty() || ns == "default"
        } else {
            ns == involved_ns
        };
        if !ok {
            errs.push(mismatch());
        }
        return errs;
    }
    if involved_ns.is_empty() && ns != "default" && ns != "kube-system" {
        errs.push(mismatch());
    }
    // The events.k8s.io create validation reports these fields under their own names.
    if events_v1 {
        return errs;
    }
    for (field, limit) in [
        ("reportingComponent", 0),
        ("reportingInstance", 128),
        ("action", 128),
        ("reason", 128),
    ] {
        match str_at(obj, &format!("/{field}")) {
            None | Some("") => errs.push(FieldError::required(field, "")),
            Some(v) if limit > 0 && v.len() > limit => errs.push(FieldError::invalid(
                field,
                "",
                &format!("can have at most {limit} characters"),
            )),
            Some(_) => {}
        }
    }
    errs
}

/// events.k8s.io/v1 create validation (`ValidateEventCreate` for the v1 API).
pub(crate) fn validate_events_v1_create(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if obj.get("eventTime").is_none_or(Value::is_null) {
        errs.push(FieldError::required("eventTime", ""));
    }
    let ty = str_at(obj, "/type").unwrap_or_default();
    if ty != "Normal" && ty != "Warning" {
        errs.push(FieldError::invalid("type", ty, "has invalid value"));
    }
    let mut required = |field: &str, limit: usize| match str_at(obj, &format!("/{field}")) {
        None | Some("") => errs.push(FieldError::required(field, "")),
        Some(v) if v.len() > limit => errs.push(FieldError {
            reason: "FieldValueTooLong",
            field: field.to_string(),
            message: format!("{field}: Too long: may not be more than {limit} bytes"),
        }),
        Some(_) => {}
    };
    required("reportingController", 253);
    required("reportingInstance", 128);
    required("action", 128);
    required("reason", 128);
    if let Some(c) = str_at(obj, "/reportingController") {
        errs.extend(qualified_name_errors("reportingController", c));
    }
    if let Some(note) = str_at(obj, "/note")
        && note.len() > 1024
    {
        errs.push(FieldError {
            reason: "FieldValueTooLong",
            field: "note".into(),
            message: "note: Too long: may not be more than 1024 bytes".into(),
        });
    }
    errs
}

//! Errors as kube-apiserver reports them: a `meta.k8s.io/v1` `Status` object.

use serde_json::{Value, json};

use super::resources::ResourceInfo;

/// One field error of an `Invalid` (422) answer, as in `k8s.io/apimachinery/pkg/util/validation/field`.
#[derive(Debug, Clone)]
pub(crate) struct FieldError {
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldValueForbidden`, ...
    pub(crate) reason: &'static str,
    /// The dotted field path, e.g. `spec.providerID`.
    pub(crate) field: String,
    /// The full message, e.g. `spec.providerID: Forbidden: ...`.
    pub(crate) message: String,
}

impl FieldError {
    pub(crate) fn invalid(field: impl Into<String>, value: &str, detail: &str) -> Self {
        let field = field.into();
        let message = format!("{field}: Invalid value: {value:?}: {detail}");
        FieldError {
            reason: "FieldValueInvalid",
            field,
            message,
        }
    }

    pub(crate) fn required(field: impl Into<String>, detail: &str) -> Self {
        let field = field.into();
        let message = if detail.is_empty() {
            format!("{field}: Required value")
        } else {
            format!("{field}: Required value: {detail}")
        };
        FieldError {
            reason: "FieldValueRequired",
            field,
            message,
        }
    }

    pub(crate) fn forbidden(field: impl Into<String>, detail: &str) -> Self {
        let field = field.into();
        let message = format!("{field}: Forbidden: {detail}");
        FieldError {
            reason: "FieldValueForbidden",
            field,
            message,
        }
    }

    pub(crate) fn duplicate(field: impl Into<String>, value: &str) -> Self {
        let field = field.into();
        let message = format!("{field}: Duplicate value: {value}");
        FieldError {
            reason: "FieldValueDuplicate",
            field,
            message,
        }
    }

    pub(crate) fn not_supported(field: impl Into<String>, value: &str, supported: &[&str]) -> Self {
        let field = field.into();
        let list = supported
            .iter()
            .map(|s| format!("{s:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        let message = format!("{field}: Unsupported value: {value:?}: supported values: {list}");
        FieldError {
            reason: "FieldValueNotSupported",
            field,
            message,
        }
    }

    pub(crate) fn immutable(field: impl Into<String>, value: &str) -> Self {
        FieldError::invalid(field, value, "field is immutable")
    }
}

/// An error answer: HTTP status code plus the `Status` body kube-apiserver would send.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub(crate) code: u16,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    pub(crate) details: Option<Value>,
    pub(crate) retry_after: Option<u64>,
}

/// The `reason` kube-apiserver uses for a bare status code.
pub(crate) fn reason_for_code(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Expired",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

fn details(info: &ResourceInfo, name: &str) -> Value {
    let mut d = json!({ "name": name, "kind": info.plural });
    if !info.group.is_empty() {
        d["group"] = json!(info.group);
    }
    d
}

impl ApiError {
    pub(crate) fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(400, "BadRequest", message)
    }

    pub(crate) fn not_found(info: &ResourceInfo, name: &str) -> Self {
        ApiError {
            details: Some(details(info, name)),
            ..ApiError::new(
                404,
                "NotFound",
                format!("{} {name:?} not found", info.qualified()),
            )
        }
    }

    pub(crate) fn namespace_not_found(ns: &str) -> Self {
        ApiError {
            details: Some(json!({ "name": ns, "kind": "namespaces" })),
            ..ApiError::new(404, "NotFound", format!("namespaces {ns:?} not found"))
        }
    }

    pub(crate) fn already_exists(info: &ResourceInfo, name: &str) -> Self {
        ApiError {
            details: Some(details(info, name)),
            ..ApiError::new(
                409,
                "AlreadyExists",
                format!("{} {name:?} already exists", info.qualified()),
            )
        }
    }

    pub(crate) fn conflict(info: &ResourceInfo, name: &str, why: &str) -> Self {
        ApiError {
            details: Some(details(info, name)),
            ..ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} {name:?}: {why}",
                    info.qualified()
                ),
            )
        }
    }

    pub(crate) fn stale(info: &ResourceInfo, name: &str) -> Self {
        ApiError::conflict(
            info,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub(crate) fn invalid(info: &ResourceInfo, name: &str, errors: &[FieldError]) -> Self {
        let joined = if errors.len() == 1 {
            errors[0].message.clone()
        } else {
            format!(
                "[{}]",
                errors
                    .iter()
                    .map(|e| e.message.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| json!({ "reason": e.reason, "message": e.message, "field": e.field }))
            .collect();
        let mut d = json!({ "name": name, "kind": info.kind, "causes": causes });
        if !info.group.is_empty() {
            d["group"] = json!(info.group);
        }
        ApiError {
            details: Some(d),
            ..ApiError::new(
                422,
                "Invalid",
                format!("{} {name:?} is invalid: {joined}", info.kind),
            )
        }
    }

    pub(crate) fn expired(message: impl Into<String>) -> Self {
        ApiError::new(410, "Expired", message)
    }

    /// The `Status` object sent as the response body (or as a watch `ERROR` event's object).
    pub(crate) fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        if let Some(secs) = self.retry_after {
            let d = s
                .as_object_mut()
                .map(|o| o.entry("details").or_insert_with(|| json!({})));
            if let Some(d) = d {
                d["retryAfterSeconds"] = json!(secs);
            }
        }
        s
    }
}

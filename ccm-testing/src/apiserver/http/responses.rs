//! Response bodies: JSON objects and `Status` errors, the metadata-only (`PartialObjectMetadata`)
//! form, and the errors a test injects.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::apiserver::status::{ApiError, reason_for_code};

pub(super) fn json_response(code: u16, body: &Value) -> Response {
    let mut resp = (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        body.to_string(),
    )
        .into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

pub(super) fn error_response(e: &ApiError) -> Response {
    let mut resp = json_response(e.code, &e.to_status());
    if let Some(secs) = e.retry_after
        && let Ok(v) = HeaderValue::from_str(&secs.to_string())
    {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}

pub(super) fn not_served() -> ApiError {
    ApiError {
        details: Some(json!({})),
        ..ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }
}

/// How the client asked to see objects: full, or as `PartialObjectMetadata`.
pub(super) fn metadata_only(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=PartialObjectMetadata"))
}

pub(super) fn to_partial(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
    })
}

pub(super) fn to_partial_list(list: &Value) -> Value {
    let items: Vec<Value> = list
        .get("items")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(to_partial).collect())
        .unwrap_or_default();
    json!({
        "kind": "PartialObjectMetadataList",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list.get("metadata").cloned().unwrap_or(json!({})),
        "items": items,
    })
}

/// The error a `fail_next` rule answers with.
pub(crate) fn injected_error(status: u16, retry_after: Option<Duration>) -> ApiError {
    let reason = reason_for_code(status);
    ApiError {
        retry_after: retry_after.map(|d| d.as_secs_f64().ceil() as u64),
        ..ApiError::new(
            status,
            reason,
            format!("injected failure: {reason} ({status})"),
        )
    }
}

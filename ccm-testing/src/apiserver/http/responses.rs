//! Response bodies: JSON objects and `Status` errors, the metadata-only (`PartialObjectMetadata`)
//! form, and the errors a test injects.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};

use crate::apiserver::resources::ResourceInfo;
use crate::apiserver::state::{ListPage, StoredObject};
use crate::apiserver::status::{ApiError, reason_for_code};

pub(super) fn json_response(code: u16, body: &Value) -> Response {
    text_response(code, body.to_string())
}

/// A response whose body is JSON text already.
pub(super) fn text_response(code: u16, body: impl Into<Body>) -> Response {
    let mut resp = (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        body.into(),
    )
        .into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// A list body larger than this is streamed in chunks of about this size.
const LIST_CHUNK: usize = 256 * 1024;

/// The body of a list response, written from the page's shared objects: their stored texts
/// as they are (events.k8s.io and metadata-only lists convert each item), one chunk at a time,
/// so a list of 100,000 Nodes is never one string in memory.
struct ListBody {
    info: &'static ResourceInfo,
    items: std::vec::IntoIter<Arc<StoredObject>>,
    meta_only: bool,
    head: Option<String>,
    tail: Option<String>,
    first: bool,
}

impl ListBody {
    fn push_item(&mut self, buf: &mut String, obj: &StoredObject) {
        if !std::mem::take(&mut self.first) {
            buf.push(',');
        }
        if self.meta_only {
            buf.push_str(&to_partial(&obj.value()).to_string());
        } else {
            buf.push_str(&obj.list_item(self.info));
        }
    }
}

impl ListBody {
    /// The next part of the body, of about `size` bytes (empty at the end).
    fn fill(&mut self, size: usize) -> String {
        let mut buf = self.head.take().unwrap_or_default();
        while buf.len() < size {
            match self.items.next() {
                Some(obj) => self.push_item(&mut buf, &obj),
                None => {
                    if let Some(tail) = self.tail.take() {
                        buf.push_str(&tail);
                    }
                    break;
                }
            }
        }
        buf
    }
}

impl Iterator for ListBody {
    type Item = Result<Bytes, Infallible>;

    fn next(&mut self) -> Option<Self::Item> {
        let buf = self.fill(LIST_CHUNK);
        (!buf.is_empty()).then(|| Ok(Bytes::from(buf)))
    }
}

/// The `200` answer to a list: `<Kind>List` (or `PartialObjectMetadataList`) with the page's
/// items, as kube-apiserver writes it (and as `serde_json` orders the keys).
pub(super) fn list_response(
    info: &'static ResourceInfo,
    page: ListPage,
    meta_only: bool,
) -> Response {
    let (api_version, kind) = if meta_only {
        (
            "meta.k8s.io/v1".to_string(),
            "PartialObjectMetadataList".to_string(),
        )
    } else {
        (info.api_version(), format!("{}List", info.kind))
    };
    let size: usize = page.items.iter().map(|o| o.text().len() + 1).sum();
    let mut body = ListBody {
        info,
        head: Some(format!(
            "{{\"apiVersion\":{},\"items\":[",
            json!(api_version)
        )),
        tail: Some(format!(
            "],\"kind\":{},\"metadata\":{}}}",
            json!(kind),
            page.metadata()
        )),
        items: page.items.into_iter(),
        meta_only,
        first: true,
    };
    if size < LIST_CHUNK {
        return text_response(200, body.fill(usize::MAX));
    }
    text_response(200, Body::from_stream(futures::stream::iter(body)))
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

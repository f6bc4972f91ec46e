//! The request path of the in-process API server without a socket, for the fuzz targets of
//! `fuzz/` (feature `fuzzing`, off by default; not part of the harness a vendor uses).

use std::sync::Arc;

use axum::extract::State as AxState;
use axum::http::{HeaderMap, HeaderValue, Method, Uri, header};
use bytes::Bytes;

use super::Inner;

/// The message of the one `500` the server answers on purpose: kube-apiserver's to a create
/// that sets `metadata.resourceVersion` (its storage layer's plain error, reported as an
/// internal error). Any other `500` is a bug of the server.
pub const INTENDED_INTERNAL_ERROR: &str = super::state::RESOURCE_VERSION_ON_CREATE;

/// What the server answered a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FuzzAnswer {
    /// The HTTP status code.
    pub status: u16,
    /// The `message` of the `Status` object of an error answer (status 400 and above); `None`
    /// for a success, whose body (a watch's stream among them) is not read.
    pub message: Option<String>,
}

/// A server's state and the request path, called directly.
#[derive(Debug)]
pub struct FuzzServer {
    inner: Arc<Inner>,
    runtime: tokio::runtime::Runtime,
}

impl FuzzServer {
    /// An empty server on a current-thread runtime.
    ///
    /// # Panics
    ///
    /// If no tokio runtime can be built (a broken environment).
    #[allow(clippy::expect_used)] // fuzzing only: nothing can run without a runtime
    pub fn new() -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime");
        let inner = Inner::new();
        // Off: the built-in namespace controller's task is not running here.
        inner
            .namespace_controller
            .store(false, std::sync::atomic::Ordering::SeqCst);
        inner
            .record_bodies
            .store(false, std::sync::atomic::Ordering::SeqCst);
        FuzzServer { inner, runtime }
    }

    /// Handles one request as the server would and returns its status code and, for an error,
    /// the `Status` message (a watch's stream is not read). A method or URI that HTTP itself
    /// rejects is `None`.
    pub fn request(
        &self,
        method: &str,
        uri: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Option<FuzzAnswer> {
        let method = Method::from_bytes(method.as_bytes()).ok()?;
        let uri: Uri = uri.parse().ok()?;
        let mut headers = HeaderMap::new();
        if let Some(ct) = content_type {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_str(ct).ok()?);
        }
        let body = Bytes::copy_from_slice(body);
        let inner = self.inner.clone();
        let answer = self.runtime.block_on(async move {
            let resp = super::http::handle(AxState(inner), method, uri, headers, body).await;
            let status = resp.status().as_u16();
            let message = if status >= 400 {
                let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
                    .await
                    .unwrap_or_default();
                let status_object: serde_json::Value =
                    serde_json::from_slice(&bytes).unwrap_or_default();
                Some(
                    status_object["message"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            } else {
                None
            };
            FuzzAnswer { status, message }
        });
        // The request log would grow without bound over a fuzzing run.
        super::lock(&self.inner.requests).clear();
        Some(answer)
    }
}

impl Default for FuzzServer {
    fn default() -> Self {
        Self::new()
    }
}

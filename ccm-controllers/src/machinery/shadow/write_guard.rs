//! The write guard: a tower layer on every Kubernetes client of a shadow process (the
//! outermost layer, so it sees each request as kube built it). Reads (`GET`, `HEAD`) pass
//! untouched; every write is sent as a dry run, with `dryRun: All` where kube-apiserver reads
//! that request's options (the server validates, admits and authorises it as the real write,
//! persists nothing, and answers with the object as it would be); an Event is answered here and
//! never sent; a write the guard cannot make a dry run is never sent. A dry-run write to a Node
//! or a Service is compared with the cached object ([`super::fields`]) and each differing field
//! is handed to the recorder; a rejected one (validation, admission, a conflict) is logged.
//!
//! # Where kube-apiserver reads each write's options, and why each is safe
//!
//! The handlers are in `k8s.io/apiserver/pkg/endpoints/handlers/`; the forms are in
//! `dry_run.rs`.
//!
//! | Request (who sends it) | Where the server reads `dryRun` | What the guard sends |
//! |---|---|---|
//! | `POST` create (`create.go`): none of the controllers; a provider's own client may | `CreateOptions` from the query only; the body is the object | `?dryRun=All` |
//! | `PUT` update (`update.go`), subresources included (`nodes/status`, ...) | `UpdateOptions` from the query only | `?dryRun=All` |
//! | `PATCH` (`patch.go`): Node labels, taints, `spec.providerID`; `nodes/status` addresses and `NetworkUnavailable`; `services/status` ingress and the cleanup finalizer | `PatchOptions` from the query only; the body is the patch | `?dryRun=All` |
//! | `DELETE` one object (`delete.go`, `DeleteResource`): a Node whose instance is gone | `DeleteOptions` from the **body** when it is not empty (kube's client always sends one, `{}` at least), the query only when it is empty | `dryRun: ["All"]` set in the body (a `DeleteOptions` created when empty; its other options, e.g. the UID precondition, kept) **and** `?dryRun=All` |
//! | `DELETE` a collection (`delete.go`, `DeleteCollection`): none of the controllers | as a delete: the body when not empty, else the query (the list options are always the query's) | as a delete |
//! | `POST pods/<name>/eviction` (`pkg/registry/core/pod/storage/eviction.go`): none of the controllers | the Eviction body's `deleteOptions.dryRun` when set, else the query's (`propagateDryRun`) | `deleteOptions.dryRun: ["All"]` in the body and `?dryRun=All` |
//! | Events (`events.k8s.io` or core, any verb): every controller's recorder | — | never sent: answered here with the Event itself, as created; counted `result="not_sent"` |
//! | Leases | — | none: a shadow takes no Lease (no leader election) |
//! | ServiceAccounts and their tokens (`serviceaccounts/token`, `--use-service-account-credentials`) | — | none: a shadow ignores `--use-service-account-credentials` (`runtime/shadow.rs`) and every controller uses the root credentials |
//! | TokenReview, SubjectAccessReview (`POST`, secure serving's delegated authentication and authorisation, sent with the root client, so through this guard) | `CreateOptions` from the query; neither review persists anything, dry run or not (`pkg/registry/authentication/tokenreview`, `pkg/registry/authorization/subjectaccessreview`) | `?dryRun=All`; answered as usual |
//! | Any other method (`OPTIONS`, `TRACE`, ...) | — | never sent: refused |
//!
//! A body the guard must rewrite but cannot (not JSON, e.g. protobuf or YAML; not a JSON
//! object; a streaming body) is never sent: the guard answers `400 BadRequest` itself, logs a
//! warning and counts `shadow_dry_run_writes_total{result="refused"}`.
//!
//! # A dry-run delete the shadow's identity may not make
//!
//! kube-apiserver authorises a dry run as the real request, so under the recommended shadow
//! RBAC (`examples/deploy/shadow/`: every write verb the controllers use except `delete` and
//! `deletecollection`) a dry-run delete is answered `403`. The guard then records the planned
//! deletion as a successful dry-run delete does, counts it `result="forbidden"`, and answers the
//! controller as a successful dry run would (`200`, a `Status` of `Success`): the controller
//! goes on as it would beside a server that allowed the dry run, instead of taking its error
//! path (a `DeletingNodeFailed` warning every monitor period for what is, in a shadow, the
//! expected refusal). The first such refusal is logged once at INFO.
//!
//! Hand-written: no crate offers a request-rewriting layer that also reads the response body;
//! it is one `Service` impl over `http` types.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use k8s_openapi::api::core::v1::{Node, Service};
use serde_json::{Value, json};
use tower::{BoxError, Layer};

use super::dry_run::{
    Form, Target, delete_options_body, eviction_body, form, target, verb, with_dry_run_query,
};
use super::fields::{
    FIELD_NODE_DELETED, FieldDiff, diff, fold_aliases, node_fields, node_pending, service_fields,
    service_pending,
};
use super::{Planned, Shadow};

/// The layer: one per client, naming the controller (the client name) its writes belong to.
#[derive(Clone, Debug)]
pub(crate) struct WriteGuardLayer {
    shadow: Arc<Shadow>,
    controller: Arc<str>,
}

impl WriteGuardLayer {
    /// Guards the writes of the client named `controller`.
    pub(crate) fn new(shadow: Arc<Shadow>, controller: &str) -> Self {
        WriteGuardLayer {
            shadow,
            controller: controller.into(),
        }
    }
}

impl<S> Layer<S> for WriteGuardLayer {
    type Service = WriteGuard<S>;
    fn layer(&self, inner: S) -> WriteGuard<S> {
        WriteGuard {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`WriteGuardLayer`].
#[derive(Debug)]
pub(crate) struct WriteGuard<S> {
    inner: S,
    layer: WriteGuardLayer,
}

type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type GuardBody<B> = Either<B, Full<Bytes>>;
type GuardFuture<B> = BoxFut<Result<Response<GuardBody<B>>, BoxError>>;
/// Rewrites a request body (given its `Content-Type`) so the server reads `dryRun: All` in it;
/// `Err` says why it cannot.
type BodyRewrite = fn(Option<&str>, &[u8]) -> Result<Vec<u8>, String>;

/// A body sent as it is (the options are in the query).
fn keep_body(_content_type: Option<&str>, body: &[u8]) -> Result<Vec<u8>, String> {
    Ok(body.to_vec())
}

/// The bytes of a request body kube built in one piece, without waiting; `None` for a
/// streaming body (kube builds every request body in one piece; a streaming one is refused).
fn whole_body(body: kube::client::Body) -> Option<Bytes> {
    let mut collect = std::pin::pin!(body.collect_bytes());
    match collect
        .as_mut()
        .poll(&mut Context::from_waker(std::task::Waker::noop()))
    {
        Poll::Ready(Ok(bytes)) => Some(bytes),
        _ => None,
    }
}

/// `req` made a dry run: `dryRun=All` in its query, its body rewritten by `rewrite` (with
/// `Content-Type` and `Content-Length` to match). `Err` with the reason when it cannot be.
#[allow(clippy::result_large_err)]
fn dry_run_request(
    req: Request<kube::client::Body>,
    rewrite: BodyRewrite,
) -> Result<Request<kube::client::Body>, (Request<kube::client::Body>, String)> {
    let (mut parts, body) = req.into_parts();
    let refused = |parts: http::request::Parts, reason: String| {
        Err((
            Request::from_parts(parts, kube::client::Body::empty()),
            reason,
        ))
    };
    match with_dry_run_query(&parts.uri) {
        Ok(uri) => parts.uri = uri,
        Err(e) => return refused(parts, format!("cannot add dryRun=All to its URL: {e}")),
    }
    let Some(bytes) = whole_body(body) else {
        return refused(parts, "its body is a stream".to_owned());
    };
    let content_type = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let rewritten = match rewrite(content_type, &bytes) {
        Ok(b) => b,
        Err(reason) => return refused(parts, reason),
    };
    if rewritten != bytes {
        parts.headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
    }
    parts.headers.remove(http::header::CONTENT_LENGTH);
    if !rewritten.is_empty() {
        parts.headers.insert(
            http::header::CONTENT_LENGTH,
            http::HeaderValue::from(rewritten.len()),
        );
    }
    Ok(Request::from_parts(
        parts,
        kube::client::Body::from(rewritten),
    ))
}

/// A local answer with a JSON `body`.
fn json_answer<B>(status: StatusCode, body: impl Into<Bytes>) -> Response<GuardBody<B>> {
    let mut resp = Response::new(Either::Right(Full::new(body.into())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

/// The `Status` kube-apiserver answers a successful delete with.
fn deleted_status(resource: &str, name: Option<&str>) -> Vec<u8> {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": name.unwrap_or_default(), "kind": resource},
    })
    .to_string()
    .into_bytes()
}

/// A write not sent: answered `400` here, logged, counted `result="refused"`.
fn refuse<B: Send + 'static>(
    shadow: &Shadow,
    controller: &str,
    resource: &str,
    verb: &str,
    req: &Request<kube::client::Body>,
    reason: &str,
) -> GuardFuture<B> {
    shadow.count_write(resource, verb, "refused");
    tracing::warn!(
        controller = %controller,
        method = %req.method(),
        path = %req.uri().path(),
        "shadow: a write was not sent, it cannot be made a dry run: {reason}"
    );
    let status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "reason": "BadRequest",
        "code": 400,
        "message": format!("shadow mode: not sent, the write cannot be made a dry run: {reason}"),
    });
    let resp = json_answer(StatusCode::BAD_REQUEST, status.to_string().into_bytes());
    Box::pin(async move { Ok(resp) })
}

impl<S, RB> tower::Service<Request<kube::client::Body>> for WriteGuard<S>
where
    S: tower::Service<Request<kube::client::Body>, Response = Response<RB>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    RB: hyper::body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Response<GuardBody<RB>>;
    type Error = BoxError;
    type Future = GuardFuture<RB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<kube::client::Body>) -> Self::Future {
        let method = req.method().clone();
        let target = target(req.uri().path());
        let verb = verb(&method, target.as_ref());
        let resource = target
            .as_ref()
            .map_or("", |t| t.resource.as_str())
            .to_owned();
        let shadow = self.layer.shadow.clone();
        let controller = self.layer.controller.clone();
        let body_rewrite: BodyRewrite = match form(&method, target.as_ref()) {
            Form::Read => {
                let fut = self.inner.call(req);
                return Box::pin(async move {
                    let resp = fut.await.map_err(Into::into)?;
                    Ok(resp.map(Either::Left))
                });
            }
            Form::Event => {
                // Never sent: answered with the Event itself, as a created one.
                shadow.count_write("events", verb, "not_sent");
                return Box::pin(async move {
                    let body = req.into_body().collect_bytes().await?;
                    Ok(json_answer(StatusCode::CREATED, body))
                });
            }
            Form::Refused(reason) => {
                return refuse(&shadow, &controller, &resource, verb, &req, &reason);
            }
            Form::Query => keep_body,
            Form::DeleteOptionsBody => delete_options_body,
            Form::EvictionBody => eviction_body,
        };
        let req = match dry_run_request(req, body_rewrite) {
            Ok(req) => req,
            Err((req, reason)) => {
                return refuse(&shadow, &controller, &resource, verb, &req, &reason);
            }
        };
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await.map_err(Into::into)?;
            let compared = resource == "nodes" || resource == "services";
            if !compared && resp.status().is_success() {
                shadow.count_write(&resource, verb, "dry_run");
                return Ok(resp.map(Either::Left));
            }
            let (parts, body) = resp.into_parts();
            let bytes = body.collect().await.map_err(Into::into)?.to_bytes();
            let name = target.as_ref().and_then(|t| t.name.as_deref());
            if parts.status.is_success() {
                shadow.count_write(&resource, verb, "dry_run");
                if let Some(t) = &target {
                    shadow.compare_write(&controller, &method, t, &bytes);
                }
            } else if parts.status == StatusCode::FORBIDDEN && method == Method::DELETE {
                // The identity may not delete (the recommended shadow RBAC): the planned
                // deletion is recorded and answered as a successful dry run (module docs).
                shadow.count_write(&resource, verb, "forbidden");
                shadow.note_forbidden_delete(&controller, &resource);
                if let Some(t) = &target {
                    shadow.compare_write(&controller, &method, t, &bytes);
                }
                return Ok(json_answer(StatusCode::OK, deleted_status(&resource, name)));
            } else {
                shadow.count_write(&resource, verb, "rejected");
                let message = serde_json::from_slice::<Value>(&bytes)
                    .ok()
                    .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
                    .unwrap_or_default();
                tracing::warn!(
                    controller = %controller,
                    resource = %resource,
                    name = name.unwrap_or_default(),
                    status = parts.status.as_u16(),
                    "shadow: the API server rejected a dry-run write: {message}"
                );
            }
            Ok(Response::from_parts(parts, Either::Right(Full::new(bytes))))
        })
    }
}

/// The planned changes of one object's differing fields, beta label aliases folded.
fn planned_fields(
    controller: &str,
    kind: &'static str,
    object: &str,
    pending: bool,
    diffs: Vec<(String, Value, Value)>,
) -> Vec<Planned> {
    fold_aliases(diffs)
        .into_iter()
        .map(
            |FieldDiff {
                 field,
                 incumbent,
                 ours,
                 also,
             }| Planned {
                controller: controller.to_owned(),
                kind,
                object: object.to_owned(),
                field,
                also,
                incumbent,
                ours,
                pending,
            },
        )
        .collect()
}

impl Shadow {
    /// Compares a successful dry-run write with the cached object.
    fn compare_write(&self, controller: &str, method: &Method, t: &Target, body: &[u8]) {
        let Some(name) = t.name.as_deref() else {
            return;
        };
        let planned = match (t.resource.as_str(), method) {
            ("nodes", &Method::DELETE) => {
                let pending = self.cached_node(name).is_none_or(|n| node_pending(&n));
                vec![Planned {
                    controller: controller.to_owned(),
                    kind: "Node",
                    object: name.to_owned(),
                    field: FIELD_NODE_DELETED.to_owned(),
                    also: Vec::new(),
                    incumbent: json!("exists"),
                    ours: json!("deleted"),
                    pending,
                }]
            }
            ("nodes", _) => {
                let (Some(before), Ok(after)) =
                    (self.cached_node(name), serde_json::from_slice::<Node>(body))
                else {
                    return;
                };
                let pending = node_pending(&before);
                planned_fields(
                    controller,
                    "Node",
                    name,
                    pending,
                    diff(&node_fields(&before), &node_fields(&after)),
                )
            }
            ("services", &Method::DELETE) => return,
            ("services", _) => {
                let ns = t.namespace.as_deref().unwrap_or_default();
                let (Some(before), Ok(after)) = (
                    self.cached_service(ns, name),
                    serde_json::from_slice::<Service>(body),
                ) else {
                    return;
                };
                let pending = service_pending(&before);
                planned_fields(
                    controller,
                    "Service",
                    &format!("{ns}/{name}"),
                    pending,
                    diff(&service_fields(&before), &service_fields(&after)),
                )
            }
            _ => return,
        };
        self.observe(planned);
    }
}

#[cfg(test)]
mod tests;

//! The write guard: a tower layer on every Kubernetes client of a shadow process. Reads
//! (`GET`, `HEAD`) pass untouched; every other request is sent with `dryRun=All` (the API
//! server validates and admits it, persists nothing, and answers with the object as it would
//! be), except an Event, which is answered here and never sent. A dry-run write to a Node or a
//! Service is compared with the cached object ([`super::fields`]) and each differing field is
//! handed to the recorder; a rejected one (validation, admission, a conflict) is logged.
//!
//! Hand-written: no crate offers a request-rewriting layer that also reads the response body;
//! it is one `Service` impl over `http` types.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Either, Full};
use k8s_openapi::api::core::v1::{Node, Service};
use serde_json::{Value, json};
use tower::{BoxError, Layer};

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

/// What a request path names: `(namespace, resource, name, subresource)`.
#[derive(Debug, PartialEq)]
struct Target {
    namespace: Option<String>,
    resource: String,
    name: Option<String>,
}

/// Parses `/api/v1/...` and `/apis/<group>/<version>/...` paths.
fn target(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match parts.first() {
        Some(&"api") => parts.get(2..)?,
        Some(&"apis") => parts.get(3..)?,
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, resource, tail @ ..] => (Some((*ns).to_owned()), {
            let mut v = vec![*resource];
            v.extend_from_slice(tail);
            v
        }),
        other => (None, other.to_vec()),
    };
    Some(Target {
        namespace,
        resource: (*rest.first()?).to_owned(),
        name: rest.get(1).map(|s| (*s).to_owned()),
    })
}

/// `uri` with `dryRun=All` added to its query.
fn dry_run(uri: &Uri) -> Result<Uri, http::Error> {
    let path = uri.path();
    let pq = match uri.query() {
        Some(q) if !q.is_empty() => format!("{path}?{q}&dryRun=All"),
        _ => format!("{path}?dryRun=All"),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(pq.parse()?);
    Ok(Uri::from_parts(parts)?)
}

fn verb(method: &Method) -> &'static str {
    match *method {
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "unknown",
    }
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
    type Future = BoxFut<Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Request<kube::client::Body>) -> Self::Future {
        let method = req.method().clone();
        if method == Method::GET || method == Method::HEAD {
            let fut = self.inner.call(req);
            return Box::pin(async move {
                let resp = fut.await.map_err(Into::into)?;
                Ok(resp.map(Either::Left))
            });
        }
        let shadow = self.layer.shadow.clone();
        let target = target(req.uri().path());
        let resource = target
            .as_ref()
            .map_or("", |t| t.resource.as_str())
            .to_owned();
        if resource == "events" {
            // Never sent: answered with the Event itself, as a created one.
            shadow.count_write("events", verb(&method), "not_sent");
            return Box::pin(async move {
                let body = req.into_body().collect_bytes().await?;
                let mut resp = Response::new(Either::Right(Full::new(body)));
                *resp.status_mut() = StatusCode::CREATED;
                resp.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/json"),
                );
                Ok(resp)
            });
        }
        match dry_run(req.uri()) {
            Ok(uri) => *req.uri_mut() = uri,
            Err(e) => {
                // Never send a write that could not be made a dry run.
                let e: BoxError = format!("shadow mode: cannot add dryRun=All: {e}").into();
                return Box::pin(async move { Err(e) });
            }
        }
        let controller = self.layer.controller.clone();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await.map_err(Into::into)?;
            let compared = resource == "nodes" || resource == "services";
            if !compared && resp.status().is_success() {
                shadow.count_write(&resource, verb(&method), "dry_run");
                return Ok(resp.map(Either::Left));
            }
            let (parts, body) = resp.into_parts();
            let bytes = body.collect().await.map_err(Into::into)?.to_bytes();
            if parts.status.is_success() {
                shadow.count_write(&resource, verb(&method), "dry_run");
                if let Some(t) = &target {
                    shadow.compare_write(&controller, &method, t, &bytes);
                }
            } else {
                shadow.count_write(&resource, verb(&method), "rejected");
                let message = serde_json::from_slice::<Value>(&bytes)
                    .ok()
                    .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
                    .unwrap_or_default();
                tracing::warn!(
                    controller = %controller,
                    resource = %resource,
                    name = target.as_ref().and_then(|t| t.name.as_deref()).unwrap_or_default(),
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
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_resource_namespace_and_object() {
        assert_eq!(
            target("/api/v1/nodes/n1/status"),
            Some(Target {
                namespace: None,
                resource: "nodes".into(),
                name: Some("n1".into())
            })
        );
        assert_eq!(
            target("/api/v1/namespaces/ns/services/s/status"),
            Some(Target {
                namespace: Some("ns".into()),
                resource: "services".into(),
                name: Some("s".into())
            })
        );
        assert_eq!(
            target("/apis/events.k8s.io/v1/namespaces/ns/events").map(|t| t.resource),
            Some("events".into())
        );
    }

    #[test]
    fn dry_run_is_added_to_any_query() {
        let u: Uri = "http://h/api/v1/nodes/n?fieldManager=x"
            .parse()
            .unwrap_or_default();
        assert_eq!(
            dry_run(&u).map(|u| u.to_string()).unwrap_or_default(),
            "http://h/api/v1/nodes/n?fieldManager=x&dryRun=All"
        );
        let u: Uri = "/api/v1/nodes/n".parse().unwrap_or_default();
        assert_eq!(
            dry_run(&u).map(|u| u.to_string()).unwrap_or_default(),
            "/api/v1/nodes/n?dryRun=All"
        );
    }
}

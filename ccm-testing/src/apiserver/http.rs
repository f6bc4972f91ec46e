//! Routing, request parsing, responses and watch streams.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Query, State as AxState};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use super::rbac::{self, Attributes, Identity};
use super::resources::{self, ResourceInfo};
use super::selector::{FieldSelector, LabelSelector};
use super::state::{Change, ListOptions, PatchType, change_kind, filter_change};
use super::status::{ApiError, reason_for_code};
use super::{Inner, RequestRecord};

/// The parsed target of a request.
#[derive(Debug, Default, Clone)]
struct Target {
    group: String,
    version: String,
    resource: String,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

fn parse_path(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let mut t = Target {
        group: group.to_string(),
        version: version.to_string(),
        ..Target::default()
    };
    let rest: &[&str] = match rest {
        ["namespaces", ns, res, tail @ ..] if *res != "status" && *res != "finalize" => {
            t.namespace = Some((*ns).to_string());
            t.resource = (*res).to_string();
            tail
        }
        [res, tail @ ..] => {
            t.resource = (*res).to_string();
            tail
        }
        [] => return Some(t),
    };
    match rest {
        [] => {}
        [name] => t.name = Some((*name).to_string()),
        [name, sub] => {
            t.name = Some((*name).to_string());
            t.subresource = Some((*sub).to_string());
        }
        _ => return None,
    }
    Some(t)
}

fn json_response(code: u16, body: &Value) -> Response {
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

fn error_response(e: &ApiError) -> Response {
    let mut resp = json_response(e.code, &e.to_status());
    if let Some(secs) = e.retry_after
        && let Ok(v) = HeaderValue::from_str(&secs.to_string())
    {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}

fn not_served() -> ApiError {
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
fn metadata_only(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=PartialObjectMetadata"))
}

fn to_partial(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
    })
}

fn to_partial_list(list: &Value) -> Value {
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

fn parse_body(body: &Bytes, yaml_ok: bool) -> Result<Value, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(v) => Ok(v),
        Err(e) if yaml_ok => serde_norway::from_slice::<Value>(body)
            .map_err(|_| ApiError::bad_request(format!("error decoding YAML: {e}"))),
        Err(e) => Err(ApiError::bad_request(format!(
            "couldn't get version/kind; json parse error: {e}"
        ))),
    }
}

fn verb_of(method: &Method, t: &Target, watch: bool) -> &'static str {
    match (method.as_str(), t.name.is_some()) {
        ("GET", true) if watch => "watch",
        ("GET", true) => "get",
        ("GET", false) if watch => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    }
}

/// The single entry point: every request lands here.
pub(crate) async fn handle(
    AxState(inner): AxState<Arc<Inner>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let query: Vec<(String, String)> = Query::<Vec<(String, String)>>::try_from_uri(&uri)
        .map(|q| q.0)
        .unwrap_or_default();
    let param = |k: &str| {
        query
            .iter()
            .find(|(qk, _)| qk == k)
            .map(|(_, v)| v.as_str())
    };
    let watch = matches!(param("watch"), Some("true") | Some("1"));
    let target = parse_path(uri.path());
    let header_str = |h: header::HeaderName| {
        headers
            .get(h)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let t = target.clone().unwrap_or_default();
    let mut record = RequestRecord {
        verb: verb_of(&method, &t, watch).to_string(),
        method: method.to_string(),
        path: uri.path().to_string(),
        query: uri.query().unwrap_or_default().to_string(),
        group: t.group.clone(),
        version: t.version.clone(),
        resource: t.resource.clone(),
        subresource: t.subresource.clone(),
        namespace: t.namespace.clone(),
        name: t.name.clone(),
        content_type: header_str(header::CONTENT_TYPE),
        user_agent: header_str(header::USER_AGENT),
        status: 0,
        patch_type: (method == Method::PATCH)
            .then(|| patch_type_of(&headers).ok())
            .flatten(),
        body: if inner.records_bodies() {
            recorded_body(&body)
        } else {
            None
        },
        user: None,
        groups: Vec::new(),
    };

    let latency = inner.latency();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }

    let identity = match authenticate(&inner, &headers) {
        Ok(identity) => identity,
        Err(e) => {
            let resp = error_response(&e);
            record.status = resp.status().as_u16();
            inner.record(record);
            return resp;
        }
    };
    record.user = Some(identity.username.clone());
    record.groups = identity.groups.clone();
    if inner.rbac_enabled() {
        let resource_request = target.as_ref().is_some_and(|t| !t.resource.is_empty());
        let attrs = Attributes {
            // A non-resource request's verb is its lower-cased HTTP method.
            verb: if resource_request {
                record.verb.clone()
            } else {
                method.as_str().to_lowercase()
            },
            resource_request,
            group: t.group.clone(),
            resource: t.resource.clone(),
            subresource: t.subresource.clone(),
            namespace: t.namespace.clone(),
            name: t
                .name
                .clone()
                .or_else(|| name_from_field_selector(param("fieldSelector"))),
            path: uri.path().to_string(),
        };
        let allowed = rbac::allows(&inner.state(), &identity, &attrs);
        if !allowed {
            let mut details = json!({ "kind": t.resource });
            if let Some(n) = &attrs.name {
                details["name"] = json!(n);
            }
            if !t.group.is_empty() {
                details["group"] = json!(t.group);
            }
            let e = ApiError {
                details: Some(details),
                ..ApiError::new(403, "Forbidden", rbac::forbidden_message(&identity, &attrs))
            };
            let resp = error_response(&e);
            record.status = resp.status().as_u16();
            inner.record(record);
            return resp;
        }
    }

    let resp = if let Some(e) = inner.take_fault(&record) {
        if record.verb == "watch" && e.code == 410 {
            // kube-apiserver sends an expired watch as a 200 stream with one ERROR event.
            watch_error_response(&e)
        } else {
            error_response(&e)
        }
    } else {
        match uri.path() {
            "/version" => json_response(
                200,
                &json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-ccm-testing", "platform": "linux/amd64"}),
            ),
            "/healthz" | "/livez" | "/readyz" => (StatusCode::OK, "ok").into_response(),
            "/api" => json_response(
                200,
                &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
            ),
            "/apis" => json_response(200, &discovery_groups()),
            p if discovery_resources(p).is_some() => {
                json_response(200, &discovery_resources(p).unwrap_or_default())
            }
            p if super::reviews::Reviews::handles(method.as_str(), p) => {
                let answer = inner.reviews.serve(p, &body, &inner.state());
                match answer {
                    Ok(review) => json_response(201, &review),
                    Err(e) => error_response(&e),
                }
            }
            _ => match target {
                None => error_response(&not_served()),
                Some(t) => serve(&inner, &method, &t, &query, &headers, &body, watch)
                    .await
                    .unwrap_or_else(|e| error_response(&e)),
            },
        }
    };
    record.status = resp.status().as_u16();
    inner.record(record);
    resp
}

/// The request body as the request log keeps it: JSON (or YAML, for apply) as a value, any
/// other body as a string; `None` when empty.
fn recorded_body(body: &Bytes) -> Option<Value> {
    if body.is_empty() {
        return None;
    }
    serde_json::from_slice::<Value>(body)
        .ok()
        .or_else(|| serde_norway::from_slice::<Value>(body).ok())
        .or_else(|| Some(Value::String(String::from_utf8_lossy(body).into_owned())))
}

/// The patch type named by a PATCH request's `Content-Type`.
fn patch_type_of(headers: &HeaderMap) -> Result<PatchType, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let ct = ct.split(';').next().unwrap_or_default().trim();
    match ct {
        "application/merge-patch+json" => Ok(PatchType::Merge),
        "application/json-patch+json" => Ok(PatchType::Json),
        "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
        "application/apply-patch+yaml" | "application/apply-patch+cbor" => Ok(PatchType::Apply),
        other => Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {other:?})"
            ),
        )),
    }
}

/// `metadata.name=<n>` of a list or watch's field selector: the object RBAC sees it name.
fn name_from_field_selector(selector: Option<&str>) -> Option<String> {
    selector?.split(',').find_map(|part| {
        let (k, v) = part.split_once("==").or_else(|| part.split_once('='))?;
        (k.trim() == "metadata.name" && !k.ends_with('!')).then(|| v.trim().to_string())
    })
}

/// Who is calling: the user of a bearer token registered with `add_token` or issued by the
/// TokenRequest API, or, without a token, the cluster administrator (as a client with an admin
/// kubeconfig is). A token that does not authenticate is `401 Unauthorized`.
fn authenticate(inner: &Inner, headers: &HeaderMap) -> Result<Identity, ApiError> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        });
    match bearer {
        None => Ok(Identity {
            username: ADMIN_USER.to_string(),
            groups: vec![
                rbac::MASTERS_GROUP.to_string(),
                "system:authenticated".to_string(),
            ],
        }),
        Some(token) => {
            let state = inner.state();
            inner
                .reviews
                .authenticate(token, &[], &state)
                .map_err(|why| {
                    tracing::debug!(?why, "ccm-testing ApiServer: bearer token rejected");
                    ApiError::new(401, "Unauthorized", "Unauthorized")
                })
        }
    }
}

/// The user of requests made without credentials.
pub(crate) const ADMIN_USER: &str = "system:admin";

/// `POST .../serviceaccounts/<name>/token`: issues a token for the ServiceAccount, as
/// kube-apiserver's TokenRequest REST does (default and minimum lifetime, capped by the
/// server's maximum, audiences defaulted to the API server's).
fn token_request(
    inner: &Inner,
    info: &ResourceInfo,
    ns: &str,
    name: &str,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let mut request = if body.is_empty() {
        json!({})
    } else {
        parse_body(body, false)?
    };
    if !request.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    }
    let requested = request
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(3600);
    let invalid = |detail: &str| {
        ApiError::new(
            422,
            "Invalid",
            format!(
                "TokenRequest.authentication.k8s.io {name:?} is invalid: spec.expirationSeconds: Invalid value: {requested}: {detail}"
            ),
        )
    };
    if requested < 600 {
        return Err(invalid("may not specify a duration less than 10 minutes"));
    }
    if requested > 1 << 32 {
        return Err(invalid(
            "may not specify a duration larger than 2^32 seconds",
        ));
    }
    let account = inner.state().get(info, Some(ns), name)?;
    let uid = account
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let seconds = match inner.max_token_expiration() {
        Some(max) => requested.min(i64::try_from(max.as_secs()).unwrap_or(i64::MAX)),
        None => requested,
    };
    let mut audiences: Vec<String> = request
        .pointer("/spec/audiences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    if audiences.is_empty() {
        audiences.push(super::reviews::API_AUDIENCE.to_string());
    }
    let now = jiff::Timestamp::now();
    let expires = jiff::Timestamp::from_second(now.as_second().saturating_add(seconds))
        .unwrap_or(jiff::Timestamp::MAX);
    let issued = inner
        .reviews
        .issue(ns, name, &uid, expires, audiences.clone());
    request["apiVersion"] = json!("authentication.k8s.io/v1");
    request["kind"] = json!("TokenRequest");
    request["metadata"] = json!({
        "name": name,
        "namespace": ns,
        "creationTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
    });
    request["spec"]["audiences"] = json!(audiences);
    request["spec"]["expirationSeconds"] = json!(seconds);
    if request["spec"].get("boundObjectRef").is_none() {
        request["spec"]["boundObjectRef"] = Value::Null;
    }
    request["status"] = json!({
        "token": issued.token,
        "expirationTimestamp": issued.expires.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
    });
    Ok(json_response(201, &request))
}

fn list_options(info: &ResourceInfo, query: &[(String, String)]) -> Result<ListOptions, ApiError> {
    let mut opts = ListOptions::default();
    for (k, v) in query {
        match k.as_str() {
            "labelSelector" => opts.labels = LabelSelector::parse(v)?,
            "fieldSelector" => opts.fields = FieldSelector::parse(info, v)?,
            "limit" => {
                opts.limit = Some(
                    v.parse()
                        .map_err(|_| ApiError::bad_request(format!("invalid limit {v:?}")))?,
                )
            }
            "continue" if !v.is_empty() => opts.continue_token = Some(v.clone()),
            _ => {}
        }
    }
    Ok(opts)
}

#[allow(clippy::too_many_arguments)]
async fn serve(
    inner: &Arc<Inner>,
    method: &Method,
    t: &Target,
    query: &[(String, String)],
    headers: &HeaderMap,
    body: &Bytes,
    watch: bool,
) -> Result<Response, ApiError> {
    let info = resources::lookup(&t.group, &t.version, &t.resource).ok_or_else(not_served)?;
    // Cluster-scoped resources have no namespaced paths; namespaced ones are reachable without
    // a namespace only to list and watch across namespaces.
    let all_namespaces_read = info.namespaced && t.name.is_none() && method == Method::GET;
    if info.namespaced != t.namespace.is_some() && !all_namespaces_read {
        return Err(not_served());
    }
    if let Some(sub) = &t.subresource {
        let served = (sub == "status" && info.status_subresource)
            || (sub == "finalize" && info.storage == "namespaces" && method == Method::PUT)
            || (sub == "token" && info.storage == "serviceaccounts" && method == Method::POST);
        if !served {
            return Err(not_served());
        }
    }
    let param = |k: &str| {
        query
            .iter()
            .find(|(qk, _)| qk == k)
            .map(|(_, v)| v.as_str())
    };
    let dry_run = param("dryRun") == Some("All");
    let user_agent = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("unknown");
    let default_manager = user_agent
        .split('/')
        .next()
        .unwrap_or("unknown")
        .to_string();
    let manager = param("fieldManager").map(str::to_string);
    let meta_only = metadata_only(headers);
    let ns = t.namespace.as_deref();
    let name = t.name.as_deref();
    let shape = |v: Value| if meta_only { to_partial(&v) } else { v };

    if t.subresource.as_deref() == Some("token")
        && let (Some(ns), Some(name)) = (ns, name)
    {
        return token_request(inner, info, ns, name, body);
    }
    match (method.as_str(), name) {
        ("GET", _) if watch => {
            let opts = list_options(info, query)?;
            let mut opts = opts;
            if let Some(n) = name {
                opts.fields = FieldSelector::parse(info, &format!("metadata.name={n}"))?;
            }
            watch_response(inner, info, ns, opts, query, meta_only)
        }
        ("GET", Some(name)) => {
            let obj = inner.state().get(info, ns, name)?;
            Ok(json_response(200, &shape(obj)))
        }
        ("GET", None) => {
            let opts = list_options(info, query)?;
            if param("resourceVersionMatch").is_some_and(|m| !m.is_empty())
                && param("resourceVersion").is_none_or(str::is_empty)
            {
                return Err(ApiError::invalid(
                    info,
                    "",
                    &[super::status::FieldError::forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch is forbidden unless resourceVersion is provided",
                    )],
                ));
            }
            let mut opts = opts;
            let rv = match param("resourceVersion") {
                None | Some("") => None,
                Some(v) => Some(v.parse::<u64>().map_err(|_| {
                    ApiError::bad_request(format!("invalid resource version: {v:?}"))
                })?),
            };
            if rv.is_some() && opts.continue_token.is_some() {
                return Err(ApiError::bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
            match (rv, param("resourceVersionMatch")) {
                (Some(0), Some("Exact")) => {
                    return Err(ApiError::bad_request(
                        "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                    ));
                }
                (Some(n), Some("Exact")) => opts.exact_version = Some(n),
                // kube-apiserver serves `resourceVersion=0` from its watch cache, which does not
                // paginate: `limit` is ignored and the whole list comes in one response
                // (kubernetes/kubernetes#96182; client-go's informers rely on it).
                (Some(0), _) => opts.limit = None,
                (Some(n), _) if n != 0 => {
                    let current = inner.state().current_rv();
                    if n > current {
                        return Err(super::state::too_large(n, current));
                    }
                }
                _ => {}
            }
            let list = inner.state().list(info, ns, &opts)?;
            Ok(json_response(
                200,
                &if meta_only {
                    to_partial_list(&list)
                } else {
                    list
                },
            ))
        }
        ("POST", None) => {
            let obj = parse_body(body, false)?;
            let m = manager.unwrap_or(default_manager);
            let res = inner.state().create(info, ns, obj, &m, dry_run)?;
            Ok(json_response(201, &shape(res.object)))
        }
        ("PUT", Some(name)) => {
            let obj = parse_body(body, false)?;
            let m = manager.unwrap_or(default_manager);
            let res =
                inner
                    .state()
                    .update(info, ns, name, t.subresource.as_deref(), obj, &m, dry_run)?;
            Ok(json_response(
                if res.created { 201 } else { 200 },
                &shape(res.object),
            ))
        }
        ("PATCH", Some(name)) => {
            let patch_type = patch_type_of(headers)?;
            let force = matches!(param("force"), Some("true") | Some("1"));
            if force && patch_type != PatchType::Apply {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    "PatchOptions.meta.k8s.io \"\" is invalid: force: Forbidden: may not be specified for non-apply patch",
                ));
            }
            let m = match (patch_type, manager) {
                (_, Some(m)) if !m.is_empty() => m,
                (PatchType::Apply, _) => {
                    return Err(ApiError::new(
                        422,
                        "Invalid",
                        "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                    ));
                }
                _ => default_manager,
            };
            let patch = parse_body(body, patch_type == PatchType::Apply)?;
            let res = inner.state().patch(
                info,
                ns,
                name,
                t.subresource.as_deref(),
                patch_type,
                patch,
                &m,
                force,
                dry_run,
            )?;
            Ok(json_response(
                if res.created { 201 } else { 200 },
                &shape(res.object),
            ))
        }
        ("DELETE", Some(name)) => {
            let opts = if body.is_empty() {
                Value::Null
            } else {
                parse_body(body, false)?
            };
            let dry_run = dry_run
                || opts
                    .get("dryRun")
                    .and_then(Value::as_array)
                    .is_some_and(|a| a.iter().any(|v| v == "All"));
            let (obj, gone) = inner.state().delete(info, ns, name, &opts, dry_run)?;
            if gone && !info.return_deleted_object {
                let mut details = json!({
                    "name": name,
                    "kind": info.plural,
                    "uid": obj.pointer("/metadata/uid").cloned().unwrap_or(Value::Null),
                });
                if !info.group.is_empty() {
                    details["group"] = json!(info.group);
                }
                return Ok(json_response(
                    200,
                    &json!({
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Success",
                        "details": details,
                    }),
                ));
            }
            Ok(json_response(200, &shape(obj)))
        }
        ("DELETE", None) => {
            let opts = list_options(info, query)?;
            let list = inner.state().delete_collection(info, ns, &opts, dry_run)?;
            Ok(json_response(200, &list))
        }
        _ => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            format!(
                "the server does not allow this method on the requested resource ({} {})",
                method,
                info.qualified()
            ),
        )),
    }
}

/// Per-watch state for the response stream.
struct WatchStream {
    inner: Arc<Inner>,
    info: &'static ResourceInfo,
    ns: Option<String>,
    opts: ListOptions,
    rx: tokio::sync::broadcast::Receiver<Arc<Change>>,
    close_rx: tokio::sync::watch::Receiver<u64>,
    queue: VecDeque<Value>,
    deadline: Instant,
    bookmarks: bool,
    next_bookmark: Instant,
    last_rv: u64,
    meta_only: bool,
    done: bool,
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        self.inner.watch_closed(&self.info.qualified());
    }
}

impl WatchStream {
    fn line(&self, ty: &str, obj: Value) -> Bytes {
        let obj = if self.meta_only && ty != "ERROR" {
            to_partial(&obj)
        } else {
            obj
        };
        let mut s = json!({ "type": ty, "object": obj }).to_string();
        s.push('\n');
        Bytes::from(s)
    }

    fn bookmark(&self, annotations: Option<Value>) -> Bytes {
        let mut meta = json!({ "resourceVersion": self.last_rv.to_string() });
        if let Some(a) = annotations {
            meta["annotations"] = a;
        }
        self.line(
            "BOOKMARK",
            json!({ "kind": self.info.kind, "apiVersion": self.info.api_version(), "metadata": meta }),
        )
    }

    async fn next_line(&mut self) -> Option<Bytes> {
        if let Some(v) = self.queue.pop_front() {
            let ty = v
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("ADDED")
                .to_string();
            let obj = v.get("object").cloned().unwrap_or(Value::Null);
            if ty == "BOOKMARK" {
                let ann = obj.pointer("/metadata/annotations").cloned();
                return Some(self.bookmark(ann));
            }
            return Some(self.line(&ty, obj));
        }
        if self.done {
            return None;
        }
        loop {
            let interval = self.inner.bookmark_interval();
            tokio::select! {
                _ = tokio::time::sleep_until(self.deadline) => {
                    self.done = true;
                    return self.bookmarks.then(|| self.bookmark(None));
                }
                _ = tokio::time::sleep_until(self.next_bookmark), if self.bookmarks => {
                    self.next_bookmark = Instant::now() + interval;
                    return Some(self.bookmark(None));
                }
                r = self.close_rx.changed() => {
                    let _ = r;
                    self.done = true;
                    return None;
                }
                r = self.rx.recv() => match r {
                    Ok(change) => {
                        if change.rv <= self.last_rv {
                            continue;
                        }
                        self.last_rv = change.rv;
                        let Some(ty) = change_kind(self.info, self.ns.as_deref(), &self.opts, &change) else {
                            continue;
                        };
                        // Serialized once per change for every full-object watch.
                        if !self.meta_only && let Some(object) = change.encoded_for(self.info) {
                            let ty = ty.as_str();
                            return Some(Bytes::from(format!("{{\"type\":\"{ty}\",\"object\":{object}}}\n")));
                        }
                        if let Some((ty, obj)) = filter_change(self.info, self.ns.as_deref(), &self.opts, &change) {
                            return Some(self.line(ty.as_str(), obj));
                        }
                    }
                    Err(RecvError::Lagged(_)) => {
                        self.done = true;
                        let e = ApiError::expired("The resourceVersion for the provided watch is too old.");
                        return Some(self.line("ERROR", e.to_status()));
                    }
                    Err(RecvError::Closed) => return None,
                }
            }
        }
    }
}

fn watch_response(
    inner: &Arc<Inner>,
    info: &'static ResourceInfo,
    ns: Option<&str>,
    opts: ListOptions,
    query: &[(String, String)],
    meta_only: bool,
) -> Result<Response, ApiError> {
    let param = |k: &str| {
        query
            .iter()
            .find(|(qk, _)| qk == k)
            .map(|(_, v)| v.as_str())
    };
    let rv = match param("resourceVersion") {
        None | Some("") => None,
        Some(s) => Some(
            s.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s:?}")))?,
        ),
    };
    let bookmarks = param("allowWatchBookmarks") == Some("true");
    let send_initial = param("sendInitialEvents") == Some("true");
    if send_initial && !bookmarks {
        return Err(ApiError::new(
            422,
            "Invalid",
            "ListOptions.meta.k8s.io \"\" is invalid: allowWatchBookmarks: Required value: sendInitialEvents requires allowWatchBookmarks=true",
        ));
    }
    if send_initial && param("resourceVersionMatch") != Some("NotOlderThan") {
        return Err(ApiError::new(
            422,
            "Invalid",
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        ));
    }
    let timeout = param("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(Duration::from_secs(1800), Duration::from_secs);
    let close_rx = inner.close_rx();
    let watched = inner.state().watch(info, ns, &opts, rv, send_initial);
    let mut queue = VecDeque::new();
    let (rx, start_rv) = match watched {
        Ok((initial, rx, start_rv)) => {
            for (ty, obj, _) in initial {
                queue.push_back(json!({ "type": ty.as_str(), "object": obj }));
            }
            if send_initial && bookmarks {
                queue.push_back(json!({
                    "type": "BOOKMARK",
                    "object": { "metadata": { "annotations": { "k8s.io/initial-events-end": "true" } } }
                }));
            }
            (rx, start_rv)
        }
        // kube-apiserver answers 200 and sends the 410 as an ERROR event.
        Err(e) => return Ok(watch_error_response(&e)),
    };
    let interval = inner.bookmark_interval();
    inner.watch_opened(&info.qualified());
    let ws = WatchStream {
        inner: inner.clone(),
        info,
        ns: ns.map(str::to_string),
        opts,
        rx,
        close_rx,
        queue,
        deadline: Instant::now() + timeout,
        bookmarks,
        next_bookmark: Instant::now() + interval,
        last_rv: start_rv,
        meta_only,
        done: false,
    };
    let stream = futures::stream::unfold(ws, |mut ws| async move {
        ws.next_line()
            .await
            .map(|line| (Ok::<Bytes, Infallible>(line), ws))
    });
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

/// A watch response carrying a single `ERROR` event.
fn watch_error_response(e: &ApiError) -> Response {
    let mut s = json!({ "type": "ERROR", "object": e.to_status() }).to_string();
    s.push('\n');
    let mut resp = Response::new(Body::from(s));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// `/apis`: the API groups served (besides the core group).
fn discovery_groups() -> Value {
    let mut groups: Vec<&str> = resources::RESOURCES
        .iter()
        .map(|r| r.group)
        .filter(|g| !g.is_empty())
        .collect();
    groups.dedup();
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|g| {
            let gv = json!({"groupVersion": format!("{g}/v1"), "version": "v1"});
            json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/api/v1` and `/apis/<group>/v1`: the resources of one group version.
fn discovery_resources(path: &str) -> Option<Value> {
    let (group, version) = match path
        .trim_end_matches('/')
        .split('/')
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["", "api", v] => ("", *v),
        ["", "apis", g, v] => (*g, *v),
        _ => return None,
    };
    let mut list = Vec::new();
    for r in resources::RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        list.push(json!({
            "name": r.plural,
            "singularName": r.kind.to_lowercase(),
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
            "shortNames": short_names(r.group, r.plural),
        }));
        if r.status_subresource {
            list.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    if list.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": list}),
    )
}

/// kube-apiserver's short names of a resource, which kubectl resolves through discovery
/// (`kubectl get svc`).
fn short_names(group: &str, plural: &str) -> &'static [&'static str] {
    match (group, plural) {
        ("", "nodes") => &["no"],
        ("", "services") => &["svc"],
        ("", "namespaces") => &["ns"],
        ("", "configmaps") => &["cm"],
        ("", "events") | ("events.k8s.io", "events") => &["ev"],
        _ => &[],
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let t = parse_path("/api/v1/nodes/n1/status").unwrap();
        assert_eq!(
            (
                t.resource.as_str(),
                t.name.as_deref(),
                t.subresource.as_deref()
            ),
            ("nodes", Some("n1"), Some("status"))
        );
        let t = parse_path("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l").unwrap();
        assert_eq!(
            (t.group.as_str(), t.namespace.as_deref(), t.name.as_deref()),
            ("coordination.k8s.io", Some("kube-system"), Some("l"))
        );
        let t = parse_path("/api/v1/namespaces/ns1").unwrap();
        assert_eq!(
            (t.resource.as_str(), t.name.as_deref()),
            ("namespaces", Some("ns1"))
        );
        let t = parse_path("/api/v1/namespaces/ns1/status").unwrap();
        assert_eq!(
            (
                t.resource.as_str(),
                t.name.as_deref(),
                t.subresource.as_deref()
            ),
            ("namespaces", Some("ns1"), Some("status"))
        );
        let t = parse_path("/api/v1/services").unwrap();
        assert_eq!((t.resource.as_str(), t.namespace), ("services", None));
    }
}

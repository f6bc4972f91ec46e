//! Routing, request parsing and the verbs: [`handle`] authenticates, authorizes and routes a
//! request, [`serve`] runs the verb against the store. Responses ([`responses`]), watch streams
//! ([`watch`]), discovery documents ([`discovery`]) and authentication with token requests
//! ([`auth`]) have files of their own.

mod auth;
mod discovery;
mod options;
mod responses;
mod watch;

use std::sync::Arc;

use axum::extract::{Query, State as AxState};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};

use crate::apiserver::rbac::{self, Attributes};
use crate::apiserver::resources::{self, ResourceInfo};
use crate::apiserver::selector::{FieldSelector, LabelSelector};
use crate::apiserver::state::{ListOptions, PatchType};
use crate::apiserver::status::ApiError;
use crate::apiserver::{Inner, RequestRecord};

use auth::{authenticate, token_request};
use discovery::{discovery_groups, discovery_resources};
pub(crate) use responses::injected_error;
use responses::{
    error_response, json_response, list_response, metadata_only, not_served, text_response,
    to_partial,
};
use watch::{watch_error_response, watch_response};

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
        dry_run: options::handled_as_dry_run(method.as_str(), &body, &query),
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

    // Random faults (apiserver/faults.rs): an error instead of the answer, a delay, or a watch
    // stream cut short.
    let mut roll = inner.api_faults.roll(&record);
    if let Some(delay) = roll.delay {
        tokio::time::sleep(delay).await;
    }
    let resp = if let Some(e) = inner.take_fault(&record).or_else(|| roll.error.take()) {
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
    let resp = roll.finish(resp);
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
    // Create, update and patch read their options from the query; a delete reads them from
    // its body when it has one (`options.rs`).
    let dry_run = match options::query_options_kind(method.as_str()) {
        Some(kind) => options::query_dry_run(kind, query)?,
        None => false,
    };
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
            let obj = inner.state().get_shared(info, ns, name)?;
            if meta_only {
                return Ok(json_response(200, &to_partial(&obj.presented_value(info))));
            }
            Ok(text_response(200, obj.presented(info).into_owned()))
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
            let page = inner.state().list(info, ns, &opts)?;
            Ok(list_response(info, page, meta_only))
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
            let options::DeleteOptions {
                value: opts,
                dry_run,
            } = options::delete_options(body, query)?;
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
            let delete = options::delete_options(body, query)?;
            let list =
                inner
                    .state()
                    .delete_collection(info, ns, &opts, &delete.value, delete.dry_run)?;
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

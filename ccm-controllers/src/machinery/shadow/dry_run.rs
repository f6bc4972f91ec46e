//! How the write guard makes a request a dry run: where kube-apiserver reads the request's
//! options decides where `dryRun: ["All"]` must go (see the table in `write_guard.rs`). Pure:
//! request parts in, the form to send (or the reason not to send) out.

use http::{Method, Uri};
use serde_json::{Value, json};

/// What a request path names.
#[derive(Debug, PartialEq)]
pub(super) struct Target {
    pub(super) namespace: Option<String>,
    /// The resource (plural), e.g. `nodes`.
    pub(super) resource: String,
    pub(super) name: Option<String>,
    /// The subresource, e.g. `status`, `eviction`.
    pub(super) subresource: Option<String>,
}

/// Parses `/api/v1/...` and `/apis/<group>/<version>/...` paths.
pub(super) fn target(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match parts.first() {
        Some(&"api") => parts.get(2..)?,
        Some(&"apis") => parts.get(3..)?,
        _ => return None,
    };
    let (namespace, rest) = match rest {
        // `namespaces/<ns>/status` and `/finalize` are a Namespace's subresources.
        ["namespaces", ns, resource, tail @ ..]
            if *resource != "status" && *resource != "finalize" =>
        {
            (Some((*ns).to_owned()), {
                let mut v = vec![*resource];
                v.extend_from_slice(tail);
                v
            })
        }
        other => (None, other.to_vec()),
    };
    Some(Target {
        namespace,
        resource: (*rest.first()?).to_owned(),
        name: rest.get(1).map(|s| (*s).to_owned()),
        subresource: rest.get(2).map(|s| (*s).to_owned()),
    })
}

/// How the guard sends a request.
#[derive(Debug, PartialEq)]
pub(super) enum Form {
    /// `GET`, `HEAD`: sent untouched.
    Read,
    /// An Event (any write to `events`): never sent, answered by the guard.
    Event,
    /// Create, update, patch: kube-apiserver reads their options from the query only;
    /// `dryRun=All` is added to it.
    Query,
    /// Delete, deletecollection: the `DeleteOptions` body is read when not empty (the query
    /// only when it is); `dryRun: ["All"]` is put in the body (created when empty) and in the
    /// query.
    DeleteOptionsBody,
    /// A Pod eviction (`POST pods/<name>/eviction`): the `DeleteOptions` inside the Eviction
    /// body win over the query's when they carry a `dryRun`; `dryRun: ["All"]` is put in them
    /// and in the query.
    EvictionBody,
    /// Not sent: the guard does not know where the server reads this request's options.
    Refused(String),
}

/// The form of a request with `method` on `target`.
pub(super) fn form(method: &Method, target: Option<&Target>) -> Form {
    let resource = target.map(|t| t.resource.as_str());
    let subresource = target.and_then(|t| t.subresource.as_deref());
    match *method {
        Method::GET | Method::HEAD => Form::Read,
        _ if resource == Some("events") => Form::Event,
        Method::DELETE => Form::DeleteOptionsBody,
        Method::POST if subresource == Some("eviction") => Form::EvictionBody,
        Method::POST | Method::PUT | Method::PATCH => Form::Query,
        ref other => Form::Refused(format!(
            "the method {other} is not a Kubernetes write the guard can make a dry run"
        )),
    }
}

/// The `verb` label of a request with `method` on `target`, as kube-apiserver names it.
pub(super) fn verb(method: &Method, target: Option<&Target>) -> &'static str {
    match *method {
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if target.is_some_and(|t| t.name.is_none()) => "deletecollection",
        Method::DELETE => "delete",
        _ => "unknown",
    }
}

/// `uri` with `dryRun=All` added to its query.
pub(super) fn with_dry_run_query(uri: &Uri) -> Result<Uri, http::Error> {
    let path = uri.path();
    let pq = match uri.query() {
        Some(q) if !q.is_empty() => format!("{path}?{q}&dryRun=All"),
        _ => format!("{path}?dryRun=All"),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(pq.parse()?);
    Ok(Uri::from_parts(parts)?)
}

/// Whether a body of `content_type` may be rewritten as JSON: absent or `application/json`
/// (with parameters). A protobuf, YAML or CBOR body is not.
fn is_json(content_type: Option<&str>) -> bool {
    content_type.is_none_or(|ct| {
        ct.split(';')
            .next()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
    })
}

/// The JSON object of a body the guard may rewrite, or why not.
fn json_object(
    content_type: Option<&str>,
    body: &[u8],
) -> Result<serde_json::Map<String, Value>, String> {
    if !is_json(content_type) {
        return Err(format!(
            "its body is {} and only a JSON body can be rewritten",
            content_type.unwrap_or_default()
        ));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err("its body is not a JSON object".to_owned()),
        Err(e) => Err(format!("its body is not JSON: {e}")),
    }
}

/// A delete's body with `dryRun: ["All"]`: `DeleteOptions` created when `body` is empty, set
/// in the object otherwise (its other options kept). `Err` says why it cannot be rewritten.
pub(super) fn delete_options_body(
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Vec<u8>, String> {
    let options = if body.is_empty() {
        json!({"kind": "DeleteOptions", "apiVersion": "v1", "dryRun": ["All"]})
    } else {
        let mut map = json_object(content_type, body)?;
        map.insert("dryRun".to_owned(), json!(["All"]));
        Value::Object(map)
    };
    serde_json::to_vec(&options).map_err(|e| e.to_string())
}

/// An Eviction's body with `deleteOptions.dryRun: ["All"]` (its other options kept). An empty
/// body is not an Eviction. `Err` says why it cannot be rewritten.
pub(super) fn eviction_body(content_type: Option<&str>, body: &[u8]) -> Result<Vec<u8>, String> {
    let mut map = json_object(content_type, body)?;
    let options = map.entry("deleteOptions").or_insert_with(|| json!({}));
    if options.is_null() {
        *options = json!({});
    }
    let Some(options) = options.as_object_mut() else {
        return Err("its deleteOptions are not a JSON object".to_owned());
    };
    options.insert("dryRun".to_owned(), json!(["All"]));
    serde_json::to_vec(&Value::Object(map)).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    #[test]
    fn paths_name_their_resource_namespace_object_and_subresource() {
        assert_eq!(
            target("/api/v1/nodes/n1/status"),
            Some(Target {
                namespace: None,
                resource: "nodes".into(),
                name: Some("n1".into()),
                subresource: Some("status".into()),
            })
        );
        assert_eq!(
            target("/api/v1/namespaces/ns/pods/p/eviction"),
            Some(Target {
                namespace: Some("ns".into()),
                resource: "pods".into(),
                name: Some("p".into()),
                subresource: Some("eviction".into()),
            })
        );
        assert_eq!(
            target("/api/v1/namespaces/ns/status").map(|t| (t.resource, t.name, t.subresource)),
            Some((
                "namespaces".into(),
                Some("ns".into()),
                Some("status".into())
            ))
        );
        assert_eq!(
            target("/apis/events.k8s.io/v1/namespaces/ns/events").map(|t| t.resource),
            Some("events".into())
        );
    }

    #[test]
    fn every_method_has_its_form() {
        let node = target("/api/v1/nodes/n");
        let nodes = target("/api/v1/nodes");
        let eviction = target("/api/v1/namespaces/ns/pods/p/eviction");
        let event = target("/apis/events.k8s.io/v1/namespaces/ns/events");
        assert_eq!(form(&Method::GET, node.as_ref()), Form::Read);
        assert_eq!(form(&Method::HEAD, node.as_ref()), Form::Read);
        assert_eq!(form(&Method::POST, nodes.as_ref()), Form::Query);
        assert_eq!(form(&Method::PUT, node.as_ref()), Form::Query);
        assert_eq!(form(&Method::PATCH, node.as_ref()), Form::Query);
        assert_eq!(
            form(&Method::DELETE, node.as_ref()),
            Form::DeleteOptionsBody
        );
        assert_eq!(
            form(&Method::DELETE, nodes.as_ref()),
            Form::DeleteOptionsBody
        );
        assert_eq!(form(&Method::POST, eviction.as_ref()), Form::EvictionBody);
        assert_eq!(form(&Method::POST, event.as_ref()), Form::Event);
        assert_eq!(form(&Method::PATCH, event.as_ref()), Form::Event);
        assert!(matches!(
            form(&Method::OPTIONS, node.as_ref()),
            Form::Refused(_)
        ));
        assert!(matches!(form(&Method::TRACE, None), Form::Refused(_)));
        assert_eq!(verb(&Method::DELETE, node.as_ref()), "delete");
        assert_eq!(verb(&Method::DELETE, nodes.as_ref()), "deletecollection");
    }

    #[test]
    fn dry_run_is_added_to_any_query() {
        let u: Uri = "http://h/api/v1/nodes/n?fieldManager=x".parse().unwrap();
        assert_eq!(
            with_dry_run_query(&u).unwrap().to_string(),
            "http://h/api/v1/nodes/n?fieldManager=x&dryRun=All"
        );
        let u: Uri = "/api/v1/nodes/n".parse().unwrap();
        assert_eq!(
            with_dry_run_query(&u).unwrap().to_string(),
            "/api/v1/nodes/n?dryRun=All"
        );
    }

    #[test]
    fn a_delete_body_gets_dry_run_and_keeps_its_options() {
        // kube's client sends `{}` for default options: the body the server reads.
        assert_eq!(
            json(&delete_options_body(Some("application/json"), b"{}").unwrap()),
            json!({"dryRun": ["All"]})
        );
        assert_eq!(
            json(&delete_options_body(None, b"").unwrap()),
            json!({"kind": "DeleteOptions", "apiVersion": "v1", "dryRun": ["All"]})
        );
        let body = br#"{"propagationPolicy":"Background","preconditions":{"uid":"u"},"dryRun":[]}"#;
        assert_eq!(
            json(&delete_options_body(Some("application/json; charset=utf-8"), body).unwrap()),
            json!({"propagationPolicy": "Background", "preconditions": {"uid": "u"}, "dryRun": ["All"]})
        );
    }

    #[test]
    fn a_body_that_cannot_be_rewritten_is_refused() {
        let protobuf = Some("application/vnd.kubernetes.protobuf");
        assert!(delete_options_body(protobuf, b"k8s\0...").is_err());
        assert!(delete_options_body(Some("application/json"), b"not json").is_err());
        assert!(delete_options_body(Some("application/json"), b"[1]").is_err());
        assert!(delete_options_body(Some("application/yaml"), b"dryRun: []").is_err());
        assert!(eviction_body(Some("application/json"), b"").is_err());
        assert!(eviction_body(Some("application/json"), br#"{"deleteOptions":3}"#).is_err());
    }

    #[test]
    fn an_eviction_gets_dry_run_in_its_delete_options() {
        let body = br#"{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"p"}}"#;
        assert_eq!(
            json(&eviction_body(None, body).unwrap())["deleteOptions"],
            json!({"dryRun": ["All"]})
        );
        let body = br#"{"kind":"Eviction","deleteOptions":{"gracePeriodSeconds":0,"dryRun":[]}}"#;
        assert_eq!(
            json(&eviction_body(None, body).unwrap())["deleteOptions"],
            json!({"gracePeriodSeconds": 0, "dryRun": ["All"]})
        );
    }
}

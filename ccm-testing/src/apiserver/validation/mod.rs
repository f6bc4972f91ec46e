//! Defaulting and the validations kube-apiserver applies that a cloud-controller-manager can trip on.
//!
//! Here: the name and label rules and object metadata, shared by every resource; the rules of
//! one resource live in its own file ([`nodes`], [`services`], [`events`], [`leases`]).

mod events;
mod leases;
mod nodes;
mod services;

use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Value};

use super::resources::{NameRule, ResourceInfo};
use super::status::FieldError;

pub(crate) use events::{validate_event, validate_events_v1_create};
pub(crate) use leases::validate_lease;
pub(crate) use nodes::{
    add_not_ready_taint, normalize_pod_cidrs, validate_node, validate_node_update,
    validate_pod_cidrs,
};
pub(crate) use services::{
    default_ingress_ip_mode, default_service, keep_allocated_service_values, validate_service,
    validate_service_status, validate_service_update,
};

#[allow(clippy::expect_used)] // constant patterns, checked by the unit tests below
fn re(p: &str) -> Regex {
    Regex::new(p).expect("constant regex")
}

static DNS1123_LABEL: LazyLock<Regex> = LazyLock::new(|| re(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"));

static DNS1123_SUBDOMAIN: LazyLock<Regex> =
    LazyLock::new(|| re(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"));

static DNS1035_LABEL: LazyLock<Regex> = LazyLock::new(|| re(r"^[a-z]([-a-z0-9]*[a-z0-9])?$"));

static QUALIFIED_NAME: LazyLock<Regex> =
    LazyLock::new(|| re(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$"));

static LABEL_VALUE: LazyLock<Regex> =
    LazyLock::new(|| re(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"));

pub(crate) fn is_dns1123_label(s: &str) -> bool {
    s.len() <= 63 && DNS1123_LABEL.is_match(s)
}

pub(crate) fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && DNS1123_SUBDOMAIN.is_match(s)
}

/// Validates a qualified name (label key, annotation key, finalizer, taint key).
pub(crate) fn qualified_name_errors(field: &str, key: &str) -> Vec<FieldError> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let mut errs = Vec::new();
    if let Some(p) = prefix {
        if p.is_empty() {
            errs.push(FieldError::invalid(
                field,
                key,
                "prefix part must be non-empty",
            ));
        } else if !is_dns1123_subdomain(p) {
            errs.push(FieldError::invalid(
                field,
                key,
                "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
            ));
        }
    }
    if name.is_empty() {
        errs.push(FieldError::invalid(
            field,
            key,
            "name part must be non-empty",
        ));
    } else if name.len() > 63 {
        errs.push(FieldError::invalid(
            field,
            key,
            "name part must be no more than 63 characters",
        ));
    } else if !QUALIFIED_NAME.is_match(name) {
        errs.push(FieldError::invalid(
            field,
            key,
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
        ));
    }
    errs
}

pub(crate) fn label_value_errors(field: &str, value: &str) -> Vec<FieldError> {
    if value.len() > 63 {
        vec![FieldError::invalid(
            field,
            value,
            "must be no more than 63 characters",
        )]
    } else if !LABEL_VALUE.is_match(value) {
        vec![FieldError::invalid(
            field,
            value,
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
        )]
    } else {
        Vec::new()
    }
}

fn name_errors(info: &ResourceInfo, field: &str, name: &str) -> Vec<FieldError> {
    let ok = match info.name_rule {
        NameRule::Subdomain => is_dns1123_subdomain(name),
        NameRule::Dns1123Label => is_dns1123_label(name),
        NameRule::Dns1035Label => name.len() <= 63 && DNS1035_LABEL.is_match(name),
        NameRule::PathSegment => {
            name != "." && name != ".." && !name.contains('/') && !name.contains('%')
        }
    };
    if ok {
        return Vec::new();
    }
    let detail = match info.name_rule {
        NameRule::Subdomain => {
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
        }
        NameRule::Dns1123Label => {
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
        }
        NameRule::Dns1035Label => {
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
        }
        NameRule::PathSegment => "may not contain '/' or '%' and may not be '.' or '..'",
    };
    vec![FieldError::invalid(field, name, detail)]
}

fn str_at<'a>(v: &'a Value, ptr: &str) -> Option<&'a str> {
    v.pointer(ptr).and_then(Value::as_str)
}

/// Validation of `metadata` common to every resource (name, labels, annotations, finalizers).
pub(crate) fn validate_meta(info: &ResourceInfo, obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    match str_at(obj, "/metadata/name") {
        None | Some("") => errs.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        )),
        Some(name) => errs.extend(name_errors(info, "metadata.name", name)),
    }
    if let Some(labels) = obj.pointer("/metadata/labels").and_then(Value::as_object) {
        for (k, v) in labels {
            errs.extend(qualified_name_errors("metadata.labels", k));
            match v.as_str() {
                Some(s) => errs.extend(label_value_errors("metadata.labels", s)),
                None => errs.push(FieldError::invalid(
                    "metadata.labels",
                    &v.to_string(),
                    "must be a string",
                )),
            }
        }
    }
    if let Some(ann) = obj
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
    {
        let mut total = 0usize;
        for (k, v) in ann {
            errs.extend(qualified_name_errors(
                "metadata.annotations",
                &k.to_lowercase(),
            ));
            total += k.len() + v.as_str().map_or(0, str::len);
        }
        if total > 256 * 1024 {
            errs.push(FieldError {
                reason: "FieldValueTooLong",
                field: "metadata.annotations".into(),
                message: "metadata.annotations: Too long: may not be more than 262144 bytes".into(),
            });
        }
    }
    if let Some(fins) = obj
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
    {
        for f in fins {
            let s = f.as_str().unwrap_or_default();
            errs.extend(qualified_name_errors("metadata.finalizers", s));
        }
    }
    errs
}

/// Map-typed fields whose empty value Go's `omitempty` drops.
const EMPTY_MAPS_DROPPED: &[&str] = &[
    "/metadata/labels",
    "/metadata/annotations",
    "/data",
    "/binaryData",
    "/spec/selector",
    "/status/capacity",
    "/status/allocatable",
];

/// Drops what a round trip through kube-apiserver's Go types drops: `null` values and empty
/// lists everywhere (pointers and `omitempty` slices), and empty maps of the known map
/// fields. Empty objects that are Go structs stay (e.g. Service `status.loadBalancer: {}`).
pub(crate) fn prune_like_go(obj: &mut Value) {
    fn rec(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.retain(|_, x| !x.is_null() && !x.as_array().is_some_and(Vec::is_empty));
                for x in m.values_mut() {
                    rec(x);
                }
                m.retain(|_, x| !x.as_array().is_some_and(Vec::is_empty));
            }
            Value::Array(a) => a.iter_mut().for_each(rec),
            _ => {}
        }
    }
    rec(obj);
    for path in EMPTY_MAPS_DROPPED {
        let empty = obj
            .pointer(path)
            .is_some_and(|v| v.as_object().is_some_and(Map::is_empty));
        if empty && let Some((parent, key)) = path.rsplit_once('/') {
            let parent = if parent.is_empty() {
                Some(&mut *obj)
            } else {
                obj.pointer_mut(parent)
            };
            if let Some(Value::Object(p)) = parent {
                p.remove(key);
            }
        }
    }
}

/// The namespaces kube-apiserver's NamespaceLifecycle admission never lets go.
pub(crate) const IMMORTAL_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public"];

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_keys_and_values() {
        assert!(qualified_name_errors("f", "topology.kubernetes.io/zone").is_empty());
        assert!(
            qualified_name_errors("f", "node.cloudprovider.kubernetes.io/uninitialized").is_empty()
        );
        assert!(!qualified_name_errors("f", "bad key").is_empty());
        assert!(!qualified_name_errors("f", "UPPER.example.com/x").is_empty());
        assert!(!qualified_name_errors("f", "-leading").is_empty());
        assert!(label_value_errors("f", "").is_empty());
        assert!(label_value_errors("f", "fake-small").is_empty());
        assert!(!label_value_errors("f", "has space").is_empty());
        assert!(!label_value_errors("f", &"a".repeat(64)).is_empty());
    }

    #[test]
    fn node_rules() {
        let node = json!({"spec": {"taints": [
            {"key": "a", "effect": "NoSchedule"},
            {"key": "a", "effect": "NoSchedule", "value": "x"},
            {"key": "b", "effect": "Sometimes"}
        ]}});
        let errs = validate_node(&node);
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(errs.iter().any(|e| e.reason == "FieldValueDuplicate"));
        assert!(errs.iter().any(|e| e.reason == "FieldValueNotSupported"));
        let old = json!({"spec": {"providerID": "fake://a"}});
        assert!(
            validate_node_update(&json!({"spec": {"providerID": "fake://a"}}), &old).is_empty()
        );
        assert_eq!(
            validate_node_update(&json!({"spec": {"providerID": "fake://b"}}), &old).len(),
            1
        );
        assert!(validate_node_update(&old, &json!({"spec": {}})).is_empty());
    }
}

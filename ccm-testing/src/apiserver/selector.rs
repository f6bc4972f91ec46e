//! Label and field selectors, parsed and matched as kube-apiserver does.

use std::collections::BTreeSet;

use serde_json::Value;

use super::resources::ResourceInfo;
use super::status::ApiError;

#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LabelSelector(Vec<LabelReq>);

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c);
            }
            ')' => {
                depth = depth.saturating_sub(1);
                cur.push(c);
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out
}

fn parse_set(s: &str) -> Option<BTreeSet<String>> {
    let s = s.trim();
    let inner = s.strip_prefix('(')?.strip_suffix(')')?;
    Some(
        inner
            .split(',')
            .map(|v| v.trim().to_string())
            .collect::<BTreeSet<_>>(),
    )
}

impl LabelSelector {
    pub(crate) fn parse(s: &str) -> Result<Self, ApiError> {
        let bad = |part: &str| {
            ApiError::bad_request(format!(
                "unable to parse requirement: found '{part}', expected: identifier"
            ))
        };
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let req = if let Some(k) = part.strip_prefix('!') {
                LabelReq::NotExists(k.trim().to_string())
            } else if let Some((k, v)) = part.split_once("!=") {
                LabelReq::NotEq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = part.split_once("==") {
                LabelReq::Eq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = part.split_once('=') {
                LabelReq::Eq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = part.split_once(" notin ") {
                LabelReq::NotIn(k.trim().to_string(), parse_set(v).ok_or_else(|| bad(part))?)
            } else if let Some((k, v)) = part.split_once(" in ") {
                LabelReq::In(k.trim().to_string(), parse_set(v).ok_or_else(|| bad(part))?)
            } else if part.contains(' ') || part.contains('(') {
                return Err(bad(part));
            } else {
                LabelReq::Exists(part.to_string())
            };
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    pub(crate) fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, set) => get(k).is_some_and(|v| set.contains(v)),
            LabelReq::NotIn(k, set) => get(k).is_none_or(|v| !set.contains(v)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed `fieldSelector` (only `=`, `==` and `!=`, as kube-apiserver supports).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldSelector(Vec<(String, bool, String)>);

/// The JSON pointer of a selectable field, per resource (the fields kube-apiserver indexes).
fn field_pointer(info: &ResourceInfo, field: &str) -> Option<&'static str> {
    let common = match field {
        "metadata.name" => Some("/metadata/name"),
        "metadata.namespace" => Some("/metadata/namespace"),
        _ => None,
    };
    if common.is_some() {
        return common;
    }
    match (info.storage, field) {
        ("nodes", "spec.unschedulable") => Some("/spec/unschedulable"),
        ("services", "spec.clusterIP") => Some("/spec/clusterIP"),
        ("services", "spec.type") => Some("/spec/type"),
        ("secrets", "type") => Some("/type"),
        ("namespaces", "status.phase") => Some("/status/phase"),
        ("events", "involvedObject.kind") => Some("/involvedObject/kind"),
        ("events", "involvedObject.namespace") => Some("/involvedObject/namespace"),
        ("events", "involvedObject.name") => Some("/involvedObject/name"),
        ("events", "involvedObject.uid") => Some("/involvedObject/uid"),
        ("events", "involvedObject.apiVersion") => Some("/involvedObject/apiVersion"),
        ("events", "involvedObject.resourceVersion") => Some("/involvedObject/resourceVersion"),
        ("events", "involvedObject.fieldPath") => Some("/involvedObject/fieldPath"),
        ("events", "reason") => Some("/reason"),
        ("events", "reportingComponent") => Some("/reportingComponent"),
        ("events", "type") => Some("/type"),
        ("events", "source") => Some("/source/component"),
        _ => None,
    }
}

/// events.k8s.io/v1 field labels mapped onto the core Event fields they are stored as.
fn events_v1_field<'a>(info: &ResourceInfo, field: &'a str) -> &'a str {
    if info.group != "events.k8s.io" {
        return field;
    }
    match field {
        "regarding.kind" => "involvedObject.kind",
        "regarding.namespace" => "involvedObject.namespace",
        "regarding.name" => "involvedObject.name",
        "regarding.uid" => "involvedObject.uid",
        "regarding.apiVersion" => "involvedObject.apiVersion",
        "regarding.resourceVersion" => "involvedObject.resourceVersion",
        "regarding.fieldPath" => "involvedObject.fieldPath",
        "reportingController" => "reportingComponent",
        "deprecatedSource" => "source",
        other => other,
    }
}

impl FieldSelector {
    pub(crate) fn parse(info: &ResourceInfo, s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let (k, eq, v) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                )));
            };
            let k = events_v1_field(info, k.trim());
            if field_pointer(info, k).is_none() {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {k}"
                )));
            }
            reqs.push((k.to_string(), eq, v.trim().to_string()));
        }
        Ok(FieldSelector(reqs))
    }

    /// Matches against the stored (core) representation.
    pub(crate) fn matches(&self, info: &ResourceInfo, obj: &Value) -> bool {
        self.0.iter().all(|(k, eq, v)| {
            let actual = field_pointer(info, k)
                .and_then(|p| obj.pointer(p))
                .map(|x| match x {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                })
                .unwrap_or_else(|| {
                    if k == "spec.unschedulable" {
                        "false".to_string()
                    } else {
                        String::new()
                    }
                });
            (actual == *v) == *eq
        })
    }
}

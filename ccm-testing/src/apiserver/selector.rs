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

    /// Matches the labels `label` looks up (key to value).
    pub(crate) fn matches<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
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

/// The fields kube-apiserver indexes for field selectors besides `metadata.name` and
/// `metadata.namespace`, per storage: (field label, JSON pointer in the stored form).
pub(crate) fn selectable_fields(storage: &str) -> &'static [(&'static str, &'static str)] {
    match storage {
        "nodes" => &[("spec.unschedulable", "/spec/unschedulable")],
        "services" => &[
            ("spec.clusterIP", "/spec/clusterIP"),
            ("spec.type", "/spec/type"),
        ],
        "secrets" => &[("type", "/type")],
        "namespaces" => &[("status.phase", "/status/phase")],
        "events" => &[
            ("involvedObject.kind", "/involvedObject/kind"),
            ("involvedObject.namespace", "/involvedObject/namespace"),
            ("involvedObject.name", "/involvedObject/name"),
            ("involvedObject.uid", "/involvedObject/uid"),
            ("involvedObject.apiVersion", "/involvedObject/apiVersion"),
            (
                "involvedObject.resourceVersion",
                "/involvedObject/resourceVersion",
            ),
            ("involvedObject.fieldPath", "/involvedObject/fieldPath"),
            ("reason", "/reason"),
            ("reportingComponent", "/reportingComponent"),
            ("type", "/type"),
            ("source", "/source/component"),
        ],
        _ => &[],
    }
}

/// Whether `field` may be selected on in `info`'s storage.
fn selectable(info: &ResourceInfo, field: &str) -> bool {
    matches!(field, "metadata.name" | "metadata.namespace")
        || selectable_fields(info.storage)
            .iter()
            .any(|(label, _)| *label == field)
}

/// The value a field selector compares for the field at `pointer` of a stored object: a
/// string as is, `null` or a missing field as empty (`spec.unschedulable`: `false`), anything
/// else as its JSON text.
pub(crate) fn field_value(obj: &Value, label: &str, pointer: &str) -> String {
    obj.pointer(pointer)
        .map(|x| match x {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        })
        .unwrap_or_else(|| {
            if label == "spec.unschedulable" {
                "false".to_string()
            } else {
                String::new()
            }
        })
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
            if !selectable(info, k) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {k}"
                )));
            }
            reqs.push((k.to_string(), eq, v.trim().to_string()));
        }
        Ok(FieldSelector(reqs))
    }

    /// Matches the values `field` gives for each selected field label (the stored form's,
    /// see [`field_value`]).
    pub(crate) fn matches<'a>(&self, field: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.0
            .iter()
            .all(|(k, eq, v)| (field(k).unwrap_or_default() == v) == *eq)
    }
}

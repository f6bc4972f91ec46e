//! Label and field selectors, parsed and matched as kube-apiserver does.

use ccm_controllers::{ManagedNodeSelector, SelectorError};
use serde_json::Value;

use super::resources::ResourceInfo;
use super::status::ApiError;

/// A parsed `labelSelector`: the runtime's strict parser (`ManagedNodeSelector`, apimachinery's
/// `labels.Parse` grammar: `=`, `==`, `!=`, `in`, `notin`, `key`, `!key`, `>`, `<`), so that a
/// selector kube-apiserver refuses is refused here too. `None` selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LabelSelector(Option<ManagedNodeSelector>);

impl LabelSelector {
    pub(crate) fn parse(s: &str) -> Result<Self, ApiError> {
        let selector: ManagedNodeSelector = s.parse().map_err(|e: SelectorError| {
            ApiError::bad_request(format!("unable to parse requirement: {e}"))
        })?;
        Ok(LabelSelector((!selector.selects_all()).then_some(selector)))
    }

    /// Matches the labels `label` looks up (key to value).
    pub(crate) fn matches<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.0.as_ref().is_none_or(|selector| selector.matches(get))
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

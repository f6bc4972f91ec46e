//! Node rules: taints, pod CIDRs, immutable fields, and the not-ready taint of admission.

use serde_json::{Value, json};

use super::{label_value_errors, qualified_name_errors, str_at};
use crate::apiserver::status::FieldError;

const TAINT_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];

/// Node validation (`ValidateNode`), the parts a CCM touches.
pub(crate) fn validate_node(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(taints) = obj.pointer("/spec/taints").and_then(Value::as_array) {
        let mut seen = std::collections::BTreeSet::new();
        for (i, t) in taints.iter().enumerate() {
            let key = str_at(t, "/key").unwrap_or_default();
            let value = str_at(t, "/value").unwrap_or_default();
            let effect = str_at(t, "/effect").unwrap_or_default();
            errs.extend(qualified_name_errors(&format!("spec.taints[{i}].key"), key));
            errs.extend(label_value_errors(
                &format!("spec.taints[{i}].value"),
                value,
            ));
            if effect.is_empty() {
                errs.push(FieldError::required(format!("spec.taints[{i}].effect"), ""));
            } else if !TAINT_EFFECTS.contains(&effect) {
                errs.push(FieldError::not_supported(
                    format!("spec.taints[{i}].effect"),
                    effect,
                    TAINT_EFFECTS,
                ));
            }
            if !seen.insert((key.to_string(), effect.to_string())) {
                errs.push(FieldError::duplicate(
                    format!("spec.taints[{i}]"),
                    &format!(
                        "{{{key:?}, {value:?}, {effect:?}}}: taints must be unique by key and effect pair"
                    ),
                ));
            }
        }
    }
    if let Some(addrs) = obj.pointer("/status/addresses").and_then(Value::as_array) {
        for (i, a) in addrs.iter().enumerate() {
            if str_at(a, "/type").is_none_or(str::is_empty) {
                errs.push(FieldError::required(
                    format!("status.addresses[{i}].type"),
                    "",
                ));
            }
        }
    }
    errs
}

/// `spec.podCIDR` and `spec.podCIDRs` are one field in kube-apiserver's internal type: the
/// plural list wins, the singular mirrors its first entry.
pub(crate) fn normalize_pod_cidrs(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let plural_first = spec
        .get("podCIDRs")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .cloned();
    match plural_first {
        Some(first) => {
            spec.insert("podCIDR".into(), first);
        }
        None => {
            if let Some(single) = spec
                .get("podCIDR")
                .filter(|v| v.as_str().is_some_and(|s| !s.is_empty()))
            {
                let single = single.clone();
                spec.insert("podCIDRs".into(), json!([single]));
            }
        }
    }
}

/// `spec.podCIDRs`: valid CIDRs, at most two, at most one per IP family.
pub(crate) fn validate_pod_cidrs(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let Some(cidrs) = obj.pointer("/spec/podCIDRs").and_then(Value::as_array) else {
        return errs;
    };
    if cidrs.len() > 2 {
        errs.push(FieldError::invalid(
            "spec.podCIDRs",
            &Value::Array(cidrs.clone()).to_string(),
            "may specify no more than one CIDR for each IP family",
        ));
    }
    let mut families = Vec::new();
    for (i, c) in cidrs.iter().enumerate() {
        let s = c.as_str().unwrap_or_default();
        match s.parse::<ipnet::IpNet>() {
            Ok(net) => {
                let v4 = matches!(net, ipnet::IpNet::V4(_));
                if families.contains(&v4) {
                    errs.push(FieldError::invalid(
                        "spec.podCIDRs",
                        &Value::Array(cidrs.clone()).to_string(),
                        "may specify no more than one CIDR for each IP family",
                    ));
                }
                families.push(v4);
            }
            Err(_) => errs.push(FieldError::invalid(
                format!("spec.podCIDRs[{i}]"),
                s,
                "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
            )),
        }
    }
    errs
}

/// Node update validation (`ValidateNodeUpdate`): providerID and podCIDRs are set-once.
pub(crate) fn validate_node_update(new: &Value, old: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let old_pid = str_at(old, "/spec/providerID").unwrap_or_default();
    let new_pid = str_at(new, "/spec/providerID").unwrap_or_default();
    if !old_pid.is_empty() && old_pid != new_pid {
        errs.push(FieldError::forbidden(
            "spec.providerID",
            "node updates may not change providerID except from \"\" to valid",
        ));
    }
    let old_cidrs = old
        .pointer("/spec/podCIDRs")
        .cloned()
        .unwrap_or(Value::Null);
    let new_cidrs = new
        .pointer("/spec/podCIDRs")
        .cloned()
        .unwrap_or(Value::Null);
    let old_empty = old_cidrs.as_array().is_none_or(Vec::is_empty);
    if !old_empty && old_cidrs != new_cidrs {
        errs.push(FieldError::forbidden(
            "spec.podCIDRs",
            "node updates may not change podCIDR except from \"\" to valid",
        ));
    }
    errs
}

/// The `node.kubernetes.io/not-ready:NoSchedule` taint kube-apiserver's
/// `TaintNodesByCondition` admission plugin adds to every Node it creates, unless the Node
/// already has a taint with that key and effect (any value). Only on create, and not on a
/// subresource; updates are left alone (the node lifecycle controller of
/// kube-controller-manager removes the taint once the Node is Ready).
pub(crate) fn add_not_ready_taint(obj: &mut Value) {
    const KEY: &str = "node.kubernetes.io/not-ready";
    let Some(o) = obj.as_object_mut() else {
        return;
    };
    let spec = o.entry("spec").or_insert(json!({}));
    let Some(spec) = spec.as_object_mut() else {
        return;
    };
    let taints = spec.entry("taints").or_insert(json!([]));
    if !taints.is_array() {
        *taints = json!([]);
    }
    if let Some(list) = taints.as_array_mut() {
        let present = list
            .iter()
            .any(|t| str_at(t, "/key") == Some(KEY) && str_at(t, "/effect") == Some("NoSchedule"));
        if !present {
            list.push(json!({"key": KEY, "effect": "NoSchedule"}));
        }
    }
}

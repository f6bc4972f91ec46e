//! Defaulting and the validations kube-apiserver applies that a cloud-controller-manager can trip on.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Value, json};

use super::resources::{NameRule, ResourceInfo};
use super::status::FieldError;

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

const SERVICE_TYPES: &[&str] = &["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"];

/// Fills the defaults kube-apiserver gives a new Service.
pub(crate) fn default_service(
    obj: &mut Value,
    cluster_ip: &str,
    mut node_port: impl FnMut() -> i64,
) {
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let ty = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP")
        .to_string();
    spec.insert("type".into(), json!(ty));
    spec.entry("sessionAffinity").or_insert(json!("None"));
    let wants_ip = ty != "ExternalName";
    if wants_ip {
        let has_ip = spec
            .get("clusterIP")
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty());
        if !has_ip {
            spec.insert("clusterIP".into(), json!(cluster_ip));
        }
        if let Some(ip) = spec.get("clusterIP").cloned() {
            spec.entry("clusterIPs").or_insert(json!([ip]));
        }
        spec.entry("ipFamilies").or_insert(json!(["IPv4"]));
        spec.entry("ipFamilyPolicy").or_insert(json!("SingleStack"));
        spec.entry("internalTrafficPolicy")
            .or_insert(json!("Cluster"));
    }
    let external = ty == "LoadBalancer" || ty == "NodePort";
    if external {
        spec.entry("externalTrafficPolicy")
            .or_insert(json!("Cluster"));
    }
    if ty == "LoadBalancer" {
        spec.entry("allocateLoadBalancerNodePorts")
            .or_insert(json!(true));
    }
    let allocate = ty == "NodePort"
        || (ty == "LoadBalancer"
            && spec.get("allocateLoadBalancerNodePorts") != Some(&json!(false)));
    if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports {
            let Some(p) = p.as_object_mut() else { continue };
            p.entry("protocol").or_insert(json!("TCP"));
            if let Some(port) = p.get("port").cloned() {
                p.entry("targetPort").or_insert(port);
            }
            if allocate && p.get("nodePort").and_then(Value::as_i64).unwrap_or(0) == 0 {
                p.insert("nodePort".into(), json!(node_port()));
            }
        }
    }
    if ty == "LoadBalancer"
        && spec.get("externalTrafficPolicy") == Some(&json!("Local"))
        && spec
            .get("healthCheckNodePort")
            .and_then(Value::as_i64)
            .unwrap_or(0)
            == 0
    {
        spec.insert("healthCheckNodePort".into(), json!(node_port()));
    }
}

/// Copies allocated values (cluster IP, node ports) of the old Service into an update that
/// left them out, as kube-apiserver's service REST does.
pub(crate) fn keep_allocated_service_values(new: &mut Value, old: &Value) {
    let (Some(old_spec), Some(spec)) = (
        old.get("spec"),
        new.get_mut("spec").and_then(Value::as_object_mut),
    ) else {
        return;
    };
    for k in ["clusterIP", "clusterIPs"] {
        let missing = spec.get(k).is_none_or(|v| v.is_null() || v == "");
        if missing && let Some(v) = old_spec.get(k) {
            spec.insert(k.into(), v.clone());
        }
    }
    let old_ports: Vec<Value> = old_spec
        .get("ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports {
            let Some(p) = p.as_object_mut() else { continue };
            if p.get("nodePort").and_then(Value::as_i64).unwrap_or(0) != 0 {
                continue;
            }
            let same = old_ports.iter().find(|o| {
                o.get("port") == p.get("port")
                    && o.get("protocol").and_then(Value::as_str).unwrap_or("TCP")
                        == p.get("protocol").and_then(Value::as_str).unwrap_or("TCP")
            });
            if let Some(np) = same.and_then(|o| o.get("nodePort")) {
                p.insert("nodePort".into(), np.clone());
            }
        }
    }
    let hc_missing = spec
        .get("healthCheckNodePort")
        .and_then(Value::as_i64)
        .unwrap_or(0)
        == 0;
    if hc_missing
        && spec.get("externalTrafficPolicy") == Some(&json!("Local"))
        && let Some(v) = old_spec.get("healthCheckNodePort")
    {
        spec.insert("healthCheckNodePort".into(), v.clone());
    }
}

/// Service validation: type, ports, load-balancer class, external traffic policy.
pub(crate) fn validate_service(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let ty = str_at(obj, "/spec/type").unwrap_or("ClusterIP");
    if !SERVICE_TYPES.contains(&ty) {
        errs.push(FieldError::not_supported("spec.type", ty, SERVICE_TYPES));
    }
    let ports = obj
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if ports.is_empty() && ty != "ExternalName" && str_at(obj, "/spec/clusterIP") != Some("None") {
        errs.push(FieldError::required("spec.ports", ""));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
        if !(1..=65535).contains(&port) {
            errs.push(FieldError::invalid(
                format!("spec.ports[{i}].port"),
                &port.to_string(),
                "must be between 1 and 65535, inclusive",
            ));
        }
        if ports.len() > 1 && str_at(p, "/name").is_none_or(str::is_empty) {
            errs.push(FieldError::required(format!("spec.ports[{i}].name"), ""));
        }
        let proto = str_at(p, "/protocol").unwrap_or("TCP");
        if !["TCP", "UDP", "SCTP"].contains(&proto) {
            errs.push(FieldError::not_supported(
                format!("spec.ports[{i}].protocol"),
                proto,
                &["SCTP", "TCP", "UDP"],
            ));
        }
        if !seen.insert((port, proto.to_string())) {
            errs.push(FieldError::duplicate(
                format!("spec.ports[{i}]"),
                &format!("core.ServicePort{{port:{port}, protocol:{proto:?}}}"),
            ));
        }
    }
    if let Some(etp) = str_at(obj, "/spec/externalTrafficPolicy")
        && !etp.is_empty()
    {
        if ty != "LoadBalancer" && ty != "NodePort" {
            errs.push(FieldError::invalid(
                "spec.externalTrafficPolicy",
                etp,
                "may only be set for externally-accessible services",
            ));
        } else if etp != "Cluster" && etp != "Local" {
            errs.push(FieldError::not_supported(
                "spec.externalTrafficPolicy",
                etp,
                &["Cluster", "Local"],
            ));
        }
    }
    errs.extend(source_range_errors(obj, ty));
    if let Some(class) = str_at(obj, "/spec/loadBalancerClass") {
        if ty != "LoadBalancer" {
            errs.push(FieldError::forbidden(
                "spec.loadBalancerClass",
                "may only be used when `type` is 'LoadBalancer'",
            ));
        } else {
            errs.extend(qualified_name_errors("spec.loadBalancerClass", class));
        }
    }
    errs
}

/// The annotation older clients use for `spec.loadBalancerSourceRanges`.
pub(crate) const SOURCE_RANGES_ANNOTATION: &str =
    "service.beta.kubernetes.io/load-balancer-source-ranges";

const CIDR_DETAIL: &str = "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)";

/// `spec.loadBalancerSourceRanges`, or when that is empty the source-ranges annotation, as
/// `ValidateService` checks them: only on LoadBalancer Services, every entry a CIDR (space
/// padding tolerated, as kube-apiserver does for historical reasons). The field path keeps
/// kube-apiserver's capitalised `spec.LoadBalancerSourceRanges`.
fn source_range_errors(obj: &Value, ty: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let ranges: Vec<&str> = obj
        .pointer("/spec/loadBalancerSourceRanges")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|v| v.as_str().unwrap_or_default()).collect())
        .unwrap_or_default();
    let not_lb = "may only be used when `type` is 'LoadBalancer'";
    if !ranges.is_empty() {
        let field = "spec.LoadBalancerSourceRanges";
        if ty != "LoadBalancer" {
            errs.push(FieldError::forbidden(field, not_lb));
        }
        for (i, r) in ranges.iter().enumerate() {
            let r = r.trim();
            if r.parse::<ipnet::IpNet>().is_err() {
                errs.push(FieldError::invalid(format!("{field}[{i}]"), r, CIDR_DETAIL));
            }
        }
    } else if let Some(value) = obj
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(SOURCE_RANGES_ANNOTATION))
    {
        let field = format!("metadata.annotations[{SOURCE_RANGES_ANNOTATION}]");
        if ty != "LoadBalancer" {
            errs.push(FieldError::forbidden(field.clone(), not_lb));
        }
        let value = value.as_str().unwrap_or_default().trim();
        if !value.is_empty() {
            for r in value.split(',').map(str::trim) {
                if r.parse::<ipnet::IpNet>().is_err() {
                    errs.push(FieldError::invalid(field.clone(), r, CIDR_DETAIL));
                }
            }
        }
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

/// Service update validation: clusterIP and loadBalancerClass are immutable.
pub(crate) fn validate_service_update(new: &Value, old: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let old_ip = str_at(old, "/spec/clusterIP").unwrap_or_default();
    let new_ip = str_at(new, "/spec/clusterIP").unwrap_or_default();
    let old_type = str_at(old, "/spec/type").unwrap_or("ClusterIP");
    let new_type = str_at(new, "/spec/type").unwrap_or("ClusterIP");
    if old_type != "ExternalName" && new_type != "ExternalName" && old_ip != new_ip {
        errs.push(FieldError::immutable("spec.clusterIPs[0]", new_ip));
    }
    let old_class = str_at(old, "/spec/loadBalancerClass");
    let new_class = str_at(new, "/spec/loadBalancerClass");
    if old_type == "LoadBalancer" && new_type == "LoadBalancer" && old_class != new_class {
        errs.push(FieldError::immutable(
            "spec.loadBalancerClass",
            new_class.unwrap_or_default(),
        ));
    }
    errs
}

/// Service status validation: load-balancer ingress entries need an IP or a hostname.
pub(crate) fn validate_service_status(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(ing) = obj
        .pointer("/status/loadBalancer/ingress")
        .and_then(Value::as_array)
    {
        for (i, e) in ing.iter().enumerate() {
            let f = format!("status.loadBalancer.ingress[{i}].ip");
            if let Some(ip) = str_at(e, "/ip")
                && ip.parse::<std::net::IpAddr>().is_err()
            {
                errs.push(FieldError::invalid(f, ip, "must be a valid IP address"));
            }
            if let Some(h) = str_at(e, "/hostname")
                && !is_dns1123_subdomain(h)
            {
                errs.push(FieldError::invalid(
                    format!("status.loadBalancer.ingress[{i}].hostname"),
                    h,
                    "must be a DNS name",
                ));
            }
        }
    }
    errs
}

/// Lease validation: non-negative durations and transitions.
pub(crate) fn validate_lease(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(d) = obj
        .pointer("/spec/leaseDurationSeconds")
        .and_then(Value::as_i64)
        && d <= 0
    {
        errs.push(FieldError::invalid(
            "spec.leaseDurationSeconds",
            &d.to_string(),
            "must be greater than 0",
        ));
    }
    if let Some(t) = obj
        .pointer("/spec/leaseTransitions")
        .and_then(Value::as_i64)
        && t < 0
    {
        errs.push(FieldError::invalid(
            "spec.leaseTransitions",
            &t.to_string(),
            "must be greater than or equal to 0",
        ));
    }
    errs
}

/// events.k8s.io/v1 create validation (`ValidateEventCreate` for the v1 API).
pub(crate) fn validate_events_v1_create(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if obj.get("eventTime").is_none_or(Value::is_null) {
        errs.push(FieldError::required("eventTime", ""));
    }
    let ty = str_at(obj, "/type").unwrap_or_default();
    if ty != "Normal" && ty != "Warning" {
        errs.push(FieldError::invalid("type", ty, "has invalid value"));
    }
    let mut required = |field: &str, limit: usize| match str_at(obj, &format!("/{field}")) {
        None | Some("") => errs.push(FieldError::required(field, "")),
        Some(v) if v.len() > limit => errs.push(FieldError {
            reason: "FieldValueTooLong",
            field: field.to_string(),
            message: format!("{field}: Too long: may not be more than {limit} bytes"),
        }),
        Some(_) => {}
    };
    required("reportingController", 253);
    required("reportingInstance", 128);
    required("action", 128);
    required("reason", 128);
    if let Some(c) = str_at(obj, "/reportingController") {
        errs.extend(qualified_name_errors("reportingController", c));
    }
    if let Some(note) = str_at(obj, "/note")
        && note.len() > 1024
    {
        errs.push(FieldError {
            reason: "FieldValueTooLong",
            field: "note".into(),
            message: "note: Too long: may not be more than 1024 bytes".into(),
        });
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

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

//! Service defaulting (cluster IP, node ports, ingress IP mode) and validation (spec, source
//! ranges, updates, status).

use serde_json::{Value, json};

use super::{is_dns1123_subdomain, qualified_name_errors, str_at};
use crate::apiserver::status::FieldError;

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
    let mut errs = ip_mode_errors(obj);
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

/// `SetDefaults_Service` (LoadBalancerIPMode, GA since 1.32): a LoadBalancer Service's
/// ingress entry with an `ip` and no `ipMode` gets `ipMode: VIP`, on every write.
pub(crate) fn default_ingress_ip_mode(obj: &mut Value) {
    if str_at(obj, "/spec/type") != Some("LoadBalancer") {
        return;
    }
    if let Some(ing) = obj
        .pointer_mut("/status/loadBalancer/ingress")
        .and_then(Value::as_array_mut)
    {
        for e in ing.iter_mut().filter_map(Value::as_object_mut) {
            let has_ip = e
                .get("ip")
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty());
            if has_ip && e.get("ipMode").is_none_or(Value::is_null) {
                e.insert("ipMode".into(), json!("VIP"));
            }
        }
    }
}

/// `ipMode` of load-balancer ingress entries: `VIP` or `Proxy`, and only with an `ip`.
fn ip_mode_errors(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let Some(ing) = obj
        .pointer("/status/loadBalancer/ingress")
        .and_then(Value::as_array)
    else {
        return errs;
    };
    for (i, e) in ing.iter().enumerate() {
        let Some(mode) = str_at(e, "/ipMode") else {
            continue;
        };
        let field = format!("status.loadBalancer.ingress[{i}].ipMode");
        if str_at(e, "/ip").is_none_or(str::is_empty) {
            errs.push(FieldError::forbidden(
                field,
                "may not be specified when `ip` is not set",
            ));
        } else if mode != "VIP" && mode != "Proxy" {
            errs.push(FieldError::not_supported(field, mode, &["Proxy", "VIP"]));
        }
    }
    errs
}

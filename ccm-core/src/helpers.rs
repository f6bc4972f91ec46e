//! Helpers Go's `k8s.io/cloud-provider` gives vendors: load-balancer naming, source ranges and
//! health checks of a Service, and the well-known names of the CCM protocol.

use std::collections::BTreeSet;

use ipnet::IpNet;

use crate::Service;
use crate::well_known::ANNOTATION_LOAD_BALANCER_SOURCE_RANGES;

/// The default name of a Service's load balancer: `a` followed by the Service UID without
/// dashes, truncated to 32 characters (Go's deprecated `cloudprovider.DefaultLoadBalancerName`;
/// the leading letter satisfies GCE, the length limit AWS).
///
/// ```
/// use ccm_core::{default_load_balancer_name, Service};
/// let mut svc = Service::default();
/// svc.metadata.uid = Some("2f3c6a1e-9b7d-4c1a-8e5f-0123456789ab".into());
/// assert_eq!(default_load_balancer_name(&svc), "a2f3c6a1e9b7d4c1a8e5f0123456789a");
/// assert_eq!(default_load_balancer_name(&svc).len(), 32);
/// ```
pub fn default_load_balancer_name(service: &Service) -> String {
    let uid = service.metadata.uid.as_deref().unwrap_or_default();
    let mut name: String = std::iter::once('a')
        .chain(uid.chars().filter(|c| *c != '-'))
        .collect();
    // Go truncates bytes; a UID is ASCII, and for anything else cut at a char boundary.
    if name.len() > 32 {
        let mut cut = 32;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        name.truncate(cut);
    }
    name
}

/// Why a Service's load-balancer source ranges are invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SourceRangeError {
    /// An entry of `spec.loadBalancerSourceRanges` is not a CIDR.
    #[error(
        "service.Spec.LoadBalancerSourceRanges: {ranges:?} is not valid. Expecting a list of IP ranges. For example, 10.0.0.0/24. Invalid entry: {invalid:?}"
    )]
    Spec {
        /// The field's entries.
        ranges: Vec<String>,
        /// The first entry that is not a CIDR.
        invalid: String,
    },
    /// An entry of the `service.beta.kubernetes.io/load-balancer-source-ranges` annotation is
    /// not a CIDR.
    #[error(
        "service.beta.kubernetes.io/load-balancer-source-ranges: {value} is not valid. Expecting a comma-separated list of source IP ranges. For example, 10.0.0.0/24,192.168.2.0/24"
    )]
    Annotation {
        /// The annotation's value.
        value: String,
    },
}

/// The source ranges allowed to reach a Service's load balancer (Go's
/// `GetLoadBalancerSourceRanges`).
///
/// `spec.loadBalancerSourceRanges` wins when non-empty; otherwise the comma-separated annotation
/// `service.beta.kubernetes.io/load-balancer-source-ranges`; when neither is set (or the
/// annotation is blank), `0.0.0.0/0`. Entries are trimmed, masked to their network
/// (`10.0.0.1/8` is `10.0.0.0/8`), de-duplicated and sorted. Any entry that is not a CIDR makes
/// the whole answer an error.
///
/// ```
/// use ccm_core::{load_balancer_source_ranges, is_allow_all, Service};
/// let svc = Service::default();
/// let ranges = load_balancer_source_ranges(&svc).unwrap();
/// assert_eq!(ranges.iter().map(|n| n.to_string()).collect::<Vec<_>>(), ["0.0.0.0/0"]);
/// assert!(is_allow_all(&ranges));
/// ```
pub fn load_balancer_source_ranges(service: &Service) -> Result<Vec<IpNet>, SourceRangeError> {
    let spec_ranges = service
        .spec
        .as_ref()
        .and_then(|s| s.load_balancer_source_ranges.as_ref())
        .filter(|r| !r.is_empty());
    if let Some(ranges) = spec_ranges {
        return parse_cidrs(ranges.iter().map(String::as_str)).map_err(|invalid| {
            SourceRangeError::Spec {
                ranges: ranges.clone(),
                invalid,
            }
        });
    }
    let annotation = service
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_LOAD_BALANCER_SOURCE_RANGES))
        .map(|v| v.trim())
        .unwrap_or_default();
    let value = if annotation.is_empty() {
        "0.0.0.0/0"
    } else {
        annotation
    };
    parse_cidrs(value.split(',')).map_err(|_| SourceRangeError::Annotation {
        value: value.to_owned(),
    })
}

/// Parses trimmed CIDRs, masking each to its network; on failure returns the offending entry.
fn parse_cidrs<'a>(entries: impl Iterator<Item = &'a str>) -> Result<Vec<IpNet>, String> {
    let mut set = BTreeSet::new();
    for entry in entries {
        let trimmed = entry.trim();
        let net: IpNet = trimmed.parse().map_err(|_| entry.to_owned())?;
        set.insert(net.trunc());
    }
    Ok(set.into_iter().collect())
}

/// Whether the ranges allow every IPv4 source: one of them is exactly `0.0.0.0/0` (Go's
/// `IsAllowAll`, which looks at IPv4 only).
pub fn is_allow_all(ranges: &[IpNet]) -> bool {
    ranges.iter().any(|n| n.to_string() == "0.0.0.0/0")
}

fn service_type(service: &Service) -> &str {
    service
        .spec
        .as_ref()
        .and_then(|s| s.type_.as_deref())
        .unwrap_or("ClusterIP")
}

/// Whether the Service only sends traffic to node-local endpoints: a `LoadBalancer` or
/// `NodePort` Service with `externalTrafficPolicy: Local` (Go's `RequestsOnlyLocalTraffic`).
pub fn requests_only_local_traffic(service: &Service) -> bool {
    if !matches!(service_type(service), "LoadBalancer" | "NodePort") {
        return false;
    }
    service
        .spec
        .as_ref()
        .and_then(|s| s.external_traffic_policy.as_deref())
        == Some("Local")
}

/// Whether the cloud load balancer needs a health check against the Service's
/// `healthCheckNodePort`: a `LoadBalancer` Service with `externalTrafficPolicy: Local` (Go's
/// `NeedsHealthCheck`).
pub fn needs_health_check(service: &Service) -> bool {
    service_type(service) == "LoadBalancer" && requests_only_local_traffic(service)
}

/// The HTTP path and node port the load balancer's health check should probe, when it needs one
/// (Go's `GetServiceHealthCheckPathPort`): `("/healthz", spec.healthCheckNodePort)` for a
/// `LoadBalancer` Service with `externalTrafficPolicy: Local` and a non-zero health-check port,
/// `None` otherwise.
///
/// ```
/// use ccm_core::{health_check_path_port, Service};
/// use ccm_core::k8s_openapi::api::core::v1::ServiceSpec;
/// let svc = Service {
///     spec: Some(ServiceSpec {
///         type_: Some("LoadBalancer".into()),
///         external_traffic_policy: Some("Local".into()),
///         health_check_node_port: Some(32000),
///         ..Default::default()
///     }),
///     ..Default::default()
/// };
/// assert_eq!(health_check_path_port(&svc), Some(("/healthz", 32000)));
/// ```
pub fn health_check_path_port(service: &Service) -> Option<(&'static str, i32)> {
    if !needs_health_check(service) {
        return None;
    }
    let port = service.spec.as_ref()?.health_check_node_port.unwrap_or(0);
    (port != 0).then_some(("/healthz", port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ServiceSpec;
    use std::collections::BTreeMap;

    fn svc(spec_ranges: Option<Vec<&str>>, annotation: Option<&str>) -> Service {
        let mut s = Service {
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                load_balancer_source_ranges: spec_ranges
                    .map(|r| r.into_iter().map(String::from).collect()),
                ..Default::default()
            }),
            ..Default::default()
        };
        if let Some(a) = annotation {
            s.metadata.annotations = Some(BTreeMap::from([(
                ANNOTATION_LOAD_BALANCER_SOURCE_RANGES.to_owned(),
                a.to_owned(),
            )]));
        }
        s
    }

    fn strings(r: &[IpNet]) -> Vec<String> {
        r.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn lb_name_is_a_plus_uid_truncated_to_32() {
        let mut s = Service::default();
        s.metadata.uid = Some("12345678-1234-1234-1234-123456789012".into());
        let name = default_load_balancer_name(&s);
        assert_eq!(name, "a1234567812341234123412345678901");
        assert_eq!(name.len(), 32);
        // A short UID is not padded.
        s.metadata.uid = Some("ab-cd".into());
        assert_eq!(default_load_balancer_name(&s), "aabcd");
        // No UID: just "a", as Go does.
        assert_eq!(default_load_balancer_name(&Service::default()), "a");
    }

    #[test]
    fn source_ranges_default_allow_all() {
        let r = load_balancer_source_ranges(&svc(None, None)).unwrap();
        assert_eq!(strings(&r), ["0.0.0.0/0"]);
        assert!(is_allow_all(&r));
    }

    #[test]
    fn source_ranges_blank_annotation_is_default() {
        let r = load_balancer_source_ranges(&svc(None, Some("   "))).unwrap();
        assert_eq!(strings(&r), ["0.0.0.0/0"]);
    }

    #[test]
    fn source_ranges_empty_spec_list_falls_back_to_annotation() {
        let r = load_balancer_source_ranges(&svc(Some(vec![]), Some("10.0.0.0/8"))).unwrap();
        assert_eq!(strings(&r), ["10.0.0.0/8"]);
        assert!(!is_allow_all(&r));
    }

    #[test]
    fn source_ranges_spec_wins_over_annotation() {
        let r = load_balancer_source_ranges(&svc(Some(vec!["192.168.0.0/16"]), Some("10.0.0.0/8")))
            .unwrap();
        assert_eq!(strings(&r), ["192.168.0.0/16"]);
    }

    #[test]
    fn source_ranges_annotation_comma_list_trimmed_masked_deduped() {
        let r = load_balancer_source_ranges(&svc(
            None,
            Some(" 10.0.0.1/8 , 192.168.2.0/24,10.0.0.0/8, 2001:db8::1/32"),
        ))
        .unwrap();
        assert_eq!(
            strings(&r),
            ["10.0.0.0/8", "192.168.2.0/24", "2001:db8::/32"]
        );
    }

    #[test]
    fn source_ranges_invalid_spec_entry_is_error() {
        let err =
            load_balancer_source_ranges(&svc(Some(vec!["10.0.0.0/8", "bogus"]), None)).unwrap_err();
        assert_eq!(
            err,
            SourceRangeError::Spec {
                ranges: vec!["10.0.0.0/8".into(), "bogus".into()],
                invalid: "bogus".into()
            }
        );
        assert!(err.to_string().contains("Expecting a list of IP ranges"));
    }

    #[test]
    fn source_ranges_invalid_annotation_is_error() {
        let err = load_balancer_source_ranges(&svc(None, Some("10.0.0.0/8,10.0.0.0"))).unwrap_err();
        assert_eq!(
            err,
            SourceRangeError::Annotation {
                value: "10.0.0.0/8,10.0.0.0".into()
            }
        );
        assert!(err.to_string().starts_with("service.beta.kubernetes.io/load-balancer-source-ranges: 10.0.0.0/8,10.0.0.0 is not valid"));
    }

    #[test]
    fn allow_all_is_ipv4_only() {
        let r = load_balancer_source_ranges(&svc(None, Some("::/0"))).unwrap();
        assert!(!is_allow_all(&r));
    }

    fn typed(type_: &str, etp: Option<&str>, hc: Option<i32>) -> Service {
        Service {
            spec: Some(ServiceSpec {
                type_: Some(type_.into()),
                external_traffic_policy: etp.map(String::from),
                health_check_node_port: hc,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn local_traffic_rules() {
        assert!(requests_only_local_traffic(&typed(
            "LoadBalancer",
            Some("Local"),
            None
        )));
        assert!(requests_only_local_traffic(&typed(
            "NodePort",
            Some("Local"),
            None
        )));
        assert!(!requests_only_local_traffic(&typed(
            "ClusterIP",
            Some("Local"),
            None
        )));
        assert!(!requests_only_local_traffic(&typed(
            "LoadBalancer",
            Some("Cluster"),
            None
        )));
        assert!(!requests_only_local_traffic(&typed(
            "LoadBalancer",
            None,
            None
        )));
        assert!(!requests_only_local_traffic(&Service::default()));
    }

    #[test]
    fn health_check_rules() {
        assert!(needs_health_check(&typed(
            "LoadBalancer",
            Some("Local"),
            None
        )));
        assert!(!needs_health_check(&typed(
            "NodePort",
            Some("Local"),
            Some(3)
        )));
        assert_eq!(
            health_check_path_port(&typed("LoadBalancer", Some("Local"), Some(31000))),
            Some(("/healthz", 31000))
        );
        assert_eq!(
            health_check_path_port(&typed("LoadBalancer", Some("Local"), Some(0))),
            None
        );
        assert_eq!(
            health_check_path_port(&typed("LoadBalancer", Some("Local"), None)),
            None
        );
        assert_eq!(
            health_check_path_port(&typed("NodePort", Some("Local"), Some(31000))),
            None
        );
        assert_eq!(
            health_check_path_port(&typed("LoadBalancer", Some("Cluster"), Some(31000))),
            None
        );
    }
}

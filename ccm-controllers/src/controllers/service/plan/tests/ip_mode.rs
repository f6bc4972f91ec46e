//! The `ipMode` of the written ingress entries: provider's entry > allowed annotation > the
//! class's default; never on a hostname-only entry; a refused annotation is reported.

use super::*;
use ccm_core::{ANNOTATION_IP_MODE, IpMode, IpModes};

fn annotated(value: &str) -> Service {
    let mut s = lb();
    s.metadata.annotations = Some([(ANNOTATION_IP_MODE.to_owned(), value.to_owned())].into());
    s
}

fn entry(ip: Option<&str>, hostname: Option<&str>, mode: Option<&str>) -> LoadBalancerIngress {
    LoadBalancerIngress {
        ip: ip.map(Into::into),
        hostname: hostname.map(Into::into),
        ip_mode: mode.map(Into::into),
        ..Default::default()
    }
}

fn modes_of(status: &LoadBalancerStatus) -> Vec<Option<&str>> {
    slice_or_empty(&status.ingress)
        .iter()
        .map(|e| e.ip_mode.as_deref())
        .collect()
}

fn mixed() -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: Some(vec![
            entry(Some("203.0.113.1"), None, None),
            entry(None, Some("lb.example.com"), Some("VIP")),
            entry(Some("203.0.113.2"), None, Some("Proxy")),
            entry(Some("203.0.113.3"), Some("lb.example.com"), Some("bogus")),
        ]),
    }
}

#[test]
fn every_ip_entry_gets_an_explicit_mode_and_hostnames_none() {
    let vip = IpModes::vip();
    let out = with_ip_modes(mixed(), &ip_mode_request(&lb(), vip), vip);
    assert_eq!(
        modes_of(&out),
        [Some("VIP"), None, Some("Proxy"), Some("VIP")],
        "the default on ip entries, the provider's own valid mode kept, none on a hostname, an invalid one replaced"
    );
    let proxy = IpModes::proxy();
    let out = with_ip_modes(mixed(), &ip_mode_request(&lb(), proxy), proxy);
    assert_eq!(
        modes_of(&out),
        [Some("Proxy"), None, Some("Proxy"), Some("Proxy")]
    );
}

#[test]
fn annotation_asks_for_proxy_where_the_class_allows_it() {
    let modes = IpModes::vip_or_proxy_on_request();
    let s = annotated("Proxy");
    let request = ip_mode_request(&s, modes);
    assert_eq!(request, IpModeRequest::Allowed(IpMode::Proxy));
    let status = LoadBalancerStatus {
        ingress: Some(vec![
            entry(Some("203.0.113.1"), None, None),
            entry(Some("203.0.113.2"), None, Some("VIP")),
        ]),
    };
    assert_eq!(
        modes_of(&with_ip_modes(status, &request, modes)),
        [Some("Proxy"), Some("VIP")],
        "the provider's explicit entry wins over the annotation"
    );
}

#[test]
fn refused_or_invalid_annotation_keeps_the_default_and_says_why() {
    let vip = IpModes::vip();
    let IpModeRequest::Refused(note) = ip_mode_request(&annotated("Proxy"), vip) else {
        panic!("Proxy is not allowed by a VIP-only class");
    };
    assert!(note.contains("not offered"), "{note}");
    let IpModeRequest::Refused(note) =
        ip_mode_request(&annotated("proxy"), IpModes::vip_or_proxy_on_request())
    else {
        panic!("the API's spelling only");
    };
    assert!(note.contains("is not an ipMode"), "{note}");
    let refused = ip_mode_request(&annotated("Proxy"), vip);
    let status = LoadBalancerStatus {
        ingress: Some(vec![entry(Some("203.0.113.1"), None, None)]),
    };
    assert_eq!(
        modes_of(&with_ip_modes(status, &refused, vip)),
        [Some("VIP")]
    );
}

#[test]
fn defaulted_vip_written_against_a_stored_entry_without_mode_is_no_change() {
    // A server before the field (or before its defaulting) stores no ipMode: the planned VIP
    // must not make a patch on every sync.
    let mut s = lb();
    s.status = Some(ServiceStatus {
        load_balancer: Some(status(&["203.0.113.10"])),
        ..Default::default()
    });
    let planned = with_ip_modes(
        status(&["203.0.113.10"]),
        &IpModeRequest::None,
        IpModes::vip(),
    );
    assert_eq!(modes_of(&planned), [Some("VIP")]);
    let now = Time("2026-01-01T00:00:00Z".parse().unwrap());
    assert_eq!(
        status_patch(&s, &planned, &LoadBalancerState::Untouched, &now),
        None
    );
    let proxy = with_ip_modes(
        status(&["203.0.113.10"]),
        &IpModeRequest::Allowed(IpMode::Proxy),
        IpModes::vip_or_proxy_on_request(),
    );
    assert!(status_patch(&s, &proxy, &LoadBalancerState::Untouched, &now).is_some());
}

//! `status.loadBalancer.ingress[].ipMode` (KEP-1860, beyond Go): explicit on every entry with an
//! `ip`, the class's default unless the Service asks for another mode the provider allows with
//! `service.ccm-rs.io/ip-mode`; a refused request is a Warning Event and the default; never an
//! `ipMode` on a hostname-only entry (the API server rejects one there).

use std::sync::Arc;

use ccm_testing::TestCluster;
use ccm_testing::builders::load_balancer_service;
use ccm_testing::fake_cloud::FakeCloud;
use ccm_testing::wait::wait_for;
use k8s_openapi::api::core::v1::Service;

use crate::support::service::*;

fn ip_modes(service: &Service) -> Vec<(Option<String>, Option<String>, Option<String>)> {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.ip, e.hostname, e.ip_mode))
        .collect()
}

fn mode_of(service: &Service) -> Option<String> {
    ip_modes(service).first().and_then(|(_, _, m)| m.clone())
}

#[tokio::test]
async fn proxy_on_request_where_the_class_allows_it() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::builder()
        .load_balancer_ip_modes("-", "vip_or_proxy_on_request")
        .build();
    let _running = start(&cluster, &ns, Arc::new(fake.clone()), test_config()).await;
    let api = services(&cluster, &ns);
    let plain = cluster.unique_name("plain");
    let proxied = cluster.unique_name("proxied");
    cluster
        .create(&load_balancer_service(&ns, &plain).build())
        .await;
    cluster
        .create(
            &load_balancer_service(&ns, &proxied)
                .annotation("service.ccm-rs.io/ip-mode", "Proxy")
                .build(),
        )
        .await;
    let plain = wait_for(&api, &plain, TIMEOUT, has_ingress).await.unwrap();
    assert_eq!(
        mode_of(&plain).as_deref(),
        Some("VIP"),
        "{:?}",
        ip_modes(&plain)
    );
    let proxied = wait_for(&api, &proxied, TIMEOUT, has_ingress)
        .await
        .unwrap();
    assert_eq!(
        mode_of(&proxied).as_deref(),
        Some("Proxy"),
        "{:?}",
        ip_modes(&proxied)
    );
}

#[tokio::test]
async fn proxy_refused_where_the_class_does_not_offer_it() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let _running = start(&cluster, &ns, Arc::new(fake.clone()), test_config()).await;
    let api = services(&cluster, &ns);
    let name = cluster.unique_name("refused");
    cluster
        .create(
            &load_balancer_service(&ns, &name)
                .annotation("service.ccm-rs.io/ip-mode", "Proxy")
                .build(),
        )
        .await;
    let note = wait_event(&cluster, &ns, &name, "IPModeNotAllowed").await;
    assert!(note.contains("not offered"), "{note}");
    let service = wait_for(&api, &name, TIMEOUT, has_ingress).await.unwrap();
    assert_eq!(
        mode_of(&service).as_deref(),
        Some("VIP"),
        "{:?}",
        ip_modes(&service)
    );
}

#[tokio::test]
async fn hostname_entries_carry_no_ip_mode() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    // A class that always proxies: still no ipMode on a hostname, which the API server rejects.
    let fake = FakeCloud::builder()
        .lb_hostname("lb.example.com")
        .load_balancer_ip_modes("-", "proxy")
        .build();
    let _running = start(&cluster, &ns, Arc::new(fake.clone()), test_config()).await;
    let api = services(&cluster, &ns);
    let name = cluster.unique_name("named");
    cluster
        .create(&load_balancer_service(&ns, &name).build())
        .await;
    let service = wait_for(&api, &name, TIMEOUT, |s| !ip_modes(s).is_empty())
        .await
        .unwrap();
    assert_eq!(
        ip_modes(&service),
        [(None, Some("lb.example.com".to_owned()), None)]
    );
    assert!(!has_event(&cluster, &ns, &name, "SyncLoadBalancerFailed").await);
}

//! `--load-balancer-status-conditions` (beyond Go): the load balancer's state in the Service's
//! `status.conditions`, `False` with the error when ensuring fails, `True` in the same status
//! write as the ingress, removed when the Service is no longer served; another writer's
//! condition is kept.

use ccm_testing::TestCluster;
use ccm_testing::builders::load_balancer_service;
use ccm_testing::fake_cloud::{FakeCloud, Fault};
use ccm_testing::wait::wait_for;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::support::service::*;

fn condition<'a>(service: &'a Service, type_: &str) -> Option<&'a Condition> {
    service
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

fn provisioned(service: &Service) -> Option<&Condition> {
    condition(service, "LoadBalancerProvisioned")
}

#[tokio::test]
async fn load_balancer_state_is_in_the_services_conditions() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    fake.inject("ensure_load_balancer", Fault::FailNext(1));
    let mut config = test_config();
    config.status_conditions = true;
    let (running, _probe) = start_probed(&cluster, &ns, &fake, config).await;
    let api = services(&cluster, &ns);
    let name = cluster.unique_name("web");
    cluster
        .create(&load_balancer_service(&ns, &name).build())
        .await;

    // Another writer's condition, which the controller's writes must keep.
    api.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"conditions": [{"type": "example.com/Other", "status": "True", "reason": "R", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})),
    )
    .await
    .unwrap();

    // The failure: False, with the error's message, no ingress.
    let failed = wait_for(&api, &name, TIMEOUT, |s| {
        provisioned(s).is_some_and(|c| c.status == "False")
    })
    .await
    .unwrap();
    let c = provisioned(&failed).unwrap();
    assert_eq!(c.reason, "SyncLoadBalancerFailed");
    assert!(
        c.message.starts_with("failed to ensure load balancer: "),
        "{c:?}"
    );
    assert!(!has_ingress(&failed));

    // The retry succeeds: the ingress and True arrive in one write (never one without the
    // other).
    let ensured = wait_for(&api, &name, TIMEOUT, has_ingress).await.unwrap();
    let c = provisioned(&ensured).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "Provisioned")
    );
    assert!(condition(&ensured, "example.com/Other").is_some());

    // No longer a LoadBalancer: ingress and condition go, the other writer's stays.
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"type": "ClusterIP", "externalTrafficPolicy": null}})),
    )
    .await
    .unwrap();
    let cleared = wait_for(&api, &name, TIMEOUT, |s| {
        !has_ingress(s) && provisioned(s).is_none()
    })
    .await
    .unwrap();
    assert!(condition(&cleared, "example.com/Other").is_some());
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

/// Off by default: Go's writes only, no condition.
#[tokio::test]
async fn no_condition_without_the_flag() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let (running, _probe) = start_probed(&cluster, &ns, &fake, test_config()).await;
    let api = services(&cluster, &ns);
    let name = cluster.unique_name("web");
    cluster
        .create(&load_balancer_service(&ns, &name).build())
        .await;
    let ensured = wait_for(&api, &name, TIMEOUT, has_ingress).await.unwrap();
    assert!(provisioned(&ensured).is_none());
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

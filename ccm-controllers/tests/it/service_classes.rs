//! Service controller and load-balancer classes: a provider serves the classes it declares,
//! `--load-balancer-classes` narrows or renames them, and a Service of any other class is never
//! touched (finalizer, status, cloud calls, node sync), even while it carries the shared cleanup
//! finalizer. On TestCluster + FakeCloud (a real cluster with `CCM_TEST_KUBECONFIG`: the
//! controller sees only the test's namespace).

use std::time::Duration;

use ccm_controllers::ControllerError;
use ccm_controllers::controllers::service::{ServedClass, ServiceConfig};
use ccm_core::well_known::FINALIZER_LOAD_BALANCER_CLEANUP;
use ccm_testing::TestCluster;
use ccm_testing::builders::load_balancer_service;
use ccm_testing::fake_cloud::FakeCloud;
use ccm_testing::wait::{wait_for, wait_for_deletion};
use k8s_openapi::api::core::v1::Service;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

use crate::support::service::*;

const INTERNAL: &str = "fake.example/internal";
const FOREIGN: &str = "other.example/lb";

fn config_serving(flag: &str) -> ServiceConfig {
    let mut config = test_config();
    config.load_balancer_classes = Some(ServedClass::parse_list(flag).unwrap());
    config
}

fn class_of(service: &Service) -> Option<&str> {
    service.spec.as_ref()?.load_balancer_class.as_deref()
}

/// Asserts the Service was never touched: no finalizer of ours, no status, no cloud call.
async fn assert_untouched(api: &kube::Api<Service>, name: &str, fake: &FakeCloud, ns: &str) {
    let s = api.get(name).await.unwrap();
    assert!(ingress_ips(&s).is_empty(), "{name}: {s:?}");
    let k = key(&s);
    assert!(!cloud_lbs(fake, ns).contains_key(&k), "{name}");
    assert!(
        fake.call_log().iter().all(|c| c.subject != k),
        "{name}: {:?}",
        fake.call_log()
    );
}

#[tokio::test]
async fn a_provider_serves_the_classes_it_declares_and_no_other() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::builder()
        .load_balancer_classes(&["-", INTERNAL])
        .build();
    let n1 = cluster.unique_name("n");
    create_node(&cluster, &n1).await;
    let running = start(&cluster, &ns, fake.provider(), test_config()).await;
    let api = services(&cluster, &ns);
    let plain = cluster.unique_name("plain");
    let internal = cluster.unique_name("internal");
    let foreign = cluster.unique_name("foreign");
    cluster
        .create(&load_balancer_service(&ns, &plain).build())
        .await;
    cluster
        .create(
            &load_balancer_service(&ns, &internal)
                .load_balancer_class(INTERNAL)
                .build(),
        )
        .await;
    cluster
        .create(
            &load_balancer_service(&ns, &foreign)
                .load_balancer_class(FOREIGN)
                .build(),
        )
        .await;
    for name in [&plain, &internal] {
        let s = wait_for(&api, name, TIMEOUT, has_ingress).await.unwrap();
        assert!(plan::has_cleanup_finalizer(&s), "{name}");
        let lb = cloud_lbs(&fake, &ns).remove(&key(&s)).unwrap();
        assert_eq!(lb.class.as_deref(), class_of(&s), "{name}");
        // Other tests' Nodes may be hosts too on a shared cluster.
        assert!(lb.hosts.contains(&n1), "{name}: {:?}", lb.hosts);
    }
    // The Events of a classed Service say the class; Go's notes stay as they are without one.
    assert_eq!(
        wait_event(&cluster, &ns, &internal, "EnsuredLoadBalancer").await,
        format!("Ensured load balancer (class {INTERNAL})")
    );
    assert_eq!(
        wait_event(&cluster, &ns, &plain, "EnsuredLoadBalancer").await,
        "Ensured load balancer"
    );

    // Node sync: both served load balancers get the new host; the foreign Service nothing.
    let n2 = cluster.unique_name("n");
    create_node(&cluster, &n2).await;
    wait_until("both served load balancers have the new Node", || async {
        let lbs = cloud_lbs(&fake, &ns);
        lbs.len() == 2 && lbs.values().all(|lb| lb.hosts.contains(&n2))
    })
    .await;
    assert_untouched(&api, &foreign, &fake, &ns).await;
    let s = api.get(&foreign).await.unwrap();
    assert!(!plan::has_cleanup_finalizer(&s));

    // Metrics: the classes served, and each operation by class.
    let text = running.metrics();
    for line in [
        "service_controller_served_load_balancer_class{class=\"\",provider_class=\"\"} 1",
        &format!(
            "service_controller_served_load_balancer_class{{class=\"{INTERNAL}\",provider_class=\"{INTERNAL}\"}} 1"
        ),
    ] {
        assert!(text.contains(line), "{line} missing in\n{text}");
    }
    assert!(
        metric_value(
            &text,
            &format!(
                "service_controller_load_balancer_operations_total{{class=\"{INTERNAL}\",operation=\"ensure\",result=\"success\"}}"
            )
        ) >= 1.0,
        "{text}"
    );
    assert!(!text.contains(FOREIGN), "{text}");

    // Deleting the classed Service releases its load balancer, and only it.
    api.delete(&internal, &DeleteParams::default())
        .await
        .unwrap();
    wait_for_deletion(&api, &internal, TIMEOUT).await.unwrap();
    let lbs = cloud_lbs(&fake, &ns);
    assert_eq!(lbs.len(), 1, "{lbs:?}");
    assert!(lbs.contains_key(&format!("{ns}/{plain}")));
    assert_untouched(&api, &foreign, &fake, &ns).await;
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

#[tokio::test]
async fn a_foreign_service_with_the_shared_finalizer_is_left_to_its_own_controller() {
    // Another instance serves Services without a class and put the finalizer on this one;
    // ours serves only `team.example/b` (with the provider's default implementation).
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let running = start(
        &cluster,
        &ns,
        fake.provider(),
        config_serving("team.example/b=-"),
    )
    .await;
    let api = services(&cluster, &ns);
    let theirs = cluster.unique_name("theirs");
    let ours = cluster.unique_name("ours");
    cluster
        .create(
            &load_balancer_service(&ns, &theirs)
                .finalizer(FINALIZER_LOAD_BALANCER_CLEANUP)
                .build(),
        )
        .await;
    cluster
        .create(
            &load_balancer_service(&ns, &ours)
                .load_balancer_class("team.example/b")
                .build(),
        )
        .await;
    let s = wait_for(&api, &ours, TIMEOUT, has_ingress).await.unwrap();
    assert_eq!(
        cloud_lbs(&fake, &ns)
            .remove(&key(&s))
            .and_then(|lb| lb.class)
            .as_deref(),
        Some("team.example/b")
    );
    // Deleting theirs: Go would clean it up (finalizer + deletion); here it is not ours, so its
    // finalizer stays for the controller that serves it.
    api.delete(&theirs, &DeleteParams::default()).await.unwrap();
    // Deleting ours is served in the meantime: once it is gone, the controller has seen theirs.
    api.delete(&ours, &DeleteParams::default()).await.unwrap();
    wait_for_deletion(&api, &ours, TIMEOUT).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = api.get(&theirs).await.unwrap();
    assert!(plan::is_being_deleted(&held));
    assert!(plan::has_cleanup_finalizer(&held), "{held:?}");
    assert_untouched(&api, &theirs, &fake, &ns).await;
    assert!(cloud_lbs(&fake, &ns).is_empty());
    // What the other controller would do: remove its finalizer.
    api.patch(
        &theirs,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    wait_for_deletion(&api, &theirs, TIMEOUT).await.unwrap();
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

#[tokio::test]
async fn a_served_class_turned_cluster_ip_is_cleaned_up_with_its_implementation() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::builder()
        .load_balancer_classes(&[INTERNAL])
        .build();
    let running = start(&cluster, &ns, fake.provider(), test_config()).await;
    let api = services(&cluster, &ns);
    let name = cluster.unique_name("web");
    cluster
        .create(
            &load_balancer_service(&ns, &name)
                .load_balancer_class(INTERNAL)
                .build(),
        )
        .await;
    wait_for(&api, &name, TIMEOUT, has_ingress).await.unwrap();
    // The API server drops the class with the type (kube-apiserver does it itself; the
    // in-process one wants it said).
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"type": "ClusterIP", "externalTrafficPolicy": null, "loadBalancerClass": null}})),
    )
    .await
    .unwrap();
    wait_for(&api, &name, TIMEOUT, |s: &Service| {
        !plan::has_cleanup_finalizer(s) && ingress_ips(s).is_empty()
    })
    .await
    .unwrap();
    assert_eq!(
        wait_event(&cluster, &ns, &name, "DeletedLoadBalancer").await,
        format!("Deleted load balancer (class {INTERNAL})")
    );
    assert!(cloud_lbs(&fake, &ns).is_empty());
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

#[tokio::test]
async fn a_class_the_provider_does_not_declare_stops_the_controller_naming_it() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let running = start(
        &cluster,
        &ns,
        FakeCloud::default().provider(),
        config_serving("-,acme.example/nlb"),
    )
    .await;
    let err = running.stop().await.unwrap_err();
    assert!(matches!(err, ControllerError::Config { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("acme.example/nlb") && text.contains("it declares -"),
        "{text}"
    );
    cluster.cleanup().await;
}

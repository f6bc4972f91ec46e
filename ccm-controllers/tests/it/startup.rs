//! Start-up: every controller processes each object that exists when it starts exactly once
//! (issue 16, item 1). The shared informers deliver the store's objects at start once, on the
//! same subscription as the later changes; before that, the service controller enqueued every
//! Service from the store and again when the informer broadcast its initial list.

use std::time::Duration;

use ccm_controllers::controllers::cloud_node::CloudNodeConfig;
use ccm_controllers::controllers::node_lifecycle::NodeLifecycleConfig;
use ccm_controllers::controllers::route::{self, RouteConfig};
use ccm_core::well_known::FINALIZER_LOAD_BALANCER_CLEANUP;
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use ccm_testing::fake_cloud::{FakeCloud, Fault};
use ccm_testing::wait::{eventually, wait_for, wait_for_deletion};
use k8s_openapi::api::core::v1::Service;
use kube::api::DeleteParams;

use crate::support::node::{RUN_LABEL, TIMEOUT, Test};
use crate::support::service::{has_ingress, key, services, start, start_probed, test_config};

/// A LoadBalancer Service that exists when the controller starts is ensured once (Go: once),
/// with one `EnsuredLoadBalancer` Event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_existing_at_start_is_ensured_once() {
    let t = Test::start().await;
    let ns = t.cluster.namespace().await;
    let name = t.name("web");
    let svc = t
        .cluster
        .create(&load_balancer_service(&ns, &name).build())
        .await;
    let fake = FakeCloud::default();
    let (running, probe) = start_probed(&t.cluster, &ns, &fake, test_config()).await;
    wait_for(&services(&t.cluster, &ns), &name, TIMEOUT, has_ingress)
        .await
        .unwrap();
    running.settled().await;
    assert_eq!(probe.count("ensure_load_balancer", &key(&svc)), 1);
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

/// A Service being deleted when the controller starts (deletionTimestamp set, cleanup
/// finalizer still on: the previous leader stopped before it cleaned up) is cleaned up once:
/// one `ensure_load_balancer_deleted`, and no write to the Service answered 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_being_deleted_at_start_is_cleaned_up_once() {
    let t = Test::start().await;
    let ns = t.cluster.namespace().await;
    let name = t.name("gone");
    let api = services(&t.cluster, &ns);
    let fake = FakeCloud::default();
    // A first controller creates the load balancer, then stops.
    let first = start(&t.cluster, &ns, fake.provider(), test_config()).await;
    let svc = t
        .cluster
        .create(&load_balancer_service(&ns, &name).build())
        .await;
    wait_for(&api, &name, TIMEOUT, has_ingress).await.unwrap();
    first.stop().await.unwrap();
    api.delete(&name, &DeleteParams::default()).await.unwrap();
    wait_for(&api, &name, TIMEOUT, |s: &Service| {
        s.metadata.deletion_timestamp.is_some()
            && s.metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| f.iter().any(|f| f == FINALIZER_LOAD_BALANCER_CLEANUP))
    })
    .await
    .unwrap();
    if let Some(server) = t.cluster.api_server() {
        server.clear_requests();
    }

    let (second, probe) = start_probed(&t.cluster, &ns, &fake, test_config()).await;
    wait_for_deletion(&api, &name, TIMEOUT).await.unwrap();
    second.settled().await;
    assert_eq!(probe.count("ensure_load_balancer_deleted", &key(&svc)), 1);
    assert!(!fake.load_balancers().contains_key(&key(&svc)));
    if let Some(server) = t.cluster.api_server() {
        let not_found: Vec<String> = server
            .requests()
            .into_iter()
            .filter(|r| r.resource == "services" && r.verb == "patch" && r.status == 404)
            .map(|r| r.path)
            .collect();
        assert!(not_found.is_empty(), "PATCHes answered 404: {not_found:?}");
    }
    second.stop().await.unwrap();
    t.cluster.cleanup().await;
}

/// A `CloudError::Retry` answered to the first ensure at start is honoured: the next ensure
/// comes after the provider's delay, not at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_answered_at_start_is_honoured() {
    let t = Test::start().await;
    let ns = t.cluster.namespace().await;
    let name = t.name("later");
    let svc = t
        .cluster
        .create(&load_balancer_service(&ns, &name).build())
        .await;
    let after = Duration::from_secs(3);
    let fake = FakeCloud::default();
    fake.inject("ensure_load_balancer", Fault::Retry { after, count: 1 });
    let (running, probe) = start_probed(&t.cluster, &ns, &fake, test_config()).await;
    wait_for(&services(&t.cluster, &ns), &name, TIMEOUT, has_ingress)
        .await
        .unwrap();
    let ensures = probe.calls_for("ensure_load_balancer", &key(&svc));
    assert_eq!(ensures.len(), 2, "{ensures:?}");
    let waited = ensures[1].at - ensures[0].at;
    assert!(
        waited >= after,
        "retried after {waited:?}, asked for {after:?}"
    );
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

/// A tainted Node that exists when the cloud-node controller starts is looked up in the cloud
/// once and initialised once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloud_node_initialises_a_node_existing_at_start_once() {
    let t = Test::start().await;
    let name = t.name("n");
    t.create(&t.registered_node(&name).build()).await;
    let fake = FakeCloud::default();
    let running = t
        .run_cloud_node(fake.provider(), CloudNodeConfig::default())
        .await;
    t.events_including(&name, "Synced").await;
    running.settled().await;
    assert_eq!(fake.call_count("instance_metadata"), 1);
    let synced = t.events(&name).await;
    assert_eq!(synced.iter().filter(|e| e.1 == "Synced").count(), 1);
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

/// A Node that exists when the route controller starts costs one reconcile: one route listing
/// and one `create_route`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_reconciles_once_for_nodes_existing_at_start() {
    let t = Test::start().await;
    let name = t.name("r");
    t.create(
        &kubelet_node(&name)
            .label(RUN_LABEL, &t.run)
            .pod_cidrs(&["10.201.7.0/24"])
            .build(),
    )
    .await;
    let fake = FakeCloud::default();
    let config = {
        let mut config = RouteConfig::default();
        config.cluster_cidrs = route::parse_cluster_cidrs("10.201.0.0/16").unwrap();
        config.reconciliation_period = Duration::from_secs(3600);
        config.debounce = Duration::from_millis(100);
        config
    };
    // Scoped to this test's Nodes on every cluster (the harness of `support::node`): the route
    // controller writes a condition on every Node it sees.
    let running = t
        .start_controller(fake.provider(), route::NAME, move |ctx| {
            route::run(ctx, config.clone())
        })
        .await;
    let created = eventually(TIMEOUT, || async {
        fake.routes().iter().any(|r| r.target_node == name)
    })
    .await;
    assert!(created, "no route for {name}: {:?}", fake.routes());
    running.settled().await;
    assert_eq!(fake.call_count("create_route"), 1);
    assert_eq!(fake.call_count("list_routes"), 1);
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

/// A NotReady Node that exists when the node-lifecycle controller starts is checked once in the
/// first monitor pass. (The lifecycle controller polls the store and subscribes to nothing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_checks_a_node_existing_at_start_once_per_pass() {
    let t = Test::start().await;
    let name = t.name("l");
    t.create(
        &kubelet_node(&name)
            .label(RUN_LABEL, &t.run)
            .provider_id(&format!("fake://{name}"))
            .not_ready()
            .build(),
    )
    .await;
    let fake = FakeCloud::default();
    let config = {
        let mut config = NodeLifecycleConfig::default();
        config.monitor_period = Duration::from_secs(3600);
        config
    };
    let running = t.run_lifecycle(fake.provider(), config).await;
    let checked = eventually(TIMEOUT, || async {
        fake.call_count("instance_exists") >= 1
    })
    .await;
    assert!(checked, "calls: {:?}", fake.call_counts());
    running.settled().await;
    assert_eq!(fake.call_count("instance_exists"), 1);
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

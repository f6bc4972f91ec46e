//! Service controller: the ensure and delete paths, finalizer, status writes, events, errors and
//! `Retry`, on TestCluster + FakeCloud.

use std::collections::BTreeMap;
use std::time::Duration;

use ccm_controllers::ControllerError;
use ccm_controllers::controllers::service::ServiceConfig;
use ccm_core::well_known::FINALIZER_LOAD_BALANCER_CLEANUP;
use ccm_testing::TestCluster;
use ccm_testing::builders::load_balancer_service;
use ccm_testing::fake_cloud::{FakeCloud, Fault};
use ccm_testing::wait::{wait_for, wait_for_deletion};
use k8s_openapi::api::core::v1::Service;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

use crate::support::assert_warning_logged;
use crate::support::requests::status_patch_statuses;
use crate::support::service::*;

async fn merge(api: &kube::Api<Service>, name: &str, body: serde_json::Value) -> Service {
    api.patch(name, &PatchParams::default(), &Patch::Merge(body))
        .await
        .unwrap()
}

#[tokio::test]
async fn ensure_adds_finalizer_first_then_creates_lb_and_writes_ingress() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let (n1, n2) = (cluster.unique_name("n"), cluster.unique_name("n"));
    create_node(&cluster, &n1).await;
    create_node(&cluster, &n2).await;
    let (running, probe) = start_probed(&cluster, &ns, &fake, test_config()).await;
    let name = cluster.unique_name("web");
    cluster
        .create(&load_balancer_service(&ns, &name).build())
        .await;
    let api = services(&cluster, &ns);
    let svc = wait_for(&api, &name, TIMEOUT, |s: &Service| has_ingress(s))
        .await
        .unwrap();
    assert!(plan::has_cleanup_finalizer(&svc));
    let k = key(&svc);
    // The finalizer was persisted before the cloud was asked to create anything.
    let ensures = probe.calls_for("ensure_load_balancer", &k);
    assert!(!ensures.is_empty());
    assert!(
        ensures.iter().all(|c| c.finalizer_persisted == Some(true)),
        "{ensures:?}"
    );
    let lb = cloud_lbs(&fake, &ns)
        .remove(&k)
        .expect("load balancer exists");
    assert!(lb.hosts.contains(&n1) && lb.hosts.contains(&n2), "{lb:?}");
    assert_eq!(lb.ports, [80, 443]);
    assert_eq!(lb.cluster_name, "kubernetes");
    assert_eq!(lb.name, ccm_core::default_load_balancer_name(&svc));
    wait_event(&cluster, &ns, &name, "EnsuringLoadBalancer").await;
    let note = wait_event(&cluster, &ns, &name, "EnsuredLoadBalancer").await;
    assert_eq!(note, "Ensured load balancer");
    let evs = events(&cluster, &ns, &name).await;
    assert!(
        evs.iter()
            .filter(|(_, r, _)| r.starts_with("Ensur"))
            .all(|(t, _, _)| t == "Normal")
    );
    // Reported as Go's event source component.
    let raw = kube::Api::<k8s_openapi::api::events::v1::Event>::namespaced(cluster.client(), &ns)
        .list(&Default::default())
        .await
        .unwrap();
    let ours: Vec<_> = raw
        .items
        .iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str()))
        .collect();
    assert!(!ours.is_empty());
    assert!(
        ours.iter()
            .all(|e| e.reporting_controller.as_deref() == Some("service-controller")),
        "{ours:?}"
    );

    if let Some(server) = cluster.api_server() {
        // Every write to the Service went through the status subresource as a patch: the
        // finalizer as a JSON patch, the status as a merge patch, once.
        let writes: Vec<_> = server
            .requests()
            .into_iter()
            .filter(|r| r.resource == "services" && r.name.as_deref() == Some(name.as_str()))
            .filter(|r| !matches!(r.verb.as_str(), "get" | "list" | "watch" | "create"))
            .collect();
        assert!(
            writes
                .iter()
                .all(|r| r.verb == "patch" && r.subresource.as_deref() == Some("status")),
            "{writes:#?}"
        );
        let json_patches = writes
            .iter()
            .filter(|r| r.content_type.as_deref() == Some("application/json-patch+json"))
            .count();
        let merge_patches = |w: &[ccm_testing::apiserver::RequestRecord]| {
            w.iter()
                .filter(|r| r.content_type.as_deref() == Some("application/merge-patch+json"))
                .count()
        };
        assert_eq!(json_patches, 1, "{writes:#?}");
        assert_eq!(merge_patches(&writes), 1, "{writes:#?}");

        // A relevant change re-ensures; the unchanged ingress is not written again.
        merge(
            &api,
            &name,
            json!({"metadata": {"annotations": {"x": "1"}}}),
        )
        .await;
        wait_until("a second ensure", || async {
            probe.count("ensure_load_balancer", &k) >= 2
        })
        .await;
        wait_until("the second EnsuredLoadBalancer", || async {
            events(&cluster, &ns, &name)
                .await
                .iter()
                .any(|(_, r, _)| r == "EnsuredLoadBalancer")
        })
        .await;
        // Let the second sync finish (the status decision follows the ensure).
        tokio::time::sleep(Duration::from_millis(300)).await;
        let writes: Vec<_> = server
            .requests()
            .into_iter()
            .filter(|r| r.resource == "services" && r.name.as_deref() == Some(name.as_str()))
            .filter(|r| r.verb == "patch" && r.subresource.as_deref() == Some("status"))
            .collect();
        assert_eq!(merge_patches(&writes), 1, "{writes:#?}");
    }
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

#[tokio::test]
async fn finalizer_write_failure_blocks_cloud_calls_until_it_succeeds() {
    let cluster = TestCluster::start().await;
    let Some(server) = cluster.api_server() else {
        return; // needs fault injection
    };
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let (running, probe) = start_probed(&cluster, &ns, &fake, test_config()).await;
    server.fail_next("patch", "services/status", 1, 500, None);
    let name = cluster.unique_name("web");
    let svc = cluster
        .create(&load_balancer_service(&ns, &name).build())
        .await;
    let note = wait_event(&cluster, &ns, &name, "SyncLoadBalancerFailed").await;
    assert!(
        note.starts_with(
            "Error syncing load balancer: failed to add load balancer cleanup finalizer"
        ),
        "{note}"
    );
    assert_eq!(probe.count("ensure_load_balancer", &key(&svc)), 0);
    assert!(cloud_lbs(&fake, &ns).is_empty());
    // Retried with backoff, then created.
    let svc = wait_for(&services(&cluster, &ns), &name, TIMEOUT, has_ingress)
        .await
        .unwrap();
    assert!(plan::has_cleanup_finalizer(&svc));
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

#[tokio::test]
async fn status_write_failures_500_409_429_are_retried() {
    let cluster = TestCluster::start().await;
    let Some(server) = cluster.api_server() else {
        return; // needs fault injection
    };
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let running = start(&cluster, &ns, fake.provider(), test_config()).await;
    let api = services(&cluster, &ns);
    for code in [500u16, 409, 429] {
        let name = cluster.unique_name(&format!("s{code}"));
        // With the finalizer already present, the first status-subresource write is the
        // status itself.
        server.fail_next(
            "patch",
            "services/status",
            1,
            code,
            (code == 429).then_some(Duration::from_secs(1)),
        );
        cluster
            .create(
                &load_balancer_service(&ns, &name)
                    .finalizer(FINALIZER_LOAD_BALANCER_CLEANUP)
                    .build(),
            )
            .await;
        wait_for(&api, &name, TIMEOUT, has_ingress).await.unwrap();
        let statuses = status_patch_statuses(server, &name);
        assert_eq!(statuses.first(), Some(&code), "{statuses:?}");
        assert_eq!(statuses.last(), Some(&200), "{statuses:?}");
        if code != 429 {
            // 429 is retried inside the kube client; the others fail the sync.
            let note = wait_event(&cluster, &ns, &name, "SyncLoadBalancerFailed").await;
            assert!(
                note.starts_with(
                    "Error syncing load balancer: failed to update load balancer status"
                ),
                "{note}"
            );
        }
    }
    assert_no_leaks(&cluster, &fake, &ns).await;
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

#[tokio::test]
async fn finalizer_conflict_is_retried_on_a_fresh_read() {
    let cluster = TestCluster::start().await;
    let Some(server) = cluster.api_server() else {
        return;
    };
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let running = start(&cluster, &ns, fake.provider(), test_config()).await;
    server.fail_next("patch", "services/status", 1, 409, None);
    let name = cluster.unique_name("web");
    cluster
        .create(&load_balancer_service(&ns, &name).build())
        .await;
    let svc = wait_for(&services(&cluster, &ns), &name, TIMEOUT, has_ingress)
        .await
        .unwrap();
    assert!(plan::has_cleanup_finalizer(&svc));
    // Handled within the same sync: a GET, then the patch again, no failure event.
    let gets = server
        .requests()
        .into_iter()
        .filter(|r| {
            r.verb == "get" && r.resource == "services" && r.name.as_deref() == Some(name.as_str())
        })
        .count();
    assert!(gets >= 1);
    assert!(!has_event(&cluster, &ns, &name, "SyncLoadBalancerFailed").await);
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

#[tokio::test]
async fn cloud_failure_on_ensure_emits_event_and_retries_with_backoff() {
    let log = ccm_testing::logging::record("warn");
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    fake.inject("ensure_load_balancer", Fault::FailNext(1));
    let (running, probe) = start_probed(&cluster, &ns, &fake, test_config()).await;
    let name = cluster.unique_name("web");
    let svc = cluster
        .create(&load_balancer_service(&ns, &name).build())
        .await;
    let note = wait_event(&cluster, &ns, &name, "SyncLoadBalancerFailed").await;
    assert!(
        note.starts_with("Error syncing load balancer: failed to ensure load balancer: "),
        "{note}"
    );
    wait_for(&services(&cluster, &ns), &name, TIMEOUT, has_ingress)
        .await
        .unwrap();
    let calls = probe.calls_for("ensure_load_balancer", &key(&svc));
    assert_eq!(calls.len(), 2, "{calls:?}");
    // The first retry of the per-service backoff is 5 s.
    assert!(calls[1].at - calls[0].at >= Duration::from_secs(5));
    // The Warning is in the log too, with the object and the error (issue 28).
    assert_warning_logged(
        &log,
        "SyncLoadBalancerFailed",
        &format!("{ns}/{name}"),
        &note,
    );
    assert_no_leaks(&cluster, &fake, &ns).await;
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

/// `Retry` is honoured on ensure: requeued after exactly its delay (6 s, longer than the 5 s
/// backoff a failure would get), without a failure event.
#[tokio::test]
async fn retry_on_ensure_requeues_after_its_delay_without_failure_event() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    fake.inject(
        "ensure_load_balancer",
        Fault::Retry {
            after: Duration::from_secs(6),
            count: 1,
        },
    );
    let (running, probe) = start_probed(&cluster, &ns, &fake, test_config()).await;
    let name = cluster.unique_name("web");
    let svc = cluster
        .create(&load_balancer_service(&ns, &name).build())
        .await;
    wait_for(&services(&cluster, &ns), &name, TIMEOUT, has_ingress)
        .await
        .unwrap();
    let calls = probe.calls_for("ensure_load_balancer", &key(&svc));
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(calls[1].at - calls[0].at >= Duration::from_secs(6));
    assert!(!has_event(&cluster, &ns, &name, "SyncLoadBalancerFailed").await);
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

/// `Retry` is honoured on the delete path too: from `get_load_balancer` and from
/// `ensure_load_balancer_deleted` (Go degrades both to exponential backoff).
#[tokio::test]
async fn retry_on_get_and_delete_requeues_after_its_delay() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let (running, probe) = start_probed(&cluster, &ns, &fake, test_config()).await;
    let api = services(&cluster, &ns);
    let mut keys = Vec::new();
    for op in ["get_load_balancer", "ensure_load_balancer_deleted"] {
        let name = cluster.unique_name("web");
        let svc = cluster
            .create(&load_balancer_service(&ns, &name).build())
            .await;
        wait_for(&api, &name, TIMEOUT, has_ingress).await.unwrap();
        fake.inject(
            op,
            Fault::Retry {
                after: Duration::from_secs(6),
                count: 1,
            },
        );
        api.delete(&name, &DeleteParams::default()).await.unwrap();
        wait_for_deletion(&api, &name, TIMEOUT).await.unwrap();
        fake.clear_faults();
        let calls = probe.calls_for(op, &key(&svc));
        assert!(calls.len() >= 2, "{op}: {calls:?}");
        assert!(calls[1].at - calls[0].at >= Duration::from_secs(6), "{op}");
        assert!(!has_event(&cluster, &ns, &name, "DeleteLoadBalancerFailed").await);
        keys.push(key(&svc));
    }
    assert_no_leaks(&cluster, &fake, &ns).await;
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

#[tokio::test]
async fn zero_hosts_warns_unavailable_and_still_ensures() {
    let cluster = TestCluster::start().await;
    if cluster.is_real() {
        return; // a real cluster has nodes
    }
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let running = start(&cluster, &ns, fake.provider(), test_config()).await;
    let name = cluster.unique_name("web");
    cluster
        .create(&load_balancer_service(&ns, &name).build())
        .await;
    wait_for(&services(&cluster, &ns), &name, TIMEOUT, has_ingress)
        .await
        .unwrap();
    let note = wait_event(&cluster, &ns, &name, "UnAvailableLoadBalancer").await;
    assert_eq!(note, "There are no available nodes for LoadBalancer");
    let evs = events(&cluster, &ns, &name).await;
    assert!(
        evs.iter()
            .any(|(t, r, _)| t == "Warning" && r == "UnAvailableLoadBalancer")
    );
    let lbs = cloud_lbs(&fake, &ns);
    assert_eq!(lbs.len(), 1);
    assert!(lbs.values().all(|lb| lb.hosts.is_empty()));
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

#[tokio::test]
async fn implemented_elsewhere_keeps_finalizer_and_skips_status() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let (running, probe) = start_probed(&cluster, &ns, &fake, test_config()).await;
    let api = services(&cluster, &ns);
    let other = cluster.unique_name("other");
    let svc = cluster
        .create(
            &load_balancer_service(&ns, &other)
                .annotation(IMPLEMENTED_ELSEWHERE, "yes")
                .build(),
        )
        .await;
    let k = key(&svc);
    wait_until("ensure called for the delegated service", || async {
        probe.count("ensure_load_balancer", &k) >= 1
    })
    .await;
    // A sentinel Service created afterwards gets its ingress; by then the delegated one
    // was handled.
    let sentinel = cluster.unique_name("web");
    cluster
        .create(&load_balancer_service(&ns, &sentinel).build())
        .await;
    wait_for(&api, &sentinel, TIMEOUT, has_ingress)
        .await
        .unwrap();
    let delegated = wait_for(&api, &other, TIMEOUT, plan::has_cleanup_finalizer)
        .await
        .unwrap();
    assert!(ingress_ips(&delegated).is_empty());
    assert!(!has_event(&cluster, &ns, &other, "SyncLoadBalancerFailed").await);
    assert!(!has_event(&cluster, &ns, &other, "EnsuredLoadBalancer").await);
    // Deleting it still removes the finalizer.
    api.delete(&other, &DeleteParams::default()).await.unwrap();
    wait_for_deletion(&api, &other, TIMEOUT).await.unwrap();
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

#[tokio::test]
async fn services_with_a_class_or_another_type_are_left_alone() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let (running, probe) = start_probed(&cluster, &ns, &fake, test_config()).await;
    let api = services(&cluster, &ns);
    let classed = cluster.unique_name("classed");
    let cluster_ip = cluster.unique_name("cip");
    cluster
        .create(
            &load_balancer_service(&ns, &classed)
                .load_balancer_class("example.com/other")
                .build(),
        )
        .await;
    cluster
        .create(
            &load_balancer_service(&ns, &cluster_ip)
                .type_("ClusterIP")
                .build(),
        )
        .await;
    let sentinel = cluster.unique_name("web");
    cluster
        .create(&load_balancer_service(&ns, &sentinel).build())
        .await;
    wait_for(&api, &sentinel, TIMEOUT, has_ingress)
        .await
        .unwrap();
    for name in [&classed, &cluster_ip] {
        let s = api.get(name).await.unwrap();
        assert!(!plan::has_cleanup_finalizer(&s), "{name}");
        assert!(ingress_ips(&s).is_empty(), "{name}");
        assert!(probe.calls().iter().all(|c| c.key != key(&s)), "{name}");
    }
    assert_no_leaks(&cluster, &fake, &ns).await;
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

#[tokio::test]
async fn relevant_updates_re_ensure_and_irrelevant_ones_do_not() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let (running, probe) = start_probed(&cluster, &ns, &fake, test_config()).await;
    let api = services(&cluster, &ns);
    let name = cluster.unique_name("web");
    let svc = cluster
        .create(&load_balancer_service(&ns, &name).build())
        .await;
    let k = key(&svc);
    wait_for(&api, &name, TIMEOUT, has_ingress).await.unwrap();
    let before = probe.count("ensure_load_balancer", &k);

    // A label change alone is not in Go's needsUpdate list...
    merge(&api, &name, json!({"metadata": {"labels": {"team": "a"}}})).await;
    // ... an annotation change is. Every ensure after the label change sees the annotation,
    // so the label change did not trigger one of its own.
    merge(
        &api,
        &name,
        json!({"metadata": {"annotations": {"a": "1"}}}),
    )
    .await;
    wait_until("re-ensure after the annotation change", || async {
        probe.count("ensure_load_balancer", &k) > before
    })
    .await;
    // A port change is; the cloud gets the new ports.
    let mut ports = api.get(&name).await.unwrap().spec.unwrap().ports.unwrap();
    ports[0].port = 8080;
    merge(&api, &name, json!({"spec": {"ports": ports}})).await;
    wait_until("the cloud sees port 8080", || async {
        cloud_lbs(&fake, &ns)
            .get(&k)
            .is_some_and(|lb| lb.ports.contains(&8080))
    })
    .await;
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

#[tokio::test]
async fn type_change_emits_go_event_and_deletes() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let running = start(&cluster, &ns, fake.provider(), test_config()).await;
    let api = services(&cluster, &ns);
    let name = cluster.unique_name("web");
    cluster
        .create(&load_balancer_service(&ns, &name).build())
        .await;
    wait_for(&api, &name, TIMEOUT, has_ingress).await.unwrap();
    // (externalTrafficPolicy is only valid on externally reachable Services.)
    merge(
        &api,
        &name,
        json!({"spec": {"type": "ClusterIP", "externalTrafficPolicy": null}}),
    )
    .await;
    let svc = wait_for(&api, &name, TIMEOUT, |s: &Service| {
        !plan::has_cleanup_finalizer(s) && ingress_ips(s).is_empty()
    })
    .await
    .unwrap();
    assert!(!plan::wants_load_balancer(&svc));
    assert_eq!(
        wait_event(&cluster, &ns, &name, "Type").await,
        "LoadBalancer -> ClusterIP"
    );
    wait_event(&cluster, &ns, &name, "DeletingLoadBalancer").await;
    assert_eq!(
        wait_event(&cluster, &ns, &name, "DeletedLoadBalancer").await,
        "Deleted load balancer"
    );
    assert!(cloud_lbs(&fake, &ns).is_empty());
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

#[tokio::test]
async fn run_refuses_a_provider_without_load_balancers_and_zero_workers() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::builder().load_balancer(false).build();
    let running = start(&cluster, &ns, fake.provider(), test_config()).await;
    let err = running.stop().await.unwrap_err();
    assert!(
        matches!(
            err,
            ControllerError::MissingCapability {
                controller: "service-lb-controller",
                capability: "load_balancer"
            }
        ),
        "{err}"
    );
    let running = start(&cluster, &ns, FakeCloud::default().provider(), {
        let mut config = ServiceConfig::default();
        config.workers = 0;
        config
    })
    .await;
    let err = running.stop().await.unwrap_err();
    assert!(
        err.to_string().contains("--concurrent-service-syncs"),
        "{err}"
    );
    cluster.cleanup().await;
}

#[tokio::test]
async fn events_and_status_use_go_wording_on_delete() {
    let log = ccm_testing::logging::record("warn");
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    fake.inject("ensure_load_balancer_deleted", Fault::FailNext(1));
    let running = start(&cluster, &ns, fake.provider(), test_config()).await;
    let api = services(&cluster, &ns);
    let name = cluster.unique_name("web");
    cluster
        .create(&load_balancer_service(&ns, &name).build())
        .await;
    wait_for(&api, &name, TIMEOUT, has_ingress).await.unwrap();
    api.delete(&name, &DeleteParams::default()).await.unwrap();
    let note = wait_event(&cluster, &ns, &name, "DeleteLoadBalancerFailed").await;
    assert!(
        note.starts_with("Error deleting load balancer: failed to delete load balancer: "),
        "{note}"
    );
    assert_warning_logged(
        &log,
        "DeleteLoadBalancerFailed",
        &format!("{ns}/{name}"),
        &note,
    );
    // While the cloud delete fails the finalizer holds the Service.
    let held = api.get(&name).await;
    if let Ok(held) = held {
        assert!(plan::has_cleanup_finalizer(&held));
    }
    wait_for_deletion(&api, &name, TIMEOUT).await.unwrap();
    assert!(cloud_lbs(&fake, &ns).is_empty());
    // Events are written in the order they were recorded: the last one implies the others.
    wait_event(&cluster, &ns, &name, "DeletedLoadBalancer").await;
    let evs: BTreeMap<String, String> = events(&cluster, &ns, &name)
        .await
        .into_iter()
        .map(|(t, r, _)| (r, t))
        .collect();
    assert_eq!(
        evs.get("DeletingLoadBalancer").map(String::as_str),
        Some("Normal")
    );
    assert_eq!(
        evs.get("DeletedLoadBalancer").map(String::as_str),
        Some("Normal")
    );
    assert_eq!(
        evs.get("DeleteLoadBalancerFailed").map(String::as_str),
        Some("Warning")
    );
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

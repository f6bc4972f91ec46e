//! Service controller: no leaked load balancers. After each scenario the cloud holds exactly
//! the load balancers of the Services that want one.

use std::time::Duration;

use ccm_testing::TestCluster;
use ccm_testing::builders::load_balancer_service;
use ccm_testing::fake_cloud::{FakeCloud, Fault};
use ccm_testing::wait::{wait_for, wait_for_deletion};
use k8s_openapi::api::core::v1::Service;
use kube::api::{DeleteParams, Patch, PatchParams};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::support::service::*;

async fn delete(api: &kube::Api<Service>, name: &str) {
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => panic!("delete {name}: {e}"),
    }
}

async fn set_type(api: &kube::Api<Service>, name: &str, type_: &str) {
    // externalTrafficPolicy is only valid on externally reachable Services.
    let body = if type_ == "ClusterIP" {
        json!({"spec": {"type": type_, "externalTrafficPolicy": null}})
    } else {
        json!({"spec": {"type": type_}})
    };
    api.patch(name, &PatchParams::default(), &Patch::Merge(body))
        .await
        .unwrap();
}

async fn strip_finalizers(api: &kube::Api<Service>, name: &str) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn service_deleted_while_stopped_is_cleaned_up_on_start() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let api = services(&cluster, &ns);
    let running = start(&cluster, &ns, fake.provider(), test_config()).await;
    let (gone, kept) = (cluster.unique_name("gone"), cluster.unique_name("kept"));
    for name in [&gone, &kept] {
        cluster
            .create(&load_balancer_service(&ns, name).build())
            .await;
        wait_for(&api, name, TIMEOUT, has_ingress).await.unwrap();
    }
    running.stop().await.unwrap();

    // Deleted while no controller runs: the finalizer keeps it.
    delete(&api, &gone).await;
    let held = api.get(&gone).await.unwrap();
    assert!(plan::is_being_deleted(&held) && plan::has_cleanup_finalizer(&held));
    assert_eq!(cloud_lbs(&fake, &ns).len(), 2);

    let running = start(&cluster, &ns, fake.provider(), test_config()).await;
    wait_for_deletion(&api, &gone, TIMEOUT).await.unwrap();
    assert_no_leaks(&cluster, &fake, &ns).await;
    assert_eq!(cloud_lbs(&fake, &ns).len(), 1);
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

#[tokio::test]
async fn type_changed_to_cluster_ip_running_or_stopped_deletes_the_lb() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let api = services(&cluster, &ns);
    let running = start(&cluster, &ns, fake.provider(), test_config()).await;
    let (live, offline) = (cluster.unique_name("live"), cluster.unique_name("offline"));
    for name in [&live, &offline] {
        cluster
            .create(&load_balancer_service(&ns, name).build())
            .await;
        wait_for(&api, name, TIMEOUT, has_ingress).await.unwrap();
    }
    set_type(&api, &live, "ClusterIP").await;
    wait_for(&api, &live, TIMEOUT, |s: &Service| {
        !plan::has_cleanup_finalizer(s)
    })
    .await
    .unwrap();
    assert_no_leaks(&cluster, &fake, &ns).await;
    running.stop().await.unwrap();

    // Changed while stopped: on start nothing is cached, the finalizer says "clean up".
    set_type(&api, &offline, "ClusterIP").await;
    let running = start(&cluster, &ns, fake.provider(), test_config()).await;
    wait_for(&api, &offline, TIMEOUT, |s: &Service| {
        !plan::has_cleanup_finalizer(s) && ingress_ips(s).is_empty()
    })
    .await
    .unwrap();
    assert_no_leaks(&cluster, &fake, &ns).await;
    assert!(cloud_lbs(&fake, &ns).is_empty());
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

#[tokio::test]
async fn deleted_and_recreated_under_the_same_name_replaces_the_lb() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let api = services(&cluster, &ns);
    let (running, probe) = start_probed(&cluster, &ns, &fake, test_config()).await;
    let name = cluster.unique_name("web");
    let old = cluster
        .create(&load_balancer_service(&ns, &name).build())
        .await;
    wait_for(&api, &name, TIMEOUT, has_ingress).await.unwrap();
    // Someone removes the finalizer by hand, deletes and re-creates the Service at once.
    strip_finalizers(&api, &name).await;
    delete(&api, &name).await;
    wait_for_deletion(&api, &name, TIMEOUT).await.unwrap();
    let new = cluster
        .create(&load_balancer_service(&ns, &name).port("dns", 53).build())
        .await;
    assert_ne!(old.metadata.uid, new.metadata.uid);
    let k = key(&new);
    wait_until("the new service's load balancer", || async {
        cloud_lbs(&fake, &ns).get(&k).is_some_and(|lb| {
            lb.name == ccm_core::default_load_balancer_name(&new) && lb.ports == [53]
        })
    })
    .await;
    wait_for(&api, &name, TIMEOUT, has_ingress).await.unwrap();
    // The old load balancer was deleted (by the old Service's identity) before the new one
    // was created.
    let deletes = probe.calls_for("ensure_load_balancer_deleted", &k);
    assert!(
        deletes
            .iter()
            .any(|c| Some(&c.uid) == old.metadata.uid.as_ref()),
        "{deletes:?}"
    );
    assert_no_leaks(&cluster, &fake, &ns).await;
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

#[tokio::test]
async fn cloud_failures_mid_ensure_and_delete_do_not_leak() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let api = services(&cluster, &ns);
    let running = start(&cluster, &ns, fake.provider(), test_config()).await;
    fake.inject("ensure_load_balancer", Fault::FailNext(2));
    let (a, b) = (cluster.unique_name("a"), cluster.unique_name("b"));
    for name in [&a, &b] {
        cluster
            .create(&load_balancer_service(&ns, name).build())
            .await;
    }
    for name in [&a, &b] {
        wait_for(&api, name, TIMEOUT, has_ingress).await.unwrap();
    }
    fake.inject("ensure_load_balancer_deleted", Fault::FailNext(1));
    fake.inject("get_load_balancer", Fault::FailNext(1));
    delete(&api, &a).await;
    set_type(&api, &b, "NodePort").await;
    wait_for_deletion(&api, &a, TIMEOUT).await.unwrap();
    wait_for(&api, &b, TIMEOUT, |s: &Service| {
        !plan::has_cleanup_finalizer(s)
    })
    .await
    .unwrap();
    assert_no_leaks(&cluster, &fake, &ns).await;
    assert!(cloud_lbs(&fake, &ns).is_empty());
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

/// A crash after the cloud created the load balancer but before the status was written; the
/// Service is deleted while no controller runs. The next controller deletes the load balancer.
#[tokio::test]
async fn crash_mid_ensure_then_deleted_while_down() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let api = services(&cluster, &ns);
    let (running, probe) = start_probed(&cluster, &ns, &fake, test_config()).await;
    let name = cluster.unique_name("web");
    probe.set_hold(Hold {
        op: "ensure_load_balancer",
        key: format!("{ns}/{name}"),
        after_inner: true,
    });
    let held = probe.held.notified();
    cluster
        .create(&load_balancer_service(&ns, &name).build())
        .await;
    tokio::time::timeout(TIMEOUT, held).await.unwrap();
    running.crash().await;
    assert_eq!(cloud_lbs(&fake, &ns).len(), 1, "created in the cloud");
    assert!(ingress_ips(&api.get(&name).await.unwrap()).is_empty());

    delete(&api, &name).await;
    let running = start(&cluster, &ns, fake.provider(), test_config()).await;
    wait_for_deletion(&api, &name, TIMEOUT).await.unwrap();
    assert_no_leaks(&cluster, &fake, &ns).await;
    assert!(cloud_lbs(&fake, &ns).is_empty());
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

/// A crash in the middle of a delete (before the cloud deleted anything); the type is changed
/// back and forth meanwhile. The next controller converges on what the Service wants.
#[tokio::test]
async fn crash_mid_delete_then_restart() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let api = services(&cluster, &ns);
    let (running, probe) = start_probed(&cluster, &ns, &fake, test_config()).await;
    let (a, b) = (cluster.unique_name("a"), cluster.unique_name("b"));
    for name in [&a, &b] {
        cluster
            .create(&load_balancer_service(&ns, name).build())
            .await;
        wait_for(&api, name, TIMEOUT, has_ingress).await.unwrap();
    }
    probe.set_hold(Hold {
        op: "ensure_load_balancer_deleted",
        key: format!("{ns}/{a}"),
        after_inner: false,
    });
    let held = probe.held.notified();
    delete(&api, &a).await;
    tokio::time::timeout(TIMEOUT, held).await.unwrap();
    running.crash().await;
    set_type(&api, &b, "ClusterIP").await;

    let running = start(&cluster, &ns, fake.provider(), test_config()).await;
    wait_for_deletion(&api, &a, TIMEOUT).await.unwrap();
    wait_for(&api, &b, TIMEOUT, |s: &Service| {
        !plan::has_cleanup_finalizer(s)
    })
    .await
    .unwrap();
    assert_no_leaks(&cluster, &fake, &ns).await;
    assert!(cloud_lbs(&fake, &ns).is_empty());
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

/// Random churn (creates, deletes, type flips, re-creates, finalizer removals are not part
/// of it: those are a user's own leak) with random cloud failures and controller crashes at
/// random points. After the faults stop and one controller runs undisturbed, the cloud holds
/// exactly the load balancers of the Services that want one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_churn_with_crashes_and_cloud_failures_converges_without_leaks() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let api = services(&cluster, &ns);
    let mut rng = SmallRng::seed_from_u64(0x5eed);
    for (i, op) in [
        "ensure_load_balancer",
        "ensure_load_balancer_deleted",
        "get_load_balancer",
    ]
    .into_iter()
    .enumerate()
    {
        fake.inject(
            op,
            Fault::FailWithProbability {
                p: 0.2,
                seed: i as u64,
            },
        );
    }
    let names: Vec<String> = (0..12)
        .map(|i| cluster.unique_name(&format!("c{i}")))
        .collect();
    let config = {
        let mut config = ccm_controllers::controllers::service::ServiceConfig::default();
        config.workers = 3;
        config.node_sync_window = Duration::from_millis(100);
        config.node_sync_max_window =
            ccm_controllers::controllers::service::DEFAULT_NODE_SYNC_MAX_WINDOW;
        config
    };
    let mut running = Some(start(&cluster, &ns, fake.provider(), config.clone()).await);
    for round in 0..60 {
        let name = &names[rng.random_range(0..names.len())];
        let current = api.get_opt(name).await.unwrap();
        match (rng.random_range(0..4), current) {
            (0, None) => {
                cluster
                    .create(&load_balancer_service(&ns, name).build())
                    .await;
            }
            (1, _) => delete(&api, name).await,
            (2, Some(s)) if !plan::is_being_deleted(&s) => {
                let to = if plan::wants_load_balancer(&s) {
                    "ClusterIP"
                } else {
                    "LoadBalancer"
                };
                set_type(&api, name, to).await;
            }
            _ => {}
        }
        if round % 10 == 9 {
            // Crash at a random moment, sometimes stay down for a few changes.
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..400))).await;
            if let Some(r) = running.take() {
                r.crash().await;
            }
            if rng.random_bool(0.5) {
                running = Some(start(&cluster, &ns, fake.provider(), config.clone()).await);
            }
        } else if running.is_none() && rng.random_bool(0.3) {
            running = Some(start(&cluster, &ns, fake.provider(), config.clone()).await);
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..60))).await;
    }
    if let Some(r) = running.take() {
        r.crash().await;
    }
    fake.clear_faults();
    let running = start(&cluster, &ns, fake.provider(), config).await;
    assert_no_leaks(&cluster, &fake, &ns).await;
    // Services that are being deleted go away; those wanting a load balancer have its address.
    for name in &names {
        if let Some(s) = api.get_opt(name).await.unwrap() {
            if plan::is_being_deleted(&s) {
                wait_for_deletion(&api, name, TIMEOUT).await.unwrap();
            } else if plan::wants_load_balancer(&s) {
                wait_for(&api, name, TIMEOUT, has_ingress).await.unwrap();
            } else {
                wait_for(&api, name, TIMEOUT, |s: &Service| {
                    !plan::has_cleanup_finalizer(s)
                })
                .await
                .unwrap();
            }
        }
    }
    assert_no_leaks(&cluster, &fake, &ns).await;
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

/// The finalizer is removed by hand and the Service deleted: Go has no delete handler and
/// leaks the load balancer; here the controller still has a record of it and deletes it.
#[tokio::test]
async fn service_deleted_after_its_finalizer_was_removed_by_hand() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let api = services(&cluster, &ns);
    let running = start(&cluster, &ns, fake.provider(), test_config()).await;
    let name = cluster.unique_name("web");
    cluster
        .create(&load_balancer_service(&ns, &name).build())
        .await;
    wait_for(&api, &name, TIMEOUT, has_ingress).await.unwrap();
    strip_finalizers(&api, &name).await;
    delete(&api, &name).await;
    wait_for_deletion(&api, &name, TIMEOUT).await.unwrap();
    assert_no_leaks(&cluster, &fake, &ns).await;
    assert!(cloud_lbs(&fake, &ns).is_empty());
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

/// A Service of ours becomes a ClusterIP and then a LoadBalancer of another class
/// (`spec.loadBalancerClass` can only be set together with the type). While the controller
/// runs, it has a record of handling the Service, so it deletes our load balancer and removes
/// the finalizer, and leaves the Service to the other class's controller (Go's "wants flipped"
/// path).
///
/// Had it happened while the controller was down, nothing would say the finalizer is ours: every
/// instance serving a class puts the same finalizer on its Services, so a LoadBalancer of a
/// class not served is never touched (see `a_foreign_service_with_the_shared_finalizer_is_left_
/// to_its_own_controller` in `service_classes`), and the load balancer made before the type
/// change is left behind (documented in docs/controllers.md, "Load-balancer classes").
#[tokio::test]
async fn service_handed_to_another_class_is_cleaned_up() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let api = services(&cluster, &ns);
    let running = start(&cluster, &ns, fake.provider(), test_config()).await;
    let name = cluster.unique_name("web");
    cluster
        .create(&load_balancer_service(&ns, &name).build())
        .await;
    wait_for(&api, &name, TIMEOUT, has_ingress).await.unwrap();
    set_type(&api, &name, "ClusterIP").await;
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(
            json!({"spec": {"type": "LoadBalancer", "loadBalancerClass": "example.com/other"}}),
        ),
    )
    .await
    .unwrap();
    let svc = wait_for(&api, &name, TIMEOUT, |s: &Service| {
        !plan::has_cleanup_finalizer(s)
    })
    .await
    .unwrap();
    assert!(!plan::wants_load_balancer(&svc));
    wait_until("our load balancer is deleted", || async {
        cloud_lbs(&fake, &ns).is_empty()
    })
    .await;
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

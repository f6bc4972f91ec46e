//! Hung Event writes hold up no controller work, and the runtime writes the Events of work
//! that finishes during its shutdown.

use crate::support::connection::connection_flag;
use ccm_controllers::{Builder, ControllerContext};
use ccm_testing::TestCluster;
use ccm_testing::builders::load_balancer_service;
use ccm_testing::fake_cloud::{FakeCloud, Fault};
use ccm_testing::wait::wait_for;
use k8s_openapi::api::core::v1::Node;
use std::time::Duration;

use super::{HANG, WAIT, events_of, reasons, subject};

#[tokio::test]
async fn hung_event_writes_do_not_hold_up_load_balancers() {
    use crate::support::service::{
        TIMEOUT, cloud_lbs, create_node, has_ingress, key, services, start, test_config,
        wait_event, wait_until,
    };
    let cluster = TestCluster::start().await;
    let Some(server) = cluster.api_server() else {
        return; // needs fault injection
    };
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let n1 = cluster.unique_name("n");
    create_node(&cluster, &n1).await;
    let running = start(&cluster, &ns, fake.provider(), test_config()).await;
    let api = services(&cluster, &ns);
    let first = cluster.unique_name("web");
    cluster
        .create(&load_balancer_service(&ns, &first).build())
        .await;
    let svc = wait_for(&api, &first, TIMEOUT, has_ingress).await.unwrap();
    let k = key(&svc);
    wait_event(&cluster, &ns, &first, "EnsuredLoadBalancer").await;

    // From here on the Event writer is stuck on its next create.
    server.fail_next("create", "events", 1, 429, Some(HANG));
    // Node changes: each update_load_balancer records UpdatedLoadBalancer while the Service's
    // entry is locked; the second update needs the first one's lock released.
    for _ in 0..2 {
        let n = cluster.unique_name("n");
        create_node(&cluster, &n).await;
        wait_until(&format!("{n} in the load balancer of {k}"), || async {
            cloud_lbs(&fake, &ns)
                .get(&k)
                .is_some_and(|lb| lb.hosts.contains(&n))
        })
        .await;
    }
    // A new Service: EnsuringLoadBalancer is recorded before the cloud call.
    let second = cluster.unique_name("web");
    cluster
        .create(&load_balancer_service(&ns, &second).build())
        .await;
    wait_for(&api, &second, TIMEOUT, has_ingress).await.unwrap();
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.resource == "events" && r.status == 429),
        "the Event write was never held up"
    );

    running.stop().await.unwrap();
    cluster.cleanup().await;
}

#[tokio::test]
async fn hung_event_writes_do_not_hold_up_node_initialisation() {
    use crate::support::node::{TIMEOUT, Test, quiet_cloud_node_config};
    let t = Test::start().await;
    let Some(server) = t.cluster.api_server() else {
        return; // needs fault injection
    };
    let fake = FakeCloud::default();
    // The first sync fails: SyncFailed is recorded before the node is retried.
    fake.inject("instance_metadata", Fault::FailNext(1));
    server.fail_next("create", "events", 1, 429, Some(HANG));
    let running = t
        .run_cloud_node(fake.provider(), quiet_cloud_node_config())
        .await;
    let name = t.name("hung");
    t.create(&t.registered_node(&name).build()).await;
    let initialised = wait_for(&t.nodes, &name, TIMEOUT, |n: &Node| {
        n.spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .is_some_and(|p| p == format!("fake://{name}"))
            && !n
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|ts| ts.iter().any(|t| t.key.contains("uninitialized")))
    })
    .await;
    assert!(initialised.is_ok(), "{initialised:?}");
    assert_eq!(fake.call_count("instance_metadata"), 2);
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.resource == "events" && r.status == 429),
        "the Event write was never held up"
    );
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn the_runtime_writes_the_events_of_work_that_finishes_during_shutdown() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let name = cluster.unique_name("subject");
    let connection = connection_flag(&cluster);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (started_tx, started) = tokio::sync::oneshot::channel::<()>();
    let started_tx = std::sync::Mutex::new(Some(started_tx));
    let object = subject(&ns, &name);
    let runtime = tokio::spawn(
        Builder::new()
            .without_builtin_controllers()
            .provider(FakeCloud::default().provider())
            .listener(listener)
            // In-flight work that ends after the shutdown signal and records an Event.
            .controller("drainer", move |ctx: ControllerContext| {
                let object = object.clone();
                let started = started_tx.lock().unwrap().take();
                async move {
                    let recorder = ctx.recorder("drainer");
                    recorder.normal(&object, "Started", "before the signal");
                    if let Some(started) = started {
                        let _ = started.send(());
                    }
                    ctx.shutdown.cancelled().await;
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    recorder.normal(&object, "Finished", "after the signal");
                    Ok(())
                }
            })
            .args([
                "ccm".to_owned(),
                connection,
                "--leader-elect=false".to_owned(),
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics".to_owned(),
            ])
            .shutdown_signal(async {
                let _ = stop_rx.await;
            })
            .run_async(),
    );
    tokio::time::timeout(WAIT, started)
        .await
        .expect("the controller starts")
        .unwrap();
    stop.send(()).unwrap();
    let code = tokio::time::timeout(WAIT, runtime)
        .await
        .expect("the runtime stops")
        .unwrap();
    assert_eq!(code, 0);
    // Written before the runtime returned, the last one after the controller had drained.
    let written = events_of(&cluster.client(), &ns, &name).await;
    assert_eq!(reasons(&written), ["Finished", "Started"], "{written:#?}");
    cluster.cleanup().await;
}

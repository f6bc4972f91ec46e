//! A real SIGTERM to the test process while the runtime runs with its default signal handling.
//! The runtime finishes the in-flight cloud call, releases the Lease and returns exit code 0.
//!
//! A test binary of its own: the signal goes to the whole process, so every other test running
//! in it would see it too (and any other runtime in it would shut down).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "it/support/connection.rs"]
mod connection;
#[path = "it/support/https.rs"]
mod https;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ccm_controllers::{Builder, ControllerContext};
use ccm_testing::TestCluster;
use ccm_testing::builders::kubelet_node;
use ccm_testing::fake_cloud::FakeCloud;
use ccm_testing::wait::eventually;
use connection::connection_flag;
use https::http_get;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

async fn status(addr: std::net::SocketAddr, path: &str) -> u16 {
    http_get(addr, path).await.0
}

#[cfg(unix)]
#[tokio::test]
async fn sigterm_waits_for_the_in_flight_cloud_call_releases_the_lease_and_exits_0() {
    let cluster = TestCluster::start().await;
    let namespace = cluster.namespace().await;
    let lease = cluster.unique_name("ccm-lease");
    let cloud = FakeCloud::default();
    cloud.set_operation_latency("instance_metadata", Duration::from_secs(2));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let connection = connection_flag(&cluster);
    let in_flight = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let (started, finished) = (in_flight.clone(), done.clone());
    let runtime = tokio::spawn(
        Builder::new()
            // Only the test's controller: the built-in ones would act on a real cluster's Nodes
            // with FakeCloud answers.
            .without_builtin_controllers()
            .provider(cloud.provider())
            .listener(listener)
            .controller("slow", move |ctx: ControllerContext| {
                let (started, finished) = (started.clone(), finished.clone());
                async move {
                    // One reconcile with a slow cloud call, running when SIGTERM arrives.
                    let cloud = ctx.cloud.clone();
                    let call = tokio::spawn(async move {
                        started.fetch_add(1, Ordering::SeqCst);
                        let node = kubelet_node("slow-node").build();
                        let result = cloud
                            .instances_v2()
                            .unwrap()
                            .instance_metadata(&ccm_core::NodeView::from_node(&node))
                            .await;
                        finished.fetch_add(1, Ordering::SeqCst);
                        result
                    });
                    ctx.shutdown.cancelled().await;
                    let _ = call.await;
                    Ok(())
                }
            })
            .args([
                "ccm".to_owned(),
                connection,
                format!("--leader-elect-resource-name={lease}"),
                format!("--leader-elect-resource-namespace={namespace}"),
                "--leader-elect-retry-period=1s".to_owned(),
            ])
            .run_async(),
    );
    // Ready means leading and synced; the signal handler is installed before that.
    assert!(
        eventually(Duration::from_secs(20), || async {
            status(addr, "/readyz").await == 200
        })
        .await
    );
    assert!(
        eventually(Duration::from_secs(20), || async {
            in_flight.load(Ordering::SeqCst) == 1
        })
        .await
    );
    assert_eq!(
        done.load(Ordering::SeqCst),
        0,
        "the cloud call is in flight"
    );

    let sent = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(std::process::id().to_string())
        .status()
        .unwrap();
    assert!(sent.success());
    let code = tokio::time::timeout(Duration::from_secs(20), runtime)
        .await
        .expect("the runtime stops on SIGTERM")
        .unwrap();
    assert_eq!(code, 0);
    assert_eq!(
        done.load(Ordering::SeqCst),
        1,
        "the in-flight cloud call finished first"
    );
    assert_eq!(cloud.call_count("instance_metadata"), 1);
    let holder = Api::<Lease>::namespaced(cluster.client(), &namespace)
        .get(&lease)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.holder_identity);
    assert_eq!(holder, None, "the Lease was released");
    cluster.cleanup().await;
}

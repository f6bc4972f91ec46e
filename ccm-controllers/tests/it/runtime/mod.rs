//! The runtime end to end without leader election, against a minimal API server (empty
//! lists, idle watches; `support::minimal_api`): `--help`, `--version` and syntax errors, the
//! probes and `/metrics` behind authentication, graceful shutdown in the middle of slow cloud
//! calls; and the cloud-call budget on its own (`budget`).
//!
//! The tests that read the runtime's log lines run in their own binary
//! (`tests/runtime_logs.rs`); leader election and whole runtimes on `TestCluster` are in
//! `runtime_cluster`.

mod budget;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ccm_controllers::{Builder, ControllerContext};
use ccm_core::Node;
use ccm_testing::wait::eventually;
use tokio::sync::oneshot;

use crate::support::https::http_get;
use crate::support::minimal_api::{
    NO_ELECTION, NO_SERVING, TestCloud, fake_api_server, free_listener, run_and_stop,
};

const WAIT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn help_version_and_syntax_errors() {
    assert_eq!(run_and_stop(&["--help"], Builder::new()).await, 0);
    assert_eq!(run_and_stop(&["--version"], Builder::new()).await, 0);
    assert_eq!(
        run_and_stop(&["--leader-elect", "false"], Builder::new()).await,
        2
    );
    assert_eq!(run_and_stop(&["--bogus"], Builder::new()).await, 2);
}

#[tokio::test]
async fn metrics_need_authentication_by_default_probes_do_not() {
    let api = fake_api_server().await;
    let (listener, addr) = free_listener();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let master = format!("--master={api}");
    let runtime = tokio::spawn(
        Builder::new()
            .provider(Arc::new(TestCloud::default()))
            .listener(listener)
            .args(["ccm", &master, NO_ELECTION, "--authentication-skip-lookup"])
            .shutdown_signal(async {
                let _ = stop_rx.await;
            })
            .run_async(),
    );
    assert!(eventually(WAIT, || async { http_get(addr, "/readyz").await.0 == 200 }).await);
    assert_eq!(http_get(addr, "/healthz").await.0, 200);
    assert_eq!(http_get(addr, "/livez").await.0, 200);
    assert_eq!(http_get(addr, "/metrics").await.0, 401, "no token");
    stop_tx.send(()).unwrap();
    assert_eq!(runtime.await.unwrap(), 0);
}

#[tokio::test]
async fn shutdown_waits_for_slow_cloud_calls_then_exits_0() {
    let api = fake_api_server().await;
    let cloud = Arc::new(TestCloud {
        latency: Duration::from_secs(2),
        ..TestCloud::default()
    });
    let (started_tx, started_rx) = oneshot::channel::<()>();
    let started_tx = Arc::new(Mutex::new(Some(started_tx)));
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let reconciled = Arc::new(AtomicUsize::new(0));
    let reconciled_in = reconciled.clone();
    let probe = cloud.clone();
    let master = format!("--master={api}");
    let builder = Builder::new()
        .provider(cloud.clone())
        .controller("slow", move |ctx: ControllerContext| {
            let started_tx = started_tx.clone();
            let reconciled = reconciled_in.clone();
            let probe = probe.clone();
            async move {
                // Five detached cloud calls (the budget must wait for them) and one reconcile
                // this controller waits for itself.
                for _ in 0..5 {
                    let cloud = ctx.cloud.clone();
                    tokio::spawn(async move {
                        let node = Node::default();
                        cloud
                            .instances_v2()
                            .unwrap()
                            .instance_metadata(&ccm_core::NodeView::from_node(&node))
                            .await
                    });
                }
                let cloud = ctx.cloud.clone();
                let reconcile = tokio::spawn(async move {
                    cloud
                        .instances_v2()
                        .unwrap()
                        .instance_exists(&ccm_core::NodeView::from_node(&Node::default()))
                        .await
                });
                while probe.started.load(Ordering::SeqCst) < 6 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                if let Some(tx) = started_tx.lock().unwrap().take() {
                    let _ = tx.send(());
                }
                ctx.shutdown.cancelled().await;
                // Stop taking work; finish the in-flight reconcile.
                if reconcile.await.is_ok_and(|r| r.is_ok()) {
                    reconciled.fetch_add(1, Ordering::SeqCst);
                }
                Ok(())
            }
        })
        .args(["ccm", &master, NO_ELECTION, NO_SERVING])
        .shutdown_signal(async {
            let _ = stop_rx.await;
        });
    let runtime = tokio::spawn(builder.run_async());
    tokio::time::timeout(Duration::from_secs(20), started_rx)
        .await
        .expect("the slow calls start")
        .unwrap();
    assert_eq!(cloud.started.load(Ordering::SeqCst), 6);
    assert_eq!(
        cloud.completed.load(Ordering::SeqCst),
        0,
        "the calls are still in flight"
    );
    // SIGTERM equivalent.
    stop_tx.send(()).unwrap();
    let code = tokio::time::timeout(Duration::from_secs(20), runtime)
        .await
        .expect("shutdown completes")
        .unwrap();
    assert_eq!(code, 0);
    assert_eq!(
        cloud.completed.load(Ordering::SeqCst),
        6,
        "every in-flight cloud call finished before the runtime returned"
    );
    assert_eq!(reconciled.load(Ordering::SeqCst), 1);
}

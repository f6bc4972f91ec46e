//! The leader keeps renewing its Lease while its controllers keep the runtime busy: a
//! controller (or a provider) that blocks the runtime's thread longer than the renew deadline
//! must not make the leader lose its Lease, as Go's preempted goroutines never do. Found at
//! 100,000 Nodes, where the start-up's load-balancer ensures kept the leader from renewing
//! until it exited (docs/performance.md, "100,000 Nodes").
//!
//! The cluster (the in-process API server, or the real cluster of `$CCM_TEST_KUBECONFIG`) is
//! served from a runtime on a thread of its own, so that blocking the runtime under test
//! blocks only the CCM.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ccm_controllers::{Builder, ControllerContext};
use ccm_testing::TestCluster;
use ccm_testing::fake_cloud::FakeCloud;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use tokio::sync::{Notify, oneshot};

use crate::support::connection::connection_flag;

/// How long the controller blocks the runtime's only thread: twice the lease duration.
const BLOCKED: Duration = Duration::from_secs(8);

/// A `TestCluster` served by a runtime on a thread of its own until dropped.
struct ClusterThread {
    flag: String,
    namespace: String,
    client: Client,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ClusterThread {
    fn start() -> ClusterThread {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stop_rx) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let cluster = TestCluster::start().await;
                let namespace = cluster.namespace().await;
                ready_tx
                    .send((connection_flag(&cluster), namespace, cluster.client()))
                    .unwrap();
                let _ = stop_rx.await;
                cluster.cleanup().await;
            });
        });
        let (flag, namespace, client) = ready_rx.recv().expect("the cluster starts");
        ClusterThread {
            flag,
            namespace,
            client,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for ClusterThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[test]
fn a_leader_whose_runtime_is_blocked_past_the_renew_deadline_keeps_its_lease() {
    let cluster = ClusterThread::start();
    let lease_name = format!(
        "ccm-lease-blocked-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    // The CCM's runtime: one thread, so a blocked controller blocks every task on it.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    runtime.block_on(async {
        let running = Arc::new(AtomicBool::new(false));
        let block = Arc::new(Notify::new());
        let (stop, stop_rx) = oneshot::channel::<()>();
        let (flag, blocker) = (running.clone(), block.clone());
        let builder = Builder::new()
            .without_builtin_controllers()
            .provider(FakeCloud::default().provider())
            .controller("blocker", move |ctx: ControllerContext| {
                let (flag, blocker) = (flag.clone(), blocker.clone());
                async move {
                    flag.store(true, Ordering::SeqCst);
                    loop {
                        tokio::select! {
                            () = ctx.shutdown.cancelled() => return Ok(()),
                            () = blocker.notified() => {
                                // CPU work or a blocking call that never yields.
                                std::thread::sleep(BLOCKED);
                            }
                        }
                    }
                }
            })
            .args([
                "ccm".to_owned(),
                cluster.flag.clone(),
                format!("--leader-elect-resource-name={lease_name}"),
                format!("--leader-elect-resource-namespace={}", cluster.namespace),
                "--leader-elect-lease-duration=4s".to_owned(),
                "--leader-elect-renew-deadline=3s".to_owned(),
                "--leader-elect-retry-period=1s".to_owned(),
                "--secure-port=0".to_owned(),
                "--shutdown-grace-period=5s".to_owned(),
            ])
            .shutdown_signal(async {
                let _ = stop_rx.await;
            });
        let mut replica = tokio::spawn(builder.run_async());
        let started = tokio::time::Instant::now();
        while !running.load(Ordering::SeqCst) {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the replica leads"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let holder = |lease: Lease| lease.spec.and_then(|s| s.holder_identity);
        let leader = holder(leases.get(&lease_name).await.unwrap()).expect("a holder");

        block.notify_one();
        // The controller now holds the runtime's thread for BLOCKED; this sleep ends after it.
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Give the watchdog two retry periods to notice a stale renewal.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let lease = leases.get(&lease_name).await.unwrap();
        let spec = lease.spec.clone().unwrap_or_default();
        assert_eq!(spec.holder_identity.as_deref(), Some(leader.as_str()));
        let renewed = spec.renew_time.expect("a renewal time").0;
        let age = jiff::Timestamp::now().duration_since(renewed);
        assert!(
            age < jiff::SignedDuration::from_secs(3),
            "the Lease was renewed while the runtime was blocked (last renewal {age:?} ago)"
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(10), &mut replica)
                .await
                .is_err(),
            "the leader is still running (it did not exit on a lost Lease)"
        );
        assert!(running.load(Ordering::SeqCst), "its controller still runs");
        let _ = stop.send(());
        let code = tokio::time::timeout(Duration::from_secs(20), replica)
            .await
            .expect("the replica stops")
            .unwrap();
        assert_eq!(code, 0, "a graceful stop after the blocked period");
    });
}

//! A shadow never takes the Lease while a leader holds it, does not take it when it is free
//! either, and keeps running when the leader changes.

use std::time::Duration;

use ccm_controllers::Builder;
use ccm_testing::TestCluster;
use ccm_testing::fake_cloud::FakeCloud;
use ccm_testing::wait::eventually;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::{ShadowRun, WAIT};
use crate::support::connection::connection_flag;
use crate::support::https::http_get;

/// A normal runtime (no controllers) electing on the test's Lease.
struct Leader {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<i32>,
}

impl Leader {
    fn start(cluster: &TestCluster, cloud: &FakeCloud, lease_flags: &[String]) -> Leader {
        let (stop, stop_rx) = oneshot::channel::<()>();
        let mut args = vec![
            "ccm".to_owned(),
            connection_flag(cluster),
            "--secure-port=0".to_owned(),
        ];
        args.extend(lease_flags.iter().cloned());
        let builder = Builder::new()
            .without_builtin_controllers()
            .provider(cloud.provider())
            .args(args)
            .shutdown_signal(async move {
                let _ = stop_rx.await;
            });
        Leader {
            stop: Some(stop),
            task: tokio::spawn(builder.run_async()),
        }
    }

    async fn stop(mut self) -> i32 {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(WAIT, self.task)
            .await
            .unwrap()
            .unwrap()
    }
}

async fn holder(cluster: &TestCluster, ns: &str, lease: &str) -> Option<String> {
    Api::<Lease>::namespaced(cluster.client(), ns)
        .get(lease)
        .await
        .ok()?
        .spec?
        .holder_identity
        .filter(|h| !h.is_empty())
}

#[tokio::test]
async fn the_shadow_never_takes_the_lease_and_keeps_running_when_the_leader_changes() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let lease = cluster.unique_name("shadow-lease");
    let cloud = FakeCloud::default();
    let lease_flags = vec![
        format!("--leader-elect-resource-name={lease}"),
        format!("--leader-elect-resource-namespace={ns}"),
        "--leader-elect-lease-duration=3s".to_owned(),
        "--leader-elect-renew-deadline=2s".to_owned(),
        "--leader-elect-retry-period=500ms".to_owned(),
    ];
    let first = Leader::start(&cluster, &cloud, &lease_flags);
    assert!(
        eventually(WAIT, || async {
            holder(&cluster, &ns, &lease).await.is_some()
        })
        .await,
        "the first leader holds the Lease"
    );
    let h1 = holder(&cluster, &ns, &lease).await;

    // The shadow with the same flags, the Lease ones included.
    let shadow = ShadowRun::start(&cluster, &cloud, &lease_flags);
    assert!(
        eventually(WAIT, || async {
            http_get(shadow.addr, "/readyz").await.0 == 200
        })
        .await,
        "the shadow is ready"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        holder(&cluster, &ns, &lease).await,
        h1,
        "the leader keeps it"
    );

    // The leader stops gracefully and releases the Lease: the shadow does not take it.
    assert_eq!(first.stop().await, 0);
    let mark = cluster.api_server().map_or(0, |s| s.requests().len());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        holder(&cluster, &ns, &lease).await,
        None,
        "nobody took the free Lease"
    );
    if let Some(server) = cluster.api_server() {
        let lease_requests: Vec<_> = server.requests()[mark..]
            .iter()
            // The runtime's requests (the test's own reads have no such user agent).
            .filter(|r| {
                r.resource == "leases"
                    && r.user_agent
                        .as_deref()
                        .is_some_and(|ua| ua.starts_with("cloud-controller-manager/"))
            })
            .cloned()
            .collect();
        assert!(
            lease_requests.is_empty(),
            "the shadow touched the Lease: {lease_requests:?}"
        );
    }

    // A new leader takes it; the shadow keeps running all along.
    let second = Leader::start(&cluster, &cloud, &lease_flags);
    assert!(
        eventually(WAIT, || async {
            holder(&cluster, &ns, &lease).await.is_some()
        })
        .await,
        "the second leader holds the Lease"
    );
    assert!(!shadow.task.is_finished(), "the shadow keeps running");
    assert_eq!(http_get(shadow.addr, "/healthz").await.0, 200);
    let metrics = shadow.metrics().await;
    assert!(
        !metrics.contains("leader_election_master_status{"),
        "the shadow does not elect: {metrics}"
    );
    assert_eq!(second.stop().await, 0);
    assert_eq!(shadow.stop().await, 0);
    cluster.cleanup().await;
}

//! Two cloud-controller-managers in one cluster (issue 35, docs/running.md "Two
//! cloud-controller-managers in one cluster"): two `fake-ccm` processes, one answering as
//! provider `fake`, the other as `fake-b`, with their own Leases, run beside each other while
//! Nodes of both clouds and of a third kind that neither owns are NotReady, some with their
//! instance gone or shut down. Each initialises exactly its own Nodes; neither deletes, taints
//! or load-balances the other's; the third kind stays untouched.
//!
//! In-process by default; with `CCM_TEST_KUBECONFIG` against that cluster (e.g. a
//! `ccm-apiserver` process). Both CCMs take `--managed-node-selector=<run label>,cloud!=c`:
//! scoped to this test's Nodes (on a shared cluster they never act on anybody else's), with
//! the third kind left out as docs/running.md says; between the two clouds, the provider IDs
//! and the deletion rule decide (each sees the other's uninitialised Nodes until they are
//! initialised).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use ccm_core::well_known::{LABEL_TOPOLOGY_ZONE, TAINT_SHUTDOWN, TAINT_UNINITIALIZED};
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use ccm_testing::fake_cloud::FakeCloudState;
use ccm_testing::wait::{eventually, wait_for, wait_for_deletion};
use ccm_testing::{KUBECONFIG_ENV, TestCluster};
use k8s_openapi::api::core::v1::Node;
use kube::Api;

mod support;

const RUN_LABEL: &str = "ccm-test.example.com/run";
const TIMEOUT: Duration = Duration::from_secs(60);
/// The CCMs' `--node-monitor-period`; the test lets many of them pass.
const MONITOR_PERIOD_MS: u64 = 200;

fn taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == key))
}

fn provider_id(node: &Node) -> Option<&str> {
    node.spec.as_ref().and_then(|s| s.provider_id.as_deref())
}

fn zone(node: &Node) -> Option<&str> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_TOPOLOGY_ZONE))
        .map(String::as_str)
}

/// One fake-ccm process for `provider`, with a cloud-config in `dir`.
fn start_ccm(
    cluster: &TestCluster,
    provider: &str,
    lease: &str,
    selector: &str,
    config: &str,
    dir: &Path,
    extra: &[&str],
) -> tokio::process::Child {
    let path = dir.join(format!("{provider}.yaml"));
    std::fs::write(&path, config).unwrap();
    let api = match (cluster.api_server(), std::env::var(KUBECONFIG_ENV)) {
        (Some(server), _) => format!("--master={}", server.url()),
        (None, Ok(kubeconfig)) => format!("--kubeconfig={kubeconfig}"),
        (None, Err(_)) => unreachable!("a real cluster comes from {KUBECONFIG_ENV}"),
    };
    tokio::process::Command::new(env!("CARGO_BIN_EXE_fake-ccm"))
        .arg(api)
        .arg(format!("--cloud-provider={provider}"))
        .arg(format!("--cloud-config={}", path.display()))
        .arg("--leader-elect-resource-namespace=default")
        .arg(format!("--leader-elect-resource-name={lease}"))
        .arg(format!("--managed-node-selector={selector}"))
        .arg(format!("--node-monitor-period={MONITOR_PERIOD_MS}ms"))
        .arg("--node-deletion-grace-period=600ms")
        .arg("--node-status-update-frequency=1s")
        .arg("--node-sync-window=100ms")
        .arg("--secure-port=0")
        .arg("--configure-cloud-routes=false")
        .args(extra)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ccms_each_manage_only_their_own_nodes() {
    let cluster = TestCluster::start().await;
    let run = cluster.unique_name("run");
    let nodes: Api<Node> = Api::all(cluster.client());
    let name = |p: &str| cluster.unique_name(p);
    let (a_new, a_gone, a_shut) = (name("a-new"), name("a-gone"), name("a-shut"));
    let (b_new, b_gone, b_shut) = (name("b-new"), name("b-gone"), name("b-shut"));
    // The third kind: another cloud's Node before its CCM got to it, and one after.
    let (c_new, c_initialised) = (name("c-new"), name("c-initialised"));
    // Each Node is labelled with its cloud, as kubelet `--node-labels` would; the CCMs'
    // selector leaves out the third kind (`cloud!=c`), not each other's: between them, the
    // provider IDs and the deletion rule decide.
    let labelled = |n: &str| {
        kubelet_node(n)
            .label(RUN_LABEL, &run)
            .label("cloud", &n[..1])
    };
    for (node, pid) in [
        (&a_gone, "fake"),
        (&a_shut, "fake"),
        (&b_gone, "fake-b"),
        (&b_shut, "fake-b"),
    ] {
        let node = labelled(node)
            .without_uninitialized_taint()
            .provider_id(&format!("{pid}://{node}"))
            .not_ready()
            .build();
        cluster.create(&node).await;
    }
    for node in [&a_new, &b_new, &c_new] {
        cluster.create(&labelled(node).not_ready().build()).await;
    }
    cluster
        .create(
            &labelled(&c_initialised)
                .without_uninitialized_taint()
                .provider_id("proxmox://cluster-1/101")
                .not_ready()
                .build(),
        )
        .await;
    let namespace = cluster.namespace().await;
    let service = name("lb");
    cluster
        .create(&load_balancer_service(&namespace, &service).build())
        .await;

    // Each cloud knows its own instances only (by name); one of each is gone, one shut down.
    let dir = TempDir(std::env::temp_dir().join(format!("two-clouds-{run}")));
    std::fs::create_dir_all(&dir.0).unwrap();
    let state_a = dir.0.join("a-state.json");
    let config = |zone: &str, own: &str, other: &str, gone: &str, shut: &str, state: &str| {
        format!(
            "zone: {zone}\nlb_ip: 203.0.113.7\nmissing_nodes: [\"{other}-.*\", \"c-.*\", \"{gone}\"]\nshutdown_nodes: [\"{shut}\"]\n{state}# {own}\n"
        )
    };
    let selector = format!("{RUN_LABEL}={run},cloud!=c");
    let mut ccm_a = start_ccm(
        &cluster,
        "fake",
        &format!("{run}-a"),
        &selector,
        &config(
            "zone-a",
            "a",
            "b",
            &a_gone,
            &a_shut,
            &format!("state_file: {}\n", state_a.display()),
        ),
        &dir.0,
        &[],
    );
    // The second runs no service controller (docs/running.md: one per cluster until classes).
    let mut ccm_b = start_ccm(
        &cluster,
        "fake-b",
        &format!("{run}-b"),
        &selector,
        &config("zone-b", "b", "a", &b_gone, &b_shut, ""),
        &dir.0,
        &["--controllers=*,-service-lb-controller"],
    );

    // Each initialises its own, with its own scheme and zone.
    for (node, scheme, z) in [(&a_new, "fake", "zone-a"), (&b_new, "fake-b", "zone-b")] {
        let got = wait_for(&nodes, node, TIMEOUT, |n: &Node| {
            !taint(n, TAINT_UNINITIALIZED)
        })
        .await
        .unwrap();
        assert_eq!(
            provider_id(&got),
            Some(format!("{scheme}://{node}").as_str())
        );
        assert_eq!(zone(&got), Some(z), "{node} initialised by the other CCM");
    }
    // Each deletes its own gone Node and taints its own shut-down one.
    for node in [&a_gone, &b_gone] {
        wait_for_deletion(&nodes, node, TIMEOUT).await.unwrap();
    }
    for node in [&a_shut, &b_shut] {
        wait_for(&nodes, node, TIMEOUT, |n: &Node| taint(n, TAINT_SHUTDOWN))
            .await
            .unwrap();
    }
    // Many monitor periods more, with the other cloud's Nodes NotReady and unknown to each.
    tokio::time::sleep(Duration::from_millis(MONITOR_PERIOD_MS * 20)).await;

    for node in [&a_shut, &b_shut, &a_new, &b_new] {
        assert!(
            nodes.get_opt(node).await.unwrap().is_some(),
            "{node} deleted"
        );
    }
    // The third kind is untouched: still uninitialised, no provider ID, no taint of ours.
    let c = nodes.get(&c_new).await.unwrap();
    assert!(taint(&c, TAINT_UNINITIALIZED) && !taint(&c, TAINT_SHUTDOWN));
    assert_eq!(provider_id(&c), None);
    assert_eq!(zone(&c), None);
    let c = nodes.get(&c_initialised).await.unwrap();
    assert!(!taint(&c, TAINT_SHUTDOWN) && zone(&c).is_none());
    // A's load balancer has A's Nodes only (B's left it once B initialised them).
    let ours = |s: &FakeCloudState| {
        s.load_balancers
            .values()
            .next()
            .map(|lb| lb.hosts.clone())
            .unwrap_or_default()
    };
    let mut want = vec![a_new.clone(), a_shut.clone()];
    want.sort();
    assert!(
        eventually(TIMEOUT, || async {
            ours(&FakeCloudState::load(&state_a).unwrap()) == want
        })
        .await,
        "hosts {:?}, expected {want:?}",
        ours(&FakeCloudState::load(&state_a).unwrap())
    );

    for ccm in [&mut ccm_a, &mut ccm_b] {
        let status = support::stop(ccm).await;
        assert!(status.success(), "fake-ccm exited with {status}");
    }
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(cluster.client(), "default");
    for lease in [format!("{run}-a"), format!("{run}-b")] {
        let _ = leases.delete(&lease, &Default::default()).await;
    }
    cluster.cleanup().await;
}

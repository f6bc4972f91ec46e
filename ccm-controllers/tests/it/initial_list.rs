//! The shared informers' initial list: streamed (`sendInitialEvents=true`) where the API server
//! offers it, in pages where it rejects it (a v1.33 kube-apiserver with the WatchList feature
//! gate off). The first test runs on a real cluster too (`CCM_TEST_KUBECONFIG`), whichever
//! path that server takes; the other two read the in-process server's request log.

use std::time::Duration;

use ccm_controllers::{Informer, strip_node};
use ccm_testing::TestCluster;
use ccm_testing::apiserver::{ApiServer, RequestFilter};
use ccm_testing::builders::kubelet_node;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams};
use kube::runtime::watcher;
use tokio_util::sync::CancellationToken;

const T: Duration = Duration::from_secs(30);

/// Polls `cond` every 20 ms until it holds; panics after [`T`].
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + T;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An informer over the Nodes labelled `label=run`, with the Node informer's page size.
fn informer(client: kube::Client, label: &str, run: &str) -> (Informer<Node>, CancellationToken) {
    let shutdown = CancellationToken::new();
    let config = watcher::Config::default()
        .page_size(5)
        .labels(&format!("{label}={run}"));
    let (informer, driver) = Informer::new(Api::all(client), config, strip_node, shutdown.clone());
    tokio::spawn(driver);
    (informer, shutdown)
}

async fn create_nodes(cluster: &TestCluster, label: &str, run: &str, n: usize) -> Vec<String> {
    let mut names = Vec::new();
    for _ in 0..n {
        let name = cluster.unique_name("initial-list");
        cluster
            .create(&kubelet_node(&name).label(label, run).build())
            .await;
        names.push(name);
    }
    names
}

/// Syncs with every Node present, then follows a deletion and an addition: on the in-process
/// server through the streaming list, on a real cluster through whatever it offers.
#[tokio::test]
async fn the_informer_syncs_and_then_follows_changes() {
    let cluster = TestCluster::start().await;
    let run = cluster.unique_name("run");
    let label = "ccm-rs.io/initial-list-test";
    let names = create_nodes(&cluster, label, &run, 12).await;
    let (informer, shutdown) = informer(cluster.client(), label, &run);
    assert!(
        tokio::time::timeout(T, informer.wait_until_synced())
            .await
            .unwrap()
    );
    assert_eq!(informer.list().len(), 12);
    let nodes: Api<Node> = Api::all(cluster.client());
    nodes
        .delete(&names[0], &DeleteParams::default())
        .await
        .unwrap();
    let added = create_nodes(&cluster, label, &run, 1).await;
    until("the deletion and the addition", || {
        informer.list().len() == 12
            && informer.get(&names[0]).is_none()
            && informer.get(&added[0]).is_some()
    })
    .await;
    shutdown.cancel();
    cluster.cleanup().await;
}

fn node_reads(server: &ApiServer) -> (Vec<String>, usize) {
    let watches = server
        .requests_matching(&RequestFilter::new().verb("watch").resource("nodes"))
        .into_iter()
        .map(|r| r.query)
        .collect();
    let lists = server
        .requests_matching(&RequestFilter::new().verb("list").resource("nodes"))
        .len();
    (watches, lists)
}

#[tokio::test]
async fn a_server_with_watch_list_is_streamed_not_listed() {
    let cluster = TestCluster::start().await;
    let Some(server) = cluster.api_server() else {
        return; // reads the in-process server's request log
    };
    let run = cluster.unique_name("run");
    let label = "ccm-rs.io/initial-list-test";
    create_nodes(&cluster, label, &run, 12).await;
    server.clear_requests();
    let (informer, shutdown) = informer(cluster.client(), label, &run);
    assert!(
        tokio::time::timeout(T, informer.wait_until_synced())
            .await
            .unwrap()
    );
    assert_eq!(informer.list().len(), 12);
    let (watches, lists) = node_reads(server);
    assert_eq!(lists, 0, "no list request: {watches:?}");
    assert_eq!(watches.len(), 1, "{watches:?}");
    for part in [
        "sendInitialEvents=true",
        "resourceVersionMatch=NotOlderThan",
        "allowWatchBookmarks=true",
    ] {
        assert!(watches[0].contains(part), "{part} in {}", watches[0]);
    }
    shutdown.cancel();
}

#[tokio::test]
async fn a_server_without_watch_list_is_listed_in_pages() {
    let cluster = TestCluster::start().await;
    let Some(server) = cluster.api_server() else {
        return; // switches the in-process server's WatchList feature off
    };
    server.set_watch_list(false);
    let run = cluster.unique_name("run");
    let label = "ccm-rs.io/initial-list-test";
    create_nodes(&cluster, label, &run, 12).await;
    server.clear_requests();
    let (informer, shutdown) = informer(cluster.client(), label, &run);
    assert!(
        tokio::time::timeout(T, informer.wait_until_synced())
            .await
            .unwrap()
    );
    assert_eq!(informer.list().len(), 12);
    // One rejected streaming watch, then 12 Nodes in pages of 5 and a plain watch.
    let rejected = server
        .requests_matching(&RequestFilter::new().verb("watch").resource("nodes"))
        .into_iter()
        .filter(|r| r.status == 422)
        .count();
    assert_eq!(rejected, 1);
    let (_, lists) = node_reads(server);
    assert_eq!(lists, 3);
    until("a plain watch after the list", || {
        let (watches, _) = node_reads(server);
        watches
            .iter()
            .any(|q| !q.contains("sendInitialEvents") && q.contains("resourceVersion="))
    })
    .await;
    // The watch after the list delivers changes.
    let added = create_nodes(&cluster, label, &run, 1).await;
    until("the new Node", || informer.get(&added[0]).is_some()).await;
    shutdown.cancel();
}

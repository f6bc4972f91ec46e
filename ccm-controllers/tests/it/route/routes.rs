//! Routes follow the Nodes: created for a new or joining Node (one per family), deleted for a
//! removed Node or a stale one, re-created on an address change when the provider tracks
//! addresses.

use ccm_core::Route;
use ccm_testing::fake_cloud::{FakeCloud, FakeCloudConfig};
use ccm_testing::wait::eventually;
use k8s_openapi::api::core::v1::NodeAddress;
use kube::api::{Patch, PatchParams};
use std::time::Duration;

use super::{RouteTest, WAIT, cidr, name, network_unavailable, test_config};

#[tokio::test]
async fn new_node_gets_its_route_and_route_created_condition() {
    let h = RouteTest::start(FakeCloud::default(), test_config(&cidr(101))).await;
    let node = h.node("single", &["10.101.1.0/24"]).await;
    let n = name(&node);
    h.wait_routes(&n, &["10.101.1.0/24"]).await;

    let route = &h.routes_of(&n)[0];
    let addresses = node.status.as_ref().unwrap().addresses.clone().unwrap();
    assert_eq!(route.target_node_addresses, addresses);
    // FakeCloud names a route `<cluster>-<name hint>`: the hint is the Node's UID.
    assert_eq!(
        route.name,
        format!("kubernetes-{}", node.metadata.uid.as_deref().unwrap())
    );

    let updated = h.wait_condition(&n, "False", "RouteCreated").await;
    let c = network_unavailable(&updated).unwrap();
    assert_eq!(
        c.message.as_deref(),
        Some("RouteController created a route")
    );
    assert!(c.last_transition_time.is_some());
    assert!(c.last_heartbeat_time.is_some());
    // The kubelet's Ready condition is untouched.
    let conditions = updated.status.unwrap().conditions.unwrap();
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        "{conditions:?}"
    );
    h.stop().await;
}

#[tokio::test]
async fn dual_stack_node_gets_one_route_per_family() {
    let h = RouteTest::start(
        FakeCloud::default(),
        test_config(&format!("{},fd00:102::/56", cidr(102))),
    )
    .await;
    let node = h
        .node("dual", &["10.102.1.0/24", "fd00:102:0:1::/64"])
        .await;
    let n = name(&node);
    h.wait_routes(&n, &["10.102.1.0/24", "fd00:102:0:1::/64"])
        .await;
    h.wait_condition(&n, "False", "RouteCreated").await;
    assert_eq!(h.fake.call_count("create_route"), 2);
    h.stop().await;
}

#[tokio::test]
async fn node_joining_gets_its_route_without_waiting_for_the_periodic_reconcile() {
    // The period is an hour: only the watch can produce the route within the wait.
    let h = RouteTest::start(FakeCloud::default(), test_config(&cidr(103))).await;
    // Let the initial reconcile (empty) happen first, so the Node arrives afterwards.
    assert!(eventually(WAIT, || async { h.fake.call_count("list_routes") >= 1 }).await);
    let node = h.node("joiner", &["10.103.7.0/24"]).await;
    h.wait_routes(&name(&node), &["10.103.7.0/24"]).await;
    h.wait_condition(&name(&node), "False", "RouteCreated")
        .await;
    h.stop().await;
}

#[tokio::test]
async fn routes_of_removed_nodes_are_deleted() {
    let h = RouteTest::start(FakeCloud::default(), test_config(&cidr(104))).await;
    let keep = h.node("keep", &["10.104.1.0/24"]).await;
    let gone = h.node("gone", &["10.104.2.0/24"]).await;
    h.wait_routes(&name(&keep), &["10.104.1.0/24"]).await;
    h.wait_routes(&name(&gone), &["10.104.2.0/24"]).await;

    h.nodes()
        .delete(&name(&gone), &Default::default())
        .await
        .unwrap();
    h.wait_routes(&name(&gone), &[]).await;
    assert_eq!(h.routes_of(&name(&keep)).len(), 1);
    h.stop().await;
}

#[tokio::test]
async fn stale_and_blackhole_routes_are_removed_and_outside_routes_left_alone() {
    let fake = FakeCloud::default();
    let h = RouteTest::start(fake.clone(), test_config(&cidr(105))).await;
    let node = h.node("bh", &["10.105.1.0/24"]).await;
    let n = name(&node);
    let seeded = |name: &str, target: &str, cidr: &str, blackhole: bool| Route {
        name: name.into(),
        target_node: target.into(),
        destination_cidr: cidr.into(),
        blackhole,
        ..Route::default()
    };
    // Seeded while the controller runs: the periodic reconcile is an hour away, so trigger a
    // reconcile with a relevant Node change (another Node joining) afterwards.
    fake.insert_route(seeded("stale", "no-such-node", "10.105.9.0/24", false));
    fake.insert_route(seeded("untargeted", "", "10.105.10.0/24", false));
    fake.insert_route(seeded("outside", "no-such-node", "172.31.5.0/24", false));
    fake.insert_route(seeded("outside-bh", "", "172.31.6.0/24", true));
    h.wait_routes(&n, &["10.105.1.0/24"]).await;
    // Turn the node's route into a blackhole (its instance was replaced).
    let mut bh = h.routes_of(&n).remove(0);
    h.fake.reset_calls();
    bh.blackhole = true;
    // Replace the route: FakeCloud keeps what insert_route gives it.
    h.fake.insert_route(bh.clone());
    let _trigger = h.node("trigger", &["10.105.2.0/24"]).await;

    let ok = eventually(WAIT, || async {
        let routes = fake.routes();
        let names: Vec<&str> = routes.iter().map(|r| r.name.as_str()).collect();
        !names.contains(&"stale")
            && !names.contains(&"untargeted")
            && names.contains(&"outside")
            && names.contains(&"outside-bh")
            && routes.iter().any(|r| {
                r.target_node == n && !r.blackhole && r.destination_cidr == "10.105.1.0/24"
            })
            && !routes.iter().any(|r| r.target_node == n && r.blackhole)
    })
    .await;
    assert!(ok, "routes: {:?}", fake.routes());
    h.wait_condition(&n, "False", "RouteCreated").await;
    h.stop().await;
}

#[tokio::test]
async fn node_with_routes_but_no_pod_cidrs_gets_no_route_created_and_loses_them() {
    let fake = FakeCloud::default();
    let h = RouteTest::start(fake.clone(), test_config(&cidr(106))).await;
    // Node "plain" has neither pod CIDRs nor routes: it gets no condition.
    let plain = h.node("plain", &[]).await;
    let orphan = h.node("orphan", &[]).await;
    fake.insert_route(Route {
        name: "old".into(),
        target_node: name(&orphan),
        destination_cidr: "10.106.3.0/24".into(),
        ..Route::default()
    });
    // A relevant change makes the controller look again.
    let other = h.node("other", &["10.106.4.0/24"]).await;
    h.wait_routes(&name(&other), &["10.106.4.0/24"]).await;
    let n = h
        .wait_condition(&name(&orphan), "True", "NoRouteCreated")
        .await;
    assert_eq!(
        network_unavailable(&n).unwrap().message.as_deref(),
        Some("RouteController failed to create a route")
    );
    h.wait_routes(&name(&orphan), &[]).await;
    let plain = h.nodes().get(&name(&plain)).await.unwrap();
    assert!(network_unavailable(&plain).is_none());
    h.stop().await;
}

async fn set_addresses(h: &RouteTest, node: &str, addresses: Vec<NodeAddress>) {
    let patch = serde_json::json!({ "status": { "addresses": addresses } });
    h.nodes()
        .patch_status(node, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

#[tokio::test]
async fn address_change_recreates_the_route_when_the_provider_tracks_addresses() {
    let fake = FakeCloud::new({
        let mut config = FakeCloudConfig::default();
        config.track_node_addresses = true;
        config
    });
    let h = RouteTest::start(fake.clone(), test_config(&cidr(107))).await;
    let node = h.node("moving", &["10.107.1.0/24"]).await;
    let n = name(&node);
    h.wait_routes(&n, &["10.107.1.0/24"]).await;
    h.settle().await;
    fake.reset_calls();

    let new_addresses = vec![
        NodeAddress {
            type_: "InternalIP".into(),
            address: "192.0.2.77".into(),
        },
        NodeAddress {
            type_: "Hostname".into(),
            address: n.clone(),
        },
    ];
    set_addresses(&h, &n, new_addresses.clone()).await;
    let ok = eventually(WAIT, || async {
        h.routes_of(&n)
            .first()
            .is_some_and(|r| r.target_node_addresses == new_addresses)
    })
    .await;
    assert!(ok, "routes: {:?}", fake.routes());
    assert_eq!(h.routes_of(&n).len(), 1);
    assert!(fake.call_count("delete_route") >= 1);
    assert!(fake.call_count("create_route") >= 1);
    h.wait_condition(&n, "False", "RouteCreated").await;
    h.stop().await;
}

#[tokio::test]
async fn address_change_is_ignored_when_the_provider_does_not_track_addresses() {
    let fake = FakeCloud::default();
    let h = RouteTest::start(fake.clone(), test_config(&cidr(108))).await;
    let node = h.node("still", &["10.108.1.0/24"]).await;
    let n = name(&node);
    h.wait_routes(&n, &["10.108.1.0/24"]).await;
    h.wait_condition(&n, "False", "RouteCreated").await;
    h.settle().await;
    fake.reset_calls();
    set_addresses(
        &h,
        &n,
        vec![NodeAddress {
            type_: "InternalIP".into(),
            address: "192.0.2.78".into(),
        }],
    )
    .await;
    // The change triggers a reconcile (one list), which changes nothing.
    assert!(eventually(WAIT, || async { fake.call_count("list_routes") >= 1 }).await);
    // Let the reconcile finish its work, if any.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(fake.call_count("delete_route"), 0);
    assert_eq!(fake.call_count("create_route"), 0);
    h.stop().await;
}

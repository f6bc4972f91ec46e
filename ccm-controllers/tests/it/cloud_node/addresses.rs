//! A Node's addresses: kubelet's hostname, the provided node IP (single and dual stack), and
//! the periodic refresh.

use crate::support::node::{
    TIMEOUT, Test, addresses, has_taint, provider_id, quiet_cloud_node_config,
};
use ccm_controllers::controllers::cloud_node::CloudNodeConfig;
use ccm_core::well_known::{ANNOTATION_PROVIDED_NODE_IP, TAINT_UNINITIALIZED};
use ccm_core::{Node, NodeAddress};
use ccm_testing::fake_cloud::FakeCloud;
use ccm_testing::wait::{eventually, wait_for};
use kube::api::{Patch, PatchParams};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

use super::{Probe, addr, fake_addresses, fake_internal_ip};

#[tokio::test]
async fn kubelet_hostname_is_kept_when_the_cloud_reports_none() {
    let t = Test::start().await;
    let probe = Probe::new(FakeCloud::default(), |m| {
        m.node_addresses.retain(|a| a.type_ != "Hostname");
    });
    let name = t.name("hostname");
    let fake_addrs = fake_addresses(&probe.fake, &name).await;
    t.create(&t.registered_node(&name).build()).await;
    let running = t
        .run_cloud_node(probe.clone(), quiet_cloud_node_config())
        .await;

    t.wait_event(&name, "Synced").await;
    let node = t.nodes.get(&name).await.unwrap();
    let mut expected: Vec<_> = fake_addrs
        .into_iter()
        .filter(|(ty, _)| ty != "Hostname")
        .collect();
    expected.push(addr("Hostname", &name));
    assert_eq!(addresses(&node), expected);
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn zero_cloud_addresses_leave_the_nodes_addresses_alone() {
    let t = Test::start().await;
    let probe = Probe::new(FakeCloud::default(), |m| m.node_addresses.clear());
    let name = t.name("noaddr");
    t.create(&t.registered_node(&name).build()).await;
    let running = t
        .run_cloud_node(probe.clone(), quiet_cloud_node_config())
        .await;

    t.wait_event(&name, "Synced").await;
    let node = t.nodes.get(&name).await.unwrap();
    assert!(!has_taint(&node, TAINT_UNINITIALIZED));
    assert_eq!(addresses(&node), vec![addr("Hostname", &name)]);
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn provided_node_ip_single_stack_goes_first_and_drops_other_internal_ips() {
    let t = Test::start().await;
    // The cloud reports a second InternalIP before the node's own.
    let probe = Probe::new(FakeCloud::default(), |m| {
        m.node_addresses.insert(
            0,
            NodeAddress {
                type_: "InternalIP".into(),
                address: "192.0.2.200".into(),
            },
        );
    });
    let name = t.name("nodeip");
    let ip = fake_internal_ip(&fake_addresses(&probe.fake, &name).await);
    t.create(
        &t.registered_node(&name)
            .provided_node_ip(&ip)
            .addresses(vec![NodeAddress {
                type_: "Hostname".into(),
                address: name.clone(),
            }])
            .build(),
    )
    .await;
    let running = t
        .run_cloud_node(probe.clone(), quiet_cloud_node_config())
        .await;

    t.wait_event(&name, "Synced").await;
    let node = t.nodes.get(&name).await.unwrap();
    assert_eq!(
        addresses(&node),
        vec![addr("InternalIP", &ip), addr("Hostname", &name)]
    );
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn provided_node_ip_dual_stack_in_requested_order() {
    let t = Test::start().await;
    let probe = Probe::new(FakeCloud::default(), |m| {
        m.node_addresses.push(NodeAddress {
            type_: "InternalIP".into(),
            address: "fd00::10".into(),
        });
        m.node_addresses.push(NodeAddress {
            type_: "InternalIP".into(),
            address: "fd00::11".into(),
        });
        m.node_addresses.push(NodeAddress {
            type_: "ExternalIP".into(),
            address: "198.51.100.7".into(),
        });
    });
    let name = t.name("dualstack");
    let v4 = fake_internal_ip(&fake_addresses(&probe.fake, &name).await);
    let mut node = t.registered_node(&name).build();
    node.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(ANNOTATION_PROVIDED_NODE_IP.into(), format!("fd00::11,{v4}"));
    t.create(&node).await;
    let running = t
        .run_cloud_node(probe.clone(), quiet_cloud_node_config())
        .await;

    t.wait_event(&name, "Synced").await;
    let node = t.nodes.get(&name).await.unwrap();
    assert_eq!(
        addresses(&node),
        vec![
            addr("InternalIP", "fd00::11"),
            addr("InternalIP", &v4),
            addr("Hostname", &name),
            addr("ExternalIP", "198.51.100.7"),
        ]
    );
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn unknown_provided_node_ip_keeps_the_node_tainted_until_fixed() {
    let t = Test::start().await;
    let fake = FakeCloud::default();
    let name = t.name("badip");
    let ip = fake_internal_ip(&fake_addresses(&fake, &name).await);
    let mut node = t.registered_node(&name).build();
    node.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(ANNOTATION_PROVIDED_NODE_IP.into(), format!("{ip},fd00::99"));
    t.create(&node).await;
    let running = t
        .run_cloud_node(fake.provider(), quiet_cloud_node_config())
        .await;

    let (type_, _, note) = t.wait_event(&name, "SyncFailed").await;
    assert_eq!(type_, "Warning");
    assert!(note.contains("node IP"), "{note}");
    assert!(note.contains("fd00::99"), "{note}");
    let node = t.nodes.get(&name).await.unwrap();
    assert!(has_taint(&node, TAINT_UNINITIALIZED));
    assert_eq!(
        provider_id(&node),
        None,
        "nothing written for an invalid node IP"
    );

    // kubelet restarted with a valid --node-ip: the node is initialised.
    t.nodes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {ANNOTATION_PROVIDED_NODE_IP: ip}}})),
        )
        .await
        .unwrap();
    let node = t.wait_initialized(&name).await;
    assert_eq!(provider_id(&node), Some(format!("fake://{name}").as_str()));
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn periodic_refresh_updates_addresses_of_initialized_nodes() {
    let t = Test::start().await;
    let fake = FakeCloud::default();
    let name = t.name("refresh");
    let expected = fake_addresses(&fake, &name).await;
    t.create(
        &t.registered_node(&name)
            .without_uninitialized_taint()
            .provider_id(&format!("fake://{name}"))
            .addresses(vec![
                NodeAddress {
                    type_: "InternalIP".into(),
                    address: "192.0.2.1".into(),
                },
                NodeAddress {
                    type_: "Hostname".into(),
                    address: name.clone(),
                },
            ])
            .build(),
    )
    .await;
    let running = t
        .run_cloud_node(fake.provider(), {
            let mut config = CloudNodeConfig::default();
            config.status_update_frequency = Duration::from_millis(500);
            config.status_update_workers = 2;
            config
        })
        .await;
    wait_for(&t.nodes, &name, TIMEOUT, |n: &Node| {
        addresses(n) == expected
    })
    .await
    .unwrap();
    // The cloud changes nothing: later refreshes write nothing.
    let calls = fake.call_count("instance_metadata");
    assert!(
        eventually(TIMEOUT, || async {
            fake.call_count("instance_metadata") >= calls + 2
        })
        .await
    );
    if let Some(server) = t.cluster.api_server() {
        let status_writes = server
            .requests()
            .iter()
            .filter(|r| r.name.as_deref() == Some(name.as_str()) && r.verb == "patch")
            .count();
        assert_eq!(status_writes, 1);
    }
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

//! The cloud-node controller's table.

use ccm_core::well_known::{
    LABEL_INSTANCE_TYPE, LABEL_TOPOLOGY_REGION, LABEL_TOPOLOGY_ZONE, TAINT_UNINITIALIZED,
};
use ccm_testing::TestCluster;
use ccm_testing::builders::kubelet_node;
use ccm_testing::fake_cloud::{FakeCloud, NodeAnswer};
use ccm_testing::harness::ControllerHarness;
use serde_json::json;

use super::{
    Calls, Write, call, cloud_calls, dump, internal_ip, node_args, skip_on_real_cluster, write,
    writes,
};

struct CloudNodeCase {
    name: &'static str,
    /// The cloud's answer for Node `n1` (kubelet-registered, carrying the uninitialized taint).
    answer: NodeAnswer,
    /// The cloud calls expected.
    calls: Calls,
    /// The API writes expected, in order.
    writes: Vec<Write>,
}

#[tokio::test]
async fn cloud_node_table() {
    if skip_on_real_cluster("cloud_node_table") {
        return;
    }
    let uninitialized =
        json!({"effect": "NoSchedule", "key": TAINT_UNINITIALIZED, "value": "true"});
    let not_ready = json!({"effect": "NoSchedule", "key": "node.kubernetes.io/not-ready"});
    let cases = vec![
        CloudNodeCase {
            name: "provider ID, topology labels and addresses from the cloud",
            answer: NodeAnswer {
                provider_id: Some("fake://i-0001".into()),
                addresses: Some(vec![internal_ip("10.0.0.1")]),
                instance_type: Some("m5.large".into()),
                zone: Some("eu-1b".into()),
                region: Some("eu-1".into()),
                ..Default::default()
            },
            calls: Calls::Exactly(vec![call("instance_metadata", node_args("n1", None))]),
            writes: vec![
                // The cloud's addresses, the kubelet's Hostname kept.
                write(
                    "patch nodes/status n1",
                    json!({"metadata": {"uid": "<uid>"}, "status": {"addresses": [
                        {"address": "10.0.0.1", "type": "InternalIP"},
                        {"address": "n1", "type": "Hostname"},
                    ]}}),
                ),
                // Labels (GA and beta), provider ID and the taint removed in one patch,
                // guarded by `test` ops on what it read.
                write(
                    "patch nodes n1",
                    json!([
                        {"op": "test", "path": "/metadata/uid", "value": "<uid>"},
                        {"op": "test", "path": "/metadata/labels/beta.kubernetes.io~1instance-type", "value": null},
                        {"op": "test", "path": "/metadata/labels/failure-domain.beta.kubernetes.io~1region", "value": null},
                        {"op": "test", "path": "/metadata/labels/failure-domain.beta.kubernetes.io~1zone", "value": null},
                        {"op": "test", "path": "/metadata/labels/node.kubernetes.io~1instance-type", "value": null},
                        {"op": "test", "path": "/metadata/labels/topology.kubernetes.io~1region", "value": null},
                        {"op": "test", "path": "/metadata/labels/topology.kubernetes.io~1zone", "value": null},
                        {"op": "test", "path": "/spec/providerID", "value": null},
                        {"op": "test", "path": "/spec/taints", "value": [uninitialized, not_ready]},
                        {"op": "add", "path": "/metadata/labels/beta.kubernetes.io~1instance-type", "value": "m5.large"},
                        {"op": "add", "path": "/metadata/labels/failure-domain.beta.kubernetes.io~1region", "value": "eu-1"},
                        {"op": "add", "path": "/metadata/labels/failure-domain.beta.kubernetes.io~1zone", "value": "eu-1b"},
                        {"op": "add", "path": format!("/metadata/labels/{}", LABEL_INSTANCE_TYPE.replace('/', "~1")), "value": "m5.large"},
                        {"op": "add", "path": format!("/metadata/labels/{}", LABEL_TOPOLOGY_REGION.replace('/', "~1")), "value": "eu-1"},
                        {"op": "add", "path": format!("/metadata/labels/{}", LABEL_TOPOLOGY_ZONE.replace('/', "~1")), "value": "eu-1b"},
                        {"op": "add", "path": "/spec/providerID", "value": "fake://i-0001"},
                        {"op": "add", "path": "/spec/taints", "value": [not_ready]},
                    ]),
                ),
            ],
        },
        CloudNodeCase {
            name: "gone from the cloud: not initialised, taint kept",
            answer: NodeAnswer {
                exists: Some(false),
                ..Default::default()
            },
            // Go: the metadata lookup fails, the Node is requeued; nothing is written.
            calls: Calls::Repeated(vec![call("instance_metadata", node_args("n1", None))], 1),
            writes: vec![],
        },
        CloudNodeCase {
            name: "cloud lookup fails: not initialised, taint kept",
            answer: NodeAnswer {
                error: Some("instance API down".into()),
                ..Default::default()
            },
            // Go: the metadata lookup fails, the Node is requeued; nothing is written.
            calls: Calls::Repeated(vec![call("instance_metadata", node_args("n1", None))], 1),
            writes: vec![],
        },
    ];
    for case in cases {
        let cluster = TestCluster::start().await;
        let server = cluster.api_server().unwrap();
        let cloud = FakeCloud::builder().node("n1", case.answer.clone()).build();
        let uid = cluster
            .create(&kubelet_node("n1").build())
            .await
            .metadata
            .uid
            .unwrap();
        server.clear_requests();
        let harness = ControllerHarness::builder(&cluster, cloud.provider())
            .cloud_node()
            .start()
            .await;
        harness.settled().await;
        let (calls, writes) = (cloud_calls(&cloud), writes(server, &[(&uid, "<uid>")]));
        dump(case.name, &calls, &writes);
        case.calls.check(case.name, &calls);
        assert_eq!(writes, case.writes, "case {}: API writes", case.name);
        harness.stop().await.unwrap();
        cluster.cleanup().await;
    }
}

//! The cloud-node-lifecycle controller's table.

use ccm_controllers::controllers::node_lifecycle::{self, NodeLifecycleConfig};
use ccm_core::well_known::TAINT_SHUTDOWN;
use ccm_testing::TestCluster;
use ccm_testing::builders::kubelet_node;
use ccm_testing::fake_cloud::{FakeCloud, NodeAnswer};
use ccm_testing::harness::ControllerHarness;
use ccm_testing::wait::eventually;
use serde_json::json;
use std::time::Duration;

use super::{
    Calls, SHORT, Write, call, cloud_calls, dump, node_args, skip_on_real_cluster, write, writes,
};

struct LifecycleCase {
    name: &'static str,
    /// The cloud's answer for Node `n1`: initialised (provider ID `fake://n1`) and NotReady.
    /// Node `n2` is Ready and gone from the cloud in every case: Go looks only at NotReady
    /// Nodes, so it is never asked about and never deleted.
    answer: NodeAnswer,
    /// The cloud calls expected (one monitor pass, repeated).
    calls: Calls,
    /// The API writes expected, in order.
    writes: Vec<Write>,
}

#[tokio::test]
async fn node_lifecycle_table() {
    if skip_on_real_cluster("node_lifecycle_table") {
        return;
    }
    let n1 = node_args("n1", Some("fake://n1"));
    let not_ready = json!({"effect": "NoSchedule", "key": "node.kubernetes.io/not-ready"});
    let cases = vec![
        LifecycleCase {
            name: "exists and runs: nothing to do",
            answer: NodeAnswer::default(),
            calls: Calls::Repeated(
                vec![
                    call("instance_exists", n1.clone()),
                    call("instance_shutdown", n1.clone()),
                ],
                1,
            ),
            writes: vec![],
        },
        LifecycleCase {
            name: "shut down: the shutdown taint is added",
            answer: NodeAnswer {
                shutdown: Some(true),
                ..Default::default()
            },
            calls: Calls::Repeated(
                vec![
                    call("instance_exists", n1.clone()),
                    call("instance_shutdown", n1.clone()),
                ],
                1,
            ),
            // Go's ShutdownTaint, added once, the not-ready taint (admission's) kept.
            writes: vec![write(
                "patch nodes n1",
                json!([
                    {"op": "test", "path": "/metadata/uid", "value": "<uid>"},
                    {"op": "test", "path": "/spec/taints", "value": [not_ready]},
                    {"op": "add", "path": "/spec/taints", "value": [
                        not_ready,
                        {"effect": "NoSchedule", "key": TAINT_SHUTDOWN},
                    ]},
                ]),
            )],
        },
        LifecycleCase {
            name: "gone from the cloud: deleted once the grace period passed",
            answer: NodeAnswer {
                exists: Some(false),
                ..Default::default()
            },
            // Deleted only after two "gone" answers a grace period apart (Go deletes on the
            // first; DESIGN.md's deliberate difference), with a UID precondition.
            calls: Calls::Repeated(vec![call("instance_exists", n1.clone())], 2),
            writes: vec![write(
                "delete nodes n1",
                json!({"preconditions": {"uid": "<uid>"}}),
            )],
        },
    ];
    let config = {
        let mut config = NodeLifecycleConfig::default();
        config.monitor_period = Duration::from_millis(50);
        config.deletion_grace_period = Duration::from_millis(200);
        config
    };
    for case in cases {
        let cluster = TestCluster::start().await;
        let server = cluster.api_server().unwrap();
        let cloud = FakeCloud::builder()
            .node("n1", case.answer.clone())
            .node(
                "n2",
                NodeAnswer {
                    exists: Some(false),
                    ..Default::default()
                },
            )
            .build();
        let initialised = |name: &str| {
            kubelet_node(name)
                .without_uninitialized_taint()
                .provider_id(&format!("fake://{name}"))
        };
        let uid = cluster
            .create(&initialised("n1").not_ready().build())
            .await
            .metadata
            .uid
            .unwrap();
        cluster.create(&initialised("n2").build()).await;
        server.clear_requests();
        let run_config = config.clone();
        let harness = ControllerHarness::builder(&cluster, cloud.provider())
            .controller("cloud-node-lifecycle", move |ctx, _| {
                node_lifecycle::run(ctx, run_config.clone())
            })
            .start()
            .await;
        // Periodic passes: run until the expected writes were made and a few passes went by
        // (or, once n1 is deleted, the passes stop asking about it).
        let expected_writes = case.writes.len();
        eventually(SHORT, || async {
            writes(server, &[]).len() >= expected_writes
                && (cloud.call_log().len() >= 8 || expected_writes > 0)
        })
        .await;
        harness.settled().await;
        harness.stop().await.unwrap();
        let (calls, writes) = (cloud_calls(&cloud), writes(server, &[(&uid, "<uid>")]));
        dump(case.name, &calls, &writes);
        case.calls.check(case.name, &calls);
        assert_eq!(writes, case.writes, "case {}: API writes", case.name);
        cluster.cleanup().await;
    }
}

//! The Node marks beyond Go in shadow mode: a shadow with `--node-out-of-service-after`
//! reports the out-of-service taint it would add as a divergence and never adds it; one with
//! `--reconcile-cloud-labels` reports a label the cloud moved and writes nothing.

use ccm_core::well_known::{LABEL_TOPOLOGY_ZONE, TAINT_OUT_OF_SERVICE};
use ccm_testing::fake_cloud::NodeAnswer;

use super::{Reconciled, ShadowRun};

#[tokio::test]
async fn out_of_service_is_a_divergence_never_a_taint() {
    let r = Reconciled::start(2).await;
    let stopped = r.nodes[0].clone();
    ccm_testing::harness::set_node_ready(&r.cluster.client(), &stopped, false).await;
    r.cloud.set_node(
        &stopped,
        NodeAnswer {
            shutdown: Some(true),
            ..NodeAnswer::default()
        },
    );
    let mark = r.log_mark();
    let shadow = ShadowRun::start(
        &r.cluster,
        &r.cloud,
        &["--node-out-of-service-after=1s".to_owned()],
    );
    let d = shadow
        .wait_for("the out-of-service divergence", |report| {
            r.own(report).into_iter().find(|d| {
                d["object"] == stopped.as_str()
                    && d["field"] == "spec.taints"
                    && d["ours"].to_string().contains(TAINT_OUT_OF_SERVICE)
            })
        })
        .await;
    assert_eq!(d["kind"], "Node");
    assert_eq!(shadow.stop().await, 0);
    let node = r.node_api().get(&stopped).await.unwrap();
    let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
    assert!(
        taints.iter().all(|t| t.key != TAINT_OUT_OF_SERVICE),
        "the shadow tainted the Node: {taints:?}"
    );
    r.assert_nothing_persisted(mark);
    r.assert_no_mutating_call();
    r.cluster.cleanup().await;
}

#[tokio::test]
async fn a_label_the_cloud_moved_is_a_divergence_at_the_refresh() {
    let r = Reconciled::start(2).await;
    let moved = r.nodes[1].clone();
    r.cloud.set_node(
        &moved,
        NodeAnswer {
            zone: Some("zone-b".to_owned()),
            ..NodeAnswer::default()
        },
    );
    let mark = r.log_mark();
    let shadow = ShadowRun::start(
        &r.cluster,
        &r.cloud,
        &[
            "--reconcile-cloud-labels".to_owned(),
            "--node-status-update-frequency=500ms".to_owned(),
        ],
    );
    let d = shadow
        .wait_for("the zone divergence", |report| {
            r.own(report).into_iter().find(|d| {
                d["object"] == moved.as_str()
                    && d["field"] == format!("metadata.labels[{LABEL_TOPOLOGY_ZONE}]")
            })
        })
        .await;
    assert_eq!(d["incumbent"], "zone-a");
    assert_eq!(d["ours"], "zone-b");
    assert_eq!(shadow.stop().await, 0);
    let node = r.node_api().get(&moved).await.unwrap();
    assert_eq!(
        node.metadata
            .labels
            .unwrap_or_default()
            .get(LABEL_TOPOLOGY_ZONE)
            .map(String::as_str),
        Some("zone-a")
    );
    r.assert_nothing_persisted(mark);
    r.cluster.cleanup().await;
}

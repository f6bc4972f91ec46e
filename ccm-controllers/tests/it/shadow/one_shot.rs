//! The one-shot shadow at its limits (issue 41): a would-delete Node is asked about once, not
//! once per monitor pass; a run that cannot compare every object ends at `--shadow-duration`
//! plus `--shadow-settle-time` with exit 4 and the objects not compared in the report.
//!
//! Both hold on a real cluster (`CCM_TEST_KUBECONFIG`): the assertions are about the test's own
//! Nodes and FakeCloud's calls; other Nodes of a shared cluster may add divergences of their
//! own (exit 3 there, which still tells "not clean").

use std::time::Duration;

use ccm_controllers::Builder;
use ccm_testing::fake_cloud::NodeAnswer;
use serde_json::Value;

use super::{Reconciled, ShadowRun, shadow_args};

/// Runs a one-shot shadow with `extra` flags; returns its exit code and report.
async fn one_shot_with(r: &Reconciled, extra: &[&str]) -> (i32, Value) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.json");
    let mut args = vec![format!("--shadow-report={}", path.display())];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let code = tokio::time::timeout(
        // A hang guard only: the run ends by itself at duration + settle (a few seconds).
        Duration::from_secs(90),
        Builder::new()
            .provider(r.cloud.provider())
            .listener(std::net::TcpListener::bind("127.0.0.1:0").unwrap())
            .args(shadow_args(&r.cluster, &args))
            .shutdown_signal(std::future::pending())
            .run_async(),
    )
    .await
    .expect("the one-shot shadow stops by itself");
    let report = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    (code, report)
}

/// The `instance_exists` calls about Node `node`.
fn exists_calls(r: &Reconciled, node: &str) -> usize {
    r.cloud
        .calls_of("instance_exists")
        .iter()
        .filter(|c| c.subject == node)
        .count()
}

#[tokio::test]
async fn a_would_delete_is_decided_then_held_not_asked_about_once_per_pass() {
    let r = Reconciled::start(2).await;
    let gone = r.instance_gone(0).await;
    // 200 ms monitor passes, a 1 s deletion grace period (`shadow_args`).
    let shadow = ShadowRun::start(&r.cluster, &r.cloud, &[]);
    shadow.would_delete(&r, &gone).await;
    // Decided: the first "gone" answer, the answers of the passes within the grace period,
    // the confirming one.
    let decided = exists_calls(&r, &gone);
    assert!(
        (2..=7).contains(&decided),
        "{decided} calls to decide; calls: {:#?}",
        r.cloud.call_counts()
    );
    // Ten more passes: the would-delete is held, never asked about again (today's code asked
    // on every pass and sent a dry-run delete on every pass).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        exists_calls(&r, &gone),
        decided,
        "asked again after the would-delete was decided"
    );
    let metrics = shadow.metrics().await;
    assert_eq!(shadow.stop().await, 0);
    assert!(
        metrics.contains("outcome=\"would_delete_held\""),
        "the held passes are counted"
    );
    assert!(
        r.node_api().get_opt(&gone).await.unwrap().is_some(),
        "the Node still exists"
    );
    r.cluster.cleanup().await;
}

#[tokio::test]
async fn a_run_that_cannot_compare_a_node_exits_4_and_lists_it_with_the_reason() {
    let r = Reconciled::start(2).await;
    // Every lookup of Node 1 fails from now on: the shadow cannot compare it.
    let failing = r.nodes[1].clone();
    r.cloud.set_node(
        &failing,
        NodeAnswer {
            error: Some("the cloud API is down".to_owned()),
            ..NodeAnswer::default()
        },
    );
    let (code, report) =
        one_shot_with(&r, &["--shadow-duration=1s", "--shadow-settle-time=2s"]).await;
    assert_eq!(report["complete"], false, "{report:#}");
    let listed = report["notCompared"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["kind"] == "Node" && n["object"] == failing.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("{failing} not listed: {report:#}"));
    assert_eq!(listed["reason"], "cloud error", "{listed:#}");
    assert!(
        listed["error"]
            .as_str()
            .is_some_and(|e| e.contains("the cloud API is down")),
        "{listed:#}"
    );
    // The other Node and the Service were compared.
    assert!(
        !report["notCompared"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["object"] == r.nodes[0].as_str() || n["kind"] == "Service"),
        "{report:#}"
    );
    if r.cluster.is_real() {
        assert!(
            matches!(code, 3 | 4),
            "never 0 when a Node was not compared: {code}"
        );
    } else {
        assert_eq!(code, 4, "incomplete without divergences: exit 4");
    }
    r.cluster.cleanup().await;
}

//! The `fake-ccm` binary as an operator runs it beside a cluster's CCM: a one-shot shadow
//! (`--shadow-report`) over an initialised NotReady Node whose instance the cloud reports gone
//! (`missing_nodes`), with the lifecycle controller's periods at one second. The shadow must
//! report the would-delete divergence and exit 3, and the Node must still be there: the issue 33
//! scenario, where the dry-run marker of the delete was in the query while kube-apiserver reads
//! a delete's options from its body.
//!
//! And the issue 41 scenario: 30 would-deletes at the shadow's default cloud budget (5 calls/s).
//! The one-shot must end by itself within `--shadow-duration` plus the default settle time
//! (30 s) with all 30 in the report, and log at most one "would delete node (shadow)" line per
//! Node, never "deleting node".
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::time::Duration;

use ccm_testing::apiserver::ApiServer;
use ccm_testing::builders::kubelet_node;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};

#[tokio::test]
async fn a_one_shot_shadow_reports_a_gone_instance_and_deletes_nothing() {
    let server = ApiServer::start().await;
    let nodes: Api<Node> = Api::all(server.client());
    for (name, ready) in [("sh-a", false), ("sh-b", true)] {
        let node = kubelet_node(name)
            .without_uninitialized_taint()
            .provider_id(&format!("fake://{name}"))
            .ready(ready)
            .build();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }

    let mark = server.requests().len();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cloud.yaml");
    std::fs::write(&config, "missing_nodes: [sh-a]\n").unwrap();
    let report = dir.path().join("report.json");
    let ccm = tokio::process::Command::new(env!("CARGO_BIN_EXE_fake-ccm"))
        .arg(format!("--master={}", server.url()))
        .arg("--cloud-provider=fake")
        .arg(format!("--cloud-config={}", config.display()))
        .arg(format!("--shadow-report={}", report.display()))
        .arg("--shadow-duration=5s")
        .arg("--node-monitor-period=1s")
        .arg("--node-deletion-grace-period=1s")
        .arg("--secure-port=0")
        .arg("--configure-cloud-routes=false")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .status();
    let status = tokio::time::timeout(Duration::from_secs(120), ccm)
        .await
        .expect("the one-shot shadow stops by itself")
        .unwrap();
    assert_eq!(status.code(), Some(3), "divergences: exit 3");

    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let divergences = report["divergences"].as_array().unwrap();
    assert!(
        divergences.iter().any(|d| d["kind"] == "Node"
            && d["object"] == "sh-a"
            && d["field"] == "(node deleted)"
            && d["incumbent"] == "exists"
            && d["ours"] == "deleted"),
        "{report:#}"
    );
    assert!(
        nodes.get_opt("sh-a").await.unwrap().is_some(),
        "the shadow deleted Node sh-a"
    );
    assert!(nodes.get_opt("sh-b").await.unwrap().is_some());
    // The delete reached the server, as a dry run where the server reads its options.
    let shadow = server.requests().split_off(mark);
    assert!(
        shadow
            .iter()
            .any(|r| r.verb == "delete" && r.name.as_deref() == Some("sh-a")),
        "the lifecycle controller sent no delete"
    );
    for r in shadow.iter().filter(|r| r.is_write()) {
        assert!(r.dry_run, "a write not handled as a dry run: {r:#?}");
    }
}

/// The Node names of the issue 41 scenario: `gone-000`… (no name a prefix of another).
fn gone(i: usize) -> String {
    format!("gone-{i:03}")
}

#[tokio::test]
async fn thirty_would_deletes_end_on_time_with_one_log_line_each() {
    const GONE: usize = 30;
    let server = ApiServer::start().await;
    let nodes: Api<Node> = Api::all(server.client());
    let mut names: Vec<(String, bool)> = (0..GONE).map(|i| (gone(i), false)).collect();
    names.extend([("here-a".to_owned(), true), ("here-b".to_owned(), true)]);
    for (name, ready) in &names {
        let node = kubelet_node(name)
            .without_uninitialized_taint()
            .provider_id(&format!("fake://{name}"))
            .ready(*ready)
            .build();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cloud.yaml");
    let missing: Vec<String> = (0..GONE).map(gone).collect();
    std::fs::write(
        &config,
        format!("missing_nodes: [{}]\n", missing.join(", ")),
    )
    .unwrap();
    let report = dir.path().join("report.json");
    // The default shadow budget (no --cloud-api-qps) and the default settle time.
    let (duration, settle) = (Duration::from_secs(30), Duration::from_secs(30));
    let ccm = tokio::process::Command::new(env!("CARGO_BIN_EXE_fake-ccm"))
        .arg(format!("--master={}", server.url()))
        .arg("--cloud-provider=fake")
        .arg(format!("--cloud-config={}", config.display()))
        .arg(format!("--shadow-report={}", report.display()))
        .arg("--shadow-duration=30s")
        .arg("--node-monitor-period=1s")
        .arg("--node-deletion-grace-period=1s")
        .arg("--secure-port=0")
        .arg("--configure-cloud-routes=false")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    // A hang guard: duration + settle, and 20 s for the start (today's code ran until killed).
    let output = tokio::time::timeout(duration + settle + Duration::from_secs(20), ccm)
        .await
        .expect("the one-shot shadow ends by itself within duration + settle")
        .unwrap();
    let log = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(3),
        "divergences: exit 3; log:\n{log}"
    );

    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(report["complete"], true, "{report:#}");
    assert_eq!(report["notCompared"], serde_json::json!([]), "{report:#}");
    let mut would_delete: Vec<&str> = report["divergences"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["field"] == "(node deleted)")
        .map(|d| d["object"].as_str().unwrap())
        .collect();
    would_delete.sort_unstable();
    assert_eq!(would_delete, missing, "{report:#}");
    // The Ready Nodes were made without the labels a CCM sets: divergences of their own.
    assert!(
        report["divergences"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["field"] == "(node deleted)")
            .all(|d| d["object"].as_str().is_some_and(|o| o.starts_with("gone-"))),
        "{report:#}"
    );
    for (name, _) in &names {
        assert!(
            nodes.get_opt(name).await.unwrap().is_some(),
            "{name} deleted"
        );
    }

    // The log says what the shadow does, once per Node.
    assert!(
        !log.contains("deleting node"),
        "a shadow never says 'deleting node':\n{log}"
    );
    for name in &missing {
        let field = format!("node=\"{name}\"");
        let lines = |what: &str| {
            log.lines()
                .filter(|l| l.contains(what) && l.contains(&field))
                .count()
        };
        assert_eq!(lines("would delete node (shadow)"), 1, "{name}:\n{log}");
        assert!(
            lines("would delete the node (shadow) if confirmed") <= 1,
            "{name}:\n{log}"
        );
    }
}

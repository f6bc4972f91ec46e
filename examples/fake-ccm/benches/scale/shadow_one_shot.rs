//! shadow with `--would-deletes K`: the issue 41 scenario at scale. After the incumbent
//! reconciled N Nodes and M Services, K Nodes go NotReady and their instances are gone from
//! the cloud (`missing_nodes`); the shadow runs as a one-shot (`--shadow-report`,
//! `--shadow-duration`, the default settle time of 30 s) at its default cloud budget (5 calls/s,
//! unless `--ccm-arg=--cloud-api-qps=…`). Figures: whether it ends by itself within duration +
//! settle, its exit code and report (complete, every object compared, K would-deletes), the
//! lifecycle controller's cloud calls per monitor pass once the would-deletes are held, and
//! the log lines per would-delete Node.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::ccm::{Ccm, LogTail, Metrics};
use crate::cli::Opts;
use crate::environment::{Env, Progress};
use crate::report::Report;

/// fake-ccm's default `--shadow-settle-time`.
const SETTLE: Duration = Duration::from_secs(30);
/// fake-ccm's default `--node-monitor-period`.
const MONITOR_PERIOD: Duration = Duration::from_secs(5);
/// The window at the end of the run over which the lifecycle calls per pass are measured.
const HELD_WINDOW: Duration = Duration::from_secs(60);
/// The operations of the node-lifecycle checks.
const LIFECYCLE_OPS: &[&str] = &[
    "instance_exists",
    "instance_shutdown",
    "instance_exists_by_provider_id",
    "instance_shutdown_by_provider_id",
    "describe_instances",
];

/// Marks the first `k` Nodes NotReady (the kubelet stopped posting).
async fn not_ready(env: &Env, k: usize) {
    let patch = Patch::Strategic(json!({"status": {"conditions": [{
        "type": "Ready", "status": "False", "reason": "KubeletNotReady",
        "message": "the instance is gone",
        "lastHeartbeatTime": jiff::Timestamp::now().to_string(),
    }]}}));
    let nodes = env.nodes();
    let params = PatchParams::default();
    futures::future::join_all((0..k).map(|i| {
        let (nodes, patch, params, name) = (&nodes, &patch, &params, env.node_name(i));
        async move {
            nodes.patch_status(&name, params, patch).await.unwrap();
        }
    }))
    .await;
}

fn lifecycle_calls(m: &Metrics) -> f64 {
    m.cloud_calls()
        .iter()
        .filter(|(op, _)| LIFECYCLE_OPS.contains(&op.as_str()))
        .map(|(_, n)| n)
        .sum()
}

pub(crate) async fn one_shot(
    env: &Env,
    opts: &Opts,
    state_config: &str,
    mut report: Report,
) -> Report {
    let k = opts.would_deletes.min(opts.nodes);
    {
        let _p = Progress::start("not ready", move || format!("{k} nodes NotReady"));
        not_ready(env, k).await;
    }
    let missing: Vec<String> = (0..k).map(|i| env.node_name(i)).collect();
    let config = format!("{state_config}missing_nodes: [{}]\n", missing.join(", "));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.json");
    let duration = opts.shadow_duration;
    let mut shadow_opts = opts.clone();
    shadow_opts.ccm_args.extend([
        format!("--shadow-report={}", path.display()),
        format!("--shadow-duration={}s", duration.as_secs()),
        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics,/shadow/divergences"
            .to_owned(),
    ]);
    let started = Instant::now();
    let mut ccm = Ccm::start_with(env, &shadow_opts, false, &config).await;
    let ready = started.elapsed();
    // Sample the metrics every 5 s until it exits by itself (or duration + settle + 2 min).
    let deadline = started + duration + SETTLE + Duration::from_secs(120);
    let mut samples: Vec<(Instant, Metrics)> = Vec::new();
    let code = {
        let _p = Progress::start("one-shot", move || {
            format!(
                "{:.0}/{:.0} s",
                started.elapsed().as_secs_f64(),
                duration.as_secs_f64()
            )
        });
        loop {
            if let Some(code) = ccm.wait_exit(Duration::from_secs(5)).await {
                break Some(code);
            }
            if Instant::now() > deadline {
                break None;
            }
            samples.push((Instant::now(), ccm.metrics().await));
        }
    };
    let elapsed = started.elapsed();
    report.secs("ready_s", "shadow start to ready", ready);
    let bound = duration + SETTLE;
    report.target(
        "one_shot_end_s",
        "shadow start to its exit (by itself)",
        elapsed.as_secs_f64(),
        format!("{:.1} s", elapsed.as_secs_f64()),
        &format!(
            "≤ duration + settle ({:.0} s) + start ({:.0} s)",
            bound.as_secs_f64(),
            ready.as_secs_f64()
        ),
        code.is_some() && elapsed <= bound + ready + Duration::from_secs(5),
        format!("{:.1} s", elapsed.as_secs_f64()),
        true,
    );
    let code_shown = code.map_or("still running: killed".to_owned(), |c| c.to_string());
    report.target(
        "exit_code",
        "exit code",
        code.map_or(-1.0, f64::from),
        code_shown.clone(),
        "3 (divergences: the would-deletes)",
        code == Some(3),
        code_shown,
        true,
    );
    let json: serde_json::Value = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let not_compared = json["notCompared"].as_array().map_or(usize::MAX, Vec::len);
    report.target(
        "not_compared",
        "objects not compared (report)",
        not_compared as f64,
        format!("{not_compared} (complete: {})", json["complete"]),
        "0",
        not_compared == 0 && json["complete"] == true,
        format!("{not_compared}"),
        true,
    );
    let would_delete = json["divergences"].as_array().map_or(0, |d| {
        d.iter().filter(|d| d["field"] == "(node deleted)").count()
    });
    report.target(
        "would_delete_divergences",
        "would-delete divergences (report)",
        would_delete as f64,
        format!("{would_delete}"),
        &format!("{k}"),
        would_delete == k,
        format!("{would_delete}"),
        true,
    );
    report.fig(
        "objects_compared",
        "objects compared (report)",
        json["objectsCompared"].clone(),
        format!("{}", json["objectsCompared"]),
    );
    // Lifecycle calls per monitor pass over the last minute sampled (would-deletes held).
    if let (Some((t1, last)), Some((t0, first))) = (
        samples.last(),
        samples.iter().find(|(t, _)| {
            samples
                .last()
                .is_some_and(|(end, _)| *end - *t <= HELD_WINDOW)
        }),
    ) {
        let window = (*t1 - *t0).max(MONITOR_PERIOD);
        let passes = window.as_secs_f64() / MONITOR_PERIOD.as_secs_f64();
        let per_pass = (lifecycle_calls(last) - lifecycle_calls(first)) / passes;
        report.target(
            "held_lifecycle_calls_per_pass",
            "lifecycle cloud calls per monitor pass, last minute (would-deletes held)",
            per_pass,
            format!("{per_pass:.2} ({:.0} s window)", window.as_secs_f64()),
            "0",
            per_pass == 0.0,
            format!("{per_pass:.2}"),
            true,
        );
        let calls: BTreeMap<String, f64> = last.cloud_calls();
        report.counts(
            "cloud_calls",
            "cloud calls of the run (last sample)",
            &calls,
            1,
        );
    }
    // Log lines per would-delete Node.
    let mut tail = LogTail::new(&ccm);
    let lines = tail.lines_containing("would delete");
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for name in &missing {
        let field = format!("node=\"{name}\"");
        per_node.insert(
            name,
            lines
                .iter()
                .filter(|l| l.contains(&field) && l.contains("would delete node (shadow)"))
                .count(),
        );
    }
    let max = per_node.values().copied().max().unwrap_or(0);
    let min = per_node.values().copied().min().unwrap_or(0);
    report.target(
        "would_delete_log_lines_per_node",
        "'would delete node (shadow)' log lines per would-delete Node (min..max)",
        max as f64,
        format!("{min}..{max}"),
        "1",
        max == 1 && min == 1,
        format!("{min}..{max}"),
        true,
    );
    let deleting = tail_count(&ccm, "deleting node");
    report.target(
        "deleting_node_lines",
        "'deleting node' log lines",
        deleting as f64,
        format!("{deleting}"),
        "0",
        deleting == 0,
        format!("{deleting}"),
        true,
    );
    if code.is_none() {
        ccm.stop().await;
    }
    report
}

/// Lines of `ccm`'s whole log containing `needle`.
fn tail_count(ccm: &Ccm, needle: &str) -> usize {
    LogTail::new(ccm).lines_containing(needle).len()
}

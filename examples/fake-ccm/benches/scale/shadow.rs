//! shadow: N initialised Nodes and M LoadBalancer Services reconciled by a normal fake-ccm
//! (the incumbent), then a shadow (`--shadow`) started against the same cloud (FakeCloud's
//! state file): its first pass (until it is quiet), then an idle window. Figures: divergences
//! (0 expected), API requests (no persisting write), cloud calls per minute, memory, CPU.
//! With `--would-deletes K`: the one-shot at scale instead (`shadow_one_shot.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::ccm::{Ccm, Metrics, diff};
use crate::cli::Opts;
use crate::environment::{Env, Progress, Shared, create_settled_cluster, observe};
use crate::report::{Report, api_figures, request_counts};

/// Waits until `ccm` made no cloud call and no API request for `quiet` (at most `timeout`);
/// returns when its cloud calls last changed, and whether it went quiet.
async fn settle(ccm: &Ccm, quiet: Duration, timeout: Duration) -> (Instant, bool) {
    let mut last = (Metrics::default().cloud_calls(), BTreeMap::new());
    let (mut since, mut converged) = (Instant::now(), Instant::now());
    let deadline = Instant::now() + timeout;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let metrics = ccm.metrics().await;
        let now = (metrics.cloud_calls(), metrics.api_writes());
        if now != last {
            if now.0 != last.0 {
                converged = Instant::now();
            }
            last = now;
            since = Instant::now();
        } else if since.elapsed() >= quiet {
            return (converged, true);
        }
        if Instant::now() > deadline {
            return (converged, false);
        }
    }
}

pub(crate) async fn shadow(env: &Env, opts: &Opts) -> Report {
    let mut report = Report::new(opts);
    let (n, m) = (opts.nodes, opts.services);
    let track: Shared = Arc::default();
    let _observer = observe(env, &track);
    env.create_namespace().await;
    {
        let _p = Progress::start("setup", move || format!("{n} nodes, {m} services"));
        create_settled_cluster(env, &track, n, m, opts.concurrency).await;
    }
    let state = std::env::temp_dir().join(format!("{}-fake-cloud-state.json", env.run));
    let state_config = format!("state_file: {}\n", state.display());
    // The incumbent: a normal fake-ccm creates every load balancer, then stops (the cloud
    // stays in the state file).
    {
        let _p = Progress::start("incumbent", || "the normal CCM reconciles".into());
        let incumbent = Ccm::start_with(env, opts, false, &state_config).await;
        settle(&incumbent, Duration::from_secs(10), opts.timeout).await;
        incumbent.stop().await;
    }
    if opts.would_deletes > 0 {
        let report = crate::shadow_one_shot::one_shot(env, opts, &state_config, report).await;
        let _ = std::fs::remove_file(&state);
        return report;
    }

    let mut shadow_opts = opts.clone();
    shadow_opts.ccm_args.extend([
        "--shadow".to_owned(),
        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics,/shadow/divergences"
            .to_owned(),
    ]);
    env.clear_requests();
    let started = Instant::now();
    let ccm = Ccm::start_with(env, &shadow_opts, false, &state_config).await;
    let (converged, quiet) = {
        let _p = Progress::start("first pass", || "the shadow compares every object".into());
        settle(&ccm, Duration::from_secs(15), opts.timeout).await
    };
    let first_pass = converged.duration_since(started);
    report.secs(
        "first_pass_s",
        "shadow start to its last cloud call of the first pass",
        first_pass,
    );
    if !quiet {
        report.notes.push(format!(
            "the shadow did not go quiet within {:?}; measured anyway",
            opts.timeout
        ));
    }
    let first = ccm.metrics().await;
    let calls = first.cloud_calls();
    report.counts(
        "first_pass_cloud_calls",
        "cloud calls of the first pass",
        &calls,
        1,
    );
    let total: f64 = calls.values().sum::<f64>() + 0.0;
    let per_min = total / first_pass.as_secs_f64().max(1.0) * 60.0;
    report.fig(
        "first_pass_cloud_calls_per_min",
        "cloud calls per minute in the first pass",
        json!(per_min.round()),
        format!("{per_min:.0}"),
    );
    if let Some(reqs) = env.ccm_requests() {
        report.counts(
            "first_pass_api_requests",
            "API requests of the first pass",
            &request_counts(&reqs),
            1,
        );
        let persisting = reqs
            .iter()
            .filter(|r| !matches!(r.verb.as_str(), "get" | "list" | "watch"))
            .filter(|r| !r.query.split('&').any(|p| p == "dryRun=All"))
            .count();
        report.target(
            "persisting_writes",
            "API writes without dryRun=All",
            persisting as f64,
            format!("{persisting}"),
            "0",
            persisting == 0,
            format!("{persisting} writes"),
            true,
        );
    }
    let body = ccm.get("/shadow/divergences").await.unwrap_or_default();
    let divergences = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["divergences"].as_array().map(Vec::len))
        .unwrap_or(usize::MAX);
    report.target(
        "divergences",
        "divergences reported",
        divergences as f64,
        format!("{divergences}"),
        "0 (same cloud as the incumbent)",
        divergences == 0,
        format!("{divergences}"),
        true,
    );

    // The idle window.
    env.clear_requests();
    let p0 = ccm.proc();
    let w0 = Instant::now();
    let window = Duration::from_secs_f64(opts.settle);
    {
        let _p = Progress::start("idle", move || {
            format!(
                "window {:.0}/{:.0} s",
                w0.elapsed().as_secs_f64(),
                window.as_secs_f64()
            )
        });
        tokio::time::sleep(window).await;
    }
    let elapsed = w0.elapsed();
    let (p1, after) = (ccm.proc(), ccm.metrics().await);
    let calls = diff(&after.cloud_calls(), &first.cloud_calls());
    let total: f64 = calls.values().sum::<f64>() + 0.0;
    let per_min = total / elapsed.as_secs_f64() * 60.0;
    report.fig(
        "window_cloud_calls_per_min",
        "cloud calls per minute, idle window",
        json!(per_min),
        format!("{per_min:.1}"),
    );
    api_figures(&mut report, env, &first, &after, 1, "window");
    let rss = p1.rss_kb as f64 / 1024.0;
    report.fig(
        "shadow_rss_mb",
        "shadow resident memory (VmRSS)",
        json!(rss),
        format!("{rss:.1} MB"),
    );
    let hwm = p1.hwm_kb as f64 / 1024.0;
    report.fig(
        "shadow_peak_rss_mb",
        "shadow peak resident memory (VmHWM)",
        json!(hwm),
        format!("{hwm:.1} MB"),
    );
    let cpu = p1.cpu_s - p0.cpu_s;
    report.fig(
        "window_cpu_pct",
        "shadow CPU in the window, % of one core",
        json!(cpu / elapsed.as_secs_f64() * 100.0),
        format!("{:.2} %", cpu / elapsed.as_secs_f64() * 100.0),
    );
    ccm.stop().await;
    let _ = std::fs::remove_file(&state);
    report
}

//! steady: N Nodes and M Services settled, then an idle window: memory, CPU, calls.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::ccm::{Ccm, Metrics, diff};
use crate::cli::Opts;
use crate::environment::{
    Env, Pace, Progress, Shared, create_nodes, create_settled_cluster, lock, observe, watch_events,
};
use crate::objects::NodeKind;
use crate::report::{Report, api_figures, event_figures};

pub(crate) async fn steady(env: &Env, opts: &Opts) -> Report {
    let mut report = Report::new(opts);
    let (n, m) = (opts.nodes, opts.services);
    let track: Shared = Arc::default();
    let _observer = observe(env, &track);
    let (_event_watch, last_event) = watch_events(env);
    env.create_namespace().await;
    let setup = Instant::now();
    {
        let t = track.clone();
        let _p = Progress::start("setup", move || {
            let g = lock(&t);
            format!(
                "nodes {}/{n}, services {}/{m}",
                g.node_created.len(),
                g.svc_created.len()
            )
        });
        create_settled_cluster(env, &track, n, m, opts.concurrency).await;
    }
    let ccm = Ccm::start(env, opts, false).await;
    // Converged: the last change of the CCM's cloud calls (the start-up re-ensure of every
    // load balancer), as seen by the settle loop below.
    let mut converged = Instant::now();
    let mut setup_unsettled = false;
    // Settled: no cloud call and no API write for 15 s.
    {
        let quiet = Duration::from_secs(15);
        let _p = Progress::start("settle", || "waiting for the CCM to go quiet".into());
        let mut last = (Metrics::default().cloud_calls(), BTreeMap::new());
        let mut since = Instant::now();
        let deadline = Instant::now() + opts.settle_timeout;
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
                break;
            }
            if Instant::now() > deadline {
                // Without the batch capability under a quota the address refresh of every
                // Node may take a whole refresh period: the CCM never goes quiet.
                eprintln!(
                    "[bench] the CCM did not go quiet within {:?} (--settle-timeout); \
                     measuring anyway",
                    opts.settle_timeout
                );
                setup_unsettled = true;
                break;
            }
        }
    }
    report.secs(
        "setup_s",
        "setup (objects created, CCM started and quiet)",
        setup.elapsed(),
    );
    let before = ccm.metrics().await;
    let p0 = ccm.proc();
    env.clear_requests();
    let w0 = Instant::now();
    let window = Duration::from_secs_f64(opts.settle);
    {
        let _p = Progress::start("steady", move || {
            format!(
                "idle window {:.0}/{:.0} s",
                w0.elapsed().as_secs_f64(),
                window.as_secs_f64()
            )
        });
        if opts.quota.is_some() {
            // Under a quota, one new tainted Node in the middle of the window: its
            // initialisation must not wait for the (stretched) address refresh.
            tokio::time::sleep(window / 2).await;
            let (joiner, kind) = (n..n + 1, |_| NodeKind::Tainted);
            create_nodes(env, &track, joiner, kind, Pace::ONE_AT_A_TIME).await;
        }
        tokio::time::sleep_until((w0 + window).into()).await;
    }
    let elapsed = w0.elapsed();
    let p1 = ccm.proc();
    let after = ccm.metrics().await;
    if opts.quota.is_some() {
        new_node_figures(&mut report, env, opts, &track, &ccm, &after).await;
    }
    // Issue 34's memory targets, each judged only at the size it is stated for.
    let rss = p1.rss_kb as f64 / 1024.0;
    let (limit_mb, size) = match (n, m) {
        (5_000, 1_000) => (40.0, "5,000 nodes, 1,000 Services"),
        (20_000, 2_000) => (80.0, "20,000 nodes, 2,000 Services"),
        _ => (300.0, "100,000 nodes, 10,000 Services"),
    };
    let at_100k = n >= 100_000 && m >= 10_000;
    report.target(
        "ccm_rss_mb",
        "CCM resident memory (VmRSS)",
        rss,
        format!("{rss:.1} MB"),
        &format!("<= {limit_mb:.0} MB at {size}"),
        rss <= limit_mb,
        format!("{:.1} MB over", rss - limit_mb),
        matches!((n, m), (5_000, 1_000) | (20_000, 2_000)) || at_100k,
    );
    let hwm = p1.hwm_kb as f64 / 1024.0;
    report.fig(
        "ccm_peak_rss_mb",
        "CCM peak resident memory (VmHWM)",
        json!(hwm),
        format!("{hwm:.1} MB"),
    );
    restart_figures(&mut report, &ccm, rss, at_100k);
    // Issue 19's idle targets are stated from 5,000 Nodes / 1,000 Services up to 100,000.
    let target_size = (5000..100_000).contains(&n) && m >= 1000;
    let cpu = p1.cpu_s - p0.cpu_s;
    let pct = cpu / elapsed.as_secs_f64() * 100.0;
    report.fig(
        "window_cpu_s",
        "CCM CPU seconds in the window",
        json!(cpu),
        format!("{cpu:.2} s"),
    );
    report.target(
        "idle_cpu_pct",
        "CCM CPU, % of one core",
        pct,
        format!("{pct:.2} %"),
        "< 2 %",
        pct < 2.0,
        format!("{pct:.2} %"),
        target_size,
    );
    let calls = diff(&after.cloud_calls(), &before.cloud_calls());
    report.counts("window_cloud_calls", "cloud calls in the window", &calls, 1);
    let unexpected: f64 = calls
        .iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "instance_metadata"
                    | "instance_exists"
                    | "instance_shutdown"
                    | "describe_instances"
            )
        })
        .map(|(_, v)| v)
        .sum::<f64>()
        + 0.0; // an empty f64 sum is -0.0
    report.target(
        "window_unexpected_cloud_calls",
        "cloud calls other than refresh/lifecycle",
        unexpected,
        format!("{}", unexpected as u64),
        "0",
        unexpected == 0.0,
        format!("{} calls", unexpected as u64),
        target_size,
    );
    calls_per_hour(&mut report, opts, &before, &after, elapsed);
    api_figures(&mut report, env, &before, &after, 1, "window");
    // Events since the CCM started (its start-up re-ensure of every LB records two per
    // Service), and those written in the idle window (none expected).
    event_figures(
        &mut report,
        &Metrics::default(),
        &after,
        converged,
        &last_event,
    );
    let idle_events = diff(
        &after.by("event_recorder_events_total", "result"),
        &before.by("event_recorder_events_total", "result"),
    )
    .get("written")
    .copied()
    .unwrap_or(0.0);
    report.fig(
        "window_events_written",
        "Events written in the idle window",
        json!(idle_events),
        format!("{}", idle_events as u64),
    );
    if setup_unsettled {
        report.notes.push(format!(
            "the CCM did not go quiet within {:?} (--settle-timeout; no 15 s without cloud \
             calls and API writes); the window was measured anyway",
            opts.settle_timeout
        ));
    }
    report.fig(
        "ccm_cpu_total_s",
        "CCM CPU time since start (incl. setup)",
        json!(p1.cpu_s),
        format!("{:.2} s", p1.cpu_s),
    );
    ccm.stop().await;
    report
}

/// The address refresh runs every `--node-status-update-frequency`, Go's default 5 minutes.
const REFRESH_PERIOD_S: f64 = 300.0;

/// The node controller's warning when a refresh pass does not fit the refresh period
/// (`ccm-controllers/src/controllers/cloud_node/refresh.rs`).
const STRETCH_WARNING: &str =
    "the periodic address refresh does not fit --node-status-update-frequency";

/// Under a quota: the mid-window probe Node's initialisation (issue target: still <= 2 s
/// without the batch), the refresh period the node controller achieved and whether it warned
/// that the period stretched.
async fn new_node_figures(
    report: &mut Report,
    env: &Env,
    opts: &Opts,
    track: &Shared,
    ccm: &Ccm,
    after: &Metrics,
) {
    let name = env.node_name(opts.nodes);
    let deadline = Instant::now() + opts.timeout;
    let (created, initialised) = loop {
        let (created, initialised) = {
            let g = lock(track);
            (
                g.node_created.get(&name).copied(),
                g.node_initialised.get(&name).copied(),
            )
        };
        if initialised.is_some() || Instant::now() > deadline {
            break (created, initialised);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let applies = !opts.batch;
    let label = "new Node created -> initialised (mid-window probe)";
    match (created, initialised) {
        (Some(c), Some(i)) => {
            let s = i.saturating_duration_since(c).as_secs_f64();
            report.target(
                "new_node_init_s",
                label,
                s,
                format!("{s:.3} s"),
                "<= 2 s (quota, no batch)",
                s <= 2.0,
                format!("{:.1} s over", s - 2.0),
                applies,
            );
        }
        _ => report.target(
            "new_node_init_s",
            label,
            f64::NAN,
            format!("NOT initialised within {:.0} s", opts.timeout.as_secs_f64()),
            "<= 2 s (quota, no batch)",
            false,
            "never initialised".into(),
            applies,
        ),
    }
    let period = after
        .by("node_controller_address_refresh_period_seconds", "")
        .values()
        .sum::<f64>();
    report.fig(
        "address_refresh_period_s",
        "address refresh period achieved (node_controller_address_refresh_period_seconds)",
        json!(period),
        format!("{period:.1} s (configured {REFRESH_PERIOD_S:.0} s)"),
    );
    // The issue expects the period to stretch at 100,000 Nodes under 20 calls/s; at any size
    // a stretched period must come with the warning.
    let warned = ccm.logged_at(STRETCH_WARNING);
    let stretched = period > REFRESH_PERIOD_S;
    report.target(
        "refresh_stretch_warned",
        "refresh period stretched -> warned in the CCM's log",
        if warned.is_some() { 1.0 } else { 0.0 },
        match (stretched, warned) {
            (_, Some(at)) => format!("stretched, warned at {at}"),
            (true, None) => "stretched, NOT warned".into(),
            (false, None) => "not stretched, no warning".into(),
        },
        "a stretched period is warned (quota, no batch)",
        !stretched || warned.is_some(),
        "stretched without the warning".into(),
        applies,
    );
    report.notes.push(
        "with --quota the idle window includes one Node's initialisation (a tainted Node \
         created in its middle): its cloud calls (its lookups, and the load-balancer host \
         updates its join causes) and API requests are in the window's figures"
            .into(),
    );
}

/// Cloud calls per hour, extrapolated from the window (issue 19's steady figure): per
/// operation, the ones the quota rejected, and the share of what one call per Node per refresh
/// period (the address refresh without the batch capability) costs an hour.
fn calls_per_hour(
    report: &mut Report,
    opts: &Opts,
    before: &Metrics,
    after: &Metrics,
    window: Duration,
) {
    let per_hour = 3600.0 / window.as_secs_f64();
    let calls: BTreeMap<String, f64> = diff(&after.cloud_calls(), &before.cloud_calls())
        .into_iter()
        .map(|(op, n)| (op, (n * per_hour).round()))
        .collect();
    report.counts(
        "cloud_calls_per_hour_by_operation",
        "cloud calls per hour (window extrapolated)",
        &calls,
        1,
    );
    let total: f64 = calls.values().sum::<f64>() + 0.0;
    let rejected = diff(&after.cloud_results(), &before.cloud_results())
        .get("retry")
        .copied()
        .unwrap_or(0.0)
        * per_hour;
    report.fig(
        "cloud_calls_rejected_per_hour",
        "of which answered Retry (quota), per hour",
        json!(rejected.round()),
        format!("{rejected:.0}"),
    );
    let one_per_node = opts.nodes as f64 * 3600.0 / REFRESH_PERIOD_S;
    let share = total / one_per_node;
    report.target(
        "cloud_calls_per_hour_share",
        "cloud calls per hour / one per Node per 5 min",
        share,
        format!("{:.2} % ({total:.0} of {one_per_node:.0})", share * 100.0),
        "<= 1 % (5,000 nodes, batch)",
        share <= 0.01,
        format!("{:.2} % over", (share - 0.01) * 100.0),
        opts.nodes >= 5000 && opts.batch,
    );
    if window.as_secs_f64() < REFRESH_PERIOD_S {
        report.notes.push(format!(
            "the window ({:.0} s) is shorter than the address refresh period ({REFRESH_PERIOD_S:.0} \
             s): calls per hour are extrapolated from whatever part of a refresh fell in it; \
             use --settle 300",
            window.as_secs_f64()
        ));
    }
}

/// The restart figures of issue 25: fake-ccm started on a cluster that already holds every
/// object, from its start to `/readyz` (every informer synced), and its peak memory until then
/// against the steady memory.
fn restart_figures(report: &mut Report, ccm: &Ccm, steady_rss_mb: f64, at_size: bool) {
    let ready = ccm.ready_after.as_secs_f64();
    report.target(
        "start_to_ready_s",
        "restart: process start -> every informer synced (its log)",
        ready,
        format!("{ready:.2} s"),
        "<= 15 s at 100,000 nodes, 10,000 Services",
        ready <= 15.0,
        format!("{:.1} s over", ready - 15.0),
        at_size,
    );
    let peak = ccm.ready_hwm_kb as f64 / 1024.0;
    let ratio = peak / steady_rss_mb;
    report.target(
        "ready_peak_rss_ratio",
        "restart: peak RSS until synced / steady RSS",
        ratio,
        format!("{peak:.1} MB = {ratio:.2} x"),
        "<= 1.25 x",
        ratio <= 1.25,
        format!("{ratio:.2} x"),
        at_size,
    );
}

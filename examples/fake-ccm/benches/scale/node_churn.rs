//! node-churn: lb-burst, then K Nodes join one every S seconds; load-balancer updates.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

use crate::ccm::{CallWatch, Ccm, HOST_COUNTS_MESSAGE, LogTail, Metrics, diff, host_counts_line};
use crate::cli::Opts;
use crate::environment::{Env, Pace, Progress, create_nodes, lock, secs, wait_until};
use crate::lb_burst::lb_burst;
use crate::objects::NodeKind;
use crate::report::{Report, Row, api_figures};

pub(crate) async fn node_churn(env: &Env, opts: &Opts) -> Report {
    let mut report = Report::new(opts);
    let (n, m, k) = (opts.nodes, opts.services, opts.add);
    let (ccm, track, _observer) = lb_burst(env, opts, &mut report).await;
    // node-churn's own targets are about the joins; lb-burst's are shown as information.
    for r in &mut report.rows {
        if !r.target.is_empty() {
            r.target = format!("(lb-burst) {}", r.target);
        }
    }
    let renamed: serde_json::Map<String, Value> = std::mem::take(&mut report.figures)
        .into_iter()
        .map(|(key, v)| (format!("lb_burst_{key}"), v))
        .collect();
    report.figures = renamed;
    report.targets.clear();
    report.rows.push(Row {
        figure: "--- joins".into(),
        value: String::new(),
        target: String::new(),
        verdict: String::new(),
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = ccm.metrics().await;
    env.clear_requests();
    let events_before = lb_events(env).await;
    let watch = CallWatch::start(
        &ccm,
        &[
            "update_load_balancer",
            "update_load_balancer_hosts",
            "ensure_load_balancer",
        ],
    );
    let t = track.clone();
    let progress = Progress::start("node-churn", move || {
        let g = lock(&t);
        format!(
            "joined {}/{k}, initialised {}/{k}",
            g.node_created.len().saturating_sub(n),
            g.node_initialised.len().saturating_sub(n)
        )
    });
    let t0 = Instant::now();
    for j in 0..k {
        let target = t0 + Duration::from_secs_f64(opts.interval * j as f64);
        tokio::time::sleep_until(target.into()).await;
        let (joiner, kind) = (n + j..n + j + 1, |_| NodeKind::Tainted);
        create_nodes(env, &track, joiner, kind, Pace::ONE_AT_A_TIME).await;
    }
    let last_join = Instant::now();
    // The same clock as the timestamps of fake-ccm's log lines (UTC wall clock).
    let last_join_wall = jiff::Timestamp::now();
    wait_until("every joined node initialised", opts.timeout, || {
        lock(&track).node_initialised.len() >= n + k
    })
    .await;
    // What the cloud holds: FakeCloud's "load balancers by host count" lines, until every
    // load balancer has every Node (nothing is deleted here) or --timeout after the last join.
    let hosts_complete = hosts_complete(&ccm, n + k, m, last_join, opts.timeout).await;
    // Quiet period: no load-balancer call for 10 s after the last one.
    let quiet = Duration::from_secs(10);
    wait_until("load-balancer calls to stop", opts.timeout, || {
        let last = watch.last_change().unwrap_or(t0);
        last.elapsed() >= quiet && t0.elapsed() >= quiet
    })
    .await;
    drop(progress);
    let last_lb = watch.last_change();
    drop(watch);
    // Repeats of `UpdatedLoadBalancer` wait for their Event's repeat window (30 s).
    ccm.events_settled().await;
    let after = ccm.metrics().await;
    let calls = diff(&after.cloud_calls(), &before.cloud_calls());
    report.secs("joins_s", "first join -> last join", last_join - t0);
    let init_last = lock(&track)
        .node_initialised
        .values()
        .max()
        .copied()
        .unwrap_or(last_join);
    report.secs(
        "last_join_initialised_s",
        "last join -> all joined initialised",
        init_last.saturating_duration_since(last_join),
    );
    report.counts(
        "cloud_calls_per_lb",
        "cloud calls per load balancer",
        &calls,
        m,
    );
    // Host updates per load balancer: `update_load_balancer` calls, or, with the batch, the
    // controller's count of load balancers updated (each batch call updates many).
    let updates = if opts.lb_batch {
        let synced = |m: &Metrics| {
            m.by("service_controller_loadbalancer_sync_total", "")
                .values()
                .sum::<f64>()
        };
        synced(&after) - synced(&before)
    } else {
        calls.get("update_load_balancer").copied().unwrap_or(0.0)
    };
    let per_lb = updates / m as f64;
    let target_size = n == 50 && m >= 200 && k >= 20;
    report.target(
        "update_per_lb",
        "update_load_balancer per load balancer (mean)",
        per_lb,
        format!("{per_lb:.3}"),
        "<= 2",
        per_lb <= 2.0,
        format!("{per_lb:.2} (+{:.2})", per_lb - 2.0),
        target_size,
    );
    if let (Some(before_ev), Some(after_ev)) = (events_before, lb_events(env).await) {
        let max = env_max_per_service(&before_ev, &after_ev, m);
        report.target(
            "update_per_lb_max",
            "UpdatedLoadBalancer events per Service (max)",
            max as f64,
            format!("{max}"),
            "<= 2",
            max <= 2,
            format!("{max}"),
            target_size,
        );
    }
    hosts_complete_figures(&mut report, &hosts_complete, last_join_wall, n, m, k, opts);
    // The CCM's load-balancer call counters (from /metrics, polled every 20 ms): when they
    // last changed, not what the cloud holds.
    let complete = last_lb
        .map(|t| t.saturating_duration_since(last_join))
        .unwrap_or(Duration::ZERO);
    let shown = match last_lb {
        None => "no call seen".to_owned(),
        Some(t) if t < last_join => "none after the last join".to_owned(),
        Some(_) => format!("{:.3} s", complete.as_secs_f64()),
    };
    report.target(
        "lb_complete_after_last_join_s",
        "last join -> CCM's LB call counters last changed (/metrics)",
        secs(complete),
        shown,
        "<= 5 s",
        complete <= Duration::from_secs(5),
        format!("{:.1} s over", complete.as_secs_f64() - 5.0),
        target_size,
    );
    sync_pass_figures(&mut report, &before, &after, &calls);
    if opts.quota.is_some() {
        quota_figures(&mut report, opts, &before, &after, complete);
    }
    api_figures(&mut report, env, &before, &after, k, "joined node");
    report.notes.push(
        "'every load balancer has every joined Node' is what the cloud holds: the first of \
         FakeCloud's 'load balancers by host count' debug lines in fake-ccm's log (one after \
         every call that changed some load balancer's hosts) with all M load balancers at \
         N + K hosts, by the line's timestamp against the harness's wall clock at the last \
         join; the 'counters last changed' rows are when the CCM's load-balancer call \
         counters (polled every 20 ms from /metrics, quiet for 10 s) last changed, which \
         says nothing about what the cloud holds"
            .into(),
    );
    report.proc(ccm.proc());
    ccm.stop().await;
    report
}

/// node-churn under FakeCloud's quota (issue 19): the joins' `update_load_balancer` calls (all
/// of them, those the quota rejected included) against the target stated for 200 load
/// balancers and 10 Nodes joining one every 2 s under 20 calls/s, the share of cloud calls
/// rejected, and whether every load balancer still had every Node within 10 s of the last
/// join (updates not starved by the Nodes' lookups).
fn quota_figures(
    report: &mut Report,
    opts: &Opts,
    before: &Metrics,
    after: &Metrics,
    complete: Duration,
) {
    let results = diff(&after.cloud_results(), &before.cloud_results());
    let total: f64 = results.values().sum::<f64>() + 0.0;
    let rejected = results.get("retry").copied().unwrap_or(0.0);
    // The calls that update hosts: one per load balancer, or one per batch of them.
    let mut update_calls = 0.0;
    let mut update_rejected = 0.0;
    for op in ["update_load_balancer", "update_load_balancer_hosts"] {
        let by_result =
            |m: &Metrics| m.by_where("cloud_provider_requests_total", "result", ("operation", op));
        let updates = diff(&by_result(after), &by_result(before));
        update_calls += updates.values().sum::<f64>();
        update_rejected += updates.get("retry").copied().unwrap_or(0.0);
    }
    let issue_19 =
        opts.quota == Some(20.0) && opts.services >= 200 && opts.add == 10 && opts.interval >= 2.0;
    report.target(
        "update_load_balancer_calls",
        "host-update calls: update_load_balancer + update_load_balancer_hosts (rejected included)",
        update_calls,
        format!("{update_calls:.0} ({update_rejected:.0} rejected)"),
        "<= 500 (200 LBs, 10 joins 2 s apart, 20 calls/s)",
        update_calls <= 500.0,
        format!("{:.0} over", update_calls - 500.0),
        issue_19,
    );
    report.target(
        "lb_complete_quota_s",
        "last join -> CCM's LB call counters last changed (quota)",
        secs(complete),
        format!("{:.3} s", complete.as_secs_f64()),
        "<= 10 s (200 LBs, 10 joins 2 s apart, 20 calls/s)",
        complete <= Duration::from_secs(10),
        format!("{:.1} s over", complete.as_secs_f64() - 10.0),
        issue_19,
    );
    report.fig(
        "cloud_calls_total",
        "cloud calls in the joins (all operations)",
        json!(total),
        format!("{total:.0}"),
    );
    let share = if total > 0.0 { rejected / total } else { 0.0 };
    report.target(
        "cloud_calls_rejected_share",
        "share of cloud calls rejected (quota)",
        share,
        format!("{:.1} % ({rejected:.0})", share * 100.0),
        "<= 5 %",
        share <= 0.05,
        format!("{:.1} % over", (share - 0.05) * 100.0),
        issue_19,
    );
}

/// When the cloud first held every joined Node in every load balancer, from FakeCloud's log.
enum HostsComplete {
    /// The time of the first line with every one of the M load balancers at N + K hosts.
    Reached(jiff::Timestamp),
    /// Not within the timeout: the last counts logged (host count -> load balancers), if any.
    NotReached {
        waited: Duration,
        last: Option<BTreeMap<usize, usize>>,
    },
}

/// Reads fake-ccm's log until a "load balancers by host count" line shows all `lbs` load
/// balancers with `hosts` hosts, or `timeout` after the last join.
async fn hosts_complete(
    ccm: &Ccm,
    hosts: usize,
    lbs: usize,
    last_join: Instant,
    timeout: Duration,
) -> HostsComplete {
    let mut tail = LogTail::new(ccm);
    let mut last = None;
    loop {
        for line in tail.lines_containing(HOST_COUNTS_MESSAGE) {
            let Some((at, counts)) = host_counts_line(&line) else {
                continue;
            };
            if counts.get(&hosts).copied().unwrap_or(0) >= lbs {
                return HostsComplete::Reached(at);
            }
            last = Some(counts);
        }
        if last_join.elapsed() > timeout {
            return HostsComplete::NotReached {
                waited: last_join.elapsed(),
                last,
            };
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The row "last join -> every load balancer has every joined Node" (target 2 s at 100,000
/// Nodes and 10,000 load balancers).
fn hosts_complete_figures(
    report: &mut Report,
    complete: &HostsComplete,
    last_join: jiff::Timestamp,
    n: usize,
    m: usize,
    k: usize,
    opts: &Opts,
) {
    let label = "last join -> every load balancer has every joined Node (cloud's log)";
    let target = "<= 2 s (100,000 Nodes, 10,000 LBs)";
    let applies = n >= 100_000 && m >= 10_000;
    match complete {
        HostsComplete::Reached(at) => {
            let s = at.duration_since(last_join).as_secs_f64();
            report.target(
                "lb_hosts_complete_after_last_join_s",
                label,
                s,
                format!("{s:.3} s"),
                target,
                s <= 2.0,
                format!("{:.1} s over", s - 2.0),
                applies,
            );
        }
        HostsComplete::NotReached { waited, last } => {
            let last = last.as_ref().map_or("no line logged".to_owned(), |c| {
                c.iter()
                    .map(|(hosts, lbs)| format!("{lbs} LBs with {hosts} hosts"))
                    .collect::<Vec<_>>()
                    .join(", ")
            });
            report.target(
                "lb_hosts_complete_after_last_join_s",
                label,
                f64::NAN,
                format!("NOT REACHED within {:.0} s", waited.as_secs_f64()),
                target,
                false,
                format!(
                    "not reached within --timeout {:.0} s",
                    opts.timeout.as_secs_f64()
                ),
                applies,
            );
            report.notes.push(format!(
                "the cloud never held all {m} load balancers with {} hosts (N + K) within \
                 --timeout {:.0} s of the last join; the last counts FakeCloud logged: {last}",
                n + k,
                opts.timeout.as_secs_f64()
            ));
        }
    }
}

/// The node-sync passes during the joins (the count of the histogram
/// `service_controller_nodesync_latency_seconds`) and the host-update calls per pass.
fn sync_pass_figures(
    report: &mut Report,
    before: &Metrics,
    after: &Metrics,
    calls: &BTreeMap<String, f64>,
) {
    let count = |m: &Metrics| {
        m.by("service_controller_nodesync_latency_seconds_count", "")
            .values()
            .sum::<f64>()
    };
    let passes = count(after) - count(before) + 0.0;
    report.fig(
        "nodesync_passes",
        "node-sync passes during the joins",
        json!(passes),
        format!("{passes:.0}"),
    );
    for op in ["update_load_balancer_hosts", "update_load_balancer"] {
        let n = calls.get(op).copied().unwrap_or(0.0);
        let per_pass = if passes > 0.0 { n / passes } else { 0.0 };
        report.fig(
            &format!("{op}_per_pass"),
            &format!("{op} calls per node-sync pass"),
            json!(per_pass),
            format!("{per_pass:.2} ({n:.0} calls)"),
        );
    }
}

/// UpdatedLoadBalancer event counts per Service of this run (None on error).
pub(crate) async fn lb_events(env: &Env) -> Option<BTreeMap<String, i32>> {
    let api: Api<Event> = Api::namespaced(env.client.clone(), &env.run);
    let list = api.list(&ListParams::default()).await.ok()?;
    let mut out = BTreeMap::new();
    for e in list {
        if e.reason.as_deref() == Some("UpdatedLoadBalancer") {
            let name = e.involved_object.name.clone().unwrap_or_default();
            *out.entry(name).or_insert(0) += e.count.unwrap_or(1).max(1);
        }
    }
    Some(out)
}

pub(crate) fn env_max_per_service(
    before: &BTreeMap<String, i32>,
    after: &BTreeMap<String, i32>,
    _m: usize,
) -> i32 {
    after
        .iter()
        .map(|(k, v)| v - before.get(k).copied().unwrap_or(0))
        .max()
        .unwrap_or(0)
}

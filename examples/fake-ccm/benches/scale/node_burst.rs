//! node-burst and floor: N tainted Nodes registered as kubelets do; time until each is
//! initialised (floor: the harness patches them itself, no CCM).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_core::well_known::{
    LABEL_INSTANCE_TYPE, LABEL_TOPOLOGY_REGION, LABEL_TOPOLOGY_ZONE, TAINT_UNINITIALIZED,
};
use ccm_testing::apiserver::RequestRecord;
use ccm_testing::fake_cloud::FakeCloud;
use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

use crate::ccm::{Ccm, Metrics, diff};
use crate::cli::Opts;
use crate::environment::{
    Env, OwnThread, Progress, Shared, create_nodes, lock, observe, register_control_plane_nodes,
    secs, wait_until, watch_events,
};
use crate::objects::NodeKind;
use crate::report::{Report, api_figures, event_figures, percentile};

/// node-burst and floor.
pub(crate) async fn node_burst(env: &Env, opts: &Opts, floor: bool) -> Report {
    let mut report = Report::new(opts);
    let n = opts.nodes;
    let without_ccm = if opts.without_ccm_baseline && !floor {
        creation_without_ccm(opts).await
    } else {
        None
    };
    let track: Shared = Arc::default();
    let _observer = observe(env, &track);
    let (_event_watch, last_event) = watch_events(env);
    let ccm = if floor {
        None
    } else {
        Some(Ccm::start(env, opts, false).await)
    };
    let floor_task = floor.then(|| spawn_floor(env));
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The control-plane Nodes first, initialised (by the CCM, or the floor) before the burst;
    // the observer counts them among the initialised, the burst's figures do not.
    let cp = opts.control_plane_nodes;
    register_control_plane_nodes(env, &track, opts).await;
    let before = match &ccm {
        Some(c) => c.metrics().await,
        None => Metrics::default(),
    };
    env.clear_requests();

    let t = track.clone();
    let progress = Progress::start(opts.scenario.name(), move || {
        let g = lock(&t);
        format!(
            "created {}/{n}, initialised {}/{n}",
            g.node_created.len(),
            g.node_initialised.len()
        )
    });
    let t0 = Instant::now();
    create_nodes(env, &track, 0..n, |_| NodeKind::Tainted, opts.node_pace()).await;
    let created_all = Instant::now();
    wait_until("every node initialised", opts.timeout, || {
        lock(&track).node_initialised.len() >= n + cp
    })
    .await;
    drop(progress);
    // Trailing writes (address patches, events) still waiting for a rate-limit token.
    match &ccm {
        // ... and the summary Event, once the burst is over.
        Some(c) => c.events_settled().await,
        None => tokio::time::sleep(Duration::from_secs(2)).await,
    }

    let (lat, last_created, last_init) = {
        let g = lock(&track);
        let lat: Vec<Duration> = g
            .node_created
            .iter()
            .map(|(k, c)| g.node_initialised[k].saturating_duration_since(*c))
            .collect();
        let last_created = g
            .node_created
            .values()
            .max()
            .copied()
            .unwrap_or(created_all);
        let last_init = g.node_initialised.values().max().copied().unwrap_or(t0);
        (lat, last_created, last_init)
    };
    // The p99 target was set for 1,000 Nodes; at 100,000 the target is the time from
    // the last creation to all initialised (below).
    let target_size = (1000..100_000).contains(&n);
    let at_100k = n >= 100_000;
    let mut sorted = lat.clone();
    sorted.sort();
    let p99 = percentile(&sorted, 0.99);
    report.latencies("init_latency", "creation -> initialised", lat);
    if opts.latency_ms == 0 && !floor {
        report.target(
            "init_latency_p99_target_s",
            "p99 creation -> initialised (target)",
            secs(p99),
            format!("{:.3} s", p99.as_secs_f64()),
            "p99 <= 2 s at 1,000 nodes, 0 ms",
            p99 <= Duration::from_secs(2),
            format!(
                "{:.1} s over ({:.1}x)",
                p99.as_secs_f64() - 2.0,
                p99.as_secs_f64() / 2.0
            ),
            target_size,
        );
    }
    report.secs(
        "total_s",
        "first creation -> all initialised",
        last_init - t0,
    );
    report.secs(
        "creation_s",
        "first creation -> last creation",
        last_created - t0,
    );
    let after_last = last_init.saturating_duration_since(last_created);
    // The "last creation -> all initialised" target row, with its limit and the size it is
    // stated for.
    let after_last_target = |report: &mut Report, limit_s: u64, target: &str, applies: bool| {
        report.target(
            "after_last_creation_s",
            "last creation -> all initialised",
            secs(after_last),
            format!("{:.3} s", after_last.as_secs_f64()),
            target,
            after_last <= Duration::from_secs(limit_s),
            format!("{:.1} s over", after_last.as_secs_f64() - limit_s as f64),
            applies,
        );
    };
    if opts.latency_ms == 100 {
        after_last_target(
            &mut report,
            15,
            "<= 15 s at 1,000 nodes, 100 ms",
            target_size,
        );
    } else if at_100k && opts.quota.is_none() {
        after_last_target(&mut report, 5, "<= 5 s at 100,000 nodes", true);
    } else {
        report.secs(
            "after_last_creation_s",
            "last creation -> all initialised",
            after_last,
        );
    }

    if floor {
        let reqs: Vec<RequestRecord> = env
            .server
            .as_ref()
            .map(|s| {
                s.requests()
                    .into_iter()
                    .filter(|r| r.verb == "patch" && r.subresource.is_none())
                    .collect()
            })
            .unwrap_or_default();
        report.fig(
            "floor_patches_per_node",
            "harness PATCHes per node",
            json!(reqs.len() as f64 / n as f64),
            format!("{:.3}", reqs.len() as f64 / n as f64),
        );
        drop(floor_task);
        report.notes.push(
            "floor: no CCM; the harness patches each node once (taint, labels, providerID) as \
             it sees it, from a thread of its own, 100 patches in flight"
                .into(),
        );
        return report;
    }

    let ccm = ccm.unwrap();
    let after = ccm.metrics().await;
    let api_total = api_figures(&mut report, env, &before, &after, n, "node").unwrap_or(0.0);
    if let Some(reqs) = env.ccm_requests() {
        let per_node = crate::report::writes(&reqs) as f64 / n as f64;
        report.target(
            "api_writes_per_node_target",
            "API writes per node, Events included (target)",
            per_node,
            format!("{per_node:.3}"),
            "<= 2.21 (Go's, issue 43)",
            per_node <= 2.21,
            format!("{:.2} over", per_node - 2.21),
            (1000..100_000).contains(&n) && opts.latency_ms == 0,
        );
    }
    report.target(
        "api_requests_per_node_total",
        "API requests per node (all)",
        api_total,
        format!("{api_total:.3}"),
        "<= 3 (two writes, at most one event)",
        api_total <= 3.0,
        format!("{:.2} over", api_total - 3.0),
        target_size && opts.latency_ms == 0,
    );
    // Converged: every node initialised.
    event_figures(&mut report, &before, &after, last_init, &last_event);
    let calls = diff(&after.cloud_calls(), &before.cloud_calls());
    report.counts("cloud_calls_per_node", "cloud calls per node", &calls, n);
    let total_calls: f64 = calls.values().sum::<f64>() / n as f64;
    report.target(
        "cloud_calls_per_node_total",
        "cloud calls per node (all)",
        total_calls,
        format!("{total_calls:.3}"),
        "exactly 1",
        (total_calls - 1.0).abs() < 1e-9,
        format!("{total_calls:.3} instead of 1"),
        target_size && opts.latency_ms == 0 && !opts.batch && opts.quota.is_none(),
    );
    if opts.quota.is_some() || opts.batch {
        cloud_quota_figures(&mut report, opts, &before, &after, after_last);
    }
    report.proc(ccm.proc());
    ccm.stop().await;
    if let Some(before) = without_ccm {
        // Bracketed: the same baseline again after the run, so that the machine's drift
        // between the runs (a shared VM's speed changes by tens of percent over minutes) does
        // not count for or against the CCM.
        let after = creation_without_ccm(opts).await.unwrap_or(before);
        creation_ratio(&mut report, opts, last_created - t0, before, after);
    }
    report
}

/// The creation with the CCM against the baselines without it, run before and after it.
fn creation_ratio(
    report: &mut Report,
    opts: &Opts,
    with_ccm: Duration,
    before: Duration,
    after: Duration,
) {
    report.secs(
        "creation_without_ccm_s",
        "first -> last creation, no CCM (before the run)",
        before,
    );
    report.secs(
        "creation_without_ccm_after_s",
        "first -> last creation, no CCM (after the run)",
        after,
    );
    let alone = (before + after) / 2;
    let ratio = with_ccm.as_secs_f64() / alone.as_secs_f64().max(1e-9);
    report.target(
        "creation_with_ccm_ratio",
        "creation with the CCM / without (mean of both)",
        ratio,
        format!("{ratio:.3}"),
        "<= 1.15 at 1,000 and 10,000 nodes (issue 43)",
        ratio <= 1.15,
        format!("{:.2} over", ratio - 1.15),
        (opts.nodes == 1000 || opts.nodes == 10_000) && opts.node_rate.is_none(),
    );
}

/// The harness's creation of the same Nodes with no CCM, in a fresh in-process API server
/// with the harness's watches running as in the run: first -> last creation. `None` on a real
/// cluster (the baseline needs a server of its own).
async fn creation_without_ccm(opts: &Opts) -> Option<Duration> {
    if std::env::var_os("CCM_TEST_KUBECONFIG").is_some() {
        eprintln!("[bench] no baseline without the CCM on a real cluster");
        return None;
    }
    let env = Env::start(opts.record_bodies).await;
    let track: Shared = Arc::default();
    let _observer = observe(&env, &track);
    let (_event_watch, _) = watch_events(&env);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let n = opts.nodes;
    let cp = opts.control_plane_nodes;
    let cp_track: Shared = Arc::default();
    create_nodes(
        &env,
        &cp_track,
        n..n + cp,
        |_| NodeKind::Tainted,
        opts.node_pace(),
    )
    .await;
    let t = track.clone();
    let progress = Progress::start("baseline without the CCM", move || {
        format!("created {}/{n}", lock(&t).node_created.len())
    });
    let t0 = Instant::now();
    create_nodes(&env, &track, 0..n, |_| NodeKind::Tainted, opts.node_pace()).await;
    drop(progress);
    let last = lock(&track).node_created.values().max().copied()?;
    let took = last - t0;
    eprintln!(
        "[bench] baseline: {n} nodes created without the CCM in {:.3} s",
        took.as_secs_f64()
    );
    Some(took)
}

/// node-burst under FakeCloud's quota and/or with its batch capability: the cloud calls made,
/// how many the quota rejected (`Retry`, the cloud's 429), and issue 19's targets at 5,000 Nodes
/// under 20 calls/s.
pub(crate) fn cloud_quota_figures(
    report: &mut Report,
    opts: &Opts,
    before: &Metrics,
    after: &Metrics,
    after_last: Duration,
) {
    let results = diff(
        &after.by("cloud_provider_requests_total", "result"),
        &before.by("cloud_provider_requests_total", "result"),
    );
    let total: f64 = results.values().sum();
    let rejected = results.get("retry").copied().unwrap_or(0.0);
    report.fig(
        "cloud_calls_total",
        "cloud calls (all operations)",
        json!(total),
        format!("{total:.0}"),
    );
    report.fig(
        "cloud_calls_rejected",
        "cloud calls answered Retry (quota)",
        json!(rejected),
        format!("{rejected:.0}"),
    );
    let share = if total > 0.0 { rejected / total } else { 0.0 };
    let quota_5000 = opts.quota == Some(20.0) && opts.nodes >= 5000;
    report.target(
        "cloud_calls_rejected_share",
        "share of cloud calls rejected",
        share,
        format!("{:.1} %", share * 100.0),
        "<= 5 % (5,000 nodes, 20 calls/s)",
        share <= 0.05,
        format!("{:.1} % over", (share - 0.05) * 100.0),
        quota_5000,
    );
    if opts.quota == Some(20.0) && opts.nodes >= 100_000 && opts.batch {
        report.target(
            "after_last_creation_batch_target_s",
            "last creation -> all initialised (target)",
            secs(after_last),
            format!("{:.3} s", after_last.as_secs_f64()),
            "<= 60 s (100,000 nodes, 20 calls/s, batch)",
            after_last <= Duration::from_secs(60),
            format!("{:.1} s over", after_last.as_secs_f64() - 60.0),
            true,
        );
    } else if quota_5000 && opts.batch {
        report.target(
            "after_last_creation_batch_target_s",
            "last creation -> all initialised (target)",
            secs(after_last),
            format!("{:.3} s", after_last.as_secs_f64()),
            "<= 15 s (5,000 nodes, 20 calls/s, batch)",
            after_last <= Duration::from_secs(15),
            format!("{:.1} s over", after_last.as_secs_f64() - 15.0),
            true,
        );
    }
}

/// The physical floor: one PATCH per node, done by the harness as it sees tainted nodes (on a
/// thread of its own, as the CCM has a process of its own).
pub(crate) fn spawn_floor(env: &Env) -> OwnThread {
    let cfg = watcher::Config::default().labels(&env.selector());
    let sem = Arc::new(tokio::sync::Semaphore::new(100));
    let cloud = FakeCloud::default();
    OwnThread::start("bench-floor", env, move |client| async move {
        let api: Api<Node> = Api::all(client);
        let mut seen = HashSet::new();
        let stream = watcher(api.clone(), cfg)
            .default_backoff()
            .applied_objects();
        futures::pin_mut!(stream);
        while let Ok(Some(n)) = stream.try_next().await {
            let name = n.metadata.name.clone().unwrap_or_default();
            let tainted = n
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| t.iter().any(|t| t.key == TAINT_UNINITIALIZED));
            if !tainted || !seen.insert(name.clone()) {
                continue;
            }
            let permit = sem.clone().acquire_owned().await.unwrap();
            let api = api.clone();
            let cloud = cloud.clone();
            tokio::spawn(async move {
                let v2 = ccm_core::CloudProvider::instances_v2(&cloud).unwrap();
                let m = v2
                    .instance_metadata(&ccm_core::NodeView::from_node(&n))
                    .await
                    .unwrap();
                let taints: Vec<_> = n
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.clone())
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|t| t.key != TAINT_UNINITIALIZED)
                    .collect();
                let patch = json!({
                    "metadata": {
                        "labels": {
                            LABEL_TOPOLOGY_ZONE: m.zone, LABEL_TOPOLOGY_REGION: m.region,
                            LABEL_INSTANCE_TYPE: m.instance_type,
                        }
                    },
                    "spec": { "providerID": m.provider_id, "taints": taints },
                });
                api.patch(&name, &PatchParams::default(), &Patch::Strategic(patch))
                    .await
                    .unwrap();
                drop(permit);
            });
        }
    })
}

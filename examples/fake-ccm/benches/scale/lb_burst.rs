//! lb-burst: N initialised Nodes, then M LoadBalancer Services at once; time until each has an
//! ingress.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ccm::{Ccm, diff};
use crate::cli::Opts;
use crate::environment::{
    Env, Observer, Progress, Shared, create_nodes, create_services, lock, observe, secs, wait_until,
};
use crate::objects::NodeKind;
use crate::report::{Report, api_figures, percentile};

/// lb-burst; returns the running CCM, the tracker and its observer for node-churn.
pub(crate) async fn lb_burst(
    env: &Env,
    opts: &Opts,
    report: &mut Report,
) -> (Ccm, Shared, Observer) {
    let (n, m) = (opts.nodes, opts.services);
    let track: Shared = Arc::default();
    let observer = observe(env, &track);
    env.create_namespace().await;
    let ccm = Ccm::start(env, opts, false).await;
    {
        let t = track.clone();
        let _p = Progress::start("setup", move || {
            format!("nodes initialised {}/{n}", lock(&t).node_initialised.len())
        });
        create_nodes(env, &track, 0..n, |_| NodeKind::Tainted, opts.node_pace()).await;
        wait_until("every node initialised", opts.timeout, || {
            lock(&track).node_initialised.len() >= n
        })
        .await;
        ccm.quiet().await;
    }
    let before = ccm.metrics().await;
    env.clear_requests();
    let t = track.clone();
    let progress = Progress::start("lb-burst", move || {
        let g = lock(&t);
        format!(
            "services created {}/{m}, with ingress {}/{m}",
            g.svc_created.len(),
            g.svc_ingress.len()
        )
    });
    let t0 = Instant::now();
    create_services(env, &track, 0..m, false, opts.concurrency).await;
    wait_until("every Service has an ingress", opts.timeout, || {
        lock(&track).svc_ingress.len() >= m
    })
    .await;
    drop(progress);
    ccm.quiet().await;
    let (lat, last_created, last_ingress) = {
        let g = lock(&track);
        let lat: Vec<Duration> = g
            .svc_created
            .iter()
            .map(|(k, c)| g.svc_ingress[k].saturating_duration_since(*c))
            .collect();
        (
            lat,
            g.svc_created.values().max().copied().unwrap_or(t0),
            g.svc_ingress.values().max().copied().unwrap_or(t0),
        )
    };
    let total = last_ingress - t0;
    let target_size = m >= 200 && opts.latency_ms >= 50;
    report.target(
        "all_ingress_s",
        "first creation -> every Service has an ingress",
        secs(total),
        format!("{:.3} s", total.as_secs_f64()),
        "<= 5 s at 200 Services, 50 ms",
        total <= Duration::from_secs(5),
        format!("{:.1} s over", total.as_secs_f64() - 5.0),
        target_size,
    );
    report.secs(
        "creation_s",
        "first creation -> last creation",
        last_created - t0,
    );
    let mut sorted = lat;
    sorted.sort();
    for (p, name) in [(0.5, "p50"), (0.99, "p99")] {
        report.secs(
            &format!("ingress_latency_{name}_s"),
            &format!("creation -> ingress {name}"),
            percentile(&sorted, p),
        );
    }
    let after = ccm.metrics().await;
    let calls = diff(&after.cloud_calls(), &before.cloud_calls());
    report.counts(
        "cloud_calls_per_service",
        "cloud calls per Service",
        &calls,
        m,
    );
    let ensure = calls.get("ensure_load_balancer").copied().unwrap_or(0.0) / m as f64;
    report.target(
        "ensure_per_service",
        "ensure_load_balancer per Service",
        ensure,
        format!("{ensure:.3}"),
        "exactly 1",
        (ensure - 1.0).abs() < 1e-9,
        format!("{ensure:.3} instead of 1"),
        target_size,
    );
    api_figures(report, env, &before, &after, m, "service");
    (ccm, track, observer)
}

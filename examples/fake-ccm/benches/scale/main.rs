//! Scale benchmark: the `fake-ccm` binary, run as its own process against an API server, driven
//! through one scenario; prints a table of figures (and, with `--json`, one JSON line).
//!
//! ```sh
//! cargo bench -p fake-ccm --bench scale -- node-burst --nodes 1000 --latency-ms 0
//! cargo bench -p fake-ccm --bench scale -- node-burst --nodes 5000 --latency-ms 50 --quota 20 --batch
//! cargo bench -p fake-ccm --bench scale -- node-burst --nodes 100000 --node-rate 400 --timeout 1800
//! cargo bench -p fake-ccm --bench scale -- lb-burst --nodes 50 --services 200 --latency-ms 50
//! cargo bench -p fake-ccm --bench scale -- node-churn --nodes 50 --services 200 --add 20 --interval 0.05
//! cargo bench -p fake-ccm --bench scale -- steady --nodes 5000 --services 1000 --settle 60
//! cargo bench -p fake-ccm --bench scale -- floor --nodes 1000
//! cargo bench -p fake-ccm --bench scale -- route-burst --nodes 1000
//! cargo bench -p fake-ccm --bench scale -- node-ipam --nodes 5000
//! cargo bench -p fake-ccm --bench scale -- shadow --nodes 5000 --services 100 --batch
//! cargo bench -p fake-ccm --bench scale -- shadow --nodes 10000 --services 500 --batch --would-deletes 1000
//! cargo bench -p fake-ccm --bench scale -- failover --nodes 5000 --services 1000
//! ```
//!
//! The API server is the in-process one from `ccm-testing` unless `$CCM_TEST_KUBECONFIG` names a
//! kubeconfig (then a real cluster: the CCM acts on every Node and LoadBalancer Service of that
//! cluster, so use a throw-away one). See `docs/performance.md` for what each figure means.
//!
//! Layout: `cli` (the command line), `environment` (API server, the harness's threads, watches and
//! object creation), `objects` (Nodes and Services as kubelets and users write them), `ccm` (the
//! fake-ccm process, its metrics, memory and CPU), `report` (the printed figures) and one module
//! per scenario.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr,
    missing_docs,
    unreachable_pub
)]

mod bring_up;
mod ccm;
mod cli;
mod environment;
mod failover;
mod lb_burst;
mod node_burst;
mod node_churn;
mod node_ipam;
mod objects;
mod report;
mod route_burst;
mod shadow;
mod shadow_one_shot;
mod steady;
/// The tests' process helpers: `free_port` for each replica's `--secure-port`.
#[path = "../../tests/support/mod.rs"]
mod support;

use clap::Parser;
use serde_json::{Value, json};

use crate::cli::{Cli, Opts, Scenario};
use crate::environment::Env;
use crate::report::Report;

fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_default();
    json!({
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu": cpu,
        "load_start": loadavg(),
    })
}

fn self_peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("VmHWM:")
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            })
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() {
    // `cargo bench` passes `--bench`; the rest are ours.
    let args: Vec<String> = std::env::args().filter(|a| a != "--bench").collect();
    let cli = Cli::parse_from(args);
    let opts = Opts::from_cli(&cli);
    objects::IMAGE_COUNT.store(opts.images, std::sync::atomic::Ordering::Relaxed);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let mut machine = machine();
        eprintln!(
            "[bench] {} {} on {} cores, load {}",
            opts.scenario.name(),
            opts.json(),
            machine["cores"],
            machine["load_start"]
        );
        let env = Env::start(opts.record_bodies).await;
        let report = match opts.scenario {
            Scenario::NodeBurst => node_burst::node_burst(&env, &opts, false).await,
            Scenario::Floor => node_burst::node_burst(&env, &opts, true).await,
            Scenario::LbBurst => {
                let mut r = Report::new(&opts);
                let (ccm, _, _observer) = lb_burst::lb_burst(&env, &opts, &mut r).await;
                r.proc(ccm.proc());
                ccm.stop().await;
                r
            }
            Scenario::NodeChurn => node_churn::node_churn(&env, &opts).await,
            Scenario::Steady => steady::steady(&env, &opts).await,
            Scenario::RouteBurst => route_burst::route_burst(&env, &opts).await,
            Scenario::NodeIpam => node_ipam::node_ipam(&env, &opts).await,
            Scenario::Shadow => shadow::shadow(&env, &opts).await,
            Scenario::Failover => failover::failover(&env, &opts).await,
            Scenario::BringUp => bring_up::bring_up(&env, &opts).await,
        };
        env.cleanup().await;
        machine["load_end"] = json!(loadavg());
        // The harness's own peak memory: the in-process API server holding every object,
        // plus the harness's watches (issue 25 asks for the server's own figures).
        machine["harness_peak_rss_mb"] = json!(self_peak_rss_mb());
        eprintln!(
            "[bench] harness (in-process API server) peak RSS {:.1} MB",
            self_peak_rss_mb()
        );
        eprintln!(
            "[bench] done in {:.1} s",
            env.started.elapsed().as_secs_f64()
        );
        report.print(cli.json, &machine);
    });
}

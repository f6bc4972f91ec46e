//! The command line: the scenario and its options, with each scenario's defaults.

use std::time::Duration;

use clap::{Parser, ValueEnum};
use serde_json::{Value, json};

use crate::environment::Pace;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Scenario {
    /// N tainted nodes registered as fast as possible; time until each is initialised.
    NodeBurst,
    /// N initialised nodes, then M LoadBalancer Services at once; time until each has an ingress.
    LbBurst,
    /// lb-burst, then K nodes join one every S seconds; load-balancer updates.
    NodeChurn,
    /// N nodes and M Services settled, then S seconds idle: memory, CPU, calls.
    Steady,
    /// node-burst without a CCM: the harness does the one PATCH per node itself.
    Floor,
    /// N nodes with pod CIDRs; time until each has its route and NetworkUnavailable=False.
    RouteBurst,
    /// N tainted nodes with the node-IPAM controller on; time until each has its pod CIDR.
    NodeIpam,
    /// N nodes and M Services reconciled by a normal fake-ccm, then a shadow (`--shadow`):
    /// its first pass and an idle window: divergences, API requests, cloud calls, memory.
    Shadow,
    /// N nodes and M Services settled under replica A (leader election on), replica B
    /// standing by, A killed: time until B leads and is ready, B's first minute as leader.
    Failover,
    /// N tainted nodes and M LoadBalancer Services created together (a cluster's bring-up):
    /// each Service's creation -> ingress, and whether all come before the last Node.
    BringUp,
}

impl Scenario {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Scenario::NodeBurst => "node-burst",
            Scenario::LbBurst => "lb-burst",
            Scenario::NodeChurn => "node-churn",
            Scenario::Steady => "steady",
            Scenario::Floor => "floor",
            Scenario::RouteBurst => "route-burst",
            Scenario::NodeIpam => "node-ipam",
            Scenario::Shadow => "shadow",
            Scenario::Failover => "failover",
            Scenario::BringUp => "bring-up",
        }
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "scale",
    about = "Scale benchmark of the fake-ccm binary (see docs/performance.md)"
)]
pub(crate) struct Cli {
    /// Scenario to run.
    #[arg(value_enum)]
    pub(crate) scenario: Scenario,
    /// Nodes (default: node-burst/floor/route-burst 1000, lb-burst/node-churn 50,
    /// steady/node-ipam/shadow 5000).
    #[arg(long)]
    pub(crate) nodes: Option<usize>,
    /// LoadBalancer Services (default: lb-burst/node-churn 200, steady 1000, shadow 100).
    #[arg(long)]
    pub(crate) services: Option<usize>,
    /// Latency of every FakeCloud call in ms (default: lb-burst 50, others 0).
    #[arg(long)]
    pub(crate) latency_ms: Option<u64>,
    /// node-churn: nodes that join after the Services are up (default 20).
    #[arg(long)]
    pub(crate) add: Option<usize>,
    /// node-churn: seconds between two joins (default 0.05).
    #[arg(long)]
    pub(crate) interval: Option<f64>,
    /// steady, shadow: idle window in seconds (default 60).
    #[arg(long)]
    pub(crate) settle: Option<f64>,
    /// FakeCloud's overall API quota in calls per second (burst: the same number); a call over
    /// it is answered `Retry` with the time until a token frees (a cloud's 429). Default: none.
    #[arg(long)]
    pub(crate) quota: Option<f64>,
    /// Switch FakeCloud's batch capability (`InstancesBatch`, `describe_instances`) on.
    #[arg(long)]
    pub(crate) batch: bool,
    /// Switch FakeCloud's batch load-balancer capability (`LoadBalancerHostsBatch`,
    /// `update_load_balancer_hosts`) on.
    #[arg(long)]
    pub(crate) lb_batch: bool,
    /// Most Nodes per `describe_instances` call and most Services per
    /// `update_load_balancer_hosts` call (FakeCloud's default: 100).
    #[arg(long)]
    pub(crate) max_batch_size: Option<usize>,
    /// node-ipam: `--cluster-cidr` the node-IPAM controller allocates from.
    #[arg(long, default_value = "10.0.0.0/8")]
    cluster_cidr: String,
    /// node-ipam: `--node-cidr-mask-size`, the size of each Node's pod CIDR.
    #[arg(long, default_value_t = 24)]
    node_cidr_mask_size: u8,
    /// Also print the figures as one JSON line on stdout.
    #[arg(long)]
    pub(crate) json: bool,
    /// Give up a phase after this many seconds.
    #[arg(long, default_value_t = 900.0)]
    pub(crate) timeout: f64,
    /// steady: give up waiting for the CCM to go quiet before the window after this many
    /// seconds and measure anyway (default: --timeout). Without the batch capability under a
    /// quota the CCM never goes quiet at large sizes.
    #[arg(long)]
    pub(crate) settle_timeout: Option<f64>,
    /// Objects the harness creates concurrently.
    #[arg(long, default_value_t = 64)]
    pub(crate) create_concurrency: usize,
    /// node-burst, node-ipam, route-burst, lb-burst: Nodes the harness creates per second (at
    /// most --create-concurrency at a time). Default: as fast as this machine runs the harness
    /// and the API server, which depends on its load.
    #[arg(long, value_parser = positive_rate)]
    pub(crate) node_rate: Option<f64>,
    /// Entries in each Node's `status.images` (kubelet reports up to 50; about 250 bytes of
    /// JSON each). Fewer let the in-process API server hold 100,000 Nodes in less memory.
    #[arg(long, default_value_t = 40)]
    pub(crate) images: usize,
    /// failover: the Lease's duration in seconds (renew deadline two thirds of it, retry
    /// period 2/15, as Go's 15 s / 10 s / 2 s). At 100,000 Nodes a 3 s renew deadline is too
    /// short for a leader busy with its start-up on two cores.
    #[arg(long, default_value_t = 4)]
    pub(crate) lease_duration: u64,
    /// Keep every request's body in the in-process API server's request log (node-ipam always
    /// does; off otherwise: at 100,000 Nodes the bodies alone took gigabytes of the harness).
    #[arg(long)]
    pub(crate) record_bodies: bool,
    /// node-burst: create the same Nodes in a fresh in-process API server with no CCM (the
    /// harness's watches running, as in the run) before and again after the run with the CCM:
    /// the creation times with and without it and their ratio to the mean of both baselines
    /// (issue 43: at most 1.15).
    #[arg(long)]
    pub(crate) without_ccm_baseline: bool,
    /// node-burst: Nodes registered (and, with a CCM, initialised) before the burst, as the
    /// control-plane Nodes of a cluster's bring-up are before its workers join (the CCM runs
    /// on one). Not counted in the burst's figures.
    #[arg(long, default_value_t = 1)]
    pub(crate) control_plane_nodes: usize,
    /// bring-up: register and initialise the Nodes first, then create the Services alone (the
    /// figure the bring-up's median creation -> ingress is compared with).
    #[arg(long)]
    pub(crate) without_node_burst: bool,
    /// shadow: this many Nodes NotReady with their instances gone from the cloud, and the
    /// shadow run as a one-shot (`--shadow-report`) instead of a long-running `--shadow`
    /// (default 0: long-running).
    #[arg(long, default_value_t = 0)]
    pub(crate) would_deletes: usize,
    /// shadow with --would-deletes: the one-shot's `--shadow-duration` in seconds.
    #[arg(long, default_value_t = 120.0)]
    pub(crate) shadow_duration: f64,
    /// Extra flag passed to fake-ccm (repeatable), e.g. `--ccm-arg=--kube-api-qps=500`.
    #[arg(long = "ccm-arg", allow_hyphen_values = true)]
    pub(crate) ccm_args: Vec<String>,
    /// Run fake-ccm under this program (split at spaces), for profiling, e.g.
    /// `--ccm-wrapper="heaptrack -o /tmp/ccm"`. The memory and CPU figures are then those of
    /// the wrapper's process, not of fake-ccm alone.
    #[arg(long)]
    pub(crate) ccm_wrapper: Option<String>,
}

/// The `RUST_LOG` directive that enables FakeCloud's "load balancers by host count" line
/// (`ccm-testing/src/fake_cloud/host_counts.rs`).
pub(crate) const HOST_COUNTS_DIRECTIVE: &str = "ccm_testing::fake_cloud::host_counts=debug";

#[derive(Clone, Debug)]
pub(crate) struct Opts {
    pub(crate) scenario: Scenario,
    pub(crate) nodes: usize,
    pub(crate) services: usize,
    pub(crate) latency_ms: u64,
    pub(crate) add: usize,
    pub(crate) interval: f64,
    pub(crate) settle: f64,
    pub(crate) timeout: Duration,
    pub(crate) settle_timeout: Duration,
    /// `RUST_LOG` directives fake-ccm runs with on top of `info` (or of the harness's own
    /// `RUST_LOG`): node-churn enables FakeCloud's load balancers by host count line.
    pub(crate) ccm_log_directives: Vec<&'static str>,
    pub(crate) concurrency: usize,
    pub(crate) node_rate: Option<f64>,
    pub(crate) ccm_args: Vec<String>,
    pub(crate) ccm_wrapper: Option<String>,
    pub(crate) quota: Option<f64>,
    pub(crate) batch: bool,
    pub(crate) lb_batch: bool,
    pub(crate) max_batch_size: Option<usize>,
    pub(crate) cluster_cidr: String,
    pub(crate) node_cidr_mask_size: u8,
    pub(crate) images: usize,
    pub(crate) record_bodies: bool,
    pub(crate) lease_duration: u64,
    pub(crate) without_ccm_baseline: bool,
    pub(crate) control_plane_nodes: usize,
    pub(crate) without_node_burst: bool,
    pub(crate) would_deletes: usize,
    pub(crate) shadow_duration: Duration,
}

impl Opts {
    pub(crate) fn from_cli(c: &Cli) -> Opts {
        let s = c.scenario;
        let nodes = c.nodes.unwrap_or(match s {
            Scenario::LbBurst | Scenario::NodeChurn => 50,
            Scenario::Steady | Scenario::NodeIpam | Scenario::Shadow | Scenario::Failover => 5000,
            Scenario::BringUp => 3000,
            _ => 1000,
        });
        let services = c.services.unwrap_or(match s {
            Scenario::LbBurst | Scenario::NodeChurn => 200,
            Scenario::Steady | Scenario::Failover => 1000,
            Scenario::Shadow => 100,
            Scenario::BringUp => 300,
            _ => 0,
        });
        Opts {
            scenario: s,
            nodes,
            services,
            latency_ms: c
                .latency_ms
                .unwrap_or(if s == Scenario::LbBurst { 50 } else { 0 }),
            add: c.add.unwrap_or(20),
            interval: c.interval.unwrap_or(0.05),
            settle: c.settle.unwrap_or(60.0),
            timeout: Duration::from_secs_f64(c.timeout),
            settle_timeout: Duration::from_secs_f64(c.settle_timeout.unwrap_or(c.timeout)),
            ccm_log_directives: match s {
                Scenario::NodeChurn => vec![HOST_COUNTS_DIRECTIVE],
                _ => Vec::new(),
            },
            concurrency: c.create_concurrency.max(1),
            node_rate: c.node_rate,
            ccm_args: c.ccm_args.clone(),
            ccm_wrapper: c.ccm_wrapper.clone(),
            quota: c.quota,
            batch: c.batch,
            lb_batch: c.lb_batch,
            max_batch_size: c.max_batch_size,
            cluster_cidr: c.cluster_cidr.clone(),
            node_cidr_mask_size: c.node_cidr_mask_size,
            images: c.images,
            record_bodies: c.record_bodies || s == Scenario::NodeIpam,
            lease_duration: c.lease_duration.max(2),
            without_ccm_baseline: c.without_ccm_baseline && s == Scenario::NodeBurst,
            without_node_burst: c.without_node_burst && s == Scenario::BringUp,
            control_plane_nodes: if matches!(s, Scenario::NodeBurst | Scenario::BringUp) {
                c.control_plane_nodes
            } else {
                0
            },
            would_deletes: c.would_deletes,
            shadow_duration: Duration::from_secs_f64(c.shadow_duration),
        }
    }

    /// How node-burst, node-ipam, route-burst and lb-burst create their Nodes.
    pub(crate) fn node_pace(&self) -> Pace {
        Pace {
            concurrency: self.concurrency,
            per_second: self.node_rate,
        }
    }

    pub(crate) fn json(&self) -> Value {
        let mut o = json!({ "nodes": self.nodes, "latency_ms": self.latency_ms });
        let m = o.as_object_mut().unwrap();
        match self.scenario {
            Scenario::LbBurst => {
                m.insert("services".into(), json!(self.services));
            }
            Scenario::NodeChurn => {
                m.insert("services".into(), json!(self.services));
                m.insert("add".into(), json!(self.add));
                m.insert("interval_s".into(), json!(self.interval));
            }
            Scenario::Steady | Scenario::Shadow => {
                m.insert("services".into(), json!(self.services));
                m.insert("settle_s".into(), json!(self.settle));
                if self.scenario == Scenario::Shadow && self.would_deletes > 0 {
                    m.insert("would_deletes".into(), json!(self.would_deletes));
                    m.insert(
                        "shadow_duration_s".into(),
                        json!(self.shadow_duration.as_secs_f64()),
                    );
                }
                if self.scenario == Scenario::Steady && self.settle_timeout != self.timeout {
                    m.insert(
                        "settle_timeout_s".into(),
                        json!(self.settle_timeout.as_secs_f64()),
                    );
                }
            }
            Scenario::Failover => {
                m.insert("services".into(), json!(self.services));
                m.insert("lease_duration_s".into(), json!(self.lease_duration));
            }
            Scenario::Floor => {
                m.remove("latency_ms");
            }
            Scenario::NodeIpam => {
                m.insert("cluster_cidr".into(), json!(self.cluster_cidr));
                m.insert(
                    "node_cidr_mask_size".into(),
                    json!(self.node_cidr_mask_size),
                );
            }
            _ => {}
        }
        if let Some(rate) = self.node_rate {
            m.insert("node_rate_per_s".into(), json!(rate));
        }
        if let Some(quota) = self.quota {
            m.insert("quota_per_s".into(), json!(quota));
        }
        if self.batch {
            m.insert("batch".into(), json!(true));
        }
        if self.lb_batch {
            m.insert("lb_batch".into(), json!(true));
        }
        if let Some(max) = self.max_batch_size {
            m.insert("max_batch_size".into(), json!(max));
        }
        if self.record_bodies && self.scenario != Scenario::NodeIpam {
            m.insert("record_bodies".into(), json!(true));
        }
        if self.without_ccm_baseline {
            m.insert("without_ccm_baseline".into(), json!(true));
        }
        if self.without_node_burst {
            m.insert("without_node_burst".into(), json!(true));
        }
        if self.control_plane_nodes > 0 {
            m.insert(
                "control_plane_nodes".into(),
                json!(self.control_plane_nodes),
            );
        }
        if self.images != 40 {
            m.insert("images".into(), json!(self.images));
        }
        if !self.ccm_args.is_empty() {
            m.insert("ccm_args".into(), json!(self.ccm_args));
        }
        if let Some(wrapper) = &self.ccm_wrapper {
            m.insert("ccm_wrapper".into(), json!(wrapper));
        }
        o
    }
}

/// `--node-rate`: a positive, finite number of Nodes per second.
fn positive_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        _ => Err(format!(
            "{text:?} is not a positive number of Nodes per second"
        )),
    }
}

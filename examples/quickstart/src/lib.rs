//! The quickstart's play: a cluster bring-up driven against a real CCM runtime.
//!
//! [`play`] starts the in-process API server (or uses a real cluster), runs the real
//! `ccm-controllers` runtime (all four controllers, leader election on) with `FakeCloud`, and
//! acts out what happens in a cluster: kubelets register tainted nodes, users create
//! `type: LoadBalancer` Services, a few nodes leave and their instances disappear, one Service is
//! deleted. It checks the final state and returns a [`Report`]; the `quickstart` binary prints it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ccm_core::well_known::{
    CONDITION_NETWORK_UNAVAILABLE, LABEL_TOPOLOGY_ZONE, TAINT_UNINITIALIZED,
};
use ccm_testing::apiserver::ApiServer;
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use ccm_testing::fake_cloud::FakeCloud;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use tokio_util::sync::CancellationToken;

/// What the play does.
#[derive(Clone, Debug)]
pub struct PlayOptions {
    /// Nodes that register.
    pub nodes: usize,
    /// LoadBalancer Services created.
    pub services: usize,
    /// Nodes that leave (their instances disappear) after the Services are up.
    pub leaving: usize,
    /// Latency of every fake cloud call.
    pub latency: Duration,
    /// Run against this cluster instead of the in-process API server.
    pub kubeconfig: Option<PathBuf>,
    /// How long each phase may take before the play gives up.
    pub phase_timeout: Duration,
}

impl Default for PlayOptions {
    fn default() -> Self {
        PlayOptions {
            nodes: 50,
            services: 10,
            leaving: 3,
            latency: Duration::from_millis(20),
            kubeconfig: None,
            phase_timeout: Duration::from_secs(120),
        }
    }
}

/// Reports the play's progress (a progress bar on a terminal, plain lines otherwise).
pub trait Progress: Send + Sync {
    /// A phase starts; `total` units of work are expected.
    fn start(&self, phase: &str, total: usize);
    /// `done` of the phase's units are done.
    fn update(&self, done: usize);
    /// The phase ended.
    fn finish(&self, message: &str);
}

/// A progress sink that shows nothing (for tests).
#[derive(Debug, Default)]
pub struct Silent;

impl Progress for Silent {
    fn start(&self, _: &str, _: usize) {}
    fn update(&self, _: usize) {}
    fn finish(&self, _: &str) {}
}

/// One phase of the play and how long it took.
#[derive(Clone, Debug)]
pub struct Phase {
    /// What happened.
    pub name: String,
    /// How long it took.
    pub elapsed: Duration,
}

/// The final state of the play.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Whether the CCM ran against the in-process API server.
    pub in_process: bool,
    /// Nodes initialised (taint removed, provider ID and zone set).
    pub nodes_initialised: usize,
    /// Labels of one initialised node, as a sample.
    pub sample_labels: BTreeMap<String, String>,
    /// Provider ID of the same node.
    pub sample_provider_id: String,
    /// Nodes the CCM deleted because their instances disappeared.
    pub nodes_deleted: usize,
    /// Routes in the fake cloud's route table at the end, per node.
    pub routes: BTreeMap<String, String>,
    /// Nodes whose `NetworkUnavailable` condition is `False` at the end.
    pub network_available: usize,
    /// Load balancers at the end: Service -> (ingress, host count).
    pub load_balancers: BTreeMap<String, (String, usize)>,
    /// Cloud calls per operation.
    pub cloud_calls: BTreeMap<String, usize>,
    /// The phases and their durations.
    pub phases: Vec<Phase>,
    /// The CCM's exit code after the graceful shutdown.
    pub ccm_exit_code: i32,
    /// Everything that differs from the expected final state (empty on success).
    pub problems: Vec<String>,
}

impl Report {
    /// Whether the final state is the expected one.
    pub fn is_success(&self) -> bool {
        self.problems.is_empty()
    }

    /// The summary table the binary prints.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\n== Summary ({})",
            if self.in_process {
                "in-process API server"
            } else {
                "real cluster"
            }
        );
        let _ = writeln!(
            out,
            "{:<34} {}",
            "nodes initialised", self.nodes_initialised
        );
        let _ = writeln!(
            out,
            "{:<34} {}",
            "  sample provider ID", self.sample_provider_id
        );
        for (k, v) in &self.sample_labels {
            let _ = writeln!(out, "  {:<32} {v}", k);
        }
        let _ = writeln!(
            out,
            "{:<34} {}",
            "nodes deleted (instance gone)", self.nodes_deleted
        );
        let _ = writeln!(out, "{:<34} {}", "routes", self.routes.len());
        let _ = writeln!(
            out,
            "{:<34} {}",
            "nodes with NetworkUnavailable=False", self.network_available
        );
        let _ = writeln!(
            out,
            "{:<34} {}",
            "load balancers",
            self.load_balancers.len()
        );
        for (svc, (ingress, hosts)) in &self.load_balancers {
            let _ = writeln!(out, "  {svc:<32} ingress {ingress}, {hosts} hosts");
        }
        let _ = writeln!(out, "cloud calls per operation");
        for (op, n) in &self.cloud_calls {
            let _ = writeln!(out, "  {op:<32} {n}");
        }
        let _ = writeln!(out, "elapsed");
        for p in &self.phases {
            let _ = writeln!(out, "  {:<32} {:>8.2?}", p.name, p.elapsed);
        }
        let _ = writeln!(out, "{:<34} {}", "CCM exit code", self.ccm_exit_code);
        if self.problems.is_empty() {
            let _ = writeln!(out, "\nRESULT: the final state is the expected one");
        } else {
            let _ = writeln!(out, "\nRESULT: {} problem(s)", self.problems.len());
            for p in &self.problems {
                let _ = writeln!(out, "  - {p}");
            }
        }
        out
    }
}

/// Why the play could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum PlayError {
    /// A Kubernetes API call failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The kubeconfig could not be used.
    #[error("--kubeconfig: {0}")]
    Kubeconfig(String),
    /// A phase did not complete in time.
    #[error("{phase} did not complete within {timeout:?}: {detail}")]
    Timeout {
        /// The phase.
        phase: String,
        /// The time limit.
        timeout: Duration,
        /// What was last seen.
        detail: String,
    },
}

/// The run-specific prefix of every object the play creates.
fn run_prefix() -> String {
    format!("qs-{:04x}", std::process::id() & 0xffff)
}

fn is_initialised(node: &Node) -> bool {
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TAINT_UNINITIALIZED));
    let has_id = node
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.as_ref())
        .is_some();
    let has_zone = node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(LABEL_TOPOLOGY_ZONE));
    !tainted && has_id && has_zone
}

fn network_available(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == CONDITION_NETWORK_UNAVAILABLE && c.status == "False")
        })
}

fn ingress(svc: &Service) -> Option<String> {
    let ing = svc
        .status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .first()?
        .clone();
    ing.ip.or(ing.hostname)
}

/// Polls `probe` (which returns how many units are done and a description of what it saw)
/// until `total` are done, reporting progress.
async fn wait_phase<F, Fut>(
    progress: &dyn Progress,
    phase: &str,
    total: usize,
    timeout: Duration,
    mut probe: F,
) -> Result<Duration, PlayError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(usize, String), PlayError>>,
{
    let started = Instant::now();
    progress.start(phase, total);
    loop {
        let (done, detail) = probe().await?;
        progress.update(done.min(total));
        if done >= total {
            let elapsed = started.elapsed();
            progress.finish(&format!("{phase}: {total}/{total} in {elapsed:.2?}"));
            return Ok(elapsed);
        }
        if started.elapsed() > timeout {
            progress.finish(&format!("{phase}: timed out"));
            return Err(PlayError::Timeout {
                phase: phase.to_owned(),
                timeout,
                detail,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs the play and returns the final state.
pub async fn play(options: &PlayOptions, progress: &dyn Progress) -> Result<Report, PlayError> {
    let prefix = run_prefix();
    let server;
    let (client, target_args) = match &options.kubeconfig {
        None => {
            server = Some(ApiServer::start().await);
            let s = server
                .as_ref()
                .ok_or_else(|| PlayError::Kubeconfig("no server".into()))?;
            (s.client(), vec![format!("--master={}", s.url())])
        }
        Some(path) => {
            server = None;
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| PlayError::Kubeconfig(e.to_string()))?;
            let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|e| PlayError::Kubeconfig(e.to_string()))?;
            let client = kube::Client::try_from(config).map_err(PlayError::Kube)?;
            (client, vec![format!("--kubeconfig={}", path.display())])
        }
    };
    let mut report = Report {
        in_process: server.is_some(),
        ..Default::default()
    };

    let cloud = FakeCloud::builder().latency(options.latency).build();
    let nodes: Api<Node> = Api::all(client.clone());
    let services: Api<Service> = Api::namespaced(client.clone(), "default");

    // The CCM: the real runtime, in this process, with leader election on.
    let shutdown = CancellationToken::new();
    let mut args = vec![
        "quickstart-ccm".to_owned(),
        "--cloud-provider=fake".to_owned(),
        "--leader-elect=true".to_owned(),
        format!("--leader-elect-resource-name={prefix}-ccm"),
        "--cluster-cidr=10.0.0.0/8".to_owned(),
        "--node-monitor-period=1s".to_owned(),
        "--node-deletion-grace-period=2s".to_owned(),
        "--v=0".to_owned(),
    ];
    args.extend(target_args);
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| PlayError::Kubeconfig(e.to_string()))?;
    let ccm = tokio::spawn(
        ccm_controllers::Builder::new()
            .args(args)
            .provider(cloud.provider())
            .listener(listener)
            .shutdown_signal(shutdown.clone().cancelled_owned())
            .run_async(),
    );

    let node_name = |i: usize| format!("{prefix}-node-{i:04}");
    let svc_name = |i: usize| format!("{prefix}-svc-{i:03}");
    let mine = |n: &Node| {
        n.metadata
            .name
            .as_deref()
            .is_some_and(|x| x.starts_with(&prefix))
    };

    // 1. Kubelets register tainted nodes.
    let started = Instant::now();
    progress.start("registering nodes", options.nodes);
    for i in 0..options.nodes {
        let cidr = format!("10.{}.{}.0/24", 100 + i / 256, i % 256);
        nodes
            .create(
                &PostParams::default(),
                &kubelet_node(&node_name(i)).pod_cidrs(&[&cidr]).build(),
            )
            .await?;
        progress.update(i + 1);
    }
    progress.finish(&format!("registered {} nodes", options.nodes));
    let elapsed = wait_phase(
        progress,
        "initialising nodes",
        options.nodes,
        options.phase_timeout,
        || async {
            let list = nodes.list(&ListParams::default()).await?;
            let done = list
                .items
                .iter()
                .filter(|n| mine(n) && is_initialised(n))
                .count();
            Ok((done, format!("{done} initialised")))
        },
    )
    .await?;
    let _ = elapsed;
    report.phases.push(Phase {
        name: "nodes registered → initialised".into(),
        elapsed: started.elapsed(),
    });

    let started = Instant::now();
    wait_phase(
        progress,
        "creating routes",
        options.nodes,
        options.phase_timeout,
        || async {
            let list = nodes.list(&ListParams::default()).await?;
            let done = list
                .items
                .iter()
                .filter(|n| mine(n) && network_available(n))
                .count();
            Ok((
                done,
                format!(
                    "{done} nodes with NetworkUnavailable=False, {} routes",
                    cloud.routes().len()
                ),
            ))
        },
    )
    .await?;
    report.phases.push(Phase {
        name: "routes created".into(),
        elapsed: started.elapsed(),
    });

    // 2. Users create LoadBalancer Services.
    let started = Instant::now();
    for i in 0..options.services {
        services
            .create(
                &PostParams::default(),
                &load_balancer_service("default", &svc_name(i)).build(),
            )
            .await?;
    }
    wait_phase(
        progress,
        "provisioning load balancers",
        options.services,
        options.phase_timeout,
        || async {
            let list = services.list(&ListParams::default()).await?;
            let done = list
                .items
                .iter()
                .filter(|s| {
                    s.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| n.starts_with(&prefix))
                        && ingress(s).is_some()
                })
                .count();
            Ok((done, format!("{done} with ingress")))
        },
    )
    .await?;
    report.phases.push(Phase {
        name: "load balancers provisioned".into(),
        elapsed: started.elapsed(),
    });

    // 3. A few nodes leave: their instances disappear and kubelet stops reporting Ready.
    let started = Instant::now();
    let leaving: Vec<String> = (0..options.leaving.min(options.nodes))
        .map(|i| node_name(options.nodes - 1 - i))
        .collect();
    let patterns: Vec<String> = leaving
        .iter()
        .map(|n| format!("^{}$", regex_escape(n)))
        .collect();
    cloud.set_missing_nodes(&patterns.iter().map(String::as_str).collect::<Vec<_>>());
    for name in &leaving {
        let patch = serde_json::json!({"status": {"conditions": [{
            "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
            "message": "Kubelet stopped posting node status."
        }]}});
        nodes
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await?;
    }
    let remaining = options.nodes - leaving.len();
    wait_phase(
        progress,
        "deleting departed nodes",
        leaving.len(),
        options.phase_timeout,
        || async {
            let list = nodes.list(&ListParams::default()).await?;
            let present = list
                .items
                .iter()
                .filter(|n| {
                    n.metadata
                        .name
                        .as_ref()
                        .is_some_and(|x| leaving.contains(x))
                })
                .count();
            Ok((
                leaving.len() - present,
                format!("{present} departed nodes still present"),
            ))
        },
    )
    .await?;
    wait_phase(
        progress,
        "updating load-balancer hosts",
        options.services,
        options.phase_timeout,
        || async {
            let lbs = cloud.load_balancers();
            let done = lbs
                .values()
                .filter(|lb| {
                    lb.hosts.iter().filter(|h| h.starts_with(&prefix)).count() == remaining
                })
                .count();
            Ok((
                done,
                format!("{done} load balancers with {remaining} hosts"),
            ))
        },
    )
    .await?;
    report.phases.push(Phase {
        name: "departed nodes cleaned up".into(),
        elapsed: started.elapsed(),
    });

    // 4. One Service is deleted: its load balancer goes, then the Service.
    let started = Instant::now();
    if options.services > 0 {
        let victim = svc_name(0);
        services.delete(&victim, &DeleteParams::default()).await?;
        wait_phase(
            progress,
            "deleting a load balancer",
            1,
            options.phase_timeout,
            || async {
                let gone = services.get_opt(&victim).await?.is_none();
                let lb_gone = !cloud
                    .load_balancers()
                    .contains_key(&format!("default/{victim}"));
                Ok((
                    usize::from(gone && lb_gone),
                    format!("service gone: {gone}, load balancer gone: {lb_gone}"),
                ))
            },
        )
        .await?;
    }
    report.phases.push(Phase {
        name: "service deleted".into(),
        elapsed: started.elapsed(),
    });

    // Final state.
    let final_nodes: Vec<Node> = nodes
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|n| mine(n))
        .collect();
    report.nodes_initialised = final_nodes.iter().filter(|n| is_initialised(n)).count();
    report.network_available = final_nodes.iter().filter(|n| network_available(n)).count();
    report.nodes_deleted = options.nodes - final_nodes.len();
    if let Some(sample) = final_nodes.first() {
        report.sample_provider_id = sample
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.clone())
            .unwrap_or_default();
        report.sample_labels = sample.metadata.labels.clone().unwrap_or_default();
    }
    for route in cloud.routes() {
        if route.target_node.starts_with(&prefix) {
            report
                .routes
                .insert(route.target_node.clone(), route.destination_cidr.clone());
        }
    }
    for svc in services.list(&ListParams::default()).await?.items {
        let Some(name) = svc.metadata.name.clone().filter(|n| n.starts_with(&prefix)) else {
            continue;
        };
        let hosts = cloud
            .load_balancers()
            .get(&format!("default/{name}"))
            .map(|lb| lb.hosts.len())
            .unwrap_or(0);
        report.load_balancers.insert(
            name,
            (ingress(&svc).unwrap_or_else(|| "<none>".into()), hosts),
        );
    }
    report.cloud_calls = cloud.call_counts();

    // Graceful shutdown of the CCM, then clean up what the play created.
    shutdown.cancel();
    report.ccm_exit_code = ccm.await.unwrap_or(-1);
    for n in &final_nodes {
        if let Some(name) = &n.metadata.name {
            let _ = nodes.delete(name, &DeleteParams::default()).await;
        }
    }
    for name in report.load_balancers.keys() {
        let _ = services.delete(name, &DeleteParams::default()).await;
    }

    // The expected final state.
    let expected_services = options.services.saturating_sub(1);
    let mut problems = Vec::new();
    if report.nodes_initialised != remaining {
        problems.push(format!(
            "{} nodes initialised, expected {remaining}",
            report.nodes_initialised
        ));
    }
    if report.nodes_deleted != leaving.len() {
        problems.push(format!(
            "{} nodes deleted, expected {}",
            report.nodes_deleted,
            leaving.len()
        ));
    }
    if report.routes.len() != remaining {
        problems.push(format!(
            "{} routes, expected {remaining}",
            report.routes.len()
        ));
    }
    if report.network_available != remaining {
        problems.push(format!(
            "{} nodes with NetworkUnavailable=False, expected {remaining}",
            report.network_available
        ));
    }
    if report.load_balancers.len() != expected_services {
        problems.push(format!(
            "{} Services left, expected {expected_services}",
            report.load_balancers.len()
        ));
    }
    let lbs_in_cloud = cloud
        .load_balancers()
        .keys()
        .filter(|k| k.contains(&prefix))
        .count();
    if lbs_in_cloud != expected_services {
        problems.push(format!(
            "{lbs_in_cloud} load balancers in the cloud, expected {expected_services}"
        ));
    }
    for (svc, (ingress, hosts)) in &report.load_balancers {
        if ingress == "<none>" || *hosts != remaining {
            problems.push(format!(
                "{svc}: ingress {ingress}, {hosts} hosts, expected an ingress and {remaining} hosts"
            ));
        }
    }
    if report.ccm_exit_code != 0 {
        problems.push(format!(
            "the CCM exited with {} after a graceful shutdown",
            report.ccm_exit_code
        ));
    }
    report.problems = problems;
    drop(server);
    Ok(report)
}

/// Escapes regex metacharacters (node names here are DNS labels, so only `.` and `-` occur).
fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                vec![c]
            } else {
                vec!['\\', c]
            }
        })
        .collect()
}

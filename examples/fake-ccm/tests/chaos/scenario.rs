//! The driver: the API server, the `fake-ccm` process and its cloud configuration, the
//! churn of Nodes and Services, the kills, and the final wait for convergence.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use ccm_testing::apiserver::{ApiFaultKind, ApiFaultRule, ApiFaults, ApiServer};
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::invariants::{Observed, Report};

pub(crate) const NS: &str = "default";
const OTHER_CLASS: &str = "example.com/other";
/// Latency of the calls the kills aim at: long enough that a kill often lands inside one.
const SLOW_CALL_MS: u64 = 300;
/// Cloud operations that get faults.
const FAULTY_OPERATIONS: &[&str] = &[
    "ensure_load_balancer",
    "update_load_balancer",
    "ensure_load_balancer_deleted",
    "get_load_balancer",
    "create_route",
    "delete_route",
    "list_routes",
    "instance_exists",
    "instance_shutdown",
    "instance_metadata",
];
const MUTATING: &[&str] = &[
    "ensure_load_balancer",
    "update_load_balancer",
    "ensure_load_balancer_deleted",
    "create_route",
    "delete_route",
];

/// What a run does.
pub(crate) struct Settings {
    pub(crate) seed: u64,
    pub(crate) kills: usize,
    /// Share of the cloud calls that fail: 60 % of it as errors, 20 % as `Retry` with a
    /// delay, 20 % as calls that time out after they took effect.
    pub(crate) cloud_fault_rate: f64,
    pub(crate) api_faults: bool,
}

/// The desired state of one Service, as the driver last wrote it.
#[derive(Clone, Debug)]
pub(crate) struct ServiceSpec {
    pub(crate) ports: Vec<i32>,
    /// `LoadBalancer` (with or without the other class) or `ClusterIP`.
    pub(crate) load_balancer: bool,
    pub(crate) class: bool,
}

pub(crate) struct Chaos {
    pub(crate) server: ApiServer,
    settings: Settings,
    rng: ChaCha8Rng,
    dir: PathBuf,
    pub(crate) state_file: PathBuf,
    missing_file: PathBuf,
    log_dir: PathBuf,
    ccm: Option<tokio::process::Child>,
    runs: usize,
    /// Every Node name ever created.
    pub(crate) nodes_created: BTreeSet<String>,
    /// Nodes whose instance the driver terminated.
    pub(crate) terminated: BTreeSet<String>,
    pub(crate) services: BTreeMap<String, ServiceSpec>,
    pub(crate) deleted_services: BTreeSet<String>,
    next_node: usize,
    next_service: usize,
    pub(crate) report: Report,
}

impl Chaos {
    pub(crate) async fn run(settings: Settings) -> Report {
        let dir = std::env::temp_dir().join(format!(
            "fake-ccm-chaos-{}-{}",
            std::process::id(),
            settings.seed
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        let mut chaos = Chaos {
            server: ApiServer::start().await,
            rng: ChaCha8Rng::seed_from_u64(settings.seed),
            state_file: dir.join("cloud.json"),
            missing_file: dir.join("terminated-instances"),
            log_dir: dir.join("logs"),
            dir,
            settings,
            ccm: None,
            runs: 0,
            nodes_created: BTreeSet::new(),
            terminated: BTreeSet::new(),
            services: BTreeMap::new(),
            deleted_services: BTreeSet::new(),
            next_node: 0,
            next_service: 0,
            report: Report::default(),
        };
        chaos.server.set_record_bodies(false);
        let started = Instant::now();
        for _ in 0..3 {
            chaos.add_node().await;
        }
        for _ in 0..3 {
            chaos.add_service().await;
        }
        if chaos.settings.api_faults {
            chaos
                .server
                .set_faults(Some(api_faults(chaos.settings.seed)));
        }
        chaos.start_ccm(true);
        while chaos.report.kills < chaos.settings.kills {
            let actions = chaos.rng.random_range(2..=4);
            for _ in 0..actions {
                chaos.act().await;
            }
            chaos.wait_for_a_kill_moment().await;
            chaos.kill();
            if chaos.report.kills < chaos.settings.kills {
                chaos.start_ccm(true);
            }
        }
        chaos.report.churn_seconds = started.elapsed().as_secs_f64();

        // Faults off: the API server's now, the cloud's with the next start.
        chaos.report.api_faults = chaos.server.fault_counts();
        chaos.server.set_faults(None);
        chaos.stop_ccm_gracefully().await;
        let quiet = Instant::now();
        chaos.start_ccm(false);
        chaos.converge(quiet).await;
        chaos.stop_ccm_gracefully().await;
        chaos.collect_logs();
        let report = std::mem::take(&mut chaos.report);
        println!("{report}");
        if report.violations.total() == 0 {
            let _ = std::fs::remove_dir_all(&chaos.dir);
        } else {
            println!("logs and state kept in {}", chaos.dir.display());
        }
        report
    }

    /// One random change of the cluster or the cloud.
    async fn act(&mut self) {
        let live = self.live_nodes().len();
        let lb_services = self.services.values().filter(|s| s.load_balancer).count();
        match self.rng.random_range(0..10) {
            0 | 1 if live < 8 => self.add_node().await,
            2 if live > 2 => self.remove_node().await,
            3 | 4 if lb_services < 6 => self.add_service().await,
            5 | 6 => self.change_service().await,
            7 if !self.services.is_empty() => self.delete_service().await,
            _ => self.change_service().await,
        }
    }

    pub(crate) fn live_nodes(&self) -> BTreeSet<String> {
        self.nodes_created
            .difference(&self.terminated)
            .cloned()
            .collect()
    }

    async fn add_node(&mut self) {
        let name = format!("chaos-n{}", self.next_node);
        self.next_node += 1;
        let node = kubelet_node(&name).build();
        let nodes: Api<Node> = Api::all(self.server.client());
        let pp = PostParams::default();
        retry(|| nodes.create(&pp, &node)).await;
        self.nodes_created.insert(name);
        self.report.nodes_joined += 1;
    }

    /// Terminates a Node's instance in the cloud and makes the Node NotReady, as a kubelet
    /// that stopped reporting would leave it.
    async fn remove_node(&mut self) {
        let live: Vec<String> = self.live_nodes().into_iter().collect();
        let name = live[self.rng.random_range(0..live.len())].clone();
        self.terminated.insert(name.clone());
        let list: String = self.terminated.iter().map(|n| format!("{n}\n")).collect();
        std::fs::write(&self.missing_file, list).unwrap();
        let nodes: Api<Node> = Api::all(self.server.client());
        let patch = Patch::Strategic(json!({"status": {"conditions": [
            {"type": "Ready", "status": "False", "reason": "KubeletStopped"}
        ]}}));
        let pp = PatchParams::default();
        retry(|| nodes.patch_status(&name, &pp, &patch)).await;
        self.report.nodes_left += 1;
    }

    fn random_ports(&mut self) -> Vec<i32> {
        let all = [80, 443, 8080, 9000];
        let n = self.rng.random_range(1..=2);
        let mut ports: Vec<i32> = (0..n)
            .map(|_| all[self.rng.random_range(0..all.len())])
            .collect();
        ports.sort_unstable();
        ports.dedup();
        ports
    }

    async fn add_service(&mut self) {
        let name = format!("svc-{}", self.next_service);
        self.next_service += 1;
        let ports = self.random_ports();
        let mut builder = load_balancer_service(NS, &name);
        for p in &ports {
            builder = builder.port(&format!("p{p}"), *p);
        }
        let service = builder.build();
        let services: Api<Service> = Api::namespaced(self.server.client(), NS);
        let pp = PostParams::default();
        retry(|| services.create(&pp, &service)).await;
        self.services.insert(
            name,
            ServiceSpec {
                ports,
                load_balancer: true,
                class: false,
            },
        );
        self.report.services_created += 1;
    }

    async fn change_service(&mut self) {
        if self.services.is_empty() {
            return self.add_service().await;
        }
        let names: Vec<String> = self.services.keys().cloned().collect();
        let name = names[self.rng.random_range(0..names.len())].clone();
        let mut spec = self.services[&name].clone();
        let patch = match (spec.load_balancer, self.rng.random_range(0..4)) {
            // A LoadBalancer Service of ours: new ports, or away from LoadBalancer.
            (true, 0 | 1) if !spec.class => {
                spec.ports = self.random_ports();
                json!({"spec": {"ports": ports_json(&spec.ports)}})
            }
            (true, _) => {
                spec.load_balancer = false;
                spec.class = false;
                json!({"spec": {"type": "ClusterIP", "loadBalancerClass": null,
                    "externalTrafficPolicy": null, "ports": ports_json(&spec.ports)}})
            }
            // Back to LoadBalancer, ours or another controller's class.
            (false, n) => {
                spec.load_balancer = true;
                spec.class = n == 0;
                let class = if spec.class {
                    json!(OTHER_CLASS)
                } else {
                    json!(null)
                };
                json!({"spec": {"type": "LoadBalancer", "loadBalancerClass": class}})
            }
        };
        let services: Api<Service> = Api::namespaced(self.server.client(), NS);
        let patch = Patch::Merge(patch);
        let pp = PatchParams::default();
        if retry(|| services.patch(&name, &pp, &patch)).await {
            self.services.insert(name, spec);
            self.report.services_changed += 1;
        }
    }

    async fn delete_service(&mut self) {
        let names: Vec<String> = self.services.keys().cloned().collect();
        let name = names[self.rng.random_range(0..names.len())].clone();
        let services: Api<Service> = Api::namespaced(self.server.client(), NS);
        let dp = DeleteParams::default();
        retry(|| services.delete(&name, &dp)).await;
        self.services.remove(&name);
        self.deleted_services.insert(name);
        self.report.services_deleted += 1;
    }

    /// The cloud configuration of the next start: slow mutating calls, the instances file,
    /// and faults seeded per start (every start gets its own sequence).
    fn write_cloud_config(&self, faults: bool) -> PathBuf {
        let mut faults_map = serde_json::Map::new();
        let rate = self.settings.cloud_fault_rate;
        if faults && rate > 0.0 {
            for (i, op) in FAULTY_OPERATIONS.iter().enumerate() {
                let seed = self.settings.seed * 1_000_003 + (self.runs * 31 + i) as u64;
                let mut list = vec![
                    json!({"fail_with_probability": {"p": rate * 0.6, "seed": seed}}),
                    json!({"retry_with_probability": {"p": rate * 0.2, "after_ms": 400, "seed": seed + 1}}),
                ];
                if MUTATING.contains(op) {
                    list.push(json!({"timeout_after_effect": {"p": rate * 0.2, "seed": seed + 2}}));
                }
                faults_map.insert((*op).to_owned(), json!(list));
            }
        }
        let slow: serde_json::Map<String, serde_json::Value> = MUTATING
            .iter()
            .map(|op| ((*op).to_owned(), json!(SLOW_CALL_MS)))
            .collect();
        let config = json!({
            "state_file": self.state_file,
            "missing_nodes_file": self.missing_file,
            "latency_ms": 5,
            "operation_latency_ms": slow,
            "faults": faults_map,
        });
        let path = self.dir.join(format!("cloud-config-{}.json", self.runs));
        std::fs::write(&path, config.to_string()).unwrap();
        path
    }

    fn log_path(&self, run: usize) -> PathBuf {
        self.log_dir.join(format!("run-{run}.log"))
    }

    fn start_ccm(&mut self, faults: bool) {
        assert!(self.ccm.is_none());
        self.runs += 1;
        let config = self.write_cloud_config(faults);
        let log = std::fs::File::create(self.log_path(self.runs)).unwrap();
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fake-ccm"))
            .arg(format!("--master={}", self.server.url()))
            .arg("--cloud-provider=fake")
            .arg(format!("--cloud-config={}", config.display()))
            .arg("--leader-elect=false")
            .arg("--secure-port=0")
            .arg("--controllers=*,nodeipam")
            .arg("--allocate-node-cidrs=true")
            .arg("--cluster-cidr=10.244.0.0/16")
            .arg("--configure-cloud-routes=true")
            .arg("--node-monitor-period=1s")
            .arg("--node-deletion-grace-period=2s")
            .arg("--route-reconciliation-period=2s")
            .arg("--concurrent-service-syncs=2")
            .env("RUST_LOG", "info,ccm_testing::fake_cloud=debug")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        self.ccm = Some(child);
    }

    /// Waits for the moment of the next kill: most of the time as soon as the log shows a
    /// cloud call in flight that changes the cloud (after a random few milliseconds more),
    /// else at a random time up to 3 s.
    async fn wait_for_a_kill_moment(&mut self) {
        let deadline = Instant::now() + Duration::from_millis(self.rng.random_range(150..=3000));
        let aim = self.rng.random_bool(0.85);
        let extra = Duration::from_millis(self.rng.random_range(0..=SLOW_CALL_MS / 2));
        while Instant::now() < deadline {
            if aim && !in_flight(&self.log_path(self.runs)).is_empty() {
                tokio::time::sleep(extra).await;
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILL, noting the memory before and which cloud calls were in flight.
    fn kill(&mut self) {
        let mut child = self.ccm.take().unwrap();
        if let Ok(Some(status)) = child.try_wait() {
            self.report.violations.exited_on_its_own += 1;
            self.report
                .notes
                .push(format!("run {} exited on its own: {status}", self.runs));
            return;
        }
        let pid = child.id().unwrap();
        self.report.max_rss_kib = self.report.max_rss_kib.max(rss_kib(pid));
        let status = std::process::Command::new("kill")
            .arg("-KILL")
            .arg(pid.to_string())
            .status()
            .unwrap();
        assert!(status.success());
        self.report.kills += 1;
        let in_flight = in_flight(&self.log_path(self.runs));
        if in_flight.is_empty() {
            *self
                .report
                .kills_during
                .entry("idle".to_owned())
                .or_default() += 1;
        }
        for op in in_flight {
            *self.report.kills_during.entry(op).or_default() += 1;
        }
        // Reaped by tokio's orphan queue once dropped.
        drop(child);
    }

    async fn stop_ccm_gracefully(&mut self) {
        let Some(mut child) = self.ccm.take() else {
            return;
        };
        if let Ok(Some(status)) = child.try_wait() {
            self.report.violations.exited_on_its_own += 1;
            self.report
                .notes
                .push(format!("run {} exited on its own: {status}", self.runs));
            return;
        }
        let pid = child.id().unwrap();
        self.report.max_rss_kib = self.report.max_rss_kib.max(rss_kib(pid));
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status();
        match tokio::time::timeout(Duration::from_secs(60), child.wait()).await {
            Ok(Ok(status)) if status.success() => {}
            other => {
                self.report.violations.bad_exit += 1;
                self.report
                    .notes
                    .push(format!("graceful stop of run {}: {other:?}", self.runs));
            }
        }
    }

    /// Polls the invariants until they hold (or three minutes pass).
    async fn converge(&mut self, quiet: Instant) {
        let deadline = quiet + Duration::from_secs(180);
        loop {
            let observed = Observed::take(self).await;
            let violations = observed.violations(self);
            let done = violations.total() == 0;
            if done || Instant::now() > deadline {
                self.report.convergence_seconds = quiet.elapsed().as_secs_f64();
                self.report.converged = done;
                self.report.violations.add(&violations);
                self.report
                    .notes
                    .extend(observed.describe(self, &violations));
                self.report.final_load_balancers = observed.load_balancers.len();
                self.report.final_nodes = observed.nodes.len();
                self.report.final_routes = observed.routes.len();
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Panics and the cloud faults injected, from every run's log.
    fn collect_logs(&mut self) {
        for run in 1..=self.runs {
            let Ok(text) = std::fs::read_to_string(self.log_path(run)) else {
                continue;
            };
            for line in text.lines() {
                if line.contains("panicked at") {
                    self.report.violations.panics += 1;
                    self.report.notes.push(format!("run {run}: {line}"));
                }
                if line.contains("fake cloud fault injected")
                    && let Some(kind) = field(line, "kind")
                {
                    *self.report.cloud_faults.entry(kind).or_default() += 1;
                }
            }
        }
    }
}

fn ports_json(ports: &[i32]) -> serde_json::Value {
    json!(
        ports
            .iter()
            .map(
                |p| json!({"name": format!("p{p}"), "port": p, "protocol": "TCP", "targetPort": p})
            )
            .collect::<Vec<_>>()
    )
}

/// The API server's faults during the churn.
fn api_faults(seed: u64) -> ApiFaults {
    ApiFaults::seeded(seed)
        .rule(ApiFaultRule::new(ApiFaultKind::InternalError, 0.03))
        .rule(ApiFaultRule::new(ApiFaultKind::TooManyRequests, 0.03))
        .rule(ApiFaultRule::new(ApiFaultKind::Conflict, 0.05))
        .rule(ApiFaultRule::new(ApiFaultKind::WatchGone, 0.1))
        .rule(ApiFaultRule::new(ApiFaultKind::WatchClose, 0.3))
        .rule(ApiFaultRule::new(ApiFaultKind::Hang, 0.01))
        .retry_after(Duration::from_secs(1))
        .hang_for(Duration::from_secs(2))
        .close_watches_within(Duration::from_secs(3))
}

/// Runs a write of the driver until the API server takes it (it sees the injected faults
/// too). Answers that no retry changes (404, 409 AlreadyExists, 422) end it: `false`.
async fn retry<T, F, Fut>(mut write: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    for _ in 0..50 {
        match write().await {
            Ok(_) => return true,
            Err(kube::Error::Api(s)) if s.code == 409 && s.reason == "AlreadyExists" => {
                return true;
            }
            Err(kube::Error::Api(s)) if [404, 422].contains(&s.code) => return false,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    panic!("the API server refused a write 50 times");
}

/// The resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// A `key=value` field of a text log line (quotes removed).
pub(crate) fn field(line: &str, key: &str) -> Option<String> {
    let start = line.find(&format!(" {key}="))? + key.len() + 2;
    let rest = &line[start..];
    let value = match rest.strip_prefix('"') {
        Some(quoted) => quoted.split('"').next()?,
        None => rest.split_whitespace().next()?,
    };
    Some(value.to_owned())
}

/// The cloud operations a log shows started and not ended.
fn in_flight(log: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut open: BTreeMap<String, i64> = BTreeMap::new();
    for line in text.lines() {
        let delta = if line.contains("fake cloud call started") {
            1
        } else if line.contains("fake cloud call ended") {
            -1
        } else {
            continue;
        };
        if let Some(op) = field(line, "operation") {
            *open.entry(op).or_default() += delta;
        }
    }
    open.into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(op, _)| op)
        .collect()
}

//! Where a scenario runs: the API server (in-process or `$CCM_TEST_KUBECONFIG`), the run's
//! names, progress lines, the harness's own threads, its watches on the run's objects and the
//! creation of Nodes and Services as kubelets and users write them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccm_core::well_known::FINALIZER_LOAD_BALANCER_CLEANUP;
use ccm_testing::apiserver::{ApiServer, RequestRecord};
use ccm_testing::builders::load_balancer_service;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

use crate::objects::{
    NodeKind, has_ingress, has_pod_cidr, is_initialised, metadata, network_ready, node,
};

/// Where the scenario runs.
pub(crate) struct Env {
    pub(crate) client: kube::Client,
    /// How to reach the API server: the observer builds a client of its own from it.
    pub(crate) config: kube::Config,
    pub(crate) server: Option<ApiServer>,
    pub(crate) kubeconfig: Option<PathBuf>,
    /// Unique per run: label value, name prefix, namespace.
    pub(crate) run: String,
    pub(crate) started: Instant,
}

pub(crate) const RUN_LABEL: &str = "bench.ccm-rs.io/run";
pub(crate) const CCM_AGENT: &str = "cloud-controller-manager/";
pub(crate) const LB_IP: &str = "203.0.113.10";

impl Env {
    /// `record_bodies`: whether the in-process server keeps request bodies in its log.
    pub(crate) async fn start(record_bodies: bool) -> Env {
        let run = format!(
            "bench-{}-{}",
            std::process::id(),
            jiff::Timestamp::now().as_second() % 100_000
        );
        match std::env::var_os("CCM_TEST_KUBECONFIG") {
            Some(path) => {
                let path = PathBuf::from(path);
                let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
                let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                    .await
                    .unwrap();
                eprintln!("[bench] real cluster from {}", path.display());
                Env {
                    client: kube::Client::try_from(config.clone()).unwrap(),
                    config,
                    server: None,
                    kubeconfig: Some(path),
                    run,
                    started: Instant::now(),
                }
            }
            None => {
                let server = ApiServer::start().await;
                server.set_record_bodies(record_bodies);
                Env {
                    client: server.client(),
                    config: kube::Config::new(server.url().parse().unwrap()),
                    server: Some(server),
                    kubeconfig: None,
                    run,
                    started: Instant::now(),
                }
            }
        }
    }

    pub(crate) fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    pub(crate) fn services(&self) -> Api<Service> {
        Api::namespaced(self.client.clone(), &self.run)
    }

    pub(crate) fn node_name(&self, i: usize) -> String {
        format!("{}-n{i:05}", self.run)
    }

    pub(crate) fn service_name(&self, i: usize) -> String {
        format!("lb-{i:05}")
    }

    pub(crate) fn selector(&self) -> String {
        format!("{RUN_LABEL}={}", self.run)
    }

    pub(crate) async fn create_namespace(&self) {
        let ns: Api<Namespace> = Api::all(self.client.clone());
        let obj: Namespace = serde_json::from_value(json!({
            "metadata": { "name": self.run, "labels": { RUN_LABEL: self.run } }
        }))
        .unwrap();
        ns.create(&PostParams::default(), &obj).await.unwrap();
    }

    /// The CCM's requests recorded by the in-process server (None on a real cluster).
    pub(crate) fn ccm_requests(&self) -> Option<Vec<RequestRecord>> {
        self.server.as_ref().map(|s| {
            s.requests()
                .into_iter()
                .filter(|r| {
                    r.user_agent
                        .as_deref()
                        .is_some_and(|a| a.starts_with(CCM_AGENT))
                })
                .collect()
        })
    }

    pub(crate) fn clear_requests(&self) {
        if let Some(s) = &self.server {
            s.clear_requests();
        }
    }

    /// Deletes what this run created (only matters on a real cluster).
    pub(crate) async fn cleanup(&self) {
        if self.server.is_some() {
            return;
        }
        eprintln!("[bench] cleaning up nodes and namespace {}", self.run);
        let lp = ListParams::default().labels(&self.selector());
        let _ = self
            .nodes()
            .delete_collection(&DeleteParams::default(), &lp)
            .await;
        let svcs = self.services();
        if let Ok(list) = svcs.list(&lp).await {
            for s in list {
                let name = s.metadata.name.unwrap_or_default();
                let _ = svcs
                    .patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                    )
                    .await;
            }
        }
        let ns: Api<Namespace> = Api::all(self.client.clone());
        let _ = ns.delete(&self.run, &DeleteParams::default()).await;
    }
}

pub(crate) fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

/// Prints one status line to stderr every second until dropped.
pub(crate) struct Progress(pub(crate) tokio::task::JoinHandle<()>);

impl Progress {
    pub(crate) fn start(label: &str, line: impl Fn() -> String + Send + 'static) -> Progress {
        let label = label.to_string();
        let started = Instant::now();
        Progress(tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                eprintln!(
                    "[{label}] {:>6.1}s  {}",
                    started.elapsed().as_secs_f64(),
                    line()
                );
            }
        }))
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(crate) async fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        if Instant::now() > deadline {
            panic!("[bench] gave up waiting for {what} after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[derive(Default)]
pub(crate) struct Track {
    pub(crate) node_created: HashMap<String, Instant>,
    pub(crate) node_initialised: HashMap<String, Instant>,
    pub(crate) node_network: HashMap<String, Instant>,
    pub(crate) node_pod_cidr: HashMap<String, Instant>,
    pub(crate) svc_created: HashMap<String, Instant>,
    pub(crate) svc_ingress: HashMap<String, Instant>,
}

pub(crate) type Shared = Arc<Mutex<Track>>;

pub(crate) fn lock(t: &Shared) -> std::sync::MutexGuard<'_, Track> {
    t.lock().unwrap()
}

/// A task on a thread and runtime of its own, with a client (and so connections) of its own;
/// stopped and joined on drop.
///
/// The harness's observers and the floor's patcher run this way. On the harness's runtime they
/// shared two worker threads with the in-process API server and the 64 creating tasks, and fell
/// up to 2 s behind the cluster in node-burst: the CCM's own taint-removal counter showed 385 of
/// 435 created Nodes untainted while the harness's watch had seen 5. A figure is the cluster's,
/// not the harness's queueing.
pub(crate) struct OwnThread {
    pub(crate) stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub(crate) thread: Option<std::thread::JoinHandle<()>>,
}

impl OwnThread {
    pub(crate) fn start<F, Fut>(name: &str, env: &Env, task: F) -> OwnThread
    where
        F: FnOnce(kube::Client) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()>,
    {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let config = env.config.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let client = kube::Client::try_from(config).unwrap();
                    tokio::select! {
                        _ = task(client) => {}
                        _ = stopped => {}
                    }
                });
            })
            .unwrap();
        OwnThread {
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for OwnThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Watches this run's Nodes and Services and records when each first reaches its states.
pub(crate) type Observer = OwnThread;

pub(crate) fn observe(env: &Env, track: &Shared) -> Observer {
    let run = env.run.clone();
    let cfg = watcher::Config::default().labels(&env.selector());
    let track = track.clone();
    OwnThread::start("bench-observer", env, move |client| async move {
        let nodes = watch_nodes(Api::all(client.clone()), cfg.clone(), track.clone());
        let services = watch_services(Api::namespaced(client, &run), cfg, track);
        futures::future::join(nodes, services).await;
    })
}

pub(crate) async fn watch_nodes(api: Api<Node>, cfg: watcher::Config, t: Shared) {
    let stream = watcher(api, cfg).default_backoff().applied_objects();
    futures::pin_mut!(stream);
    while let Ok(Some(n)) = stream.try_next().await {
        let now = Instant::now();
        let name = n.metadata.name.clone().unwrap_or_default();
        let mut g = lock(&t);
        if is_initialised(&n) {
            g.node_initialised.entry(name.clone()).or_insert(now);
        }
        if has_pod_cidr(&n) {
            g.node_pod_cidr.entry(name.clone()).or_insert(now);
        }
        if network_ready(&n) {
            g.node_network.entry(name).or_insert(now);
        }
    }
}

pub(crate) async fn watch_services(api: Api<Service>, cfg: watcher::Config, t: Shared) {
    let stream = watcher(api, cfg).default_backoff().applied_objects();
    futures::pin_mut!(stream);
    while let Ok(Some(s)) = stream.try_next().await {
        let now = Instant::now();
        if has_ingress(&s) {
            let name = s.metadata.name.clone().unwrap_or_default();
            lock(&t).svc_ingress.entry(name).or_insert(now);
        }
    }
}

/// How fast the harness creates Nodes: at most `concurrency` creations in flight and, with
/// `per_second`, creation `i` of a range started no sooner than `i / per_second` after the
/// first. A set rate is a pace chosen by the bench, not by how fast this machine runs the
/// harness and the API server (which varied from 330 to 650 Nodes/s with the machine's load),
/// so that runs on different days compare.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pace {
    pub(crate) concurrency: usize,
    pub(crate) per_second: Option<f64>,
}

impl Pace {
    /// One creation at a time, as a single kubelet joins.
    pub(crate) const ONE_AT_A_TIME: Pace = Pace {
        concurrency: 1,
        per_second: None,
    };

    /// `concurrency` in flight, as fast as the API server answers.
    pub(crate) fn unpaced(concurrency: usize) -> Pace {
        Pace {
            concurrency,
            per_second: None,
        }
    }
}

/// Creates nodes `range` at `pace` as kubelet registers them, recording each one's creation
/// time (when the API server answered the create).
///
/// Kubelet registers in two steps, concurrently with the CCM: it creates the Node (with the
/// status it has computed, addresses included), then right after sends its first status
/// update, a strategic-merge PATCH of `nodes/status` with what changed in its view (the
/// `Ready` heartbeat, capacity, allocatable; not the addresses, which it leaves alone once
/// set). That write bumps the Node's resourceVersion while the CCM initialises it, as on a real
/// cluster.
pub(crate) async fn create_nodes(
    env: &Env,
    track: &Shared,
    range: std::ops::Range<usize>,
    kind: impl Fn(usize) -> NodeKind,
    pace: Pace,
) {
    let mut metas = HashMap::new();
    for i in range.clone() {
        if kind(i) != NodeKind::Tainted {
            metas.insert(i, metadata(env, i).await);
        }
    }
    let api = env.nodes();
    // Built one by one as they are created: 100,000 Nodes built up front would hold
    // gigabytes in the harness.
    let (kind, metas) = (&kind, &metas);
    let first = range.start;
    let started = tokio::time::Instant::now();
    futures::stream::iter(range)
        .then(|i| async move {
            if let Some(rate) = pace.per_second {
                let due = Duration::from_secs_f64((i - first) as f64 / rate);
                tokio::time::sleep_until(started + due).await;
            }
            i
        })
        .map(|i| {
            let n: Node = node(env, i, kind(i), metas.get(&i));
            let api = api.clone();
            let track = track.clone();
            async move {
                let created = api.create(&PostParams::default(), &n).await.unwrap();
                let now = Instant::now();
                let name = created.metadata.name.unwrap_or_default();
                lock(&track).node_created.insert(name.clone(), now);
                api.patch_status(&name, &PatchParams::default(), &kubelet_status_patch())
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(pace.concurrency)
        .collect::<()>()
        .await;
}

/// Kubelet's first status update after it registered a Node.
pub(crate) fn kubelet_status_patch() -> Patch<Value> {
    let now = Time(jiff::Timestamp::now());
    let resources = json!({"cpu": "4", "memory": "16374504Ki", "pods": "110",
                           "ephemeral-storage": "101430960Ki"});
    Patch::Strategic(json!({"status": {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
            "lastHeartbeatTime": now,
        }],
    }}))
}

/// Creates `nodes` initialised Nodes and then `services` reconciled Services (as an earlier CCM
/// left them): the cluster the steady, shadow and failover scenarios start from.
pub(crate) async fn create_settled_cluster(
    env: &Env,
    track: &Shared,
    nodes: usize,
    services: usize,
    concurrency: usize,
) {
    let pace = Pace::unpaced(concurrency);
    create_nodes(env, track, 0..nodes, |_| NodeKind::Initialised, pace).await;
    create_services(env, track, 0..services, true, concurrency).await;
}

/// Creates Services `range` concurrently (`ready`: with the finalizer and the ingress the CCM
/// would have written, as after an earlier CCM run).
pub(crate) async fn create_services(
    env: &Env,
    track: &Shared,
    range: std::ops::Range<usize>,
    ready: bool,
    concurrency: usize,
) {
    let api = env.services();
    futures::stream::iter(range)
        .map(|i| {
            let api = api.clone();
            let track = track.clone();
            let mut b = load_balancer_service(&env.run, &env.service_name(i))
                .label(RUN_LABEL, &env.run);
            if ready {
                b = b.finalizer(FINALIZER_LOAD_BALANCER_CLEANUP);
            }
            let s = b.build();
            async move {
                let created = api.create(&PostParams::default(), &s).await.unwrap();
                let now = Instant::now();
                let name = created.metadata.name.unwrap_or_default();
                lock(&track).svc_created.insert(name.clone(), now);
                if ready {
                    api.patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({
                            "status": {"loadBalancer": {"ingress": [{"ip": LB_IP, "ipMode": "VIP"}]}}
                        })),
                    )
                    .await
                    .unwrap();
                }
            }
        })
        .buffer_unordered(concurrency)
        .collect::<()>()
        .await;
}

/// When an Event about this run was last created or updated, as a watch on the API server saw
/// it (events.k8s.io/v1, all namespaces: Node Events land in `default`).
pub(crate) type LastEvent = Arc<Mutex<Option<Instant>>>;

pub(crate) fn watch_events(env: &Env) -> (OwnThread, LastEvent) {
    let last: LastEvent = Arc::default();
    let seen = last.clone();
    let run = env.run.clone();
    let thread = OwnThread::start("bench-events", env, move |client| async move {
        let api: Api<k8s_openapi::api::events::v1::Event> = Api::all(client);
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .applied_objects();
        futures::pin_mut!(stream);
        while let Ok(Some(e)) = stream.try_next().await {
            let ours = e.metadata.namespace.as_deref() == Some(run.as_str())
                || e.regarding
                    .as_ref()
                    .and_then(|r| r.name.as_deref())
                    .is_some_and(|n| n.starts_with(run.as_str()));
            if ours {
                *seen.lock().unwrap() = Some(Instant::now());
            }
        }
    });
    (thread, last)
}

/// Registers `opts.control_plane_nodes` tainted Nodes after the run's `n` and waits until
/// `track`'s observer sees them initialised (by the CCM or the floor), as a cluster's control
/// plane is before its workers join. They are not in `track`'s created Nodes.
pub(crate) async fn register_control_plane_nodes(
    env: &Env,
    track: &Shared,
    opts: &crate::cli::Opts,
) {
    let (n, cp) = (opts.nodes, opts.control_plane_nodes);
    if cp == 0 {
        return;
    }
    let cp_track: Shared = Arc::default();
    create_nodes(
        env,
        &cp_track,
        n..n + cp,
        |_| NodeKind::Tainted,
        opts.node_pace(),
    )
    .await;
    wait_until("the control-plane nodes initialised", opts.timeout, || {
        lock(track).node_initialised.len() >= cp
    })
    .await;
}

//! What the service-controller tests share (`service`, `service_leaks`, `service_nodes`,
//! `startup`, `events`): a recording [`Probe`] provider, the controller started in the
//! harness, and readers of Services, load balancers and Events.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccm_controllers::controllers::service::{self, ServiceConfig};
use ccm_controllers::{Backoff, InformerScope};
use ccm_core::{CloudError, CloudProvider, CloudResult, LoadBalancer, NodeView, async_trait};
use ccm_testing::TestCluster;
use ccm_testing::builders::kubelet_node;
use ccm_testing::fake_cloud::{FakeCloud, LoadBalancerState};
use ccm_testing::harness::ControllerHarness;
use ccm_testing::wait::eventually;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use tokio::sync::Notify;

/// Generous timeout for every wait.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(30);

/// Annotation that makes [`Probe`] answer `ImplementedElsewhere` from ensure/update.
pub(crate) const IMPLEMENTED_ELSEWHERE: &str = "test.ccm-rs.io/implemented-elsewhere";

/// Whether `ip` is in the range FakeCloud hands ingress IPs out of (its default
/// `lb_ip_range`, `198.18.0.0/15`), one per load balancer.
pub(crate) fn in_fake_lb_range(ip: &str) -> bool {
    ip.parse::<std::net::Ipv4Addr>()
        .is_ok_and(|ip| ip.octets()[0] == 198 && ip.octets()[1] & 0xfe == 18)
}

/// One call seen by the [`Probe`].
#[derive(Clone, Debug)]
pub(crate) struct ProbeCall {
    pub(crate) op: &'static str,
    /// `<namespace>/<name>` of the Service.
    pub(crate) key: String,
    pub(crate) uid: String,
    pub(crate) at: Instant,
    /// For `ensure_load_balancer`: whether the Service read back from the API server at the
    /// time of the call carried the cleanup finalizer.
    pub(crate) finalizer_persisted: Option<bool>,
}

/// Where to stop a call forever (to simulate a crash in the middle of it).
#[derive(Clone, Debug)]
pub(crate) struct Hold {
    pub(crate) op: &'static str,
    pub(crate) key: String,
    /// Stop after the inner call did its work (true) or before (false).
    pub(crate) after_inner: bool,
}

/// A provider wrapping a [`FakeCloud`]: records calls with timestamps, checks that the
/// finalizer is persisted before `ensure_load_balancer`, counts concurrent calls per load
/// balancer, answers `ImplementedElsewhere` for annotated Services, and can hold a call
/// forever.
pub(crate) struct Probe {
    pub(crate) fake: FakeCloud,
    client: kube::Client,
    calls: Mutex<Vec<ProbeCall>>,
    in_flight: Mutex<HashMap<String, usize>>,
    max_in_flight: Mutex<HashMap<String, usize>>,
    hold: Mutex<Option<Hold>>,
    pub(crate) held: Notify,
    latency: Mutex<Duration>,
}

impl Probe {
    pub(crate) fn new(fake: &FakeCloud, client: kube::Client) -> Arc<Probe> {
        Arc::new(Probe {
            fake: fake.clone(),
            client,
            calls: Mutex::new(Vec::new()),
            in_flight: Mutex::new(HashMap::new()),
            max_in_flight: Mutex::new(HashMap::new()),
            hold: Mutex::new(None),
            held: Notify::new(),
            latency: Mutex::new(Duration::ZERO),
        })
    }

    pub(crate) fn set_hold(&self, hold: Hold) {
        *self.hold.lock().unwrap() = Some(hold);
    }

    pub(crate) fn set_latency(&self, latency: Duration) {
        *self.latency.lock().unwrap() = latency;
    }

    pub(crate) fn calls(&self) -> Vec<ProbeCall> {
        self.calls.lock().unwrap().clone()
    }

    pub(crate) fn calls_for(&self, op: &str, key: &str) -> Vec<ProbeCall> {
        self.calls()
            .into_iter()
            .filter(|c| c.op == op && c.key == key)
            .collect()
    }

    pub(crate) fn count(&self, op: &str, key: &str) -> usize {
        self.calls_for(op, key).len()
    }

    /// The largest number of calls for one load balancer that ever ran at once.
    pub(crate) fn max_concurrency(&self) -> usize {
        self.max_in_flight
            .lock()
            .unwrap()
            .values()
            .copied()
            .max()
            .unwrap_or(0)
    }

    fn inner(&self) -> &dyn LoadBalancer {
        self.fake
            .load_balancer()
            .expect("FakeCloud has load balancers")
    }

    async fn enter(&self, op: &'static str, service: &Service) -> Guard<'_> {
        let key = key(service);
        let mut finalizer_persisted = None;
        if op == "ensure_load_balancer" {
            let api: Api<Service> = Api::namespaced(
                self.client.clone(),
                service.metadata.namespace.as_deref().unwrap(),
            );
            let live = api
                .get(service.metadata.name.as_deref().unwrap())
                .await
                .ok();
            finalizer_persisted = Some(live.as_ref().is_some_and(plan::has_cleanup_finalizer));
        }
        self.calls.lock().unwrap().push(ProbeCall {
            op,
            key: key.clone(),
            uid: service.metadata.uid.clone().unwrap_or_default(),
            at: Instant::now(),
            finalizer_persisted,
        });
        {
            let mut in_flight = self.in_flight.lock().unwrap();
            let n = in_flight.entry(key.clone()).or_default();
            *n += 1;
            let mut max = self.max_in_flight.lock().unwrap();
            let m = max.entry(key.clone()).or_default();
            *m = (*m).max(*n);
        }
        let latency = *self.latency.lock().unwrap();
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        Guard { probe: self, key }
    }

    async fn maybe_hold(&self, op: &str, service: &Service, after_inner: bool) {
        let hold = self.hold.lock().unwrap().clone();
        if let Some(h) = hold
            && h.op == op
            && h.key == key(service)
            && h.after_inner == after_inner
        {
            self.held.notify_one();
            std::future::pending::<()>().await;
        }
    }
}

struct Guard<'a> {
    probe: &'a Probe,
    key: String,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if let Some(n) = self.probe.in_flight.lock().unwrap().get_mut(&self.key) {
            *n -= 1;
        }
    }
}

fn elsewhere(service: &Service) -> bool {
    service
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(IMPLEMENTED_ELSEWHERE))
}

/// The `Arc` wrapper handed to the controller.
pub(crate) struct ProbeProvider(pub Arc<Probe>);

impl CloudProvider for ProbeProvider {
    fn provider_name(&self) -> &str {
        "fake"
    }

    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        Some(self)
    }
}

#[async_trait]
impl LoadBalancer for ProbeProvider {
    async fn get_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        let p = &self.0;
        let _g = p.enter("get_load_balancer", service).await;
        p.maybe_hold("get_load_balancer", service, false).await;
        let r = p.inner().get_load_balancer(cluster_name, service).await;
        p.maybe_hold("get_load_balancer", service, true).await;
        r
    }

    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        hosts: &[NodeView],
    ) -> CloudResult<LoadBalancerStatus> {
        let p = &self.0;
        let _g = p.enter("ensure_load_balancer", service).await;
        if elsewhere(service) {
            return Err(CloudError::ImplementedElsewhere);
        }
        p.maybe_hold("ensure_load_balancer", service, false).await;
        let r = p
            .inner()
            .ensure_load_balancer(cluster_name, service, hosts)
            .await;
        p.maybe_hold("ensure_load_balancer", service, true).await;
        r
    }

    async fn update_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        hosts: &[NodeView],
    ) -> CloudResult<()> {
        let p = &self.0;
        let _g = p.enter("update_load_balancer", service).await;
        if elsewhere(service) {
            return Err(CloudError::ImplementedElsewhere);
        }
        p.maybe_hold("update_load_balancer", service, false).await;
        let r = p
            .inner()
            .update_load_balancer(cluster_name, service, hosts)
            .await;
        p.maybe_hold("update_load_balancer", service, true).await;
        r
    }

    async fn ensure_load_balancer_deleted(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<()> {
        let p = &self.0;
        let _g = p.enter("ensure_load_balancer_deleted", service).await;
        p.maybe_hold("ensure_load_balancer_deleted", service, false)
            .await;
        let r = p
            .inner()
            .ensure_load_balancer_deleted(cluster_name, service)
            .await;
        p.maybe_hold("ensure_load_balancer_deleted", service, true)
            .await;
        r
    }
}

/// `<namespace>/<name>` of a Service.
pub(crate) fn key(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or_default(),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

/// A test configuration: small window, a few workers.
pub(crate) fn test_config() -> ServiceConfig {
    {
        let mut config = ServiceConfig::default();
        config.workers = 4;
        config.node_sync_window = Duration::from_millis(300);
        config.node_sync_max_window = Duration::from_millis(1200);
        config
    }
}

/// Starts the service controller on `cluster` with `cloud`, in the controller harness. Its
/// Service informer sees only the test's namespace `ns`, so on a real cluster
/// (`CCM_TEST_KUBECONFIG`) the controller never touches anyone else's Services.
pub(crate) async fn start(
    cluster: &TestCluster,
    ns: &str,
    cloud: Arc<dyn CloudProvider>,
    config: ServiceConfig,
) -> ControllerHarness {
    let scope = InformerScope {
        service_namespace: Some(ns.to_owned()),
        ..InformerScope::default()
    };
    ControllerHarness::builder(cluster, cloud)
        .controller(service::NAME, move |ctx, _| {
            service::run(ctx, config.clone())
        })
        .scope(scope)
        // These tests assert Go's service backoff (5 s, doubling), not the harness's.
        .retry_backoff(Backoff::SERVICE)
        .start()
        .await
}

/// Starts the controller with a fresh [`Probe`] around `fake`.
pub(crate) async fn start_probed(
    cluster: &TestCluster,
    ns: &str,
    fake: &FakeCloud,
    config: ServiceConfig,
) -> (ControllerHarness, Arc<Probe>) {
    let probe = Probe::new(fake, cluster.client());
    let running = start(cluster, ns, Arc::new(ProbeProvider(probe.clone())), config).await;
    (running, probe)
}

/// A metric of a running controller.
pub(crate) trait Metric {
    /// The value of a metric line `name value` (e.g. a counter or a histogram's `_count`).
    fn metric(&self, name: &str) -> f64;
}

impl Metric for ControllerHarness {
    fn metric(&self, name: &str) -> f64 {
        metric_value(&self.metrics(), name)
    }
}

pub(crate) fn metric_value(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0.0)
}

/// Creates a node as kubelet registers it and the cloud-node controller leaves it: a provider
/// ID, no uninitialised taint (a tainted Node awaits its initialisation, and the node sync holds
/// additions for it).
pub(crate) async fn create_node(cluster: &TestCluster, name: &str) -> Node {
    cluster
        .create(
            &kubelet_node(name)
                .provider_id(&format!("fake://{name}"))
                .without_uninitialized_taint()
                .build(),
        )
        .await
}

pub(crate) fn services(cluster: &TestCluster, ns: &str) -> Api<Service> {
    Api::namespaced(cluster.client(), ns)
}

pub(crate) fn nodes(cluster: &TestCluster) -> Api<Node> {
    Api::all(cluster.client())
}

pub(crate) fn ingress_ips(service: &Service) -> Vec<String> {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .map(|i| i.iter().filter_map(|i| i.ip.clone()).collect())
        .unwrap_or_default()
}

pub(crate) fn has_ingress(service: &Service) -> bool {
    matches!(ingress_ips(service).as_slice(), [ip] if in_fake_lb_range(ip))
}

/// FakeCloud's load balancers of namespace `ns`.
pub(crate) fn cloud_lbs(fake: &FakeCloud, ns: &str) -> BTreeMap<String, LoadBalancerState> {
    let prefix = format!("{ns}/");
    fake.load_balancers()
        .into_iter()
        .filter(|(k, _)| k.starts_with(&prefix))
        .collect()
}

/// `<ns>/<name>` of the Services in `ns` that want a load balancer (not being deleted).
pub(crate) async fn wanted(cluster: &TestCluster, ns: &str) -> BTreeSet<String> {
    services(cluster, ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|s| plan::wants_load_balancer(s) && !plan::is_being_deleted(s))
        .map(key)
        .collect()
}

/// Waits until FakeCloud holds exactly the load balancers of the Services in `ns` that want
/// one, each named after the current Service's UID. Panics with both sides otherwise.
pub(crate) async fn assert_no_leaks(cluster: &TestCluster, fake: &FakeCloud, ns: &str) {
    let ok = eventually(TIMEOUT, || async {
        let want = wanted(cluster, ns).await;
        let have: BTreeSet<String> = cloud_lbs(fake, ns).into_keys().collect();
        want == have && names_match_uids(cluster, fake, ns).await
    })
    .await;
    assert!(
        ok,
        "cloud load balancers {:?} != services wanting one {:?}",
        cloud_lbs(fake, ns).keys().collect::<Vec<_>>(),
        wanted(cluster, ns).await
    );
}

async fn names_match_uids(cluster: &TestCluster, fake: &FakeCloud, ns: &str) -> bool {
    let lbs = cloud_lbs(fake, ns);
    let list = services(cluster, ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    list.items.iter().all(|s| {
        lbs.get(&key(s))
            .is_none_or(|lb| lb.name == ccm_core::default_load_balancer_name(s))
    })
}

/// The events (type, reason, note) recorded on the object `name` in `ns`.
pub(crate) async fn events(
    cluster: &TestCluster,
    ns: &str,
    name: &str,
) -> Vec<(String, String, String)> {
    let api: Api<Event> = Api::namespaced(cluster.client(), ns);
    let Ok(list) = api.list(&ListParams::default()).await else {
        return Vec::new();
    };
    list.items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default(),
            )
        })
        .collect()
}

/// Waits for an event with `reason` on `name`; returns its note.
pub(crate) async fn wait_event(
    cluster: &TestCluster,
    ns: &str,
    name: &str,
    reason: &str,
) -> String {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let all = events(cluster, ns, name).await;
        if let Some((_, _, note)) = all.iter().find(|(_, r, _)| r == reason) {
            return note.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no {reason} event on {ns}/{name}; events: {all:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) async fn has_event(cluster: &TestCluster, ns: &str, name: &str, reason: &str) -> bool {
    events(cluster, ns, name)
        .await
        .iter()
        .any(|(_, r, _)| r == reason)
}

/// Waits until `cond` holds, panicking with `what` otherwise.
pub(crate) async fn wait_until<F, Fut>(what: &str, cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    assert!(
        eventually(TIMEOUT, cond).await,
        "timed out waiting for {what}"
    );
}

/// The Service predicates the service tests read (the controller's own are private to it).
pub(crate) mod plan {
    use ccm_core::well_known::FINALIZER_LOAD_BALANCER_CLEANUP;
    use k8s_openapi::api::core::v1::Service;

    /// `type: LoadBalancer` without a `loadBalancerClass`: the controller's business.
    pub(crate) fn wants_load_balancer(service: &Service) -> bool {
        service.spec.as_ref().is_some_and(|spec| {
            spec.type_.as_deref() == Some("LoadBalancer") && spec.load_balancer_class.is_none()
        })
    }

    /// Carries the `service.kubernetes.io/load-balancer-cleanup` finalizer.
    pub(crate) fn has_cleanup_finalizer(service: &Service) -> bool {
        service
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|f| f == FINALIZER_LOAD_BALANCER_CLEANUP))
    }

    /// `metadata.deletionTimestamp` is set.
    pub(crate) fn is_being_deleted(service: &Service) -> bool {
        service.metadata.deletion_timestamp.is_some()
    }
}

/// Creates `lbs` LoadBalancer Services and waits until each has its ingress; returns their
/// keys.
pub(crate) async fn lb_services(cluster: &TestCluster, ns: &str, lbs: usize) -> Vec<String> {
    let mut keys = Vec::new();
    for i in 0..lbs {
        let name = cluster.unique_name(&format!("lb{i}"));
        let svc = cluster
            .create(&ccm_testing::builders::load_balancer_service(ns, &name).build())
            .await;
        ccm_testing::wait::wait_for(&services(cluster, ns), &name, TIMEOUT, has_ingress)
            .await
            .unwrap();
        keys.push(key(&svc));
    }
    keys
}

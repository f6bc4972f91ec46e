#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The conformance suite: FakeCloud passes it whole; each deliberately broken provider (FakeCloud
//! wrapped to break exactly one contract) fails exactly the check for that contract.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ccm_core::k8s_openapi::api::core::v1::{NodeSpec, ServicePort, ServiceSpec};
use ccm_core::{
    CloudError, CloudProvider, CloudResult, InstanceMetadata, Instances, InstancesV2, LoadBalancer,
    LoadBalancerStatus, Node, NodeAddress, ObjectMeta, Route, Routes, Service, Zone, Zones,
    async_trait,
};
use ccm_testing::conformance::{Check, ConformanceInput, Outcome, Suite};
use ccm_testing::fake_cloud::FakeCloud;

const CLUSTER: &str = "conformance";
const SERVICE_KEY: &str = "default/conformance-lb";

fn node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn service() -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some("conformance-lb".into()),
            namespace: Some("default".into()),
            uid: Some("6f1d3c2a-1111-4000-8000-000000000001".into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![ServicePort {
                port: 80,
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn fake() -> ccm_testing::fake_cloud::FakeCloudBuilder {
    FakeCloud::builder()
        .missing_node("gone-.*")
        .shutdown_node("stopped-.*")
}

/// The input every test uses; `cloud` backs the load-balancer hosts probe.
fn input(cloud: &FakeCloud) -> ConformanceInput {
    let missing = Node {
        spec: Some(NodeSpec {
            provider_id: Some("fake://gone-1".into()),
            ..Default::default()
        }),
        ..node("gone-1")
    };
    let probe_cloud = cloud.clone();
    ConformanceInput::new(CLUSTER, vec![node("n-0"), node("n-1"), node("n-2")])
        .missing_node(missing)
        .shutdown_node(node("stopped-1"))
        .service(service())
        .route_cidr("10.244.250.0/24")
        .ipv6_route_cidr("fd00:10:244:fa::/64")
        .lb_hosts_probe(move |svc: Service| {
            let cloud = probe_cloud.clone();
            async move {
                let key = format!(
                    "{}/{}",
                    svc.metadata.namespace.unwrap_or_default(),
                    svc.metadata.name.unwrap_or_default()
                );
                cloud.load_balancers().get(&key).map(|lb| lb.hosts.clone())
            }
        })
        .call_timeout(Duration::from_secs(20))
}

fn failed(report: &ccm_testing::conformance::Report) -> BTreeSet<Check> {
    report.failed().map(|r| r.check).collect()
}

#[tokio::test]
async fn fake_cloud_passes_every_check() {
    // Latency makes the cancellation check cancel calls for real; legacy instances and zones
    // on make every check applicable.
    let cloud = fake()
        .legacy_instances(true)
        .instances_batch(true)
        .latency(Duration::from_millis(2))
        .build();
    let report = Suite::new(cloud.provider(), input(&cloud)).run().await;
    assert!(report.is_success(), "{report}");
    assert_eq!(report.skipped().count(), 0, "{report}");
    assert_eq!(report.passed().count(), Check::ALL.len(), "{report}");
    // The suite cleaned up after itself.
    assert!(
        cloud.load_balancers().is_empty(),
        "{:?}",
        cloud.load_balancers()
    );
    assert!(cloud.routes().is_empty(), "{:?}", cloud.routes());
    // And exercised what it claims to.
    for op in [
        "instance_metadata",
        "instance_exists",
        "instance_shutdown",
        "describe_instances",
        "instance_id",
        "instance_exists_by_provider_id",
        "instance_shutdown_by_provider_id",
        "instance_type_by_provider_id",
        "node_addresses_by_provider_id",
        "get_zone_by_provider_id",
        "get_zone_by_node_name",
        "node_addresses",
        "instance_type",
        "ensure_load_balancer",
        "update_load_balancer",
        "get_load_balancer",
        "ensure_load_balancer_deleted",
        "create_route",
        "list_routes",
        "delete_route",
    ] {
        assert!(cloud.call_count(op) > 0, "{op} never called");
    }
    report.assert_success();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_cloud_passes_on_a_multi_threaded_runtime_with_default_capabilities() {
    let cloud = fake().build();
    let report = Suite::new(cloud.provider(), input(&cloud)).run().await;
    assert!(report.is_success(), "{report}");
    // v1, Zones and batches are off by default: their checks are skipped with the reason.
    let skipped: BTreeSet<Check> = report.skipped().map(|r| r.check).collect();
    assert_eq!(
        skipped,
        BTreeSet::from([
            Check::ZonesNonEmpty,
            Check::LegacyV1ConsistentWithV2,
            Check::LegacyInstanceIdNotFoundForUnknown,
            Check::BatchAgreesWithSingleCalls,
            Check::BatchSameAnswerWhateverTheGrouping,
            Check::BatchMaxSizeHonoured,
        ])
    );
    let zones = report.get(Check::ZonesNonEmpty).unwrap();
    assert_eq!(
        zones.outcome,
        Outcome::Skipped {
            reason: "the provider offers no Zones".into()
        }
    );
}

#[tokio::test]
async fn checks_can_be_skipped_and_run_one_by_one() {
    let cloud = fake().build();
    let suite = Suite::new(cloud.provider(), input(&cloud))
        .skip(Check::RoutesRoundTrip)
        .skip(Check::ConcurrentCallsAreSafe);
    let one = suite.run_check(Check::RoutesRoundTrip).await;
    assert_eq!(
        one.outcome,
        Outcome::Skipped {
            reason: "skipped by the caller".into()
        }
    );
    cloud.reset_calls();
    let one = suite.run_check(Check::InstanceExistsFalseForUnknown).await;
    assert!(one.outcome.is_passed(), "{one}");
    // Only what that check needs was called.
    let ops: BTreeSet<String> = cloud.call_counts().into_keys().collect();
    assert_eq!(ops, BTreeSet::from(["instance_exists".to_owned()]));

    let report = suite.run().await;
    // Two by the caller, three legacy ones and three batch ones by capability.
    assert_eq!(report.skipped().count(), 2 + 3 + 3, "{report}");
    assert!(
        Check::ALL
            .iter()
            .all(|c| Check::from_name(c.name()) == Some(*c))
    );
}

#[tokio::test]
async fn missing_inputs_skip_the_checks_that_need_them() {
    let cloud = fake().build();
    let suite = Suite::new(
        cloud.provider(),
        ConformanceInput::new(CLUSTER, vec![node("n-0")]),
    );
    let report = suite.run().await;
    assert!(report.is_success(), "{report}");
    for check in [
        Check::InstanceExistsFalseForUnknown,
        Check::EnsureLoadBalancerIdempotentWithIngress,
        Check::RoutesRoundTrip,
    ] {
        let result = report.get(check).unwrap();
        assert!(result.outcome.is_skipped(), "{result}");
    }
    let text = report.to_string();
    assert!(text.contains("no Service given"), "{text}");
    assert!(text.contains("no route CIDR given"), "{text}");
    assert!(
        text.contains(
            "SKIP routes_dual_stack_same_name_hint_both_kept (no route CIDR given (ConformanceInput::route_cidr))"
        ),
        "{text}"
    );
    assert!(text.contains("no missing node given"), "{text}");
    assert!(cloud.call_count("ensure_load_balancer") == 0);
}

#[tokio::test]
async fn the_dual_stack_route_check_needs_one_cidr_per_family() {
    let cloud = fake().build();
    let base = || ConformanceInput::new(CLUSTER, vec![node("n-0")]);
    for (input, reason) in [
        (
            base().route_cidr("10.244.250.0/24"),
            "no IPv6 route CIDR given (ConformanceInput::ipv6_route_cidr)",
        ),
        (
            base()
                .route_cidr("fd00:10:244:fb::/64")
                .ipv6_route_cidr("fd00:10:244:fa::/64"),
            r#"ConformanceInput::route_cidr "fd00:10:244:fb::/64" is not an IPv4 CIDR"#,
        ),
        (
            base()
                .route_cidr("10.244.250.0/24")
                .ipv6_route_cidr("10.244.251.0/24"),
            r#"ConformanceInput::ipv6_route_cidr "10.244.251.0/24" is not an IPv6 CIDR"#,
        ),
    ] {
        let result = Suite::new(cloud.provider(), input)
            .run_check(Check::RoutesDualStackSameNameHintBothKept)
            .await;
        assert_eq!(
            result.outcome,
            Outcome::Skipped {
                reason: reason.into()
            },
            "{result}"
        );
    }
    assert_eq!(cloud.call_count("create_route"), 0);

    // Both routes of a dual-stack Node, then the IPv6 one re-created after the IPv4 one went:
    // FakeCloud keeps one route per CIDR under the shared hint and ends with none.
    let suite = Suite::new(cloud.provider(), input(&cloud));
    let result = suite
        .run_check(Check::RoutesDualStackSameNameHintBothKept)
        .await;
    assert!(result.outcome.is_passed(), "{result}");
    assert!(result.notes.is_empty(), "{result}");
    assert_eq!(cloud.call_count("create_route"), 3);
    assert!(cloud.routes().is_empty(), "{:?}", cloud.routes());
}

#[tokio::test]
async fn a_leftover_load_balancer_is_reported_not_adopted() {
    let cloud = fake().build();
    cloud
        .load_balancer()
        .unwrap()
        .ensure_load_balancer(CLUSTER, &service(), &[])
        .await
        .unwrap();
    let suite = Suite::new(cloud.provider(), input(&cloud));
    let result = suite
        .run_check(Check::GetLoadBalancerReportsExactlyBetweenEnsureAndDelete)
        .await;
    let text = result.to_string();
    assert!(result.outcome.is_failed(), "{text}");
    assert!(
        text.contains("must have no load balancer when the suite starts"),
        "{text}"
    );
}

// ------------------------------------------------------------------ deliberately broken providers

/// The one contract a [`Broken`] provider breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flaw {
    /// The second `instance_metadata` call for a node answers another instance type.
    MetadataChangesOnce,
    /// `provider_name` is "acme" while provider IDs say `fake://`.
    ProviderNameMismatch,
    /// `instance_exists` of a missing instance answers InstanceNotFound instead of false.
    ExistsErrorsForUnknown,
    /// `instance_exists` answers false for a shut-down instance.
    ShutDownMeansGone,
    /// `instance_shutdown` always answers false.
    ShutdownNeverReported,
    /// Zones answer an empty region (legacy path only).
    EmptyRegion,
    /// The legacy v1 instance type disagrees with v2.
    LegacyTypeDiffers,
    /// The legacy `instance_id` invents an ID for a missing instance.
    LegacyIdForUnknown,
    /// `ensure_load_balancer` returns a status without ingress.
    EnsureWithoutIngress,
    /// `get_load_balancer` reports a load balancer that was ever created, even once deleted.
    GetReportsDeleted,
    /// `update_load_balancer` succeeds without changing the hosts.
    UpdateIgnoresHosts,
    /// `ensure_load_balancer_deleted` fails when nothing exists.
    DeleteFailsWhenMissing,
    /// `list_routes` loses the target node.
    ListLosesTargetNode,
    /// `create_route` fails when the route already exists (IPv4 routes only, so that the
    /// dual-stack check, which creates its IPv6 route again, does not see it).
    CreateExistingRouteFails,
    /// `delete_route` fails when the route does not exist.
    DeleteMissingRouteFails,
    /// Routes are keyed by the name hint alone: a second CIDR under the same hint (the other
    /// family of a dual-stack Node) replaces the first.
    RoutesKeyedByHint,
    /// A cancelled `ensure_load_balancer` leaves a load balancer that delete cannot remove.
    CancelLeaksLoadBalancer,
    /// `instance_metadata` keeps the node being looked up in shared state across an await.
    RacyMetadata,
}

struct Broken {
    inner: FakeCloud,
    flaw: Flaw,
    metadata_calls: Mutex<BTreeMap<String, usize>>,
    ever_ensured: Mutex<bool>,
    pending: Mutex<BTreeSet<String>>,
    current: Mutex<Option<Node>>,
    by_hint: Mutex<BTreeMap<String, Route>>,
}

impl Broken {
    fn new(flaw: Flaw) -> (Arc<Broken>, FakeCloud) {
        let builder = match flaw {
            // On the legacy-only path, so that only the Zones check sees the flaw.
            Flaw::EmptyRegion => fake().instances_v2(false).legacy_instances(true),
            Flaw::LegacyTypeDiffers | Flaw::LegacyIdForUnknown => fake().legacy_instances(true),
            _ => fake(),
        };
        let inner = builder.build();
        let broken = Broken {
            inner: inner.clone(),
            flaw,
            metadata_calls: Mutex::default(),
            ever_ensured: Mutex::default(),
            pending: Mutex::default(),
            current: Mutex::default(),
            by_hint: Mutex::default(),
        };
        (Arc::new(broken), inner)
    }

    fn is(&self, flaw: Flaw) -> bool {
        self.flaw == flaw
    }
}

fn name(node: &Node) -> String {
    node.metadata.name.clone().unwrap_or_default()
}

#[async_trait]
impl CloudProvider for Broken {
    fn provider_name(&self) -> &str {
        if self.is(Flaw::ProviderNameMismatch) {
            "acme"
        } else {
            self.inner.provider_name()
        }
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        self.inner.instances_v2().map(|_| self as &dyn InstancesV2)
    }
    fn instances(&self) -> Option<&dyn Instances> {
        self.inner.instances().map(|_| self as &dyn Instances)
    }
    fn zones(&self) -> Option<&dyn Zones> {
        self.inner.zones().map(|_| self as &dyn Zones)
    }
    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        self.inner
            .load_balancer()
            .map(|_| self as &dyn LoadBalancer)
    }
    fn routes(&self) -> Option<&dyn Routes> {
        CloudProvider::routes(&self.inner).map(|_| self as &dyn Routes)
    }
}

#[async_trait]
impl InstancesV2 for Broken {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        let exists = InstancesV2::instance_exists(&self.inner, node).await?;
        if self.is(Flaw::ExistsErrorsForUnknown) && !exists {
            return Err(CloudError::InstanceNotFound);
        }
        if self.is(Flaw::ShutDownMeansGone)
            && InstancesV2::instance_shutdown(&self.inner, node).await?
        {
            return Ok(false);
        }
        Ok(exists)
    }

    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        let shutdown = InstancesV2::instance_shutdown(&self.inner, node).await?;
        Ok(shutdown && !self.is(Flaw::ShutdownNeverReported))
    }

    async fn instance_metadata(&self, node: &Node) -> CloudResult<InstanceMetadata> {
        if self.is(Flaw::RacyMetadata) {
            *self.current.lock().unwrap() = Some(node.clone());
            tokio::task::yield_now().await;
            let current = self.current.lock().unwrap().clone().unwrap();
            return InstancesV2::instance_metadata(&self.inner, &current).await;
        }
        let mut meta = InstancesV2::instance_metadata(&self.inner, node).await?;
        if self.is(Flaw::MetadataChangesOnce) {
            let mut calls = self.metadata_calls.lock().unwrap();
            let count = calls.entry(name(node)).or_default();
            *count += 1;
            if *count == 2 {
                meta.instance_type = "fake-resized".into();
            }
        }
        Ok(meta)
    }
}

#[async_trait]
impl Instances for Broken {
    async fn node_addresses(&self, node_name: &str) -> CloudResult<Vec<NodeAddress>> {
        self.inner.node_addresses(node_name).await
    }
    async fn node_addresses_by_provider_id(&self, pid: &str) -> CloudResult<Vec<NodeAddress>> {
        self.inner.node_addresses_by_provider_id(pid).await
    }
    async fn instance_id(&self, node_name: &str) -> CloudResult<String> {
        match self.inner.instance_id(node_name).await {
            Err(CloudError::InstanceNotFound) if self.is(Flaw::LegacyIdForUnknown) => {
                Ok(node_name.to_owned())
            }
            other => other,
        }
    }
    async fn instance_type(&self, node_name: &str) -> CloudResult<String> {
        self.inner.instance_type(node_name).await
    }
    async fn instance_type_by_provider_id(&self, pid: &str) -> CloudResult<String> {
        let t = self.inner.instance_type_by_provider_id(pid).await?;
        Ok(if self.is(Flaw::LegacyTypeDiffers) {
            "fake-legacy".into()
        } else {
            t
        })
    }
    async fn instance_exists_by_provider_id(&self, pid: &str) -> CloudResult<bool> {
        self.inner.instance_exists_by_provider_id(pid).await
    }
    async fn instance_shutdown_by_provider_id(&self, pid: &str) -> CloudResult<bool> {
        self.inner.instance_shutdown_by_provider_id(pid).await
    }
}

#[async_trait]
impl Zones for Broken {
    async fn get_zone_by_provider_id(&self, pid: &str) -> CloudResult<Zone> {
        let mut zone = self.inner.get_zone_by_provider_id(pid).await?;
        if self.is(Flaw::EmptyRegion) {
            zone.region.clear();
        }
        Ok(zone)
    }
    async fn get_zone_by_node_name(&self, node_name: &str) -> CloudResult<Zone> {
        let mut zone = self.inner.get_zone_by_node_name(node_name).await?;
        if self.is(Flaw::EmptyRegion) {
            zone.region.clear();
        }
        Ok(zone)
    }
}

#[async_trait]
impl LoadBalancer for Broken {
    async fn get_load_balancer(
        &self,
        cluster: &str,
        svc: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        let got = self.inner.get_load_balancer(cluster, svc).await?;
        if self.is(Flaw::GetReportsDeleted) && *self.ever_ensured.lock().unwrap() {
            return Ok(Some(got.unwrap_or_default()));
        }
        if self.is(Flaw::CancelLeaksLoadBalancer) && !self.pending.lock().unwrap().is_empty() {
            return Ok(Some(got.unwrap_or_default()));
        }
        Ok(got)
    }

    async fn ensure_load_balancer(
        &self,
        cluster: &str,
        svc: &Service,
        hosts: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        if self.is(Flaw::CancelLeaksLoadBalancer) {
            // Allocates a cloud resource, then awaits: dropped here, the resource leaks.
            let id = format!(
                "{}-{}",
                svc.metadata.name.clone().unwrap_or_default(),
                rand_id()
            );
            self.pending.lock().unwrap().insert(id.clone());
            tokio::task::yield_now().await;
            self.pending.lock().unwrap().remove(&id);
        }
        let status = self.inner.ensure_load_balancer(cluster, svc, hosts).await?;
        *self.ever_ensured.lock().unwrap() = true;
        if self.is(Flaw::EnsureWithoutIngress) {
            return Ok(LoadBalancerStatus::default());
        }
        Ok(status)
    }

    async fn update_load_balancer(
        &self,
        cluster: &str,
        svc: &Service,
        hosts: &[Arc<Node>],
    ) -> CloudResult<()> {
        if self.is(Flaw::UpdateIgnoresHosts) {
            return Ok(());
        }
        self.inner.update_load_balancer(cluster, svc, hosts).await
    }

    async fn ensure_load_balancer_deleted(&self, cluster: &str, svc: &Service) -> CloudResult<()> {
        if self.is(Flaw::DeleteFailsWhenMissing)
            && !self.inner.load_balancers().contains_key(SERVICE_KEY)
        {
            return Err(CloudError::msg("load balancer not found"));
        }
        self.inner.ensure_load_balancer_deleted(cluster, svc).await
    }
}

fn rand_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[async_trait]
impl Routes for Broken {
    async fn list_routes(&self, cluster: &str) -> CloudResult<Vec<Route>> {
        let mut routes = self.inner.list_routes(cluster).await?;
        if self.is(Flaw::ListLosesTargetNode) {
            for r in &mut routes {
                r.target_node.clear();
            }
        }
        Ok(routes)
    }

    async fn create_route(&self, cluster: &str, hint: &str, route: &Route) -> CloudResult<()> {
        if self.is(Flaw::CreateExistingRouteFails)
            && !route.destination_cidr.contains(':')
            && self
                .inner
                .routes()
                .iter()
                .any(|r| r.destination_cidr == route.destination_cidr)
        {
            return Err(CloudError::msg("route already exists"));
        }
        if self.is(Flaw::RoutesKeyedByHint) {
            // One route per hint: the previous route under this hint is overwritten.
            let previous = self.by_hint.lock().unwrap().get(hint).cloned();
            if let Some(previous) = previous
                && previous.destination_cidr != route.destination_cidr
            {
                self.inner.delete_route(cluster, &previous).await?;
            }
            self.by_hint
                .lock()
                .unwrap()
                .insert(hint.to_owned(), route.clone());
        }
        self.inner.create_route(cluster, hint, route).await
    }

    async fn delete_route(&self, cluster: &str, route: &Route) -> CloudResult<()> {
        if self.is(Flaw::DeleteMissingRouteFails)
            && !self
                .inner
                .routes()
                .iter()
                .any(|r| r.destination_cidr == route.destination_cidr)
        {
            return Err(CloudError::msg("route not found"));
        }
        self.inner.delete_route(cluster, route).await
    }
}

/// Runs the whole suite against the broken provider and asserts that exactly `check` fails,
/// with a report line naming it.
async fn only_fails(flaw: Flaw, check: Check) -> String {
    let (broken, inner) = Broken::new(flaw);
    let provider: Arc<dyn CloudProvider> = broken;
    let report = Suite::new(provider, input(&inner)).run().await;
    assert_eq!(
        failed(&report),
        BTreeSet::from([check]),
        "{flaw:?} must fail exactly {check}:\n{report}"
    );
    let result = report.get(check).unwrap();
    let line = result.to_string();
    assert!(
        line.starts_with(&format!("FAIL {}", check.name())),
        "{line}"
    );
    assert!(
        line.contains("expected: ") && line.contains("observed: "),
        "{line}"
    );
    assert!(
        report
            .to_string()
            .contains(&format!("FAIL {}", check.name()))
    );
    line
}

macro_rules! broken_provider_tests {
    ($($test:ident: $flaw:ident => $check:ident,)*) => {$(
        #[tokio::test]
        async fn $test() {
            let _ = only_fails(Flaw::$flaw, Check::$check).await;
        }
    )*};
}

broken_provider_tests! {
    unstable_metadata_fails_instance_metadata_stable:
        MetadataChangesOnce => InstanceMetadataStable,
    provider_name_mismatch_fails_provider_id_well_formed:
        ProviderNameMismatch => ProviderIdWellFormed,
    error_for_unknown_instance_fails_instance_exists_false_for_unknown:
        ExistsErrorsForUnknown => InstanceExistsFalseForUnknown,
    shut_down_reported_gone_fails_instance_exists_true_for_existing_and_shut_down:
        ShutDownMeansGone => InstanceExistsTrueForExistingAndShutDown,
    shutdown_never_reported_fails_instance_shutdown_consistent_with_exists:
        ShutdownNeverReported => InstanceShutdownConsistentWithExists,
    empty_region_fails_zones_non_empty:
        EmptyRegion => ZonesNonEmpty,
    legacy_type_differs_fails_legacy_v1_consistent_with_v2:
        LegacyTypeDiffers => LegacyV1ConsistentWithV2,
    legacy_id_for_unknown_fails_legacy_instance_id_not_found_for_unknown:
        LegacyIdForUnknown => LegacyInstanceIdNotFoundForUnknown,
    ensure_without_ingress_fails_ensure_load_balancer_idempotent_with_ingress:
        EnsureWithoutIngress => EnsureLoadBalancerIdempotentWithIngress,
    get_reporting_deleted_fails_get_load_balancer_reports_exactly_between:
        GetReportsDeleted => GetLoadBalancerReportsExactlyBetweenEnsureAndDelete,
    update_ignoring_hosts_fails_update_load_balancer_changes_hosts:
        UpdateIgnoresHosts => UpdateLoadBalancerChangesHosts,
    delete_failing_when_missing_fails_ensure_load_balancer_deleted_idempotent:
        DeleteFailsWhenMissing => EnsureLoadBalancerDeletedIdempotent,
    list_losing_target_fails_routes_round_trip:
        ListLosesTargetNode => RoutesRoundTrip,
    create_existing_route_failing_fails_routes_create_existing_succeeds:
        CreateExistingRouteFails => RoutesCreateExistingSucceeds,
    delete_missing_route_failing_fails_routes_delete_missing_succeeds:
        DeleteMissingRouteFails => RoutesDeleteMissingSucceeds,
    routes_keyed_by_hint_fail_routes_dual_stack_same_name_hint_both_kept:
        RoutesKeyedByHint => RoutesDualStackSameNameHintBothKept,
    cancel_leaking_load_balancer_fails_cancellation_leaves_consistent_state:
        CancelLeaksLoadBalancer => CancellationLeavesConsistentState,
    racy_metadata_fails_concurrent_calls_are_safe:
        RacyMetadata => ConcurrentCallsAreSafe,
}

#[tokio::test]
async fn failure_messages_show_what_changed() {
    let line = only_fails(Flaw::MetadataChangesOnce, Check::InstanceMetadataStable).await;
    assert!(
        line.contains(r#"observed: it changed: instance_type: "fake-small" -> "fake-resized""#),
        "{line}"
    );
    let line = only_fails(
        Flaw::ExistsErrorsForUnknown,
        Check::InstanceExistsFalseForUnknown,
    )
    .await;
    assert!(
        line.contains("observed: error (instance_not_found)"),
        "{line}"
    );
}

#[test]
fn every_check_has_a_broken_provider() {
    // Keep this list in step with the macro above: one flaw per check.
    let covered = [
        Check::InstanceMetadataStable,
        Check::ProviderIdWellFormed,
        Check::InstanceExistsFalseForUnknown,
        Check::InstanceExistsTrueForExistingAndShutDown,
        Check::InstanceShutdownConsistentWithExists,
        Check::ZonesNonEmpty,
        Check::LegacyV1ConsistentWithV2,
        Check::LegacyInstanceIdNotFoundForUnknown,
        Check::EnsureLoadBalancerIdempotentWithIngress,
        Check::GetLoadBalancerReportsExactlyBetweenEnsureAndDelete,
        Check::UpdateLoadBalancerChangesHosts,
        Check::EnsureLoadBalancerDeletedIdempotent,
        Check::RoutesRoundTrip,
        Check::RoutesCreateExistingSucceeds,
        Check::RoutesDeleteMissingSucceeds,
        Check::RoutesDualStackSameNameHintBothKept,
        Check::CancellationLeavesConsistentState,
        Check::ConcurrentCallsAreSafe,
        // Their broken batches are in tests/conformance_batch.rs.
        Check::BatchAgreesWithSingleCalls,
        Check::BatchSameAnswerWhateverTheGrouping,
        Check::BatchMaxSizeHonoured,
    ];
    assert_eq!(
        covered.iter().collect::<BTreeSet<_>>(),
        Check::ALL.iter().collect::<BTreeSet<_>>()
    );
}

/// A provider whose calls panic: the suite reports it as a failure instead of aborting.
struct Panicking;

#[async_trait]
impl CloudProvider for Panicking {
    fn provider_name(&self) -> &str {
        "panicking"
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }
}

#[async_trait]
impl InstancesV2 for Panicking {
    async fn instance_exists(&self, _node: &Node) -> CloudResult<bool> {
        panic!("boom in instance_exists")
    }
    async fn instance_shutdown(&self, _node: &Node) -> CloudResult<bool> {
        Ok(false)
    }
    async fn instance_metadata(&self, _node: &Node) -> CloudResult<InstanceMetadata> {
        Err(CloudError::NotImplemented)
    }
}

#[tokio::test]
async fn a_panicking_provider_fails_the_check_without_aborting_the_suite() {
    let suite = Suite::new(
        Arc::new(Panicking),
        ConformanceInput::new(CLUSTER, vec![node("n-0")]).missing_node(node("gone-1")),
    );
    let result = suite.run_check(Check::InstanceExistsFalseForUnknown).await;
    let text = result.to_string();
    assert!(result.outcome.is_failed(), "{text}");
    assert!(text.contains("panicked: boom in instance_exists"), "{text}");
    let report = suite.run().await;
    assert!(!report.is_success());
}

#[tokio::test(start_paused = true)]
async fn retry_answers_are_honoured_and_a_hung_call_times_out() {
    use ccm_testing::fake_cloud::Fault;
    let cloud = fake().build();
    cloud.inject(
        "ensure_load_balancer",
        Fault::Retry {
            after: Duration::from_secs(30),
            count: 2,
        },
    );
    let suite = Suite::new(cloud.provider(), input(&cloud));
    let result = suite
        .run_check(Check::EnsureLoadBalancerIdempotentWithIngress)
        .await;
    assert!(result.outcome.is_passed(), "{result}");
    assert_eq!(
        cloud.call_count("ensure_load_balancer"),
        4,
        "2 retries + 2 ensures"
    );

    let slow = fake()
        .operation_latency("instance_exists", Duration::from_secs(3600))
        .build();
    let suite = Suite::new(
        slow.provider(),
        input(&slow).call_timeout(Duration::from_secs(5)),
    );
    let result = suite.run_check(Check::InstanceExistsFalseForUnknown).await;
    let text = result.to_string();
    assert!(text.contains("did not answer within 5s"), "{text}");
}

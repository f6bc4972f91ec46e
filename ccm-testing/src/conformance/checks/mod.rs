//! The checks of the conformance suite.

mod batch;
mod cancellation;
mod concurrency;
mod instances;
mod load_balancers;
mod routes;

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ccm_core::{
    CloudError, CloudProvider, CloudResult, InstanceMetadata, Instances, InstancesV2, LoadBalancer,
    LoadBalancerStatus, NodeAddress, NodeView, Route, Routes, Service,
};
use ipnet::IpNet;
use tokio::time::Instant;

use super::{Check, SkipKind, Suite, guarded};

/// Why a check stopped before its end.
pub(super) enum Stop {
    Failed { expected: String, observed: String },
    Skipped(SkipKind, String),
}

type Step = Result<(), Stop>;

fn fail(expected: impl Into<String>, observed: impl Into<String>) -> Stop {
    Stop::Failed {
        expected: expected.into(),
        observed: observed.into(),
    }
}

/// A skip for a lack in the input (no Service, no route CIDR, ...): with it, the check runs.
fn skip(reason: impl Into<String>) -> Stop {
    Stop::Skipped(SkipKind::InputMissing, reason.into())
}

/// A skip because the provider does not offer the capability the check needs.
fn not_offered(reason: impl Into<String>) -> Stop {
    Stop::Skipped(SkipKind::NotOffered, reason.into())
}

/// The skip of a check that exercises whichever of instances (with nodes), load balancers
/// (with a Service) and routes (with a CIDR) it can, when it could exercise none: not offered
/// when the provider has none of the three capabilities, else the input lacks what they need.
fn nothing_to_exercise(ctx: &Ctx<'_>, reason: impl Into<String>) -> Stop {
    let p = ctx.provider();
    if p.instances_v2().is_none() && p.load_balancer().is_none() && p.routes().is_none() {
        not_offered(reason)
    } else {
        skip(reason)
    }
}

impl Stop {
    /// The same failure, reported with another expectation (what the check was doing when
    /// the step failed); a skip stays a skip.
    fn expecting(self, expected: impl Into<String>) -> Stop {
        match self {
            Stop::Failed { observed, .. } => fail(expected, observed),
            skipped => skipped,
        }
    }
}

/// A call's answer, or a failed check when it is an error: `expected`, and the error with its
/// kind as what the call answered.
fn succeeded<T>(answer: CloudResult<T>, expected: impl Into<String>) -> Result<T, Stop> {
    answer.map_err(|e| fail(expected, describe(&e)))
}

/// A call's answer with the errors `tolerated` accepts read as `Ok(instead)` (as Go reads
/// NotImplemented or ImplementedElsewhere where they are allowed).
fn tolerate<T>(
    answer: CloudResult<T>,
    tolerated: impl FnOnce(&CloudError) -> bool,
    instead: T,
) -> CloudResult<T> {
    match answer {
        Err(e) if tolerated(&e) => Ok(instead),
        answer => answer,
    }
}

/// Matches a value a call answered against the one expected; another fails the check with
/// `expected`, and `Ok(<value>)` as what the call answered.
fn expect_value<T: PartialEq + std::fmt::Debug>(
    got: T,
    want: T,
    expected: impl Into<String>,
) -> Step {
    if got == want {
        Ok(())
    } else {
        Err(fail(expected, format!("Ok({got:?})")))
    }
}

/// Matches a call's answer against `Ok(want)`: an error or another value fails the check with
/// `expected` and what the call answered.
fn expect_answer<T: PartialEq + std::fmt::Debug>(
    answer: CloudResult<T>,
    want: T,
    expected: impl Into<String>,
) -> Step {
    let expected = expected.into();
    let got = succeeded(answer, expected.clone())?;
    expect_value(got, want, expected)
}

fn describe(err: &CloudError) -> String {
    format!("error ({}): {err}", err.kind())
}

fn name_of(node: &NodeView) -> String {
    node.name().to_owned()
}

fn spec_provider_id(node: &NodeView) -> Option<String> {
    Some(node.provider_id())
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
}

fn service_ref(svc: &Service) -> String {
    format!(
        "{}/{}",
        svc.metadata.namespace.as_deref().unwrap_or("default"),
        svc.metadata.name.as_deref().unwrap_or_default()
    )
}

fn address_set(addresses: &[NodeAddress]) -> BTreeSet<(String, String)> {
    addresses
        .iter()
        .map(|a| (a.type_.clone(), a.address.clone()))
        .collect()
}

fn has_ingress(status: &LoadBalancerStatus) -> bool {
    status.ingress.as_ref().is_some_and(|ingress| {
        ingress.iter().any(|i| {
            i.ip.as_deref().is_some_and(|s| !s.is_empty())
                || i.hostname.as_deref().is_some_and(|s| !s.is_empty())
        })
    })
}

/// The fields in which two metadata answers differ, `field: old -> new`.
fn metadata_diff(a: &InstanceMetadata, b: &InstanceMetadata) -> String {
    let mut diffs = Vec::new();
    let mut field = |name: &str, x: String, y: String| {
        if x != y {
            diffs.push(format!("{name}: {x} -> {y}"));
        }
    };
    field(
        "provider_id",
        format!("{:?}", a.provider_id),
        format!("{:?}", b.provider_id),
    );
    field(
        "instance_type",
        format!("{:?}", a.instance_type),
        format!("{:?}", b.instance_type),
    );
    field(
        "node_addresses",
        format!("{:?}", a.node_addresses),
        format!("{:?}", b.node_addresses),
    );
    field("zone", format!("{:?}", a.zone), format!("{:?}", b.zone));
    field(
        "region",
        format!("{:?}", a.region),
        format!("{:?}", b.region),
    );
    field(
        "additional_labels",
        format!("{:?}", a.additional_labels),
        format!("{:?}", b.additional_labels),
    );
    diffs.join("; ")
}

/// Whether two CIDR strings name the same network (textually different forms allowed).
fn same_cidr(a: &str, b: &str) -> bool {
    match (a.parse::<IpNet>(), b.parse::<IpNet>()) {
        (Ok(a), Ok(b)) => a.trunc() == b.trunc(),
        _ => a == b,
    }
}

/// Whether `cidr` lies inside `outer`.
fn inside(outer: &str, cidr: &str) -> bool {
    match (outer.parse::<IpNet>(), cidr.parse::<IpNet>()) {
        (Ok(outer), Ok(net)) => outer.contains(&net),
        _ => outer == cidr,
    }
}

/// Repeats a call answered with `CloudError::Retry` after the requested delay, within `budget`;
/// each attempt is guarded by `timeout` and turns panics into errors.
async fn call_with_retry<T, F, Fut>(
    timeout: Duration,
    budget: Duration,
    what: &str,
    mut f: F,
) -> CloudResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = CloudResult<T>>,
{
    let deadline = Instant::now() + budget;
    loop {
        match guarded(timeout, what, f()).await {
            Err(CloudError::Retry { after, .. }) if Instant::now() + after <= deadline => {
                tokio::time::sleep(after).await;
            }
            other => return other,
        }
    }
}

/// The state of one check run: the suite, and what to clean up.
async fn require_unused_cidr(ctx: &Ctx<'_>, cidr: &str) -> Step {
    let listed = ctx.listed_with(cidr).await?;
    if listed.is_empty() {
        Ok(())
    } else {
        Err(fail(
            format!(
                "no route for {cidr} before the check (ConformanceInput::route_cidr must be unused)"
            ),
            format!("{listed:?}"),
        ))
    }
}

pub(super) struct Ctx<'a> {
    suite: &'a Suite,
    lb_touched: bool,
    routes_touched: bool,
    /// Remarks for the result that do not change the outcome.
    notes: Vec<String>,
}

impl<'a> Ctx<'a> {
    pub(super) fn new(suite: &'a Suite) -> Self {
        Ctx {
            suite,
            lb_touched: false,
            routes_touched: false,
            notes: Vec::new(),
        }
    }

    fn provider(&self) -> &'a dyn CloudProvider {
        self.suite.provider.as_ref()
    }

    fn input(&self) -> &'a super::ConformanceInput {
        &self.suite.input
    }

    async fn call<T, F, Fut>(&self, what: &str, f: F) -> CloudResult<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = CloudResult<T>>,
    {
        let input = self.input();
        call_with_retry(input.call_timeout, input.retry_budget, what, f).await
    }

    /// Calls the provider (as [`call`](Self::call)) and returns its answer; an error fails the
    /// check with `expected` and the error.
    async fn call_ok<T, F, Fut>(
        &self,
        what: &str,
        expected: impl Into<String>,
        f: F,
    ) -> Result<T, Stop>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = CloudResult<T>>,
    {
        succeeded(self.call(what, f).await, expected)
    }

    fn nodes(&self) -> Result<&'a [NodeView], Stop> {
        let nodes = &self.input().existing_nodes;
        if nodes.is_empty() {
            Err(skip(
                "no existing nodes given (ConformanceInput::existing_nodes)",
            ))
        } else {
            Ok(nodes)
        }
    }

    fn v2(&self) -> Option<&'a dyn InstancesV2> {
        self.provider().instances_v2()
    }

    fn v1(&self) -> Option<&'a dyn Instances> {
        self.provider().instances()
    }

    fn require_instances(&self) -> Step {
        if self.v2().is_none() && self.v1().is_none() {
            Err(not_offered(
                "the provider offers neither InstancesV2 nor Instances",
            ))
        } else {
            Ok(())
        }
    }

    /// The input Service and the implementation serving its class (`load_balancer()` for a
    /// Service without a class, unless the provider overrides `load_balancer_for_class`).
    fn lb(&self) -> Result<(&'a dyn LoadBalancer, &'a Service), Stop> {
        let svc = self.input_service()?;
        let class = svc
            .spec
            .as_ref()
            .and_then(|s| s.load_balancer_class.as_deref());
        let lb = self
            .provider()
            .load_balancer_for_class(class)
            .ok_or_else(|| not_offered("the provider offers no LoadBalancer"))?;
        Ok((lb, svc))
    }

    fn input_service(&self) -> Result<&'a Service, Stop> {
        self.input()
            .service
            .as_ref()
            .ok_or_else(|| skip("no Service given (ConformanceInput::service)"))
    }

    fn routes(&self) -> Result<(&'a dyn Routes, &'a str, &'a NodeView), Stop> {
        let routes = self
            .provider()
            .routes()
            .ok_or_else(|| not_offered("the provider offers no Routes"))?;
        let cidr = self
            .input()
            .route_cidr
            .as_deref()
            .ok_or_else(|| skip("no route CIDR given (ConformanceInput::route_cidr)"))?;
        let node = self.nodes()?.first().ok_or_else(|| skip("no nodes"))?;
        Ok((routes, cidr, node))
    }

    fn cluster(&self) -> &'a str {
        &self.input().cluster_name
    }

    /// The provider ID of a node for the legacy `*_by_provider_id` lookups: `spec.providerID`,
    /// else `<provider_name>://<instance_id(name)>`, else the v2 metadata's.
    async fn provider_id_of(&self, node: &NodeView) -> Option<String> {
        if let Some(pid) = spec_provider_id(node) {
            return Some(pid);
        }
        let name = name_of(node);
        if let Some(v1) = self.v1()
            && let Ok(id) = self.call("instance_id", || v1.instance_id(&name)).await
            && !id.is_empty()
        {
            return Some(format!("{}://{id}", self.provider().provider_name()));
        }
        if let Some(v2) = self.v2()
            && let Ok(meta) = self
                .call("instance_metadata", || v2.instance_metadata(node))
                .await
            && !meta.provider_id.is_empty()
        {
            return Some(meta.provider_id);
        }
        None
    }

    async fn metadata(
        &self,
        v2: &dyn InstancesV2,
        node: &NodeView,
    ) -> Result<InstanceMetadata, Stop> {
        let expected = format!(
            "instance_metadata of running node {:?} to succeed",
            name_of(node)
        );
        self.call_ok("instance_metadata", expected, || v2.instance_metadata(node))
            .await
    }

    async fn ensure(&mut self, hosts: &[NodeView]) -> Result<LoadBalancerStatus, Stop> {
        let (lb, svc) = self.lb()?;
        self.lb_touched = true;
        let cluster = self.cluster();
        self.call("ensure_load_balancer", || {
            lb.ensure_load_balancer(cluster, svc, hosts)
        })
        .await
        .map_err(|e| match e {
            CloudError::ImplementedElsewhere => not_offered(format!(
                "ensure_load_balancer answers ImplementedElsewhere for {}",
                service_ref(svc)
            )),
            e => fail(
                format!("ensure_load_balancer of {} to succeed", service_ref(svc)),
                describe(&e),
            ),
        })
    }

    async fn delete_lb(&self) -> Result<(), Stop> {
        let (lb, svc) = self.lb()?;
        let cluster = self.cluster();
        let expected = format!(
            "ensure_load_balancer_deleted of {} to succeed",
            service_ref(svc)
        );
        self.call_ok("ensure_load_balancer_deleted", expected, || {
            lb.ensure_load_balancer_deleted(cluster, svc)
        })
        .await
    }

    async fn get_lb(&self) -> Result<Option<LoadBalancerStatus>, Stop> {
        let (lb, svc) = self.lb()?;
        let cluster = self.cluster();
        let expected = format!("get_load_balancer of {} to succeed", service_ref(svc));
        self.call_ok("get_load_balancer", expected, || {
            lb.get_load_balancer(cluster, svc)
        })
        .await
    }

    fn route_for(&self, node: &NodeView, cidr: &str) -> Route {
        Route {
            target_node: name_of(node),
            destination_cidr: cidr.to_owned(),
            target_node_addresses: node
                .addresses()
                .map(|(type_, address)| NodeAddress {
                    type_: type_.to_owned(),
                    address: address.to_owned(),
                })
                .collect(),
            ..Default::default()
        }
    }

    fn name_hint(node: &NodeView, suffix: &str) -> String {
        let base = node
            .uid()
            .map(str::to_owned)
            .unwrap_or_else(|| format!("conformance-{}", name_of(node)));
        format!("{base}{suffix}")
    }

    async fn create_route(&mut self, node: &NodeView, cidr: &str, suffix: &str) -> Step {
        let (routes, _, _) = self.routes()?;
        self.routes_touched = true;
        let route = self.route_for(node, cidr);
        let hint = Self::name_hint(node, suffix);
        let cluster = self.cluster();
        let expected = format!(
            "create_route of {cidr} to node {:?} to succeed",
            name_of(node)
        );
        self.call_ok("create_route", expected, || {
            routes.create_route(cluster, &hint, &route)
        })
        .await
    }

    async fn list_routes(&self) -> Result<Vec<Route>, Stop> {
        let (routes, _, _) = self.routes()?;
        let cluster = self.cluster();
        self.call_ok("list_routes", "list_routes to succeed", || {
            routes.list_routes(cluster)
        })
        .await
    }

    async fn listed_with(&self, cidr: &str) -> Result<Vec<Route>, Stop> {
        Ok(self
            .list_routes()
            .await?
            .into_iter()
            .filter(|r| same_cidr(&r.destination_cidr, cidr))
            .collect())
    }

    async fn delete_route(&self, route: &Route) -> Step {
        let (routes, _, _) = self.routes()?;
        let cluster = self.cluster();
        let expected = format!("delete_route of {} to succeed", route.destination_cidr);
        self.call_ok("delete_route", expected, || {
            routes.delete_route(cluster, route)
        })
        .await
    }

    /// Deletes what the check created; returns notes on failures.
    pub(super) async fn cleanup(&mut self) -> Vec<String> {
        let mut notes = std::mem::take(&mut self.notes);
        if self.lb_touched
            && let Err(Stop::Failed { observed, .. }) = self.delete_lb().await
        {
            notes.push(format!(
                "cleanup: ensure_load_balancer_deleted failed: {observed}"
            ));
        }
        if self.routes_touched
            && let Ok((_, outer, _)) = self.routes()
        {
            let outer_v6 = self.input().ipv6_route_cidr.as_deref();
            match self.list_routes().await {
                Ok(listed) => {
                    for route in listed.iter().filter(|r| {
                        inside(outer, &r.destination_cidr)
                            || outer_v6.is_some_and(|v6| inside(v6, &r.destination_cidr))
                    }) {
                        if let Err(Stop::Failed { observed, .. }) = self.delete_route(route).await {
                            notes.push(format!(
                                "cleanup: delete_route of {} failed: {observed}",
                                route.destination_cidr
                            ));
                        }
                    }
                }
                Err(Stop::Failed { observed, .. }) => {
                    notes.push(format!("cleanup: list_routes failed: {observed}"));
                }
                Err(Stop::Skipped(..)) => {}
            }
        }
        self.lb_touched = false;
        self.routes_touched = false;
        notes
    }
}

pub(super) async fn run(check: Check, ctx: &mut Ctx<'_>) -> Step {
    match check {
        Check::InstanceMetadataStable => instances::instance_metadata_stable(ctx).await,
        Check::ProviderIdWellFormed => instances::provider_id_well_formed(ctx).await,
        Check::InstanceExistsFalseForUnknown => {
            instances::instance_exists_false_for_unknown(ctx).await
        }
        Check::InstanceExistsTrueForExistingAndShutDown => {
            instances::instance_exists_true_for_existing(ctx).await
        }
        Check::InstanceShutdownConsistentWithExists => {
            instances::instance_shutdown_consistent(ctx).await
        }
        Check::ZonesNonEmpty => instances::zones_non_empty(ctx).await,
        Check::InstanceLabelsValid => instances::instance_labels_valid(ctx).await,
        Check::LegacyV1ConsistentWithV2 => instances::legacy_consistent(ctx).await,
        Check::LegacyInstanceIdNotFoundForUnknown => {
            instances::legacy_instance_id_not_found(ctx).await
        }
        Check::EnsureLoadBalancerIdempotentWithIngress => {
            load_balancers::ensure_idempotent(ctx).await
        }
        Check::GetLoadBalancerReportsExactlyBetweenEnsureAndDelete => {
            load_balancers::get_between(ctx).await
        }
        Check::UpdateLoadBalancerChangesHosts => load_balancers::update_changes_hosts(ctx).await,
        Check::EnsureLoadBalancerDeletedIdempotent => load_balancers::delete_idempotent(ctx).await,
        Check::RoutesRoundTrip => routes::routes_round_trip(ctx).await,
        Check::RoutesCreateExistingSucceeds => routes::routes_create_existing(ctx).await,
        Check::RoutesDeleteMissingSucceeds => routes::routes_delete_missing(ctx).await,
        Check::RoutesDualStackSameNameHintBothKept => routes::routes_dual_stack(ctx).await,
        Check::CancellationLeavesConsistentState => cancellation::cancellation(ctx).await,
        Check::ConcurrentCallsAreSafe => concurrency::concurrency(ctx).await,
        Check::BatchAgreesWithSingleCalls => batch::agrees_with_single_calls(ctx).await,
        Check::BatchSameAnswerWhateverTheGrouping => {
            batch::same_answer_whatever_the_grouping(ctx).await
        }
        Check::BatchMaxSizeHonoured => batch::max_size_honoured(ctx).await,
        Check::LoadBalancerHostsBatchAgreesWithUpdate => {
            load_balancers::hosts_batch_agrees_with_update(ctx).await
        }
        Check::LoadBalancerClassesDeclared => load_balancers::classes_declared(ctx).await,
        Check::LoadBalancerIngressIpModesValid => load_balancers::ip_modes_valid(ctx).await,
    }
}

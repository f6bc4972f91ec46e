//! The checks of the conformance suite.

use std::collections::BTreeSet;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use ccm_core::{
    CloudError, CloudProvider, CloudResult, InstanceMetadata, Instances, InstancesV2, LoadBalancer,
    LoadBalancerStatus, Node, NodeAddress, ProviderId, Route, Routes, Service, Zones,
};
use futures::FutureExt;
use ipnet::IpNet;
use tokio::time::Instant;

use super::{Check, Suite, guarded, panic_message};

// The batch checks live in their own file, a child of this module to share its helpers.
#[path = "batch.rs"]
mod batch;

/// Why a check stopped before its end.
pub(super) enum Stop {
    Failed { expected: String, observed: String },
    Skipped(String),
}

type Step = Result<(), Stop>;

fn fail(expected: impl Into<String>, observed: impl Into<String>) -> Stop {
    Stop::Failed {
        expected: expected.into(),
        observed: observed.into(),
    }
}

fn skip(reason: impl Into<String>) -> Stop {
    Stop::Skipped(reason.into())
}

fn describe(err: &CloudError) -> String {
    format!("error ({}): {err}", err.kind())
}

fn name_of(node: &Node) -> String {
    node.metadata.name.clone().unwrap_or_default()
}

fn spec_provider_id(node: &Node) -> Option<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.clone())
        .filter(|p| !p.is_empty())
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

    fn nodes(&self) -> Result<&'a [Arc<Node>], Stop> {
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
            Err(skip(
                "the provider offers neither InstancesV2 nor Instances",
            ))
        } else {
            Ok(())
        }
    }

    fn lb(&self) -> Result<(&'a dyn LoadBalancer, &'a Service), Stop> {
        let lb = self
            .provider()
            .load_balancer()
            .ok_or_else(|| skip("the provider offers no LoadBalancer"))?;
        let svc = self
            .input()
            .service
            .as_ref()
            .ok_or_else(|| skip("no Service given (ConformanceInput::service)"))?;
        Ok((lb, svc))
    }

    fn routes(&self) -> Result<(&'a dyn Routes, &'a str, &'a Node), Stop> {
        let routes = self
            .provider()
            .routes()
            .ok_or_else(|| skip("the provider offers no Routes"))?;
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
    async fn provider_id_of(&self, node: &Node) -> Option<String> {
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

    async fn metadata(&self, v2: &dyn InstancesV2, node: &Node) -> Result<InstanceMetadata, Stop> {
        self.call("instance_metadata", || v2.instance_metadata(node))
            .await
            .map_err(|e| {
                fail(
                    format!(
                        "instance_metadata of running node {:?} to succeed",
                        name_of(node)
                    ),
                    describe(&e),
                )
            })
    }

    async fn ensure(&mut self, hosts: &[Arc<Node>]) -> Result<LoadBalancerStatus, Stop> {
        let (lb, svc) = self.lb()?;
        self.lb_touched = true;
        let cluster = self.cluster();
        self.call("ensure_load_balancer", || {
            lb.ensure_load_balancer(cluster, svc, hosts)
        })
        .await
        .map_err(|e| match e {
            CloudError::ImplementedElsewhere => skip(format!(
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
        self.call("ensure_load_balancer_deleted", || {
            lb.ensure_load_balancer_deleted(cluster, svc)
        })
        .await
        .map_err(|e| {
            fail(
                format!(
                    "ensure_load_balancer_deleted of {} to succeed",
                    service_ref(svc)
                ),
                describe(&e),
            )
        })
    }

    async fn get_lb(&self) -> Result<Option<LoadBalancerStatus>, Stop> {
        let (lb, svc) = self.lb()?;
        let cluster = self.cluster();
        self.call("get_load_balancer", || lb.get_load_balancer(cluster, svc))
            .await
            .map_err(|e| {
                fail(
                    format!("get_load_balancer of {} to succeed", service_ref(svc)),
                    describe(&e),
                )
            })
    }

    fn route_for(&self, node: &Node, cidr: &str) -> Route {
        Route {
            target_node: name_of(node),
            destination_cidr: cidr.to_owned(),
            target_node_addresses: node
                .status
                .as_ref()
                .and_then(|s| s.addresses.clone())
                .unwrap_or_default(),
            ..Default::default()
        }
    }

    fn name_hint(node: &Node, suffix: &str) -> String {
        let base = node
            .metadata
            .uid
            .clone()
            .unwrap_or_else(|| format!("conformance-{}", name_of(node)));
        format!("{base}{suffix}")
    }

    async fn create_route(&mut self, node: &Node, cidr: &str, suffix: &str) -> Step {
        let (routes, _, _) = self.routes()?;
        self.routes_touched = true;
        let route = self.route_for(node, cidr);
        let hint = Self::name_hint(node, suffix);
        let cluster = self.cluster();
        self.call("create_route", || {
            routes.create_route(cluster, &hint, &route)
        })
        .await
        .map_err(|e| {
            fail(
                format!(
                    "create_route of {cidr} to node {:?} to succeed",
                    name_of(node)
                ),
                describe(&e),
            )
        })
    }

    async fn list_routes(&self) -> Result<Vec<Route>, Stop> {
        let (routes, _, _) = self.routes()?;
        let cluster = self.cluster();
        self.call("list_routes", || routes.list_routes(cluster))
            .await
            .map_err(|e| fail("list_routes to succeed", describe(&e)))
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
        self.call("delete_route", || routes.delete_route(cluster, route))
            .await
            .map_err(|e| {
                fail(
                    format!("delete_route of {} to succeed", route.destination_cidr),
                    describe(&e),
                )
            })
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
                Err(Stop::Skipped(_)) => {}
            }
        }
        self.lb_touched = false;
        self.routes_touched = false;
        notes
    }
}

pub(super) async fn run(check: Check, ctx: &mut Ctx<'_>) -> Step {
    match check {
        Check::InstanceMetadataStable => instance_metadata_stable(ctx).await,
        Check::ProviderIdWellFormed => provider_id_well_formed(ctx).await,
        Check::InstanceExistsFalseForUnknown => instance_exists_false_for_unknown(ctx).await,
        Check::InstanceExistsTrueForExistingAndShutDown => {
            instance_exists_true_for_existing(ctx).await
        }
        Check::InstanceShutdownConsistentWithExists => instance_shutdown_consistent(ctx).await,
        Check::ZonesNonEmpty => zones_non_empty(ctx).await,
        Check::LegacyV1ConsistentWithV2 => legacy_consistent(ctx).await,
        Check::LegacyInstanceIdNotFoundForUnknown => legacy_instance_id_not_found(ctx).await,
        Check::EnsureLoadBalancerIdempotentWithIngress => ensure_idempotent(ctx).await,
        Check::GetLoadBalancerReportsExactlyBetweenEnsureAndDelete => get_between(ctx).await,
        Check::UpdateLoadBalancerChangesHosts => update_changes_hosts(ctx).await,
        Check::EnsureLoadBalancerDeletedIdempotent => delete_idempotent(ctx).await,
        Check::RoutesRoundTrip => routes_round_trip(ctx).await,
        Check::RoutesCreateExistingSucceeds => routes_create_existing(ctx).await,
        Check::RoutesDeleteMissingSucceeds => routes_delete_missing(ctx).await,
        Check::RoutesDualStackSameNameHintBothKept => routes_dual_stack(ctx).await,
        Check::CancellationLeavesConsistentState => cancellation(ctx).await,
        Check::ConcurrentCallsAreSafe => concurrency(ctx).await,
        Check::BatchAgreesWithSingleCalls => batch::agrees_with_single_calls(ctx).await,
        Check::BatchSameAnswerWhateverTheGrouping => {
            batch::same_answer_whatever_the_grouping(ctx).await
        }
        Check::BatchMaxSizeHonoured => batch::max_size_honoured(ctx).await,
    }
}

// ------------------------------------------------------------------------------- instances

async fn instance_metadata_stable(ctx: &mut Ctx<'_>) -> Step {
    ctx.require_instances()?;
    let nodes = ctx.nodes()?;
    for node in nodes {
        let name = name_of(node);
        if let Some(v2) = ctx.v2() {
            let first = ctx.metadata(v2, node).await?;
            for _ in 0..2 {
                let again = ctx.metadata(v2, node).await?;
                if again != first {
                    return Err(fail(
                        format!("the same instance_metadata on every call for node {name:?}"),
                        format!("it changed: {}", metadata_diff(&first, &again)),
                    ));
                }
            }
        } else if let Some(v1) = ctx.v1() {
            let mut answers = Vec::new();
            for _ in 0..3 {
                let addresses = ctx
                    .call("node_addresses", || v1.node_addresses(&name))
                    .await
                    .map_err(|e| {
                        fail(
                            format!("node_addresses of running node {name:?} to succeed"),
                            describe(&e),
                        )
                    })?;
                let instance_type = ctx
                    .call("instance_type", || v1.instance_type(&name))
                    .await
                    .map_err(|e| {
                        fail(
                            format!("instance_type of running node {name:?} to succeed"),
                            describe(&e),
                        )
                    })?;
                answers.push((addresses, instance_type));
            }
            if answers.windows(2).any(|w| w[0] != w[1]) {
                return Err(fail(
                    format!(
                        "the same node_addresses and instance_type on every call for node {name:?}"
                    ),
                    format!("{answers:?}"),
                ));
            }
        }
    }
    Ok(())
}

fn check_provider_id(provider_name: &str, pid: &str, node: &str, source: &str) -> Step {
    let parsed: ProviderId = pid.parse().map_err(|e| {
        fail(
            format!(
                "a provider ID of the form {provider_name}://<id> from {source} for node {node:?}"
            ),
            format!("{pid:?}: {e}"),
        )
    })?;
    if parsed.provider() != provider_name {
        return Err(fail(
            format!(
                "the provider ID from {source} for node {node:?} to start with provider_name() {provider_name:?}"
            ),
            format!("{pid:?} (provider {:?})", parsed.provider()),
        ));
    }
    Ok(())
}

async fn provider_id_well_formed(ctx: &mut Ctx<'_>) -> Step {
    ctx.require_instances()?;
    let provider_name = ctx.provider().provider_name().to_owned();
    for node in ctx.nodes()? {
        let name = name_of(node);
        if let Some(v2) = ctx.v2() {
            let meta = ctx.metadata(v2, node).await?;
            if meta.provider_id.is_empty() {
                if spec_provider_id(node).is_none() {
                    return Err(fail(
                        format!(
                            "a provider ID in instance_metadata for node {name:?}, which has no spec.providerID"
                        ),
                        "an empty provider_id",
                    ));
                }
            } else {
                check_provider_id(
                    &provider_name,
                    &meta.provider_id,
                    &name,
                    "instance_metadata",
                )?;
            }
        }
        if let Some(v1) = ctx.v1() {
            match ctx.call("instance_id", || v1.instance_id(&name)).await {
                Ok(id) => {
                    let pid = format!("{provider_name}://{id}");
                    check_provider_id(&provider_name, &pid, &name, "instance_id")?;
                }
                // Go: NotImplemented leaves spec.providerID empty, allowed.
                Err(CloudError::NotImplemented) => {}
                Err(e) => {
                    return Err(fail(
                        format!("instance_id of running node {name:?} to succeed"),
                        describe(&e),
                    ));
                }
            }
        }
    }
    Ok(())
}

async fn instance_exists_false_for_unknown(ctx: &mut Ctx<'_>) -> Step {
    ctx.require_instances()?;
    let node = ctx
        .input()
        .missing_node
        .as_ref()
        .ok_or_else(|| skip("no missing node given (ConformanceInput::missing_node)"))?;
    let name = name_of(node);
    let mut checked = false;
    if let Some(v2) = ctx.v2() {
        checked = true;
        match ctx
            .call("instance_exists", || v2.instance_exists(node))
            .await
        {
            Ok(false) => {}
            Ok(true) => {
                return Err(fail(
                    format!("instance_exists of the missing node {name:?} to be Ok(false)"),
                    "Ok(true)",
                ));
            }
            Err(e) => {
                return Err(fail(
                    format!(
                        "instance_exists of the missing node {name:?} to be Ok(false), not an error (an error never lets the Node be deleted)"
                    ),
                    describe(&e),
                ));
            }
        }
    }
    if let (Some(v1), Some(pid)) = (ctx.v1(), spec_provider_id(node)) {
        checked = true;
        match ctx
            .call("instance_exists_by_provider_id", || {
                v1.instance_exists_by_provider_id(&pid)
            })
            .await
        {
            Ok(false) => {}
            Ok(true) => {
                return Err(fail(
                    format!("instance_exists_by_provider_id({pid:?}) to be Ok(false)"),
                    "Ok(true)",
                ));
            }
            Err(e) => {
                return Err(fail(
                    format!(
                        "instance_exists_by_provider_id({pid:?}) of a missing instance to be Ok(false), not an error"
                    ),
                    describe(&e),
                ));
            }
        }
    }
    if checked {
        Ok(())
    } else {
        Err(skip(
            "the provider offers only the legacy Instances: give the missing node a spec.providerID",
        ))
    }
}

async fn instance_exists_true_for_existing(ctx: &mut Ctx<'_>) -> Step {
    ctx.require_instances()?;
    let mut nodes: Vec<(&Node, &str)> = ctx.nodes()?.iter().map(|n| (&**n, "running")).collect();
    if let Some(node) = ctx.input().shutdown_node.as_ref() {
        nodes.push((node, "shut-down"));
    }
    for (node, state) in nodes {
        let name = name_of(node);
        if let Some(v2) = ctx.v2() {
            match ctx
                .call("instance_exists", || v2.instance_exists(node))
                .await
            {
                Ok(true) => {}
                Ok(false) => {
                    return Err(fail(
                        format!(
                            "instance_exists of the {state} node {name:?} to be Ok(true) (false deletes the Node)"
                        ),
                        "Ok(false)",
                    ));
                }
                Err(e) => {
                    return Err(fail(
                        format!("instance_exists of the {state} node {name:?} to be Ok(true)"),
                        describe(&e),
                    ));
                }
            }
        }
        let pid = match ctx.v1() {
            Some(_) => ctx.provider_id_of(node).await,
            None => None,
        };
        if ctx.v1().is_some() && pid.is_none() {
            ctx.notes.push(format!(
                "no provider ID known for node {name:?}: instance_exists_by_provider_id not checked"
            ));
        }
        if let (Some(v1), Some(pid)) = (ctx.v1(), pid) {
            match ctx
                .call("instance_exists_by_provider_id", || {
                    v1.instance_exists_by_provider_id(&pid)
                })
                .await
            {
                Ok(true) => {}
                other => {
                    return Err(fail(
                        format!(
                            "instance_exists_by_provider_id({pid:?}) of the {state} node {name:?} to be Ok(true)"
                        ),
                        match other {
                            Ok(b) => format!("Ok({b})"),
                            Err(e) => describe(&e),
                        },
                    ));
                }
            }
        }
    }
    Ok(())
}

/// What a shutdown answer must be: `Some(true)` shut down, `Some(false)` not, `None` anything
/// but `Ok(true)`.
fn check_shutdown(
    answer: CloudResult<bool>,
    want: Option<bool>,
    what: &str,
    notes: &mut Vec<String>,
) -> Step {
    match (answer, want) {
        (Ok(got), Some(want)) if got == want => Ok(()),
        (Ok(false), None) | (Err(_), None) => Ok(()),
        // Go reads NotImplemented as "not shut down".
        (Err(CloudError::NotImplemented), Some(false)) => Ok(()),
        (Err(CloudError::NotImplemented), Some(true)) => {
            notes.push(format!(
                "{what}: NotImplemented, so shut-down instances cannot be tainted"
            ));
            Ok(())
        }
        (Ok(true), None) => Err(fail(
            format!("{what} not to be Ok(true): a missing instance is not shut down"),
            "Ok(true)",
        )),
        (Ok(got), Some(want)) => Err(fail(
            format!("{what} to be Ok({want})"),
            format!("Ok({got})"),
        )),
        (Err(e), Some(want)) => Err(fail(format!("{what} to be Ok({want})"), describe(&e))),
    }
}

async fn instance_shutdown_consistent(ctx: &mut Ctx<'_>) -> Step {
    ctx.require_instances()?;
    let mut cases: Vec<(&Node, Option<bool>, &str)> = ctx
        .nodes()?
        .iter()
        .map(|n| (&**n, Some(false), "running"))
        .collect();
    if let Some(node) = ctx.input().shutdown_node.as_ref() {
        cases.push((node, Some(true), "shut-down"));
    }
    if let Some(node) = ctx.input().missing_node.as_ref() {
        cases.push((node, None, "missing"));
    }
    let mut notes = Vec::new();
    for (node, want, state) in cases {
        let name = name_of(node);
        if let Some(v2) = ctx.v2() {
            let answer = ctx
                .call("instance_shutdown", || v2.instance_shutdown(node))
                .await;
            check_shutdown(
                answer,
                want,
                &format!("instance_shutdown of the {state} node {name:?}"),
                &mut notes,
            )?;
        }
        let pid = if want.is_none() {
            spec_provider_id(node)
        } else {
            ctx.provider_id_of(node).await
        };
        if let (Some(v1), Some(pid)) = (ctx.v1(), pid) {
            let answer = ctx
                .call("instance_shutdown_by_provider_id", || {
                    v1.instance_shutdown_by_provider_id(&pid)
                })
                .await;
            check_shutdown(
                answer,
                want,
                &format!("instance_shutdown_by_provider_id({pid:?}) of the {state} node {name:?}"),
                &mut notes,
            )?;
        }
    }
    ctx.notes.extend(notes);
    Ok(())
}

async fn zones_non_empty(ctx: &mut Ctx<'_>) -> Step {
    let zones: &dyn Zones = ctx
        .provider()
        .zones()
        .ok_or_else(|| skip("the provider offers no Zones"))?;
    for node in ctx.nodes()? {
        let name = name_of(node);
        let by_pid = match ctx.provider_id_of(node).await {
            Some(pid) => Some(
                ctx.call("get_zone_by_provider_id", || {
                    zones.get_zone_by_provider_id(&pid)
                })
                .await,
            ),
            None => None,
        };
        let zone = match by_pid {
            Some(Ok(zone)) => zone,
            // The framework falls back to the lookup by name.
            _ => ctx
                .call("get_zone_by_node_name", || {
                    zones.get_zone_by_node_name(&name)
                })
                .await
                .map_err(|e| {
                    fail(
                        format!("a zone for the running node {name:?}"),
                        describe(&e),
                    )
                })?,
        };
        if zone.failure_domain.is_empty() || zone.region.is_empty() {
            return Err(fail(
                format!(
                    "a non-empty zone and region for node {name:?} from a provider offering Zones"
                ),
                format!("{zone:?}"),
            ));
        }
    }
    Ok(())
}

async fn legacy_consistent(ctx: &mut Ctx<'_>) -> Step {
    let (Some(v1), Some(v2)) = (ctx.v1(), ctx.v2()) else {
        return Err(skip(
            "the provider does not offer both Instances (v1) and InstancesV2",
        ));
    };
    let provider_name = ctx.provider().provider_name().to_owned();
    let mismatch = |what: &str, name: &str, v1: String, v2: String| {
        fail(
            format!("{what} of node {name:?} to be the same from Instances (v1) and InstancesV2"),
            format!("v1: {v1}, v2: {v2}"),
        )
    };
    let v1_err = |what: &str, name: &str, e: CloudError| {
        fail(
            format!("{what} of running node {name:?} to succeed on the legacy path"),
            describe(&e),
        )
    };
    for node in ctx.nodes()? {
        let name = name_of(node);
        let meta = ctx.metadata(v2, node).await?;
        match ctx.call("instance_id", || v1.instance_id(&name)).await {
            Ok(id) => {
                let pid = format!("{provider_name}://{id}");
                if !meta.provider_id.is_empty() && pid != meta.provider_id {
                    return Err(mismatch("the provider ID", &name, pid, meta.provider_id));
                }
            }
            Err(CloudError::NotImplemented) => {}
            Err(e) => return Err(v1_err("instance_id", &name, e)),
        }
        let pid = if meta.provider_id.is_empty() {
            spec_provider_id(node).unwrap_or_default()
        } else {
            meta.provider_id.clone()
        };
        let instance_type = ctx
            .call("instance_type_by_provider_id", || {
                v1.instance_type_by_provider_id(&pid)
            })
            .await
            .map_err(|e| v1_err("instance_type_by_provider_id", &name, e))?;
        if instance_type != meta.instance_type {
            return Err(mismatch(
                "the instance type",
                &name,
                instance_type,
                meta.instance_type,
            ));
        }
        let addresses = ctx
            .call("node_addresses_by_provider_id", || {
                v1.node_addresses_by_provider_id(&pid)
            })
            .await
            .map_err(|e| v1_err("node_addresses_by_provider_id", &name, e))?;
        if address_set(&addresses) != address_set(&meta.node_addresses) {
            return Err(mismatch(
                "the addresses",
                &name,
                format!("{addresses:?}"),
                format!("{:?}", meta.node_addresses),
            ));
        }
        let exists_v1 = ctx
            .call("instance_exists_by_provider_id", || {
                v1.instance_exists_by_provider_id(&pid)
            })
            .await
            .map_err(|e| v1_err("instance_exists_by_provider_id", &name, e))?;
        let exists_v2 = ctx
            .call("instance_exists", || v2.instance_exists(node))
            .await
            .map_err(|e| v1_err("instance_exists (v2)", &name, e))?;
        if exists_v1 != exists_v2 {
            return Err(mismatch(
                "existence",
                &name,
                exists_v1.to_string(),
                exists_v2.to_string(),
            ));
        }
        let shut_v1 = ctx
            .call("instance_shutdown_by_provider_id", || {
                v1.instance_shutdown_by_provider_id(&pid)
            })
            .await
            .or_else(|e| {
                if e.is_not_implemented() {
                    Ok(false)
                } else {
                    Err(e)
                }
            })
            .map_err(|e| v1_err("instance_shutdown_by_provider_id", &name, e))?;
        let shut_v2 = ctx
            .call("instance_shutdown", || v2.instance_shutdown(node))
            .await
            .or_else(|e| {
                if e.is_not_implemented() {
                    Ok(false)
                } else {
                    Err(e)
                }
            })
            .map_err(|e| v1_err("instance_shutdown (v2)", &name, e))?;
        if shut_v1 != shut_v2 {
            return Err(mismatch(
                "the shutdown state",
                &name,
                shut_v1.to_string(),
                shut_v2.to_string(),
            ));
        }
        if let Some(zones) = ctx.provider().zones()
            && !meta.zone.is_empty()
        {
            let zone = ctx
                .call("get_zone_by_provider_id", || {
                    zones.get_zone_by_provider_id(&pid)
                })
                .await
                .map_err(|e| v1_err("get_zone_by_provider_id", &name, e))?;
            if zone.failure_domain != meta.zone || zone.region != meta.region {
                return Err(mismatch(
                    "the zone and region",
                    &name,
                    format!("{}/{}", zone.failure_domain, zone.region),
                    format!("{}/{}", meta.zone, meta.region),
                ));
            }
        }
    }
    Ok(())
}

async fn legacy_instance_id_not_found(ctx: &mut Ctx<'_>) -> Step {
    let v1 = ctx
        .v1()
        .ok_or_else(|| skip("the provider offers no Instances (v1)"))?;
    let node = ctx
        .input()
        .missing_node
        .as_ref()
        .ok_or_else(|| skip("no missing node given (ConformanceInput::missing_node)"))?;
    let name = name_of(node);
    match ctx.call("instance_id", || v1.instance_id(&name)).await {
        Err(CloudError::InstanceNotFound) => Ok(()),
        Err(CloudError::NotImplemented) => Err(skip("instance_id answers NotImplemented")),
        Ok(id) => Err(fail(
            format!("instance_id of the missing node {name:?} to be InstanceNotFound"),
            format!("Ok({id:?})"),
        )),
        Err(e) => Err(fail(
            format!("instance_id of the missing node {name:?} to be InstanceNotFound"),
            describe(&e),
        )),
    }
}

// ------------------------------------------------------------------------- load balancers

async fn ensure_idempotent(ctx: &mut Ctx<'_>) -> Step {
    let (_, svc) = ctx.lb()?;
    let hosts = ctx.nodes()?;
    let first = ctx.ensure(hosts).await?;
    if !has_ingress(&first) {
        return Err(fail(
            format!(
                "ensure_load_balancer of {} to return a status with an ingress IP or hostname",
                service_ref(svc)
            ),
            format!("{first:?}"),
        ));
    }
    let second = ctx.ensure(hosts).await.map_err(|stop| match stop {
        Stop::Failed { observed, .. } => fail(
            format!(
                "a second ensure_load_balancer of {} with the same input to succeed (idempotent)",
                service_ref(svc)
            ),
            observed,
        ),
        other => other,
    })?;
    if second != first {
        return Err(fail(
            format!(
                "a second ensure_load_balancer of {} with the same input to return the same status",
                service_ref(svc)
            ),
            format!("first {first:?}, then {second:?}"),
        ));
    }
    Ok(())
}

async fn get_between(ctx: &mut Ctx<'_>) -> Step {
    let (_, svc) = ctx.lb()?;
    let hosts = ctx.nodes()?;
    let svc = service_ref(svc);
    if let Some(status) = ctx.get_lb().await? {
        return Err(fail(
            format!(
                "get_load_balancer of {svc} to be None before ensure_load_balancer (the Service must have no load balancer when the suite starts)"
            ),
            format!("Some({status:?})"),
        ));
    }
    ctx.ensure(hosts).await?;
    if ctx.get_lb().await?.is_none() {
        return Err(fail(
            format!("get_load_balancer of {svc} to report it after ensure_load_balancer"),
            "None",
        ));
    }
    ctx.delete_lb().await?;
    if let Some(status) = ctx.get_lb().await? {
        return Err(fail(
            format!("get_load_balancer of {svc} to be None after ensure_load_balancer_deleted"),
            format!("Some({status:?})"),
        ));
    }
    Ok(())
}

async fn probe_hosts(ctx: &Ctx<'_>, svc: &Service) -> Option<Option<BTreeSet<String>>> {
    let probe = ctx.input().lb_hosts_probe.as_ref()?;
    Some(probe(svc.clone()).await.map(|h| h.into_iter().collect()))
}

async fn update_changes_hosts(ctx: &mut Ctx<'_>) -> Step {
    let (lb, svc) = ctx.lb()?;
    let nodes = ctx.nodes()?;
    let (first, rest) = nodes.split_at(1);
    ctx.ensure(first).await?;
    let cluster = ctx.cluster();
    for hosts in [rest, first] {
        let names: BTreeSet<String> = hosts.iter().map(|n| name_of(n)).collect();
        match ctx
            .call("update_load_balancer", || {
                lb.update_load_balancer(cluster, svc, hosts)
            })
            .await
        {
            Ok(()) => {}
            Err(CloudError::ImplementedElsewhere) => {
                return Err(skip(
                    "update_load_balancer answers ImplementedElsewhere for this Service",
                ));
            }
            Err(e) => {
                return Err(fail(
                    format!(
                        "update_load_balancer of {} to hosts {names:?} to succeed",
                        service_ref(svc)
                    ),
                    describe(&e),
                ));
            }
        }
        if ctx.get_lb().await?.is_none() {
            return Err(fail(
                format!(
                    "get_load_balancer of {} to still report it after update_load_balancer",
                    service_ref(svc)
                ),
                "None",
            ));
        }
        if let Some(observed) = probe_hosts(ctx, svc).await
            && observed.as_ref() != Some(&names)
        {
            return Err(fail(
                format!(
                    "the load balancer of {} to have the hosts {names:?} after update_load_balancer",
                    service_ref(svc)
                ),
                format!("the probe reports {observed:?}"),
            ));
        }
    }
    Ok(())
}

async fn delete_idempotent(ctx: &mut Ctx<'_>) -> Step {
    let hosts = ctx.nodes()?;
    delete_checked(ctx, "when no load balancer exists").await?;
    ctx.ensure(hosts).await?;
    delete_checked(ctx, "of an existing load balancer").await?;
    delete_checked(ctx, "a second time").await
}

async fn delete_checked(ctx: &Ctx<'_>, when: &str) -> Step {
    let (lb, svc) = ctx.lb()?;
    let cluster = ctx.cluster();
    match ctx
        .call("ensure_load_balancer_deleted", || {
            lb.ensure_load_balancer_deleted(cluster, svc)
        })
        .await
    {
        Ok(()) => Ok(()),
        Err(CloudError::ImplementedElsewhere) => Err(fail(
            format!(
                "ensure_load_balancer_deleted of {} {when} never to answer ImplementedElsewhere",
                service_ref(svc)
            ),
            "ImplementedElsewhere",
        )),
        Err(e) => Err(fail(
            format!(
                "ensure_load_balancer_deleted of {} {when} to succeed",
                service_ref(svc)
            ),
            describe(&e),
        )),
    }
}

// --------------------------------------------------------------------------------- routes

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

async fn routes_round_trip(ctx: &mut Ctx<'_>) -> Step {
    let (_, cidr, node) = ctx.routes()?;
    require_unused_cidr(ctx, cidr).await?;
    ctx.create_route(node, cidr, "").await?;
    let listed = ctx.listed_with(cidr).await?;
    let Some(route) = listed.first() else {
        return Err(fail(
            format!("list_routes to return the route to {cidr} after create_route"),
            "no route with that destination CIDR",
        ));
    };
    if route.target_node != name_of(node) {
        return Err(fail(
            format!(
                "the listed route to {cidr} to target node {:?}",
                name_of(node)
            ),
            format!("{route:?}"),
        ));
    }
    ctx.delete_route(route).await?;
    let left = ctx.listed_with(cidr).await?;
    if !left.is_empty() {
        return Err(fail(
            format!("no route to {cidr} after delete_route"),
            format!("{left:?}"),
        ));
    }
    Ok(())
}

async fn routes_create_existing(ctx: &mut Ctx<'_>) -> Step {
    let (_, cidr, node) = ctx.routes()?;
    require_unused_cidr(ctx, cidr).await?;
    ctx.create_route(node, cidr, "").await?;
    ctx.create_route(node, cidr, "")
        .await
        .map_err(|stop| match stop {
            Stop::Failed { observed, .. } => fail(
                format!("creating the existing route to {cidr} again to succeed"),
                observed,
            ),
            other => other,
        })?;
    let listed = ctx.listed_with(cidr).await?;
    if listed.len() > 1 {
        return Err(fail(
            format!("at most one route to {cidr} after creating it twice"),
            format!("{listed:?}"),
        ));
    }
    Ok(())
}

async fn routes_delete_missing(ctx: &mut Ctx<'_>) -> Step {
    let (_, cidr, node) = ctx.routes()?;
    require_unused_cidr(ctx, cidr).await?;
    let never_created = ctx.route_for(node, cidr);
    ctx.delete_route(&never_created)
        .await
        .map_err(|stop| match stop {
            Stop::Failed { observed, .. } => fail(
                format!("delete_route of a route to {cidr} that was never created to succeed"),
                observed,
            ),
            other => other,
        })?;
    ctx.create_route(node, cidr, "").await?;
    let listed = ctx.listed_with(cidr).await?;
    for route in &listed {
        ctx.delete_route(route).await?;
    }
    for route in &listed {
        ctx.delete_route(route).await.map_err(|stop| match stop {
            Stop::Failed { observed, .. } => fail(
                format!(
                    "delete_route of the already deleted route {:?} to succeed",
                    route.name
                ),
                observed,
            ),
            other => other,
        })?;
    }
    Ok(())
}

/// The one route listed to `cidr`, or a failure naming `what` went before. (Its target node is
/// `routes_round_trip`'s business.)
async fn the_route_to(ctx: &Ctx<'_>, cidr: &str, what: &str) -> Result<Route, Stop> {
    let listed = ctx.listed_with(cidr).await?;
    match listed.as_slice() {
        [route] => Ok(route.clone()),
        _ => Err(fail(
            format!("exactly one listed route to {cidr} {what}"),
            format!("routes listed to {cidr}: {listed:?}"),
        )),
    }
}

async fn routes_dual_stack(ctx: &mut Ctx<'_>) -> Step {
    let (_, v4, node) = ctx.routes()?;
    let v6 = ctx
        .input()
        .ipv6_route_cidr
        .as_deref()
        .ok_or_else(|| skip("no IPv6 route CIDR given (ConformanceInput::ipv6_route_cidr)"))?;
    if !matches!(v4.parse::<IpNet>(), Ok(IpNet::V4(_))) {
        return Err(skip(format!(
            "ConformanceInput::route_cidr {v4:?} is not an IPv4 CIDR"
        )));
    }
    if !matches!(v6.parse::<IpNet>(), Ok(IpNet::V6(_))) {
        return Err(skip(format!(
            "ConformanceInput::ipv6_route_cidr {v6:?} is not an IPv6 CIDR"
        )));
    }
    require_unused_cidr(ctx, v4).await?;
    require_unused_cidr(ctx, v6).await?;
    let hint = Ctx::name_hint(node, "");
    // As the route controller does for a dual-stack Node: one route per pod CIDR, both under
    // the Node's UID.
    ctx.create_route(node, v4, "").await?;
    ctx.create_route(node, v6, "").await?;
    let created = format!("after create_route of {v4} and of {v6}, both with name hint {hint:?}");
    let route_v4 = the_route_to(ctx, v4, &created).await?;
    the_route_to(ctx, v6, &created).await?;
    // The IPv4 route goes (e.g. the Node lost that pod CIDR); the IPv6 one must stay.
    ctx.delete_route(&route_v4).await?;
    let left = ctx.listed_with(v4).await?;
    if !left.is_empty() {
        return Err(fail(
            format!("no route to {v4} after delete_route"),
            format!("{left:?}"),
        ));
    }
    the_route_to(
        ctx,
        v6,
        &format!("after delete_route of the route to {v4} (same name hint)"),
    )
    .await?;
    // The controller creates the IPv6 route again after a lost answer or a restart.
    ctx.create_route(node, v6, "").await?;
    let route_v6 = the_route_to(
        ctx,
        v6,
        &format!("after create_route of the existing route to {v6} again"),
    )
    .await?;
    ctx.delete_route(&route_v6).await?;
    let left: Vec<Route> = ctx
        .list_routes()
        .await?
        .into_iter()
        .filter(|r| inside(v4, &r.destination_cidr) || inside(v6, &r.destination_cidr))
        .collect();
    if !left.is_empty() {
        return Err(fail(
            format!("no route inside {v4} or {v6} after deleting both routes"),
            format!("{left:?}"),
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------- cancellation & concurrency

/// Polls `fut` once (`after` zero) or for at most `after`, then drops it. Fails on a panic.
async fn cancel_after<T>(
    after: Duration,
    what: &str,
    fut: impl Future<Output = CloudResult<T>>,
) -> Step {
    let fut = AssertUnwindSafe(fut).catch_unwind();
    let polled = if after.is_zero() {
        // Exactly one poll, then drop: the cancellation point right after the first `.await`
        // that is pending.
        fut.now_or_never().map(Ok).unwrap_or_else(|| Err(()))
    } else {
        tokio::time::timeout(after, fut).await.map_err(|_| ())
    };
    match polled {
        Ok(Err(panic)) => Err(fail(
            format!("{what} not to panic"),
            format!("panicked: {}", panic_message(panic.as_ref())),
        )),
        // Finished in time (ok or error) or cancelled: both fine here.
        Ok(Ok(_)) | Err(_) => Ok(()),
    }
}

async fn cancellation(ctx: &mut Ctx<'_>) -> Step {
    let delays = [Duration::ZERO, ctx.input().cancel_after];
    let mut exercised = false;

    if let (Some(v2), Ok(nodes)) = (ctx.v2(), ctx.nodes()) {
        exercised = true;
        let node = &nodes[0];
        let name = name_of(node);
        let before = ctx.metadata(v2, node).await?;
        for after in delays {
            cancel_after(
                after,
                "a cancelled instance_metadata",
                v2.instance_metadata(node),
            )
            .await?;
            cancel_after(
                after,
                "a cancelled instance_exists",
                v2.instance_exists(node),
            )
            .await?;
            cancel_after(
                after,
                "a cancelled instance_shutdown",
                v2.instance_shutdown(node),
            )
            .await?;
            let again = ctx.metadata(v2, node).await?;
            if again != before {
                return Err(fail(
                    format!(
                        "instance_metadata of node {name:?} after a cancelled call to answer as before"
                    ),
                    format!("it changed: {}", metadata_diff(&before, &again)),
                ));
            }
        }
    }

    if let (Some(v1), Ok(nodes)) = (ctx.v1(), ctx.nodes()) {
        exercised = true;
        let node = &nodes[0];
        let name = name_of(node);
        let pid = ctx.provider_id_of(node).await.unwrap_or_default();
        let answers = || async {
            (
                ctx.call("instance_id", || v1.instance_id(&name)).await.ok(),
                ctx.call("node_addresses", || v1.node_addresses(&name))
                    .await
                    .ok(),
                ctx.call("instance_type", || v1.instance_type(&name))
                    .await
                    .ok(),
            )
        };
        let before = answers().await;
        for after in delays {
            cancel_after(
                after,
                "a cancelled node_addresses",
                v1.node_addresses(&name),
            )
            .await?;
            cancel_after(
                after,
                "a cancelled node_addresses_by_provider_id",
                v1.node_addresses_by_provider_id(&pid),
            )
            .await?;
            cancel_after(after, "a cancelled instance_id", v1.instance_id(&name)).await?;
            cancel_after(after, "a cancelled instance_type", v1.instance_type(&name)).await?;
            cancel_after(
                after,
                "a cancelled instance_type_by_provider_id",
                v1.instance_type_by_provider_id(&pid),
            )
            .await?;
            cancel_after(
                after,
                "a cancelled instance_exists_by_provider_id",
                v1.instance_exists_by_provider_id(&pid),
            )
            .await?;
            cancel_after(
                after,
                "a cancelled instance_shutdown_by_provider_id",
                v1.instance_shutdown_by_provider_id(&pid),
            )
            .await?;
            if let Some(zones) = ctx.provider().zones() {
                cancel_after(
                    after,
                    "a cancelled get_zone_by_provider_id",
                    zones.get_zone_by_provider_id(&pid),
                )
                .await?;
                cancel_after(
                    after,
                    "a cancelled get_zone_by_node_name",
                    zones.get_zone_by_node_name(&name),
                )
                .await?;
            }
            let again = answers().await;
            if again != before {
                return Err(fail(
                    format!(
                        "instance_id, node_addresses and instance_type of node {name:?} after cancelled legacy calls to answer as before: {before:?}"
                    ),
                    format!("{again:?}"),
                ));
            }
        }
    }

    if let (Ok((lb, svc)), Ok(hosts)) = (ctx.lb(), ctx.nodes()) {
        exercised = true;
        let cluster = ctx.cluster();
        let before = ctx.get_lb().await?.is_some();
        let state = |b: bool| if b { "exists" } else { "does not exist" };
        for after in delays {
            ctx.lb_touched = true;
            cancel_after(
                after,
                "a cancelled ensure_load_balancer",
                lb.ensure_load_balancer(cluster, svc, hosts),
            )
            .await?;
            ctx.ensure(hosts).await?;
            ctx.delete_lb().await?;
            let now = ctx.get_lb().await?.is_some();
            if now != before {
                return Err(fail(
                    format!(
                        "after a cancelled ensure_load_balancer, then ensure and ensure_load_balancer_deleted, the load balancer of {} to be as before ({})",
                        service_ref(svc),
                        state(before)
                    ),
                    format!("get_load_balancer: it {}", state(now)),
                ));
            }

            ctx.ensure(hosts).await?;
            cancel_after(
                after,
                "a cancelled get_load_balancer",
                lb.get_load_balancer(cluster, svc),
            )
            .await?;
            cancel_after(
                after,
                "a cancelled update_load_balancer",
                lb.update_load_balancer(cluster, svc, &hosts[..1]),
            )
            .await?;
            ctx.call("update_load_balancer", || {
                lb.update_load_balancer(cluster, svc, hosts)
            })
            .await
            .or_else(|e| {
                if e.is_implemented_elsewhere() {
                    Ok(())
                } else {
                    Err(e)
                }
            })
            .map_err(|e| {
                fail(
                    format!(
                        "update_load_balancer of {} after a cancelled update to succeed",
                        service_ref(svc)
                    ),
                    describe(&e),
                )
            })?;
            if ctx.get_lb().await?.is_none() {
                return Err(fail(
                    format!(
                        "get_load_balancer of {} to report it after a cancelled then a completed update_load_balancer",
                        service_ref(svc)
                    ),
                    "None",
                ));
            }
            cancel_after(
                after,
                "a cancelled ensure_load_balancer_deleted",
                lb.ensure_load_balancer_deleted(cluster, svc),
            )
            .await?;
            ctx.ensure(hosts).await?;
            ctx.delete_lb().await?;
            let now = ctx.get_lb().await?.is_some();
            if now != before {
                return Err(fail(
                    format!(
                        "after a cancelled ensure_load_balancer_deleted, then ensure and ensure_load_balancer_deleted, the load balancer of {} to be as before ({})",
                        service_ref(svc),
                        state(before)
                    ),
                    format!("get_load_balancer: it {}", state(now)),
                ));
            }
        }
    }

    if let Ok((routes, cidr, node)) = ctx.routes() {
        exercised = true;
        require_unused_cidr(ctx, cidr).await?;
        let cluster = ctx.cluster();
        let route = ctx.route_for(node, cidr);
        let hint = Ctx::name_hint(node, "");
        for after in delays {
            ctx.routes_touched = true;
            cancel_after(
                after,
                "a cancelled list_routes",
                routes.list_routes(cluster),
            )
            .await?;
            cancel_after(
                after,
                "a cancelled create_route",
                routes.create_route(cluster, &hint, &route),
            )
            .await?;
            for listed in ctx.listed_with(cidr).await? {
                ctx.delete_route(&listed).await?;
            }
            let left = ctx.listed_with(cidr).await?;
            if !left.is_empty() {
                return Err(fail(
                    format!(
                        "after a cancelled create_route, deleting every listed route to {cidr} to leave none"
                    ),
                    format!("{left:?}"),
                ));
            }
            ctx.create_route(node, cidr, "").await?;
            for listed in ctx.listed_with(cidr).await? {
                cancel_after(
                    after,
                    "a cancelled delete_route",
                    routes.delete_route(cluster, &listed),
                )
                .await?;
            }
            for listed in ctx.listed_with(cidr).await? {
                ctx.delete_route(&listed).await?;
            }
            let left = ctx.listed_with(cidr).await?;
            if !left.is_empty() {
                return Err(fail(
                    format!(
                        "after a cancelled delete_route, deleting every listed route to {cidr} to leave none"
                    ),
                    format!("{left:?}"),
                ));
            }
        }
    }

    if exercised {
        Ok(())
    } else {
        Err(skip(
            "nothing to cancel: no InstancesV2 with nodes, no LoadBalancer with a Service, no Routes with a CIDR",
        ))
    }
}

/// Runs `n` copies of a task at once on the runtime (threads, when it has several).
async fn parallel<T, F, Fut>(n: usize, make: F) -> Vec<Result<T, String>>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let handles: Vec<_> = (0..n).map(|i| tokio::spawn(make(i))).collect();
    let mut out = Vec::with_capacity(n);
    for handle in handles {
        out.push(handle.await.map_err(|e| {
            if e.is_panic() {
                format!("panicked: {}", panic_message(e.into_panic().as_ref()))
            } else {
                e.to_string()
            }
        }));
    }
    out
}

fn flatten<T>(r: Result<CloudResult<T>, String>) -> Result<T, String> {
    r.and_then(|inner| inner.map_err(|e| describe(&e)))
}

async fn concurrency(ctx: &mut Ctx<'_>) -> Step {
    let provider: Arc<dyn CloudProvider> = ctx.suite.provider.clone();
    let input = ctx.input();
    let (timeout, budget) = (input.call_timeout, input.retry_budget);
    let n = input.parallelism.max(1);
    let mut exercised = false;

    if let (Some(v2), Ok(nodes)) = (ctx.v2(), ctx.nodes()) {
        exercised = true;
        let mut sequential = Vec::new();
        for node in nodes {
            sequential.push(ctx.metadata(v2, node).await?);
        }
        let total = n.max(nodes.len());
        let answers = parallel(total, |i| {
            let provider = provider.clone();
            let node = nodes[i % nodes.len()].clone();
            async move {
                let Some(v2) = provider.instances_v2() else {
                    return Err(CloudError::msg("instances_v2() became None"));
                };
                call_with_retry(timeout, budget, "instance_metadata", || {
                    v2.instance_metadata(&node)
                })
                .await
            }
        })
        .await;
        for (i, answer) in answers.into_iter().enumerate() {
            let node = &nodes[i % nodes.len()];
            let expected = &sequential[i % nodes.len()];
            match flatten(answer) {
                Ok(meta) if &meta == expected => {}
                Ok(meta) => {
                    return Err(fail(
                        format!(
                            "parallel instance_metadata of node {:?} to answer as a sequential call",
                            name_of(node)
                        ),
                        format!("it differs: {}", metadata_diff(expected, &meta)),
                    ));
                }
                Err(e) => {
                    return Err(fail(
                        format!(
                            "parallel instance_metadata of node {:?} to succeed",
                            name_of(node)
                        ),
                        e,
                    ));
                }
            }
        }
    }

    if let (Ok((_, svc)), Ok(nodes)) = (ctx.lb(), ctx.nodes()) {
        exercised = true;
        let cluster = ctx.cluster().to_owned();
        let before = ctx.get_lb().await?.is_some();
        ctx.lb_touched = true;
        // Half the tasks ensure, the other half read while the writes are in flight.
        let answers = parallel(2 * n, |i| {
            let (provider, svc, nodes, cluster) = (
                provider.clone(),
                svc.clone(),
                nodes.to_vec(),
                cluster.clone(),
            );
            async move {
                let Some(lb) = provider.load_balancer() else {
                    return Err(CloudError::msg("load_balancer() became None"));
                };
                if i % 2 == 1 {
                    return call_with_retry(timeout, budget, "get_load_balancer", || {
                        lb.get_load_balancer(&cluster, &svc)
                    })
                    .await
                    .map(|_| ());
                }
                call_with_retry(timeout, budget, "ensure_load_balancer", || {
                    lb.ensure_load_balancer(&cluster, &svc, &nodes)
                })
                .await
                .map(|_| ())
            }
        })
        .await;
        for answer in answers {
            match flatten(answer) {
                Ok(_) => {}
                Err(e) if e.contains("implemented_elsewhere") => {
                    return Err(skip("ensure_load_balancer answers ImplementedElsewhere"));
                }
                Err(e) => {
                    return Err(fail(
                        format!(
                            "{n} parallel ensure_load_balancer of {} (with {n} get_load_balancer) to all succeed",
                            service_ref(svc)
                        ),
                        e,
                    ));
                }
            }
        }
        if ctx.get_lb().await?.is_none() {
            return Err(fail(
                format!(
                    "get_load_balancer of {} to report it after parallel ensure_load_balancer",
                    service_ref(svc)
                ),
                "None",
            ));
        }
        ctx.delete_lb().await?;
        let now = ctx.get_lb().await?.is_some();
        if now != before {
            return Err(fail(
                format!(
                    "after parallel ensure then ensure_load_balancer_deleted, get_load_balancer of {} to answer as before ({})",
                    service_ref(svc),
                    if before { "exists" } else { "does not exist" }
                ),
                if now {
                    "it exists"
                } else {
                    "it does not exist"
                },
            ));
        }
    }

    if let (Ok((_, cidr, _)), Ok(nodes)) = (ctx.routes(), ctx.nodes()) {
        exercised = true;
        let subnets = split_cidr(cidr, n);
        for subnet in &subnets {
            require_unused_cidr(ctx, subnet).await?;
        }
        ctx.routes_touched = true;
        let cluster = ctx.cluster().to_owned();
        let answers = parallel(subnets.len(), |i| {
            let node = nodes[i % nodes.len()].clone();
            let route = ctx.route_for(&node, &subnets[i]);
            let hint = Ctx::name_hint(&node, &format!("-{i}"));
            let (provider, cluster) = (provider.clone(), cluster.clone());
            async move {
                let Some(routes) = provider.routes() else {
                    return Err(CloudError::msg("routes() became None"));
                };
                call_with_retry(timeout, budget, "create_route", || {
                    routes.create_route(&cluster, &hint, &route)
                })
                .await
            }
        })
        .await;
        for (i, answer) in answers.into_iter().enumerate() {
            if let Err(e) = flatten(answer) {
                return Err(fail(
                    format!("parallel create_route of {} to succeed", subnets[i]),
                    e,
                ));
            }
        }
        let listed = ctx.list_routes().await?;
        let mut to_delete = Vec::new();
        for subnet in &subnets {
            let matching: Vec<&Route> = listed
                .iter()
                .filter(|r| same_cidr(&r.destination_cidr, subnet))
                .collect();
            if matching.len() != 1 {
                return Err(fail(
                    format!(
                        "exactly one route to {subnet} after {} parallel create_route calls",
                        subnets.len()
                    ),
                    format!("{matching:?}"),
                ));
            }
            to_delete.extend(matching.into_iter().cloned());
        }
        let answers = parallel(to_delete.len(), |i| {
            let route = to_delete[i].clone();
            let (provider, cluster) = (provider.clone(), cluster.clone());
            async move {
                let Some(routes) = provider.routes() else {
                    return Err(CloudError::msg("routes() became None"));
                };
                call_with_retry(timeout, budget, "delete_route", || {
                    routes.delete_route(&cluster, &route)
                })
                .await
            }
        })
        .await;
        for (i, answer) in answers.into_iter().enumerate() {
            if let Err(e) = flatten(answer) {
                return Err(fail(
                    format!(
                        "parallel delete_route of {} to succeed",
                        to_delete[i].destination_cidr
                    ),
                    e,
                ));
            }
        }
        let left: Vec<Route> = ctx
            .list_routes()
            .await?
            .into_iter()
            .filter(|r| subnets.iter().any(|s| same_cidr(&r.destination_cidr, s)))
            .collect();
        if !left.is_empty() {
            return Err(fail(
                "no route left after parallel delete_route of every created route",
                format!("{left:?}"),
            ));
        }
    }

    if exercised {
        Ok(())
    } else {
        Err(skip(
            "nothing to call in parallel: no InstancesV2 with nodes, no LoadBalancer with a Service, no Routes with a CIDR",
        ))
    }
}

/// Up to `n` distinct sub-networks of `cidr` (four bits longer prefix), or `cidr` alone when
/// it cannot be split.
fn split_cidr(cidr: &str, n: usize) -> Vec<String> {
    let Ok(net) = cidr.parse::<IpNet>() else {
        return vec![cidr.to_owned()];
    };
    let prefix = net.prefix_len().saturating_add(4).min(net.max_prefix_len());
    match net.subnets(prefix) {
        Ok(subnets) if prefix > net.prefix_len() => {
            subnets.take(n).map(|s| s.to_string()).collect()
        }
        _ => vec![net.trunc().to_string()],
    }
}

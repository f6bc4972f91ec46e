//! The route controller's pure planner: from the Nodes, the routes the cloud listed and the
//! cluster CIDRs, decide which routes to delete, which to create, and which
//! `NetworkUnavailable` condition each Node gets (reference §5.3).
//!
//! Nothing here does I/O; the shell in the parent module fetches, calls the cloud and writes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;

use ccm_core::{NodeView, Route};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The Node condition type the route controller owns.
pub(crate) const NETWORK_UNAVAILABLE: &str = "NetworkUnavailable";
/// Reason when every pod CIDR of the Node has its route.
pub(crate) const REASON_ROUTE_CREATED: &str = "RouteCreated";
/// Reason when a pod CIDR of the Node has no route (or the Node has routes but no pod CIDRs).
pub(crate) const REASON_NO_ROUTE_CREATED: &str = "NoRouteCreated";
/// Message with [`REASON_ROUTE_CREATED`] (Go's text).
pub(crate) const MESSAGE_ROUTE_CREATED: &str = "RouteController created a route";
/// Message with [`REASON_NO_ROUTE_CREATED`] (Go's text).
pub(crate) const MESSAGE_NO_ROUTE_CREATED: &str = "RouteController failed to create a route";

/// Parses `--cluster-cidr`: one CIDR, or a comma-separated dual-stack pair (one IPv4 and one
/// IPv6 CIDR). More than two CIDRs, or two of one family, is an error. The error text names
/// the problem; the caller adds the flag name and how to turn routes off.
///
/// A CIDR with host bits set (`10.0.0.1/16`) is accepted and means its network
/// (`10.0.0.0/16`), as Go's `net.ParseCIDR` does.
pub fn parse_cluster_cidrs(value: &str) -> Result<Vec<IpNet>, String> {
    if value.trim().is_empty() {
        return Err("no cluster CIDR given".to_owned());
    }
    let mut cidrs = Vec::new();
    for part in value.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err(format!("empty CIDR in {value:?}"));
        }
        let net: IpNet = part
            .parse()
            .map_err(|e| format!("invalid CIDR {part:?} in {value:?}: {e}"))?;
        cidrs.push(net.trunc());
    }
    validate_cluster_cidrs(&cidrs)?;
    Ok(cidrs)
}

/// Checks a list of cluster CIDRs: one, or one IPv4 and one IPv6.
pub fn validate_cluster_cidrs(cidrs: &[IpNet]) -> Result<(), String> {
    match cidrs {
        [] => Err("no cluster CIDR given".to_owned()),
        [_] => Ok(()),
        [a, b] => {
            if matches!(
                (a, b),
                (IpNet::V4(_), IpNet::V6(_)) | (IpNet::V6(_), IpNet::V4(_))
            ) {
                Ok(())
            } else {
                Err(format!(
                    "two cluster CIDRs ({a}, {b}) must be a dual-stack pair: one IPv4 and one IPv6"
                ))
            }
        }
        more => Err(format!(
            "{} cluster CIDRs given; at most 2 are allowed (one IPv4 and one IPv6)",
            more.len()
        )),
    }
}

/// The current `NetworkUnavailable` condition of a Node, as far as the planner cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CurrentCondition {
    /// `True`, `False` or `Unknown`.
    pub(crate) status: String,
    /// The condition's reason (may be empty).
    pub(crate) reason: String,
}

/// What the planner needs to know about one Node.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct NodeInfo {
    /// `metadata.name`.
    pub(crate) name: String,
    /// `metadata.uid`, passed as the route's name hint.
    pub(crate) uid: String,
    /// `spec.podCIDRs` (falling back to `spec.podCIDR`).
    pub(crate) pod_cidrs: Vec<String>,
    /// `status.addresses`.
    pub(crate) addresses: Vec<NodeAddress>,
    /// The Node's current `NetworkUnavailable` condition.
    pub(crate) network_unavailable: Option<CurrentCondition>,
    /// Whether the Node is ours (`machinery/ownership.rs`). A foreign Node gets no route and
    /// no condition, and the routes that target it are left as they are.
    pub(crate) managed: bool,
}

impl NodeInfo {
    /// Extracts what the planner needs from a cached Node.
    pub(crate) fn from_view(node: &NodeView) -> Self {
        let mut pod_cidrs: Vec<String> = node
            .pod_cidrs()
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect();
        if pod_cidrs.is_empty()
            && let Some(cidr) = node.pod_cidr()
            && !cidr.is_empty()
        {
            pod_cidrs.push(cidr.to_owned());
        }
        let network_unavailable = node
            .condition(NETWORK_UNAVAILABLE)
            .map(|c| CurrentCondition {
                status: c.status().to_owned(),
                reason: c.reason().unwrap_or_default().to_owned(),
            });
        NodeInfo {
            name: node.name().to_owned(),
            uid: node.uid().unwrap_or_default().to_owned(),
            pod_cidrs,
            addresses: node
                .addresses()
                .map(|(type_, address)| NodeAddress {
                    type_: type_.to_owned(),
                    address: address.to_owned(),
                })
                .collect(),
            network_unavailable,
            managed: true,
        }
    }

    /// Extracts what the planner needs from a Node (as [`NodeInfo::from_view`]).
    #[cfg(test)]
    pub(crate) fn from_node(node: &Node) -> Self {
        Self::from_view(&NodeView::from_node(node))
    }
}

/// What happens to one pod CIDR of a Node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RouteAction {
    /// A route exists and is up to date.
    Keep,
    /// No route exists: create one.
    Add,
    /// A route exists but the Node's addresses changed (the provider tracks them): delete it
    /// and create it again.
    Update,
}

/// A route to create.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RouteCreate {
    /// The name hint passed to the provider: the Node's UID.
    pub(crate) name_hint: String,
    /// The route (target node, its addresses, destination CIDR; no name).
    pub(crate) route: Route,
}

impl RouteCreate {
    /// The (node, CIDR) key of this route.
    pub(crate) fn key(&self) -> RouteKey {
        RouteKey::new(&self.route.target_node, &self.route.destination_cidr)
    }
}

/// Identifies one pod CIDR of one Node. The CIDR is normalised (a parsable CIDR is written
/// in its canonical form) so that `fd00:0:0::/64` and `fd00::/64` are the same key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct RouteKey {
    /// The Node's name.
    pub(crate) node: String,
    /// The normalised destination CIDR.
    pub(crate) cidr: String,
}

impl RouteKey {
    /// The key for `node` and `cidr` (normalised).
    pub(crate) fn new(node: &str, cidr: &str) -> Self {
        RouteKey {
            node: node.to_owned(),
            cidr: normalize_cidr(cidr),
        }
    }
}

/// Canonical text of a CIDR when it parses (Go compares the strings; comparing the parsed
/// networks avoids deleting and re-creating a route a provider lists in another spelling),
/// the text itself otherwise.
pub(crate) fn normalize_cidr(cidr: &str) -> String {
    match cidr.trim().parse::<IpNet>() {
        Ok(net) => net.to_string(),
        Err(_) => cidr.to_owned(),
    }
}

/// The per-Node part of a plan: every pod CIDR and its action.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct NodePlan {
    /// The Node's UID.
    pub(crate) uid: String,
    /// Action per (normalised) pod CIDR. Empty for a Node that has routes but no pod CIDRs.
    pub(crate) cidrs: BTreeMap<String, RouteAction>,
    /// The Node's `NetworkUnavailable` condition before this reconcile.
    pub(crate) current: Option<CurrentCondition>,
}

/// The outcome of planning one reconcile.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct RoutePlan {
    /// Routes to delete (as the provider listed them).
    pub(crate) deletes: Vec<Route>,
    /// Routes to create.
    pub(crate) creates: Vec<RouteCreate>,
    /// True when every delete must finish before the first create starts: the first listed
    /// route has `enable_node_addresses` (so an update is a delete then a create), as in Go,
    /// or a create replaces a route being deleted for the same node and CIDR (a blackhole).
    pub(crate) deletes_before_creates: bool,
    /// Nodes that get a `NetworkUnavailable` condition, by name: those with pod CIDRs and
    /// those with routes but no pod CIDRs.
    pub(crate) nodes: BTreeMap<String, NodePlan>,
}

/// The `NetworkUnavailable` condition the controller wants on a Node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DesiredCondition {
    /// `"True"` or `"False"`.
    pub(crate) status: &'static str,
    /// [`REASON_ROUTE_CREATED`] or [`REASON_NO_ROUTE_CREATED`].
    pub(crate) reason: &'static str,
    /// The matching message.
    pub(crate) message: &'static str,
}

impl DesiredCondition {
    /// `False` / `RouteCreated`: every pod CIDR has its route.
    pub(crate) const ROUTE_CREATED: DesiredCondition = DesiredCondition {
        status: "False",
        reason: REASON_ROUTE_CREATED,
        message: MESSAGE_ROUTE_CREATED,
    };
    /// `True` / `NoRouteCreated`.
    pub(crate) const NO_ROUTE_CREATED: DesiredCondition = DesiredCondition {
        status: "True",
        reason: REASON_NO_ROUTE_CREATED,
        message: MESSAGE_NO_ROUTE_CREATED,
    };

    /// Whether a Node whose condition is `current` needs this one written: skipped when the
    /// status **and** the reason are already the same (§5.3 step 6).
    pub(crate) fn differs_from(&self, current: Option<&CurrentCondition>) -> bool {
        match current {
            Some(c) => c.status != self.status || c.reason != self.reason,
            None => true,
        }
    }
}

/// The patch of a Node's `status` subresource that writes `desired` as its
/// `NetworkUnavailable` condition, decided on `node` (normally the informer's cached copy), or
/// `None` when the condition already has the desired status and reason (Go's skip rule).
///
/// `lastHeartbeatTime` is `now`; `lastTransitionTime` is `now` when the status changes and is
/// kept from the current condition when the status stays the same (Go sets `now` on every
/// write). The patch is one of two kinds:
///
/// - a JSON **object**, a strategic-merge patch of this one condition, merged by its `type`
///   (the merge key of `status.conditions`), so no other condition is touched, as Go's
///   `nodeutil.SetNodeCondition`: when the transition time is `now`, the patch is right
///   whatever the Node holds now and carries no precondition;
/// - a JSON **array**, an RFC 6902 JSON patch that replaces the condition at its position
///   among `node`'s conditions (so `node` must be the whole Node, not a copy stripped of
///   conditions): when it keeps the transition time, a value read from `node`. Its
///   `test`s guard exactly that condition (type, status, `lastTransitionTime`) and the
///   Node's UID: if it changed since, the API server answers 422 and the caller decides again
///   on a fresh read. A write to anything else (kubelet's heartbeats of its own conditions,
///   labels) fails no test; a `resourceVersion` precondition, which every such write breaks,
///   made those cost a conflict and a round trip.
pub(crate) fn condition_patch(
    node: &Node,
    desired: &DesiredCondition,
    now: &Time,
) -> Option<serde_json::Value> {
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let position = conditions
        .iter()
        .position(|c| c.type_ == NETWORK_UNAVAILABLE);
    let existing = position.map(|i| &conditions[i]);
    let current = existing.map(|c| CurrentCondition {
        status: c.status.clone(),
        reason: c.reason.clone().unwrap_or_default(),
    });
    if !desired.differs_from(current.as_ref()) {
        return None;
    }
    let kept_transition = existing
        .filter(|c| c.status == desired.status)
        .and_then(|c| c.last_transition_time.as_ref());
    let condition = serde_json::json!({
        "type": NETWORK_UNAVAILABLE,
        "status": desired.status,
        "reason": desired.reason,
        "message": desired.message,
        "lastTransitionTime": kept_transition.unwrap_or(now),
        "lastHeartbeatTime": now,
    });
    let (Some(i), Some(kept), Some(existing)) = (position, kept_transition, existing) else {
        return Some(serde_json::json!({ "status": { "conditions": [condition] } }));
    };
    let path = format!("/status/conditions/{i}");
    let test = |field: &str, value: serde_json::Value| serde_json::json!({ "op": "test", "path": format!("{path}/{field}"), "value": value });
    let mut ops = Vec::new();
    if let Some(uid) = &node.metadata.uid {
        ops.push(serde_json::json!({ "op": "test", "path": "/metadata/uid", "value": uid }));
    }
    ops.push(test("type", serde_json::json!(NETWORK_UNAVAILABLE)));
    ops.push(test("status", serde_json::json!(existing.status)));
    ops.push(test("lastTransitionTime", serde_json::json!(kept)));
    ops.push(serde_json::json!({ "op": "replace", "path": path, "value": condition }));
    Some(serde_json::Value::Array(ops))
}

/// Whether the controller is responsible for a route: its destination CIDR parses and its
/// first or last address lies inside one of the cluster CIDRs (Go's `isResponsibleForRoute`).
pub(crate) fn is_responsible(cluster_cidrs: &[IpNet], route: &Route) -> bool {
    let Ok(net) = route.destination_cidr.trim().parse::<IpNet>() else {
        return false;
    };
    let first: IpAddr = net.network();
    let last: IpAddr = net.broadcast();
    cluster_cidrs.iter().any(|c| {
        let c = c.trunc();
        c.contains(&first) || c.contains(&last)
    })
}

/// Go's `equalNodeAddrs`: the same length and every address of one list is in the other.
pub(crate) fn equal_node_addresses(a: &[NodeAddress], b: &[NodeAddress]) -> bool {
    a.len() == b.len() && a.iter().all(|x| b.contains(x)) && b.iter().all(|x| a.contains(x))
}

/// Decides the action for one pod CIDR of a Node given that Node's existing routes (Go's
/// `getRouteAction`): the first route with the same CIDR decides.
///
/// Deliberately better than Go: a blackhole route does not count as the Node's route. Go
/// marks the CIDR `keep`, deletes the blackhole, reports `RouteCreated`, and leaves the Node
/// without a route until the next reconcile; here the CIDR is `add`, so the blackhole is
/// replaced in the same pass (deletes first, see [`RoutePlan::deletes_before_creates`]).
fn route_action(routes: &[&Route], cidr: &str, addresses: &[NodeAddress]) -> RouteAction {
    for route in routes {
        if !route.blackhole && normalize_cidr(&route.destination_cidr) == cidr {
            if !route.enable_node_addresses
                || equal_node_addresses(addresses, &route.target_node_addresses)
            {
                return RouteAction::Keep;
            }
            return RouteAction::Update;
        }
    }
    RouteAction::Add
}

/// Plans one reconcile (reference §5.3 steps 2–5).
pub(crate) fn plan(nodes: &[NodeInfo], routes: &[Route], cluster_cidrs: &[IpNet]) -> RoutePlan {
    // Step 2: index existing routes by target node; an empty target matches no node.
    let mut by_node: HashMap<&str, Vec<&Route>> = HashMap::new();
    for route in routes {
        if !route.target_node.is_empty() {
            by_node
                .entry(route.target_node.as_str())
                .or_default()
                .push(route);
        }
    }

    // Step 3: an action per pod CIDR of every Node that has pod CIDRs; an empty entry for a
    // Node that has routes but no pod CIDRs.
    let mut out = RoutePlan {
        deletes_before_creates: routes.first().is_some_and(|r| r.enable_node_addresses),
        ..RoutePlan::default()
    };
    let mut seen_names: HashSet<&str> = HashSet::new();
    let mut foreign: HashSet<&str> = HashSet::new();
    for node in nodes {
        if !seen_names.insert(node.name.as_str()) {
            continue;
        }
        if !node.managed {
            foreign.insert(node.name.as_str());
            continue;
        }
        let existing = by_node.get(node.name.as_str());
        if node.pod_cidrs.is_empty() && existing.is_none() {
            continue;
        }
        let mut cidrs = BTreeMap::new();
        for raw in &node.pod_cidrs {
            let cidr = normalize_cidr(raw);
            if cidrs.contains_key(&cidr) {
                continue;
            }
            let action = route_action(
                existing.map(Vec::as_slice).unwrap_or_default(),
                &cidr,
                &node.addresses,
            );
            if action != RouteAction::Keep {
                out.creates.push(RouteCreate {
                    name_hint: node.uid.clone(),
                    route: Route {
                        name: String::new(),
                        target_node: node.name.clone(),
                        enable_node_addresses: false,
                        target_node_addresses: node.addresses.clone(),
                        destination_cidr: raw.clone(),
                        blackhole: false,
                    },
                });
            }
            cidrs.insert(cidr, action);
        }
        out.nodes.insert(
            node.name.clone(),
            NodePlan {
                uid: node.uid.clone(),
                cidrs,
                current: node.network_unavailable.clone(),
            },
        );
    }

    // Step 4: delete routes we are responsible for that are blackholes, or whose (node, CIDR)
    // has no action, or whose action is an update.
    for route in routes {
        if !is_responsible(cluster_cidrs, route) || foreign.contains(route.target_node.as_str()) {
            continue;
        }
        let action = out
            .nodes
            .get(&route.target_node)
            .filter(|_| !route.target_node.is_empty())
            .and_then(|n| n.cidrs.get(&normalize_cidr(&route.destination_cidr)));
        let delete = route.blackhole
            || match action {
                None | Some(RouteAction::Update) => true,
                Some(RouteAction::Keep | RouteAction::Add) => false,
            };
        if delete {
            out.deletes.push(route.clone());
        }
    }
    if !out.deletes_before_creates {
        let creates: HashSet<RouteKey> = out.creates.iter().map(RouteCreate::key).collect();
        out.deletes_before_creates = out
            .deletes
            .iter()
            .any(|r| creates.contains(&RouteKey::new(&r.target_node, &r.destination_cidr)));
    }
    out
}

/// The condition each planned Node gets once the creates ran, given which creates failed
/// (§5.3 step 6), for the Nodes whose current condition differs (status or reason).
pub(crate) fn condition_updates(
    plan: &RoutePlan,
    failed_creates: &HashSet<RouteKey>,
) -> Vec<(String, DesiredCondition)> {
    let mut out = Vec::new();
    for (name, node) in &plan.nodes {
        let desired = desired_condition(node.cidrs.iter().map(|(cidr, action)| {
            *action == RouteAction::Keep
                || !failed_creates.contains(&RouteKey {
                    node: name.clone(),
                    cidr: cidr.clone(),
                })
        }));
        if desired.differs_from(node.current.as_ref()) {
            out.push((name.clone(), desired));
        }
    }
    out
}

/// The condition for a Node whose pod CIDRs are routed (`true`) or not (`false`): all routed
/// → `False`/`RouteCreated`; none known (routes but no pod CIDRs) or one missing →
/// `True`/`NoRouteCreated`.
pub(crate) fn desired_condition(routed: impl IntoIterator<Item = bool>) -> DesiredCondition {
    let mut any = false;
    for ok in routed {
        if !ok {
            return DesiredCondition::NO_ROUTE_CREATED;
        }
        any = true;
    }
    if any {
        DesiredCondition::ROUTE_CREATED
    } else {
        DesiredCondition::NO_ROUTE_CREATED
    }
}

#[cfg(test)]
mod tests;

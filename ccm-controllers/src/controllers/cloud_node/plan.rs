//! Pure planning for the cloud-node controller: given a Node (as cached or freshly read) and the
//! cloud's answer, compute what to change. No I/O here; the shell in `sync.rs` fetches, calls
//! the cloud and writes.
//!
//! Rules follow Go's `controllers/node` (reference §2.2–§2.4) except where noted:
//! - address change detection compares, per address type, the *ordered list* of addresses of
//!   that type (Go keeps one address per type in a map, so it misses some changes and reports
//!   others that are not there when several addresses share a type).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use ccm_core::well_known::{
    ANNOTATION_PROVIDED_NODE_IP, LABEL_FAILURE_DOMAIN_BETA_REGION, LABEL_FAILURE_DOMAIN_BETA_ZONE,
    LABEL_INSTANCE_TYPE, LABEL_INSTANCE_TYPE_BETA, LABEL_TOPOLOGY_REGION, LABEL_TOPOLOGY_ZONE,
    TAINT_UNINITIALIZED,
};
use ccm_core::{InstanceMetadata, Node, NodeAddress};

use crate::controllers::node::spec::SpecUpdate;
use crate::controllers::node::{label, node_name, node_provider_id, taints};

/// The `Hostname` address type.
pub(crate) const ADDRESS_HOSTNAME: &str = "Hostname";

/// Label pairs reconciled on initialised nodes: (beta = source of truth, GA = kept equal).
pub(crate) const LABEL_RECONCILE: [(&str, &str); 3] = [
    (LABEL_FAILURE_DOMAIN_BETA_ZONE, LABEL_TOPOLOGY_ZONE),
    (LABEL_FAILURE_DOMAIN_BETA_REGION, LABEL_TOPOLOGY_REGION),
    (LABEL_INSTANCE_TYPE_BETA, LABEL_INSTANCE_TYPE),
];

/// The step of a node's initialisation that failed, named in the Warning event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Getting the instance metadata from the cloud.
    Metadata,
    /// Setting `spec.providerID`.
    ProviderId,
    /// Validating `alpha.kubernetes.io/provided-node-ip` against the cloud's addresses.
    NodeIp,
    /// Writing labels, providerID and taint removal.
    Update,
    /// Writing `status.addresses`.
    Addresses,
}

impl Step {
    /// A short name for logs and event notes.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Step::Metadata => "metadata",
            Step::ProviderId => "providerID",
            Step::NodeIp => "node IP",
            Step::Update => "update",
            Step::Addresses => "addresses",
        }
    }
}

/// Why `alpha.kubernetes.io/provided-node-ip` cannot be applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NodeIpError {
    /// The annotation does not parse (Go's `ParseNodeIPAnnotation`).
    #[error("failed to parse node IP {value:?}: {reason}")]
    Parse {
        /// The annotation's value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A requested IP is not among the cloud's addresses.
    #[error("failed to get node address from cloud provider that matches ip: {0}")]
    NotFound(IpAddr),
}

/// Why a tainted node cannot be initialised from the metadata it got.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum InitError {
    /// Neither the cloud nor the node has a provider ID (Go PR #123713).
    #[error("cloud provider does not set node provider ID")]
    MissingProviderId,
    /// The kubelet-provided node IP is not valid for this instance.
    #[error("provided node ip for node {node:?} is not valid: {source}")]
    InvalidNodeIp {
        /// The node's name.
        node: String,
        /// Why.
        source: NodeIpError,
    },
}

impl InitError {
    /// The step named in the Warning event.
    pub(crate) fn step(&self) -> Step {
        match self {
            InitError::MissingProviderId => Step::ProviderId,
            InitError::InvalidNodeIp { .. } => Step::NodeIp,
        }
    }
}

/// What initialising a tainted node changes.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct InitPlan {
    /// Labels, providerID and taint removal (one write on the node).
    pub(crate) spec: SpecUpdate,
    /// The new `status.addresses`, when they differ from the node's (one status write).
    pub(crate) addresses: Option<Vec<NodeAddress>>,
    /// Additional labels that were discarded, for logging.
    pub(crate) discarded_labels: Vec<String>,
}

/// Whether the node carries the `node.cloudprovider.kubernetes.io/uninitialized` taint (any
/// effect).
pub(crate) fn has_uninitialized_taint(node: &Node) -> bool {
    taints(node).iter().any(|t| t.key == TAINT_UNINITIALIZED)
}

/// Plans the initialisation of a tainted node (Go's `syncNode` modifiers plus the address
/// update that follows it).
///
/// `require_provider_id`: whether an empty providerID (from the cloud and on the node) is an
/// error. True on the `InstancesV2` path (Go PR #123713); false on the legacy path, where an
/// `instance_id` answering `NotImplemented` lets initialisation continue without one.
pub(crate) fn plan_init(
    node: &Node,
    meta: &InstanceMetadata,
    require_provider_id: bool,
) -> Result<InitPlan, InitError> {
    let mut spec = SpecUpdate::default();

    // providerID: set only when the node has none (it is immutable once set).
    if node_provider_id(node).is_empty() {
        if !meta.provider_id.is_empty() {
            spec.provider_id = Some(meta.provider_id.clone());
        } else if require_provider_id {
            return Err(InitError::MissingProviderId);
        }
    }

    // The kubelet-provided node IP must be one of the cloud's addresses, or the node stays
    // tainted (checked against the cloud's list, before kubelet's Hostname is merged in).
    if let Some(provided) = provided_node_ip(node) {
        addresses_from_provided_node_ip(provided, &meta.node_addresses).map_err(|source| {
            InitError::InvalidNodeIp {
                node: node_name(node).to_owned(),
                source,
            }
        })?;
    }

    // Well-known labels: set (Go overwrites them) when the cloud knows the value.
    let mut wanted: Vec<(&str, &str)> = Vec::new();
    if !meta.instance_type.is_empty() {
        wanted.push((LABEL_INSTANCE_TYPE_BETA, &meta.instance_type));
        wanted.push((LABEL_INSTANCE_TYPE, &meta.instance_type));
    }
    if !meta.zone.is_empty() {
        wanted.push((LABEL_FAILURE_DOMAIN_BETA_ZONE, &meta.zone));
        wanted.push((LABEL_TOPOLOGY_ZONE, &meta.zone));
    }
    if !meta.region.is_empty() {
        wanted.push((LABEL_FAILURE_DOMAIN_BETA_REGION, &meta.region));
        wanted.push((LABEL_TOPOLOGY_REGION, &meta.region));
    }
    for (k, v) in wanted {
        if label(node, k) != Some(v) {
            spec.labels.insert(k.to_owned(), v.to_owned());
        }
    }

    // Additional labels: never in the kubernetes.io / k8s.io namespaces, never overwriting.
    let mut discarded_labels = Vec::new();
    for (k, v) in &meta.additional_labels {
        if is_kubernetes_label(k) {
            discarded_labels.push(format!("{k}={v} (reserved kubernetes.io/k8s.io namespace)"));
            continue;
        }
        match label(node, k) {
            Some(existing) => {
                if existing != v {
                    discarded_labels.push(format!(
                        "{k}={v} (conflicts with existing value {existing:?})"
                    ));
                }
            }
            None => {
                spec.labels.insert(k.clone(), v.clone());
            }
        }
    }

    // Remove every uninitialized taint, whatever its effect; keep all others in order.
    let current = taints(node);
    if current.iter().any(|t| t.key == TAINT_UNINITIALIZED) {
        spec.taints = Some(
            current
                .iter()
                .filter(|t| t.key != TAINT_UNINITIALIZED)
                .cloned()
                .collect(),
        );
    }

    let addresses = desired_addresses(node, &meta.node_addresses).map_err(|source| {
        InitError::InvalidNodeIp {
            node: node_name(node).to_owned(),
            source,
        }
    })?;

    Ok(InitPlan {
        spec,
        addresses,
        discarded_labels,
    })
}

/// Go's `isKubernetesLabel`: the key matches `(^|\.)(kubernetes|k8s)\.io/`. Hand-written
/// instead of pulling in a regex for one pattern.
pub(crate) fn is_kubernetes_label(key: &str) -> bool {
    ["kubernetes.io/", "k8s.io/"].iter().any(|domain| {
        key.match_indices(domain)
            .any(|(i, _)| i == 0 || key.as_bytes().get(i - 1) == Some(&b'.'))
    })
}

/// Label reconcile of an initialised node (Go's `reconcileNodeLabels`): for each beta/GA pair,
/// when the beta label exists and the GA label is missing or differs, set the GA label to the
/// beta value. No cloud call.
pub(crate) fn plan_label_reconcile(node: &Node) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (primary, secondary) in LABEL_RECONCILE {
        let Some(value) = label(node, primary) else {
            continue;
        };
        if label(node, secondary) != Some(value) {
            out.insert(secondary.to_owned(), value.to_owned());
        }
    }
    out
}

/// The spec update of the label reconcile: the GA labels to set, planned from their beta
/// labels (whose values are preconditions of the write).
pub(crate) fn label_reconcile_update(node: &Node) -> SpecUpdate {
    let labels = plan_label_reconcile(node);
    let read_labels = LABEL_RECONCILE
        .iter()
        .filter(|(_, secondary)| labels.contains_key(*secondary))
        .map(|(primary, _)| (*primary).to_owned())
        .collect();
    SpecUpdate {
        labels,
        read_labels,
        ..Default::default()
    }
}

/// Label reconciliation with the cloud (`--reconcile-cloud-labels`, beyond Go, which writes
/// these labels once, at initialisation): the labels whose value differs from the cloud's
/// answer at the periodic refresh, planned from the Node's label lookup `label` (the cached
/// view's, so an unchanged Node costs no copy).
///
/// The rule (docs/controllers.md, "Labels kept in step with the cloud"):
/// - zone, region and instance type, GA and beta labels alike, take the cloud's value when
///   the cloud knows it (not empty): a label an operator edited or removed is set back;
///   an empty value from the cloud leaves the label as it is;
/// - the provider's additional labels take the cloud's value too (added when missing,
///   changed when different), except in the `kubernetes.io`/`k8s.io` namespaces, which are
///   never written (as at initialisation);
/// - nothing is ever removed: a label the cloud no longer reports stays as it is.
pub(crate) fn plan_cloud_labels<'a>(
    label: impl Fn(&str) -> Option<&'a str>,
    meta: &InstanceMetadata,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let well_known = [
        (LABEL_FAILURE_DOMAIN_BETA_ZONE, &meta.zone),
        (LABEL_TOPOLOGY_ZONE, &meta.zone),
        (LABEL_FAILURE_DOMAIN_BETA_REGION, &meta.region),
        (LABEL_TOPOLOGY_REGION, &meta.region),
        (LABEL_INSTANCE_TYPE_BETA, &meta.instance_type),
        (LABEL_INSTANCE_TYPE, &meta.instance_type),
    ];
    for (key, value) in well_known {
        if !value.is_empty() && label(key) != Some(value.as_str()) {
            out.insert(key.to_owned(), value.clone());
        }
    }
    for (key, value) in &meta.additional_labels {
        if !is_kubernetes_label(key) && label(key) != Some(value.as_str()) {
            out.insert(key.clone(), value.clone());
        }
    }
    out
}

/// The spec update of the label reconciliation with the cloud on `node` (its labels'
/// current values are the write's preconditions).
pub(crate) fn cloud_labels_update(node: &Node, meta: &InstanceMetadata) -> SpecUpdate {
    SpecUpdate {
        labels: plan_cloud_labels(|k| label(node, k), meta),
        ..Default::default()
    }
}

/// The metric label of a reconciled label key: the key itself for the well-known labels, and
/// `additional` for a provider's own (their keys are the provider's, unbounded).
pub(crate) fn cloud_label_metric_key(key: &str) -> &'static str {
    const WELL_KNOWN: [&str; 6] = [
        LABEL_FAILURE_DOMAIN_BETA_ZONE,
        LABEL_TOPOLOGY_ZONE,
        LABEL_FAILURE_DOMAIN_BETA_REGION,
        LABEL_TOPOLOGY_REGION,
        LABEL_INSTANCE_TYPE_BETA,
        LABEL_INSTANCE_TYPE,
    ];
    WELL_KNOWN
        .into_iter()
        .find(|k| *k == key)
        .unwrap_or("additional")
}

/// The node's `alpha.kubernetes.io/provided-node-ip` annotation, when present (even empty).
pub(crate) fn provided_node_ip(node: &Node) -> Option<&str> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_PROVIDED_NODE_IP))
        .map(String::as_str)
}

/// The addresses the node should have given the cloud's list (Go's `updateNodeAddress`
/// rules), or `None` when nothing is to be written: the cloud returned no addresses, or the
/// result equals what the node has.
///
/// 1. Cloud list without a `Hostname` entry: the node's existing `Hostname` address(es)
///    (written by kubelet) are appended.
/// 2. With `alpha.kubernetes.io/provided-node-ip`: see [`addresses_from_provided_node_ip`].
/// 3. Change detection: see [`addresses_changed`].
pub(crate) fn desired_addresses(
    node: &Node,
    cloud: &[NodeAddress],
) -> Result<Option<Vec<NodeAddress>>, NodeIpError> {
    if cloud.is_empty() {
        return Ok(None);
    }
    let current = current_addresses(node);
    let mut addresses = cloud.to_vec();
    if !addresses.iter().any(|a| a.type_ == ADDRESS_HOSTNAME) {
        addresses.extend(
            current
                .iter()
                .filter(|a| a.type_ == ADDRESS_HOSTNAME)
                .cloned(),
        );
    }
    if let Some(provided) = provided_node_ip(node) {
        addresses = addresses_from_provided_node_ip(provided, &addresses)?;
    }
    Ok(addresses_changed(current, &addresses).then_some(addresses))
}

/// The periodic refresh of an initialised node's addresses: like [`desired_addresses`], but a
/// node that is still tainted is left to initialisation (`None`).
pub(crate) fn plan_address_refresh(
    node: &Node,
    cloud: &[NodeAddress],
) -> Result<Option<Vec<NodeAddress>>, NodeIpError> {
    if has_uninitialized_taint(node) {
        return Ok(None);
    }
    desired_addresses(node, cloud)
}

fn current_addresses(node: &Node) -> &[NodeAddress] {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or_default()
}

/// Whether `new` differs from `old`: different lengths, or for some address type a different
/// ordered list of addresses of that type. Keyed by type like Go (the relative order of
/// addresses of *different* types does not count), but exact within a type, where Go's
/// one-entry-per-type map both misses changes and reports phantom ones.
pub(crate) fn addresses_changed(old: &[NodeAddress], new: &[NodeAddress]) -> bool {
    fn by_type(list: &[NodeAddress]) -> BTreeMap<&str, Vec<&str>> {
        let mut map: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for a in list {
            map.entry(a.type_.as_str())
                .or_default()
                .push(a.address.as_str());
        }
        map
    }
    old.len() != new.len() || by_type(old) != by_type(new)
}

/// Go's `GetNodeAddressesFromNodeIP`: applies kubelet's `--node-ip` (the
/// `alpha.kubernetes.io/provided-node-ip` annotation, one IP or a dual-stack pair) to the
/// cloud's addresses.
///
/// Every requested IP must equal some cloud address (else an error and no update). Matching
/// addresses come first, in request order; for every address type that matched, all other
/// addresses of that type are dropped; addresses of the other types follow in cloud order.
pub(crate) fn addresses_from_provided_node_ip(
    provided: &str,
    cloud: &[NodeAddress],
) -> Result<Vec<NodeAddress>, NodeIpError> {
    let ips = parse_node_ip_annotation(provided)?;
    let mut out = Vec::new();
    let mut matched_types: Vec<&str> = Vec::new();
    for ip in ips {
        let mut matched = false;
        for a in cloud {
            if parse_ip_sloppy(&a.address).is_some_and(|c| c.to_canonical() == ip.to_canonical()) {
                out.push(a.clone());
                if !matched_types.contains(&a.type_.as_str()) {
                    matched_types.push(a.type_.as_str());
                }
                matched = true;
            }
        }
        if !matched {
            return Err(NodeIpError::NotFound(ip));
        }
    }
    out.extend(
        cloud
            .iter()
            .filter(|a| !matched_types.contains(&a.type_.as_str()))
            .cloned(),
    );
    Ok(out)
}

/// Go's `ParseNodeIPAnnotation` (strict): a comma-separated list of one IP, or two IPs of
/// different families, neither unspecified when two.
pub(crate) fn parse_node_ip_annotation(value: &str) -> Result<Vec<IpAddr>, NodeIpError> {
    let err = |reason: String| NodeIpError::Parse {
        value: value.to_owned(),
        reason,
    };
    let mut ips = Vec::new();
    for part in value.split(',') {
        match parse_ip_sloppy(part) {
            Some(ip) => ips.push(ip.to_canonical()),
            None => return Err(err(format!("could not parse {part:?}"))),
        }
    }
    let dual_same_family = ips.len() == 2 && ips[0].is_ipv6() == ips[1].is_ipv6();
    if ips.len() > 2 || dual_same_family {
        return Err(err(
            "must contain either a single IP or a dual-stack pair of IPs".into(),
        ));
    }
    if ips.len() == 2 && ips.iter().any(IpAddr::is_unspecified) {
        return Err(err(
            "dual-stack node IP cannot include '0.0.0.0' or '::'".into()
        ));
    }
    Ok(ips)
}

/// Go's `netutils.ParseIPSloppy`: like the standard parser, but IPv4 octets may carry leading
/// zeros (read as decimal, as Go did before 1.17).
pub(crate) fn parse_ip_sloppy(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() != 4 {
        return None;
    }
    let mut octets = [0u8; 4];
    for (o, p) in octets.iter_mut().zip(parts) {
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *o = p.parse().ok()?;
    }
    Some(IpAddr::V4(Ipv4Addr::from(octets)))
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod cloud_labels_tests;

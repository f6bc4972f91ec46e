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
use k8s_openapi::api::core::v1::Taint;
use serde_json::{Value, json};

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

/// A change to a Node's metadata and spec, written as one JSON patch.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct SpecUpdate {
    /// `spec.providerID` to set (only ever set when the node has none).
    pub(crate) provider_id: Option<String>,
    /// Labels to add or change.
    pub(crate) labels: BTreeMap<String, String>,
    /// The node's complete new taint list, when it changes.
    pub(crate) taints: Option<Vec<Taint>>,
    /// Labels the update was planned from without setting them (e.g. the beta label a GA label
    /// is copied from): their values are preconditions of the write.
    pub(crate) read_labels: Vec<String>,
}

impl SpecUpdate {
    /// Whether nothing changes.
    pub(crate) fn is_empty(&self) -> bool {
        self.provider_id.is_none() && self.labels.is_empty() && self.taints.is_none()
    }

    /// The JSON patch `test` operations under which [`SpecUpdate::json_patch_ops`] against
    /// `node` is still right: exactly what the update was planned from and what the shape of
    /// its operations relies on, and nothing else, so that a concurrent write to any other
    /// field (kubelet's status writes above all) never fails it:
    /// - `metadata.uid`: the same Node, not one re-created under its name;
    /// - `spec`, when the operations add it whole;
    /// - `spec.taints` (the whole list) when the update replaces it;
    /// - `spec.providerID` when the update sets it;
    /// - the labels map when the update adds it whole, else each label the update sets or
    ///   was planned from ([`SpecUpdate::read_labels`]).
    ///
    /// An absent field is tested as `null`, which the API server's JSON patch (Go's
    /// evanphx/json-patch) accepts for a missing key whose parent exists; kube-apiserver omits
    /// empty lists, maps and strings, so those are tested as absent too.
    pub(crate) fn preconditions(&self, node: &Node) -> Vec<Value> {
        fn test(path: &str, value: Value) -> Value {
            json!({"op": "test", "path": path, "value": value})
        }
        let mut tests = Vec::new();
        if let Some(uid) = &node.metadata.uid {
            tests.push(test("/metadata/uid", json!(uid)));
        }
        let labels = labels(node).filter(|l| !l.is_empty());
        if !self.labels.is_empty() || !self.read_labels.is_empty() {
            match labels {
                None => tests.push(test("/metadata/labels", Value::Null)),
                Some(existing) => {
                    let keys = self.labels.keys().chain(self.read_labels.iter());
                    for key in keys.collect::<std::collections::BTreeSet<_>>() {
                        tests.push(test(
                            &format!("/metadata/labels/{}", escape_pointer(key)),
                            existing.get(key).map_or(Value::Null, |v| json!(v)),
                        ));
                    }
                }
            }
        }
        if self.provider_id.is_none() && self.taints.is_none() {
            return tests;
        }
        if node.spec.is_none() {
            tests.push(test("/spec", Value::Null));
            return tests;
        }
        if self.provider_id.is_some() {
            let current = node_provider_id(node);
            let value = if current.is_empty() {
                Value::Null
            } else {
                json!(current)
            };
            tests.push(test("/spec/providerID", value));
        }
        if self.taints.is_some() {
            let current = taints(node);
            let value = if current.is_empty() {
                Value::Null
            } else {
                json!(current)
            };
            tests.push(test("/spec/taints", value));
        }
        tests
    }

    /// The JSON patch operations (without the guarding `test`) that apply this update to
    /// `node`. Paths are chosen from `node`'s shape (whether `metadata.labels`, `spec`,
    /// `spec.taints` exist): the caller guards them with [`SpecUpdate::preconditions`].
    pub(crate) fn json_patch_ops(&self, node: &Node) -> Vec<Value> {
        let mut ops = Vec::new();
        if !self.labels.is_empty() {
            match node.metadata.labels.as_ref() {
                Some(existing) if !existing.is_empty() => {
                    for (k, v) in &self.labels {
                        ops.push(json!({
                            "op": "add",
                            "path": format!("/metadata/labels/{}", escape_pointer(k)),
                            "value": v,
                        }));
                    }
                }
                _ => {
                    ops.push(json!({"op": "add", "path": "/metadata/labels", "value": self.labels}))
                }
            }
        }
        let has_spec = node.spec.is_some();
        if !has_spec && (self.provider_id.is_some() || self.taints.is_some()) {
            let mut spec = serde_json::Map::new();
            if let Some(id) = &self.provider_id {
                spec.insert("providerID".into(), json!(id));
            }
            if let Some(taints) = self.taints.as_ref().filter(|t| !t.is_empty()) {
                spec.insert("taints".into(), json!(taints));
            }
            ops.push(json!({"op": "add", "path": "/spec", "value": spec}));
            return ops;
        }
        if let Some(id) = &self.provider_id {
            ops.push(json!({"op": "add", "path": "/spec/providerID", "value": id}));
        }
        if let Some(taints) = &self.taints {
            let had = node.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some();
            match (had, taints.is_empty()) {
                (true, true) => ops.push(json!({"op": "remove", "path": "/spec/taints"})),
                (_, false) => {
                    ops.push(json!({"op": "add", "path": "/spec/taints", "value": taints}))
                }
                (false, true) => {}
            }
        }
        ops
    }
}

/// Escapes a JSON pointer reference token (RFC 6901): `~` → `~0`, `/` → `~1`.
pub(crate) fn escape_pointer(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
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

fn taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

fn labels(node: &Node) -> Option<&BTreeMap<String, String>> {
    node.metadata.labels.as_ref()
}

fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    labels(node).and_then(|l| l.get(key)).map(String::as_str)
}

fn node_provider_id(node: &Node) -> &str {
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .unwrap_or_default()
}

fn node_name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or_default()
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
mod tests {
    use super::*;
    use ccm_core::ObjectMeta;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};

    fn addr(type_: &str, address: &str) -> NodeAddress {
        NodeAddress {
            type_: type_.into(),
            address: address.into(),
        }
    }

    fn taint(key: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            ..Default::default()
        }
    }

    struct N(Node);

    impl N {
        fn new(name: &str) -> Self {
            N(Node {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                spec: Some(NodeSpec::default()),
                status: Some(NodeStatus::default()),
            })
        }
        fn tainted(name: &str) -> Self {
            Self::new(name)
                .taint(TAINT_UNINITIALIZED, "NoSchedule")
                .addresses(vec![addr("Hostname", name)])
        }
        fn taint(mut self, key: &str, effect: &str) -> Self {
            let spec = self.0.spec.get_or_insert_with(Default::default);
            spec.taints
                .get_or_insert_with(Vec::new)
                .push(taint(key, effect));
            self
        }
        fn label(mut self, k: &str, v: &str) -> Self {
            self.0
                .metadata
                .labels
                .get_or_insert_with(BTreeMap::new)
                .insert(k.into(), v.into());
            self
        }
        fn annotation(mut self, k: &str, v: &str) -> Self {
            self.0
                .metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(k.into(), v.into());
            self
        }
        fn provider_id(mut self, id: &str) -> Self {
            self.0.spec.get_or_insert_with(Default::default).provider_id = Some(id.into());
            self
        }
        fn addresses(mut self, a: Vec<NodeAddress>) -> Self {
            self.0.status.get_or_insert_with(Default::default).addresses = Some(a);
            self
        }
    }

    fn meta(id: &str) -> InstanceMetadata {
        InstanceMetadata {
            provider_id: id.into(),
            instance_type: "small".into(),
            node_addresses: vec![addr("InternalIP", "10.0.0.1"), addr("Hostname", "n1")],
            zone: "zone-a".into(),
            region: "region-1".into(),
            additional_labels: BTreeMap::new(),
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    // ---- providerID ----

    #[test]
    fn provider_id_set_when_node_has_none() {
        let plan = plan_init(&N::tainted("n1").0, &meta("fake://n1"), true).unwrap();
        assert_eq!(plan.spec.provider_id.as_deref(), Some("fake://n1"));
    }

    #[test]
    fn provider_id_never_changed_when_node_has_one() {
        let node = N::tainted("n1").provider_id("fake://old").0;
        let plan = plan_init(&node, &meta("fake://new"), true).unwrap();
        assert_eq!(plan.spec.provider_id, None);
    }

    #[test]
    fn empty_provider_id_uses_the_nodes_own() {
        let node = N::tainted("n1").provider_id("fake://n1").0;
        let plan = plan_init(&node, &meta(""), true).unwrap();
        assert_eq!(plan.spec.provider_id, None);
        assert!(plan.spec.taints.is_some());
    }

    #[test]
    fn empty_provider_id_everywhere_is_an_error_on_v2() {
        let err = plan_init(&N::tainted("n1").0, &meta(""), true).unwrap_err();
        assert_eq!(err, InitError::MissingProviderId);
        assert_eq!(err.step(), Step::ProviderId);
        assert_eq!(
            err.to_string(),
            "cloud provider does not set node provider ID"
        );
    }

    #[test]
    fn empty_provider_id_is_tolerated_on_v1_not_implemented() {
        let plan = plan_init(&N::tainted("n1").0, &meta(""), false).unwrap();
        assert_eq!(plan.spec.provider_id, None);
        assert_eq!(plan.spec.taints, Some(vec![]));
    }

    // ---- labels ----

    #[test]
    fn well_known_labels_ga_and_beta() {
        let plan = plan_init(&N::tainted("n1").0, &meta("fake://n1"), true).unwrap();
        assert_eq!(
            plan.spec.labels,
            labels(&[
                (LABEL_INSTANCE_TYPE_BETA, "small"),
                (LABEL_INSTANCE_TYPE, "small"),
                (LABEL_FAILURE_DOMAIN_BETA_ZONE, "zone-a"),
                (LABEL_TOPOLOGY_ZONE, "zone-a"),
                (LABEL_FAILURE_DOMAIN_BETA_REGION, "region-1"),
                (LABEL_TOPOLOGY_REGION, "region-1"),
            ])
        );
    }

    #[test]
    fn empty_type_zone_region_write_no_labels() {
        let mut m = meta("fake://n1");
        m.instance_type.clear();
        m.zone.clear();
        m.region.clear();
        let plan = plan_init(&N::tainted("n1").0, &m, true).unwrap();
        assert!(plan.spec.labels.is_empty());
    }

    #[test]
    fn only_zone_known() {
        let mut m = meta("fake://n1");
        m.instance_type.clear();
        m.region.clear();
        let plan = plan_init(&N::tainted("n1").0, &m, true).unwrap();
        assert_eq!(
            plan.spec.labels,
            labels(&[
                (LABEL_FAILURE_DOMAIN_BETA_ZONE, "zone-a"),
                (LABEL_TOPOLOGY_ZONE, "zone-a")
            ])
        );
    }

    #[test]
    fn well_known_labels_overwrite_like_go_and_skip_equal_values() {
        let node = N::tainted("n1")
            .label(LABEL_TOPOLOGY_ZONE, "stale")
            .label(LABEL_INSTANCE_TYPE, "small")
            .0;
        let plan = plan_init(&node, &meta("fake://n1"), true).unwrap();
        assert_eq!(
            plan.spec
                .labels
                .get(LABEL_TOPOLOGY_ZONE)
                .map(String::as_str),
            Some("zone-a")
        );
        assert!(!plan.spec.labels.contains_key(LABEL_INSTANCE_TYPE));
        assert!(plan.spec.labels.contains_key(LABEL_INSTANCE_TYPE_BETA));
    }

    #[test]
    fn additional_labels_added_filtered_and_never_overwrite() {
        let node = N::tainted("n1").label("acme.io/pool", "blue").0;
        let mut m = meta("fake://n1");
        m.instance_type.clear();
        m.zone.clear();
        m.region.clear();
        m.additional_labels = labels(&[
            ("acme.io/rack", "r1"),
            ("acme.io/pool", "green"),
            ("kubernetes.io/hostname", "x"),
            ("node.kubernetes.io/foo", "x"),
            ("k8s.io/bar", "x"),
            ("sub.k8s.io/baz", "x"),
            ("notkubernetes.io/ok", "y"),
            ("plain", "z"),
        ]);
        let plan = plan_init(&node, &m, true).unwrap();
        assert_eq!(
            plan.spec.labels,
            labels(&[
                ("acme.io/rack", "r1"),
                ("notkubernetes.io/ok", "y"),
                ("plain", "z")
            ])
        );
        assert_eq!(
            plan.discarded_labels.len(),
            5,
            "{:?}",
            plan.discarded_labels
        );
    }

    #[test]
    fn additional_label_equal_to_existing_is_silently_skipped() {
        let node = N::tainted("n1").label("acme.io/pool", "blue").0;
        let mut m = meta("fake://n1");
        m.additional_labels = labels(&[("acme.io/pool", "blue")]);
        let plan = plan_init(&node, &m, true).unwrap();
        assert!(!plan.spec.labels.contains_key("acme.io/pool"));
        assert!(plan.discarded_labels.is_empty());
    }

    #[test]
    fn kubernetes_label_regex_equivalent() {
        for k in [
            "kubernetes.io/a",
            "k8s.io/a",
            "node.kubernetes.io/a",
            "a.b.k8s.io/x",
        ] {
            assert!(is_kubernetes_label(k), "{k}");
        }
        for k in [
            "kubernetes.io",
            "mykubernetes.io/a",
            "k8s.iox/a",
            "example.com/kubernetes.io",
            "x/kubernetes.io/",
            "a",
        ] {
            assert!(!is_kubernetes_label(k), "{k}");
        }
    }

    // ---- taints ----

    #[test]
    fn removes_every_uninitialized_taint_and_keeps_others_in_order() {
        let node = N::new("n1")
            .taint("a", "NoSchedule")
            .taint(TAINT_UNINITIALIZED, "NoSchedule")
            .taint("b", "NoExecute")
            .taint(TAINT_UNINITIALIZED, "NoExecute")
            .0;
        let plan = plan_init(&node, &meta("fake://n1"), true).unwrap();
        assert_eq!(
            plan.spec.taints,
            Some(vec![taint("a", "NoSchedule"), taint("b", "NoExecute")])
        );
        assert!(has_uninitialized_taint(&node));
        assert!(!has_uninitialized_taint(
            &N::new("x").taint("a", "NoSchedule").0
        ));
    }

    // ---- node IP ----

    #[test]
    fn unknown_provided_node_ip_is_an_error() {
        let node = N::tainted("n1")
            .annotation(ANNOTATION_PROVIDED_NODE_IP, "10.9.9.9")
            .0;
        let err = plan_init(&node, &meta("fake://n1"), true).unwrap_err();
        assert_eq!(err.step(), Step::NodeIp);
        assert_eq!(
            err.to_string(),
            "provided node ip for node \"n1\" is not valid: failed to get node address from cloud provider that matches ip: 10.9.9.9"
        );
    }

    #[test]
    fn provided_node_ip_checked_against_cloud_list_not_hostname() {
        // The cloud returned no addresses at all: the requested IP cannot match.
        let node = N::tainted("n1")
            .annotation(ANNOTATION_PROVIDED_NODE_IP, "10.0.0.1")
            .0;
        let mut m = meta("fake://n1");
        m.node_addresses.clear();
        assert_eq!(plan_init(&node, &m, true).unwrap_err().step(), Step::NodeIp);
    }

    #[test]
    fn parse_annotation_rules() {
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        let v6: IpAddr = "fd00::1".parse().unwrap();
        assert_eq!(parse_node_ip_annotation("10.0.0.1").unwrap(), vec![v4]);
        assert_eq!(
            parse_node_ip_annotation("10.0.0.1,fd00::1").unwrap(),
            vec![v4, v6]
        );
        assert_eq!(
            parse_node_ip_annotation("fd00::1,10.0.0.1").unwrap(),
            vec![v6, v4]
        );
        assert_eq!(
            parse_node_ip_annotation("010.000.000.001").unwrap(),
            vec![v4]
        );
        let bad = |s: &str| parse_node_ip_annotation(s).unwrap_err().to_string();
        assert_eq!(
            bad(""),
            "failed to parse node IP \"\": could not parse \"\""
        );
        assert_eq!(
            bad("10.0.0.1, fd00::1"),
            "failed to parse node IP \"10.0.0.1, fd00::1\": could not parse \" fd00::1\""
        );
        assert!(bad("10.0.0.1,10.0.0.2").contains("single IP or a dual-stack pair"));
        assert!(bad("fd00::1,fd00::2").contains("single IP or a dual-stack pair"));
        assert!(bad("10.0.0.1,fd00::1,10.0.0.2").contains("single IP or a dual-stack pair"));
        assert!(bad("0.0.0.0,fd00::1").contains("cannot include '0.0.0.0' or '::'"));
        assert!(bad("10.0.0.1,::").contains("cannot include"));
        assert!(bad("host.example").contains("could not parse"));
        // A single unspecified IP parses (and then matches nothing).
        assert!(parse_node_ip_annotation("0.0.0.0").is_ok());
    }

    #[test]
    fn sloppy_ip_parsing() {
        assert_eq!(
            parse_ip_sloppy("192.168.001.010"),
            Some("192.168.1.10".parse().unwrap())
        );
        assert_eq!(parse_ip_sloppy("256.1.1.1"), None);
        assert_eq!(parse_ip_sloppy("1.2.3"), None);
        assert_eq!(parse_ip_sloppy("1.2.3.4.5"), None);
        assert_eq!(parse_ip_sloppy("1..3.4"), None);
        assert_eq!(parse_ip_sloppy("+1.2.3.4"), None);
        assert_eq!(parse_ip_sloppy("::1"), Some("::1".parse().unwrap()));
    }

    #[test]
    fn provided_ip_single_stack_first_and_drops_same_type() {
        let cloud = vec![
            addr("InternalIP", "10.0.0.1"),
            addr("ExternalIP", "203.0.113.5"),
            addr("InternalIP", "10.0.0.2"),
            addr("Hostname", "n1"),
        ];
        let out = addresses_from_provided_node_ip("10.0.0.2", &cloud).unwrap();
        assert_eq!(
            out,
            vec![
                addr("InternalIP", "10.0.0.2"),
                addr("ExternalIP", "203.0.113.5"),
                addr("Hostname", "n1"),
            ]
        );
    }

    #[test]
    fn provided_ip_matching_an_external_ip() {
        let cloud = vec![
            addr("InternalIP", "10.0.0.1"),
            addr("ExternalIP", "203.0.113.5"),
            addr("ExternalIP", "203.0.113.6"),
        ];
        let out = addresses_from_provided_node_ip("203.0.113.6", &cloud).unwrap();
        assert_eq!(
            out,
            vec![
                addr("ExternalIP", "203.0.113.6"),
                addr("InternalIP", "10.0.0.1")
            ]
        );
    }

    #[test]
    fn provided_ip_dual_stack_in_request_order() {
        let cloud = vec![
            addr("InternalIP", "10.0.0.1"),
            addr("InternalIP", "fd00::1"),
            addr("InternalIP", "10.0.0.2"),
            addr("InternalIP", "fd00::2"),
            addr("ExternalIP", "203.0.113.5"),
        ];
        let out = addresses_from_provided_node_ip("fd00::2,10.0.0.2", &cloud).unwrap();
        assert_eq!(
            out,
            vec![
                addr("InternalIP", "fd00::2"),
                addr("InternalIP", "10.0.0.2"),
                addr("ExternalIP", "203.0.113.5"),
            ]
        );
        // One of the pair unknown: error naming it.
        let err = addresses_from_provided_node_ip("10.0.0.2,fd00::9", &cloud).unwrap_err();
        assert_eq!(err, NodeIpError::NotFound("fd00::9".parse().unwrap()));
    }

    #[test]
    fn provided_ip_matches_sloppy_and_mapped_cloud_addresses() {
        let cloud = vec![
            addr("InternalIP", "010.000.000.001"),
            addr("ExternalIP", "x"),
        ];
        let out = addresses_from_provided_node_ip("10.0.0.1", &cloud).unwrap();
        assert_eq!(out[0], addr("InternalIP", "010.000.000.001"));
        let cloud = vec![addr("InternalIP", "::ffff:10.0.0.1")];
        assert!(addresses_from_provided_node_ip("10.0.0.1", &cloud).is_ok());
        // The same IP reported under two types: both kept, both types "matched".
        let cloud = vec![
            addr("InternalIP", "10.0.0.1"),
            addr("ExternalIP", "10.0.0.1"),
            addr("ExternalIP", "203.0.113.1"),
            addr("Hostname", "h"),
        ];
        let out = addresses_from_provided_node_ip("10.0.0.1", &cloud).unwrap();
        assert_eq!(
            out,
            vec![
                addr("InternalIP", "10.0.0.1"),
                addr("ExternalIP", "10.0.0.1"),
                addr("Hostname", "h")
            ]
        );
    }

    // ---- addresses ----

    #[test]
    fn addresses_keep_kubelet_hostname_when_cloud_has_none() {
        let node = N::tainted("n1").0;
        let cloud = vec![addr("InternalIP", "10.0.0.1")];
        let out = desired_addresses(&node, &cloud).unwrap().unwrap();
        assert_eq!(
            out,
            vec![addr("InternalIP", "10.0.0.1"), addr("Hostname", "n1")]
        );
    }

    #[test]
    fn addresses_cloud_hostname_wins() {
        let node = N::tainted("n1").0;
        let cloud = vec![
            addr("Hostname", "cloud-name"),
            addr("InternalIP", "10.0.0.1"),
        ];
        let out = desired_addresses(&node, &cloud).unwrap().unwrap();
        assert_eq!(out, cloud);
    }

    #[test]
    fn addresses_empty_cloud_list_skips() {
        let node = N::tainted("n1").0;
        assert_eq!(desired_addresses(&node, &[]).unwrap(), None);
    }

    #[test]
    fn addresses_unchanged_skips() {
        let node = N::new("n1")
            .addresses(vec![addr("InternalIP", "10.0.0.1"), addr("Hostname", "n1")])
            .0;
        let cloud = vec![addr("InternalIP", "10.0.0.1")];
        assert_eq!(desired_addresses(&node, &cloud).unwrap(), None);
    }

    #[test]
    fn addresses_with_provided_ip_after_hostname_merge() {
        let node = N::new("n1")
            .annotation(ANNOTATION_PROVIDED_NODE_IP, "10.0.0.2")
            .addresses(vec![addr("Hostname", "n1")])
            .0;
        let cloud = vec![
            addr("InternalIP", "10.0.0.1"),
            addr("InternalIP", "10.0.0.2"),
        ];
        let out = desired_addresses(&node, &cloud).unwrap().unwrap();
        assert_eq!(
            out,
            vec![addr("InternalIP", "10.0.0.2"), addr("Hostname", "n1")]
        );
        let bad = N::new("n1")
            .annotation(ANNOTATION_PROVIDED_NODE_IP, "10.0.0.3")
            .0;
        assert!(desired_addresses(&bad, &cloud).is_err());
    }

    #[test]
    fn refresh_skips_tainted_nodes() {
        let cloud = vec![addr("InternalIP", "10.0.0.7")];
        assert_eq!(
            plan_address_refresh(&N::tainted("n1").0, &cloud).unwrap(),
            None
        );
        let node = N::new("n1")
            .addresses(vec![addr("InternalIP", "10.0.0.1")])
            .0;
        assert_eq!(
            plan_address_refresh(&node, &cloud).unwrap(),
            Some(vec![addr("InternalIP", "10.0.0.7")])
        );
    }

    #[test]
    fn change_detection_is_keyed_by_type_but_exact_within_a_type() {
        let a = vec![addr("InternalIP", "1"), addr("Hostname", "h")];
        let reordered_types = vec![addr("Hostname", "h"), addr("InternalIP", "1")];
        assert!(!addresses_changed(&a, &reordered_types));
        assert!(addresses_changed(&a, &[addr("InternalIP", "1")]));
        assert!(addresses_changed(
            &a,
            &[addr("InternalIP", "2"), addr("Hostname", "h")]
        ));
        assert!(addresses_changed(
            &a,
            &[addr("ExternalIP", "1"), addr("Hostname", "h")]
        ));
        // Several addresses of one type: Go's map misses these changes or invents one.
        let two = vec![addr("InternalIP", "1"), addr("InternalIP", "2")];
        assert!(!addresses_changed(&two, &two.clone()));
        assert!(addresses_changed(
            &two,
            &[addr("InternalIP", "2"), addr("InternalIP", "2")]
        ));
        assert!(addresses_changed(
            &two,
            &[addr("InternalIP", "2"), addr("InternalIP", "1")]
        ));
        assert!(!addresses_changed(&[], &[]));
    }

    #[test]
    fn init_plan_includes_addresses() {
        let plan = plan_init(&N::tainted("n1").0, &meta("fake://n1"), true).unwrap();
        assert_eq!(
            plan.addresses,
            Some(vec![addr("InternalIP", "10.0.0.1"), addr("Hostname", "n1")])
        );
    }

    // ---- label reconcile ----

    #[test]
    fn label_reconcile_beta_to_ga() {
        let node = N::new("n1")
            .label(LABEL_FAILURE_DOMAIN_BETA_ZONE, "z1")
            .label(LABEL_FAILURE_DOMAIN_BETA_REGION, "r1")
            .label(LABEL_TOPOLOGY_REGION, "old")
            .label(LABEL_INSTANCE_TYPE_BETA, "t")
            .label(LABEL_INSTANCE_TYPE, "t")
            .0;
        assert_eq!(
            plan_label_reconcile(&node),
            labels(&[(LABEL_TOPOLOGY_ZONE, "z1"), (LABEL_TOPOLOGY_REGION, "r1")])
        );
    }

    #[test]
    fn label_reconcile_nothing_without_beta_labels() {
        let node = N::new("n1").label(LABEL_TOPOLOGY_ZONE, "z1").0;
        assert!(plan_label_reconcile(&node).is_empty());
        assert!(plan_label_reconcile(&N::new("n2").0).is_empty());
    }

    // ---- JSON patch ----

    #[test]
    fn json_patch_ops_for_labelled_node() {
        let node = N::tainted("n1").label("a", "b").taint("x", "NoExecute").0;
        let update = SpecUpdate {
            provider_id: Some("fake://n1".into()),
            labels: labels(&[("topology.kubernetes.io/zone", "z"), ("w~x", "1")]),
            taints: Some(vec![taint("x", "NoExecute")]),
            read_labels: Vec::new(),
        };
        assert_eq!(
            update.json_patch_ops(&node),
            vec![
                json!({"op":"add","path":"/metadata/labels/topology.kubernetes.io~1zone","value":"z"}),
                json!({"op":"add","path":"/metadata/labels/w~0x","value":"1"}),
                json!({"op":"add","path":"/spec/providerID","value":"fake://n1"}),
                json!({"op":"add","path":"/spec/taints","value":[{"key":"x","effect":"NoExecute"}]}),
            ]
        );
    }

    #[test]
    fn preconditions_test_exactly_what_the_plan_read() {
        let mut node = N::tainted("n1").label("a", "b").0;
        node.metadata.uid = Some("u1".into());
        node.metadata.resource_version = Some("7".into());
        let update = SpecUpdate {
            provider_id: Some("fake://n1".into()),
            labels: labels(&[("a", "c"), ("new", "v")]),
            taints: Some(vec![]),
            read_labels: vec!["a".into()],
        };
        let uninitialized = json!([{"key": TAINT_UNINITIALIZED, "effect": "NoSchedule"}]);
        assert_eq!(
            update.preconditions(&node),
            vec![
                json!({"op":"test","path":"/metadata/uid","value":"u1"}),
                json!({"op":"test","path":"/metadata/labels/a","value":"b"}),
                json!({"op":"test","path":"/metadata/labels/new","value":null}),
                json!({"op":"test","path":"/spec/providerID","value":null}),
                json!({"op":"test","path":"/spec/taints","value":uninitialized}),
            ],
            "no resourceVersion: writes to other fields do not conflict"
        );
        // Labels added as a whole map: the map's absence is the precondition.
        node.metadata.labels = None;
        let only_labels = SpecUpdate {
            labels: labels(&[("k", "v")]),
            ..Default::default()
        };
        assert_eq!(
            only_labels.preconditions(&node),
            vec![
                json!({"op":"test","path":"/metadata/uid","value":"u1"}),
                json!({"op":"test","path":"/metadata/labels","value":null}),
            ]
        );
    }

    #[test]
    fn json_patch_ops_for_bare_node() {
        let mut node = N::new("n1").taint(TAINT_UNINITIALIZED, "NoSchedule").0;
        let update = SpecUpdate {
            provider_id: None,
            labels: labels(&[("k", "v")]),
            taints: Some(vec![]),
            read_labels: Vec::new(),
        };
        assert_eq!(
            update.json_patch_ops(&node),
            vec![
                json!({"op":"add","path":"/metadata/labels","value":{"k":"v"}}),
                json!({"op":"remove","path":"/spec/taints"}),
            ]
        );
        node.spec = None;
        let update = SpecUpdate {
            provider_id: Some("p://1".into()),
            labels: BTreeMap::new(),
            taints: Some(vec![]),
            read_labels: Vec::new(),
        };
        assert_eq!(
            update.json_patch_ops(&node),
            vec![json!({"op":"add","path":"/spec","value":{"providerID":"p://1"}})]
        );
        assert!(SpecUpdate::default().is_empty());
        assert!(SpecUpdate::default().json_patch_ops(&node).is_empty());
    }
}

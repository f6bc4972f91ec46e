//! Which Nodes are ours: the one place every controller asks before it touches a Node, calls
//! the cloud about one, or counts one as a load-balancer host.
//!
//! A Node is **foreign** when
//! 1. its `spec.providerID` is `<scheme>://...` with a scheme the provider does not declare
//!    ([`CloudProvider::provider_id_schemes`](ccm_core::CloudProvider::provider_id_schemes)):
//!    another cloud's Node; or
//! 2. `--managed-node-selector` is set and does not select it.
//!
//! Otherwise it is ours, as in Go (a Node without a provider ID, or with one without `://`,
//! included). A foreign Node is never initialised, deleted, given or relieved of the shutdown
//! taint, made a load-balancer host, routed or given a pod CIDR, and costs no cloud call.
//!
//! Separately, [`deletion_evidence`] says whether a Node whose instance our cloud reports gone
//! may be deleted: only with evidence that it was ours (docs/controllers.md, "Which Nodes are
//! ours").
//!
//! The decisions ([`foreign_reason`], [`deletion_evidence`]) are pure and take plain inputs
//! (provider ID, a label lookup, whether the Node is initialised), not a Node; [`Ownership`]
//! holds the configuration, and its tracker keeps the gauge `node_controller_foreign_nodes`
//! and logs one INFO line per Node when it is first seen foreign.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use ccm_core::well_known::TAINT_UNINITIALIZED;
use ccm_core::{Node, NodeView};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio_util::sync::CancellationToken;

use crate::machinery::informer::{Change, Informer};
use crate::machinery::label_selector::ManagedNodeSelector;
use crate::machinery::metrics::MetricsRegistry;

/// Why a Node is foreign.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Foreign {
    /// Its provider ID names another provider: the scheme.
    ProviderId(String),
    /// `--managed-node-selector` does not select it.
    OutsideSelector,
}

impl std::fmt::Display for Foreign {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Foreign::ProviderId(scheme) => write!(f, "providerID {scheme}://"),
            Foreign::OutsideSelector => f.write_str("outside --managed-node-selector"),
        }
    }
}

impl Foreign {
    /// The `reason` label of the gauge.
    fn label(&self) -> &'static str {
        match self {
            Foreign::ProviderId(_) => "provider_id",
            Foreign::OutsideSelector => "selector",
        }
    }
}

/// The scheme of a provider ID: the part before `://`, when there is one and it is not empty.
pub(crate) fn provider_id_scheme(provider_id: &str) -> Option<&str> {
    provider_id
        .split_once("://")
        .map(|(scheme, _)| scheme)
        .filter(|s| !s.is_empty())
}

/// Whether a Node is foreign, and why (`None`: ours). `provider_id` is `spec.providerID`
/// (`None` or empty: unset), `label(key)` the Node's value of label `key`.
pub(crate) fn foreign_reason<'a>(
    schemes: &[String],
    selector: Option<&ManagedNodeSelector>,
    provider_id: Option<&str>,
    label: impl Fn(&str) -> Option<&'a str>,
) -> Option<Foreign> {
    if let Some(scheme) = provider_id.and_then(provider_id_scheme)
        && !schemes.iter().any(|s| s == scheme)
    {
        return Some(Foreign::ProviderId(scheme.to_owned()));
    }
    if selector.is_some_and(|s| !s.matches(label)) {
        return Some(Foreign::OutsideSelector);
    }
    None
}

/// Whether a Node of ours that our cloud reports gone may be deleted: only with evidence that
/// it was ours, a provider ID of one of our schemes or its initialisation (no
/// `node.cloudprovider.kubernetes.io/uninitialized` taint; kept as Go for every initialised
/// Node). An uninitialised Node without such a provider ID is kept: it may be another cloud's
/// Node whose own cloud-controller-manager has not initialised it yet.
pub(crate) fn deletion_evidence(
    schemes: &[String],
    provider_id: Option<&str>,
    uninitialized: bool,
) -> bool {
    !uninitialized
        || provider_id
            .and_then(provider_id_scheme)
            .is_some_and(|scheme| schemes.iter().any(|s| s == scheme))
}

/// What the ownership decisions read of a Node, in either form the framework holds one: the
/// k8s-openapi [`Node`] of the informer and the [`NodeView`] providers receive. Both answer
/// alike (a test checks it), so a controller asks about whichever it has, without converting.
pub(crate) trait NodeFacts {
    /// `spec.providerID`, `None` when unset or empty.
    fn provider_id(&self) -> Option<&str>;
    /// The value of label `key`.
    fn label(&self, key: &str) -> Option<&str>;
    /// Whether it carries `node.cloudprovider.kubernetes.io/uninitialized`.
    fn uninitialized(&self) -> bool;
}

impl NodeFacts for Node {
    fn provider_id(&self) -> Option<&str> {
        self.spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .filter(|p| !p.is_empty())
    }

    fn label(&self, key: &str) -> Option<&str> {
        self.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(key))
            .map(String::as_str)
    }

    fn uninitialized(&self) -> bool {
        self.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == TAINT_UNINITIALIZED))
    }
}

impl NodeFacts for NodeView {
    fn provider_id(&self) -> Option<&str> {
        Some(NodeView::provider_id(self)).filter(|p| !p.is_empty())
    }

    fn label(&self, key: &str) -> Option<&str> {
        NodeView::label(self, key)
    }

    fn uninitialized(&self) -> bool {
        self.has_taint(TAINT_UNINITIALIZED)
    }
}

impl<N: NodeFacts + ?Sized> NodeFacts for Arc<N> {
    fn provider_id(&self) -> Option<&str> {
        (**self).provider_id()
    }

    fn label(&self, key: &str) -> Option<&str> {
        (**self).label(key)
    }

    fn uninitialized(&self) -> bool {
        (**self).uninitialized()
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// This process's ownership configuration: the provider's schemes and the operator's selector,
/// with the tracker's state. Shared by every controller through the context.
pub(crate) struct Ownership {
    schemes: Vec<String>,
    selector: RwLock<Option<ManagedNodeSelector>>,
    /// The Nodes seen foreign, by name, and why.
    foreign: Mutex<HashMap<String, Foreign>>,
    gauge: Family<ReasonLabel, Gauge>,
}

impl std::fmt::Debug for Ownership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ownership")
            .field("schemes", &self.schemes)
            .finish_non_exhaustive()
    }
}

impl Ownership {
    /// The ownership of a provider declaring `schemes`, with no selector; registers the gauge
    /// `node_controller_foreign_nodes{reason}` in `metrics`.
    pub(crate) fn new(schemes: Vec<String>, metrics: &MetricsRegistry) -> Arc<Self> {
        let gauge = Family::<ReasonLabel, Gauge>::default();
        for reason in ["provider_id", "selector"] {
            let _ = gauge.get_or_create(&ReasonLabel { reason });
        }
        metrics.register(
            "node_controller_foreign_nodes",
            "Nodes this cloud-controller-manager leaves alone, by reason: provider_id (their provider ID names another provider) or selector (outside --managed-node-selector).",
            gauge.clone(),
        );
        Arc::new(Ownership {
            schemes,
            selector: RwLock::new(None),
            foreign: Mutex::new(HashMap::new()),
            gauge,
        })
    }

    /// Sets `--managed-node-selector` (before the controllers start).
    pub(crate) fn set_selector(&self, selector: Option<ManagedNodeSelector>) {
        *self.selector.write().unwrap_or_else(|e| e.into_inner()) =
            selector.filter(|s| !s.selects_all());
    }

    /// The Nodes last seen foreign, sorted by name, and why.
    pub(crate) fn foreign_nodes(&self) -> Vec<(String, Foreign)> {
        let foreign = self.foreign.lock().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<_> = foreign
            .iter()
            .map(|(n, f)| (n.clone(), f.clone()))
            .collect();
        all.sort();
        all
    }

    /// Whether `node` is foreign, and why (`None`: ours).
    pub(crate) fn foreign(&self, node: &(impl NodeFacts + ?Sized)) -> Option<Foreign> {
        let selector = self.selector.read().unwrap_or_else(|e| e.into_inner());
        foreign_reason(
            &self.schemes,
            selector.as_ref(),
            node.provider_id(),
            |key| node.label(key),
        )
    }

    /// Whether `node` is ours.
    pub(crate) fn owns(&self, node: &(impl NodeFacts + ?Sized)) -> bool {
        self.foreign(node).is_none()
    }

    /// Whether `node`, if its instance is gone, may be deleted ([`deletion_evidence`]).
    pub(crate) fn deletion_evidence(&self, node: &(impl NodeFacts + ?Sized)) -> bool {
        deletion_evidence(&self.schemes, node.provider_id(), node.uninitialized())
    }

    /// Classifies one Node for the gauge and the log: an INFO line the first time it is seen
    /// foreign (again after it was ours for a while), nothing after.
    fn observe(&self, name: &str, node: Option<&NodeView>) {
        let now = node.and_then(|n| self.foreign(n));
        let mut foreign = self.foreign.lock().unwrap_or_else(|e| e.into_inner());
        let before = match &now {
            Some(reason) => foreign.insert(name.to_owned(), reason.clone()),
            None => foreign.remove(name),
        };
        if before == now {
            return;
        }
        if let Some(before) = &before {
            self.gauge
                .get_or_create(&ReasonLabel {
                    reason: before.label(),
                })
                .dec();
        }
        if let Some(reason) = &now {
            self.gauge
                .get_or_create(&ReasonLabel {
                    reason: reason.label(),
                })
                .inc();
            match reason {
                Foreign::ProviderId(scheme) => tracing::info!(
                    node = %name,
                    scheme = %scheme,
                    schemes = ?self.schemes,
                    "node belongs to another cloud (its provider ID's scheme is not ours); leaving it to its own cloud-controller-manager"
                ),
                Foreign::OutsideSelector => tracing::info!(
                    node = %name,
                    "node is outside --managed-node-selector; leaving it to another cloud-controller-manager"
                ),
            }
        }
    }

    /// Keeps the gauge and the log up to date with every Node change until `shutdown` fires.
    pub(crate) async fn track(
        self: Arc<Self>,
        nodes: Informer<Node, NodeView>,
        shutdown: CancellationToken,
    ) {
        let subscription = tokio::select! {
            () = shutdown.cancelled() => return,
            s = nodes.subscribe() => s,
        };
        let Some(mut changes) = subscription else {
            return;
        };
        loop {
            let change = tokio::select! {
                () = shutdown.cancelled() => return,
                change = changes.recv() => change,
            };
            match change {
                None => return,
                Some(Change::Applied { new, .. }) => {
                    self.observe(new.name(), Some(&new));
                }
                Some(Change::Deleted(gone)) => {
                    self.observe(gone.name(), None);
                }
                Some(Change::Resync) => {
                    let known: Vec<String> = self
                        .foreign
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .keys()
                        .cloned()
                        .collect();
                    for name in known {
                        let node = nodes.get(&name);
                        self.observe(&name, node.as_ref());
                    }
                    for node in nodes.list() {
                        self.observe(node.name(), Some(&node));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schemes() -> Vec<String> {
        vec!["aws".into(), "aws-legacy".into()]
    }

    fn no_labels(_: &str) -> Option<&'static str> {
        None
    }

    #[test]
    fn schemes_of_provider_ids() {
        assert_eq!(provider_id_scheme("aws:///us-east-1a/i-1"), Some("aws"));
        assert_eq!(
            provider_id_scheme("proxmox://cluster-1/101"),
            Some("proxmox")
        );
        assert_eq!(provider_id_scheme("i-1"), None);
        assert_eq!(provider_id_scheme("://x"), None);
        assert_eq!(provider_id_scheme(""), None);
    }

    #[test]
    fn another_providers_scheme_is_foreign() {
        let s = schemes();
        assert_eq!(
            foreign_reason(&s, None, Some("proxmox://cluster-1/101"), no_labels),
            Some(Foreign::ProviderId("proxmox".into()))
        );
        // Every declared scheme is ours; so are Nodes without a provider ID or a scheme.
        for ours in [
            Some("aws:///us-east-1a/i-1"),
            Some("aws-legacy://i-2"),
            Some("i-3"),
            Some(""),
            None,
        ] {
            assert_eq!(foreign_reason(&s, None, ours, no_labels), None, "{ours:?}");
        }
        // A prefix of a scheme is another scheme.
        assert!(foreign_reason(&s, None, Some("aw://x"), no_labels).is_some());
    }

    #[test]
    fn the_selector_narrows_what_is_ours() {
        let s = schemes();
        let selector: ManagedNodeSelector = "cloud=aws".parse().unwrap();
        let aws = |k: &str| (k == "cloud").then_some("aws");
        let metal = |k: &str| (k == "cloud").then_some("metal");
        assert_eq!(foreign_reason(&s, Some(&selector), None, aws), None);
        assert_eq!(
            foreign_reason(&s, Some(&selector), None, metal),
            Some(Foreign::OutsideSelector)
        );
        assert_eq!(
            foreign_reason(&s, Some(&selector), Some("aws://i-1"), no_labels),
            Some(Foreign::OutsideSelector),
            "our scheme does not override the operator's selector"
        );
        assert_eq!(
            foreign_reason(&s, Some(&selector), Some("gce://p/z/n"), aws),
            Some(Foreign::ProviderId("gce".into())),
            "nor does the selector make another cloud's Node ours"
        );
    }

    #[test]
    fn deletion_needs_evidence_that_the_node_was_ours() {
        let s = schemes();
        // Initialised: Go's rule, whatever the provider ID.
        assert!(deletion_evidence(&s, None, false));
        assert!(deletion_evidence(&s, Some("aws://i-1"), false));
        // Uninitialised: only with a provider ID of ours.
        assert!(deletion_evidence(&s, Some("aws://i-1"), true));
        assert!(deletion_evidence(&s, Some("aws-legacy://i-1"), true));
        assert!(!deletion_evidence(&s, None, true));
        assert!(!deletion_evidence(&s, Some(""), true));
        assert!(!deletion_evidence(&s, Some("i-1"), true));
        assert!(!deletion_evidence(&s, Some("gce://p/z/n"), true));
    }

    /// The decisions read a `Node` and its `NodeView` alike: a controller may ask with either.
    #[test]
    fn a_node_and_its_view_are_decided_alike() {
        use ccm_core::ObjectMeta;
        use ccm_core::k8s_openapi::api::core::v1::{NodeSpec, Taint};

        let node = |provider_id: Option<&str>, cloud: Option<&str>, uninitialized: bool| Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                labels: cloud.map(|c| [("cloud".to_owned(), c.to_owned())].into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                provider_id: provider_id.map(str::to_owned),
                taints: uninitialized.then(|| {
                    vec![Taint {
                        key: TAINT_UNINITIALIZED.into(),
                        effect: "NoSchedule".into(),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
            status: None,
        };
        let ownership = Ownership::new(schemes(), &MetricsRegistry::new());
        ownership.set_selector(Some("cloud=aws".parse().unwrap()));
        let mut decided = std::collections::BTreeSet::new();
        for provider_id in [
            None,
            Some(""),
            Some("aws://i-1"),
            Some("gce://p/z/n"),
            Some("i-1"),
        ] {
            for cloud in [None, Some("aws"), Some("metal")] {
                for uninitialized in [false, true] {
                    let node = node(provider_id, cloud, uninitialized);
                    let view = NodeView::from_node(&node);
                    let case = format!("{provider_id:?} {cloud:?} {uninitialized}");
                    assert_eq!(ownership.foreign(&node), ownership.foreign(&view), "{case}");
                    assert_eq!(
                        ownership.deletion_evidence(&node),
                        ownership.deletion_evidence(&view),
                        "{case}"
                    );
                    assert_eq!(
                        ownership.foreign(&Arc::new(node.clone())),
                        ownership.foreign(&node),
                        "{case}"
                    );
                    decided.insert((ownership.foreign(&view), ownership.deletion_evidence(&view)));
                }
            }
        }
        // The cases reach every answer: ours or foreign for either reason, deletable or not.
        assert_eq!(
            decided
                .iter()
                .map(|(f, _)| f.clone())
                .collect::<std::collections::BTreeSet<_>>(),
            [
                None,
                Some(Foreign::OutsideSelector),
                Some(Foreign::ProviderId("gce".into()))
            ]
            .into_iter()
            .collect()
        );
        assert!(decided.iter().any(|(_, d)| *d) && decided.iter().any(|(_, d)| !*d));
    }
}

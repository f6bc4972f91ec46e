//! Backends chosen per Service (beyond Go): the annotation
//! [`ANNOTATION_BACKEND_NODE_SELECTOR`] holds a Kubernetes label selector (kubectl's `-l`
//! syntax, parsed as `--managed-node-selector` is), and the hosts passed to the provider for that
//! Service are the eligible hosts (Go's rules, the exclusion label, the Nodes this CCM manages)
//! that also match it. Pure: no I/O.
//!
//! - No annotation, or an empty one: every eligible host, exactly Go's behaviour.
//! - A selector that matches no eligible host: an empty host list, as Go passes when no Node is
//!   eligible (with its `UnAvailableLoadBalancer` Warning); no error of our own.
//! - An invalid selector: no host list at all. The service worker records a Warning Event
//!   ([`REASON_INVALID_BACKEND_NODE_SELECTOR`]) and, with `--load-balancer-status-conditions`,
//!   the condition `False` with that reason, and makes no cloud call: the load balancer keeps
//!   the hosts it had (never emptied, never deleted) until the annotation is fixed, which is a
//!   Service update and so a sync of its own.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ccm_core::NodeView;
use k8s_openapi::api::core::v1::Service;

use super::{HostChange, is_eligible_host};
use crate::machinery::label_selector::{ManagedNodeSelector, SelectorError};

/// The Service annotation holding the label selector of its load balancer's backend Nodes.
pub(crate) const ANNOTATION_BACKEND_NODE_SELECTOR: &str = "service.ccm-rs.io/backend-node-selector";

/// Reason of the Warning Event, and of the `False` `LoadBalancerProvisioned` condition, when the
/// annotation [`ANNOTATION_BACKEND_NODE_SELECTOR`] is not a valid label selector.
pub(crate) const REASON_INVALID_BACKEND_NODE_SELECTOR: &str = "InvalidBackendNodeSelector";

/// The Service's backend selector as written (trimmed), `None` when the annotation is absent or
/// empty (every eligible host).
pub(crate) fn selector_text(service: &Service) -> Option<&str> {
    service
        .metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_BACKEND_NODE_SELECTOR)
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
}

/// A backend selector parsed from its text.
pub(crate) fn parse_selector(text: &str) -> Result<ManagedNodeSelector, SelectorError> {
    text.parse()
}

/// Whether `node` matches `selector`.
pub(crate) fn selects(selector: &ManagedNodeSelector, node: &NodeView) -> bool {
    selector.matches(|key| node.label(key))
}

/// The hosts among `hosts` that `selector` matches, in their order.
pub(crate) fn selected_hosts(hosts: &[NodeView], selector: &ManagedNodeSelector) -> Vec<NodeView> {
    hosts
        .iter()
        .filter(|n| selects(selector, n))
        .cloned()
        .collect()
}

/// The note of the Warning Event (and the condition's message) for an invalid selector.
pub(crate) fn invalid_selector_note(error: &SelectorError) -> String {
    format!(
        "annotation {ANNOTATION_BACKEND_NODE_SELECTOR}: {error}; the load balancer is left as it is until the annotation is fixed"
    )
}

/// How a Node update that changes no host's eligibility nor identity ([`super::host_change`]
/// said `None`) changes the hosts of the Services with a backend selector: a host leaves when a
/// selector matched it before and does not now ([`HostChange::Removal`]), joins when one matches
/// it now and did not before ([`HostChange::Addition`]); `None` when no selector's answer changed
/// or the Node is no host at all. With no selector in use (`selectors` empty) this is always
/// `None`: label changes stay no trigger, as in Go.
pub(crate) fn selector_host_change(
    old: &NodeView,
    new: &NodeView,
    selectors: &[ManagedNodeSelector],
) -> Option<HostChange> {
    if selectors.is_empty() || !is_eligible_host(new) || !is_eligible_host(old) {
        return None;
    }
    let mut joins = false;
    for selector in selectors {
        match (selects(selector, old), selects(selector, new)) {
            (true, false) => return Some(HostChange::Removal),
            (false, true) => joins = true,
            _ => {}
        }
    }
    joins.then_some(HostChange::Addition)
}

/// The distinct valid backend selectors of the Services served, kept in step with Service
/// changes, so that a Node update is checked against each selector once (not once per Service).
#[derive(Debug, Default)]
pub(crate) struct SelectorsInUse {
    /// The selector text of each Service (by `namespace/name`) that has a valid one.
    by_service: HashMap<String, Arc<str>>,
    /// Each distinct selector with the number of Services using it.
    distinct: BTreeMap<Arc<str>, (ManagedNodeSelector, usize)>,
    /// The distinct selectors, rebuilt when their set changes.
    snapshot: Arc<[ManagedNodeSelector]>,
}

impl SelectorsInUse {
    /// Records the Service `key`'s valid selector (`Some`), or that it has none (`None`: no
    /// annotation, an invalid one, or a Service not served).
    pub(crate) fn set(&mut self, key: &str, selector: Option<ManagedNodeSelector>) {
        let text: Option<Arc<str>> = selector.as_ref().map(|s| s.to_string().into());
        if self.by_service.get(key) == text.as_ref() {
            return;
        }
        let mut changed = false;
        if let Some(old) = self.by_service.remove(key)
            && let Some((_, count)) = self.distinct.get_mut(&old)
        {
            *count -= 1;
            if *count == 0 {
                self.distinct.remove(&old);
                changed = true;
            }
        }
        if let (Some(text), Some(selector)) = (text, selector) {
            self.by_service.insert(key.to_owned(), text.clone());
            let entry = self.distinct.entry(text).or_insert_with(|| {
                changed = true;
                (selector, 0)
            });
            entry.1 += 1;
        }
        if changed {
            self.snapshot = self.distinct.values().map(|(s, _)| s.clone()).collect();
        }
    }

    /// Forgets every Service (before a rebuild from the store).
    pub(crate) fn clear(&mut self) {
        *self = SelectorsInUse::default();
    }

    /// The distinct selectors in use.
    pub(crate) fn snapshot(&self) -> Arc<[ManagedNodeSelector]> {
        self.snapshot.clone()
    }
}

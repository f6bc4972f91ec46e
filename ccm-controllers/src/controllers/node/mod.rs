//! What both node controllers (cloud-node and cloud-node-lifecycle) use, as Go's
//! `controllers/node/helpers`: the guarded Node patches ([`patch`]), the spec change they write
//! ([`spec::SpecUpdate`]), the legacy providerID lookup ([`cloud`]) and the accessors below.

pub(crate) mod cloud;
pub(crate) mod instance_batch;
pub(crate) mod patch;
pub(crate) mod spec;

use std::collections::BTreeMap;

use ccm_core::Node;
use k8s_openapi::api::core::v1::Taint;

/// The node's taints (empty when it has none).
pub(crate) fn taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

/// The node's labels, when it has a label map.
pub(crate) fn labels(node: &Node) -> Option<&BTreeMap<String, String>> {
    node.metadata.labels.as_ref()
}

/// One label's value.
pub(crate) fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    labels(node).and_then(|l| l.get(key)).map(String::as_str)
}

/// `spec.providerID`, empty when unset.
pub(crate) fn node_provider_id(node: &Node) -> &str {
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .unwrap_or_default()
}

/// `metadata.name`, empty when unset.
pub(crate) fn node_name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or_default()
}

//! The change to a Node's metadata and spec that both node controllers write, and the JSON patch
//! operations and `test` preconditions for it (pure: no I/O).

use std::collections::BTreeMap;

use ccm_core::Node;
use k8s_openapi::api::core::v1::Taint;
use serde_json::{Value, json};

use super::{labels, node_provider_id, taints};

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

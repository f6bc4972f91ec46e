//! The one write of the node-IPAM controller: `spec.podCIDR` and `spec.podCIDRs` of a Node
//! that has none.
//!
//! Go sends a strategic merge patch and relies on the API server refusing to change a set
//! `podCIDRs`. Here the JSON patch says so itself: it tests the Node's UID (never a CIDR for a
//! Node re-created under the same name) and that both fields are absent (evanphx/json-patch,
//! which kube-apiserver uses, passes a `test` for `null` on a missing key), so it cannot
//! clobber another writer's CIDRs and does not conflict with kubelet's status writes (no
//! resourceVersion test).

use ccm_core::Node;
use ipnet::IpNet;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use crate::machinery::lean_node::lean_api;

/// The JSON patch that sets `cidrs` on `node` only if it has no pod CIDR yet.
pub(crate) fn pod_cidrs_patch(node: &Node, cidrs: &[IpNet]) -> Result<json_patch::Patch, String> {
    let first = cidrs
        .first()
        .ok_or_else(|| "no CIDR to write".to_owned())?
        .to_string();
    let list: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
    let mut ops = Vec::with_capacity(6);
    if let Some(uid) = &node.metadata.uid {
        ops.push(json!({"op": "test", "path": "/metadata/uid", "value": uid}));
    }
    if node.spec.is_none() {
        // A Node as stored always has `spec` (an empty object at least); be exact anyway.
        ops.push(json!({"op": "test", "path": "/spec", "value": null}));
        ops.push(json!({"op": "add", "path": "/spec", "value": {}}));
    }
    ops.push(json!({"op": "test", "path": "/spec/podCIDR", "value": null}));
    ops.push(json!({"op": "test", "path": "/spec/podCIDRs", "value": null}));
    ops.push(json!({"op": "add", "path": "/spec/podCIDR", "value": first}));
    ops.push(json!({"op": "add", "path": "/spec/podCIDRs", "value": list}));
    serde_json::from_value(Value::Array(ops)).map_err(|e| e.to_string())
}

/// Why the CIDRs were not written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WriteError {
    /// The Node is gone (or was re-created under its name).
    #[error("node not found")]
    NotFound,
    /// The Node got pod CIDRs meanwhile (or another UID): the precondition failed.
    #[error("the node changed: it has pod CIDRs now, or was re-created")]
    Precondition,
    /// The API refused the patch or failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// Writes `cidrs` to `node` with [`pod_cidrs_patch`].
pub(crate) async fn write_pod_cidrs(
    api: &Api<Node>,
    node: &Node,
    cidrs: &[IpNet],
) -> Result<Node, WriteError> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let patch = pod_cidrs_patch(node, cidrs)
        .map_err(|e| WriteError::Kube(kube::Error::Service(e.into())))?;
    match lean_api(api)
        .patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
    {
        Ok(updated) => Ok(updated.into()),
        Err(kube::Error::Api(s)) if s.code == 404 => Err(WriteError::NotFound),
        // 422: a `test` failed (kube-apiserver reports it so); 409: a conflict inside the server.
        Err(kube::Error::Api(s)) if s.code == 422 || s.code == 409 => Err(WriteError::Precondition),
        Err(e) => Err(WriteError::Kube(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;

    fn node(uid: Option<&str>, spec: Option<NodeSpec>) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        n.metadata.uid = uid.map(str::to_owned);
        n.spec = spec;
        n
    }

    fn apply(doc: &Value, patch: &json_patch::Patch) -> Result<Value, String> {
        // The API server's semantics: a `test` for null passes on a missing key.
        let mut doc = doc.clone();
        for op in &patch.0 {
            if let json_patch::PatchOperation::Test(t) = op
                && t.value.is_null()
            {
                if doc.pointer(t.path.as_str()).is_some_and(|v| !v.is_null()) {
                    return Err(format!("test {} failed", t.path));
                }
                continue;
            }
            json_patch::patch(&mut doc, &json_patch::Patch(vec![op.clone()]))
                .map_err(|e| e.to_string())?;
        }
        Ok(doc)
    }

    #[test]
    fn sets_both_fields_only_when_empty_and_same_uid() {
        let cidrs: Vec<IpNet> = vec!["10.0.1.0/24".parse().unwrap(), "fd00::/64".parse().unwrap()];
        let n = node(Some("u1"), Some(NodeSpec::default()));
        let patch = pod_cidrs_patch(&n, &cidrs).unwrap();
        let doc = json!({"metadata": {"name": "n1", "uid": "u1"}, "spec": {"providerID": "x"}});
        let out = apply(&doc, &patch).unwrap();
        assert_eq!(out["spec"]["podCIDR"], "10.0.1.0/24");
        assert_eq!(out["spec"]["podCIDRs"], json!(["10.0.1.0/24", "fd00::/64"]));
        assert_eq!(out["spec"]["providerID"], "x");

        let taken = json!({"metadata": {"uid": "u1"}, "spec": {"podCIDR": "10.0.9.0/24", "podCIDRs": ["10.0.9.0/24"]}});
        assert!(apply(&taken, &patch).is_err(), "never clobbers");
        let other = json!({"metadata": {"uid": "u2"}, "spec": {}});
        assert!(apply(&other, &patch).is_err(), "never another Node's");
    }

    #[test]
    fn a_node_without_spec_gets_one() {
        let cidrs: Vec<IpNet> = vec!["10.0.1.0/24".parse().unwrap()];
        let patch = pod_cidrs_patch(&node(None, None), &cidrs).unwrap();
        let out = apply(&json!({"metadata": {"name": "n1"}}), &patch).unwrap();
        assert_eq!(out["spec"]["podCIDRs"], json!(["10.0.1.0/24"]));
        assert!(pod_cidrs_patch(&node(None, None), &[]).is_err());
    }
}

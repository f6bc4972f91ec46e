//! Node writes that never clobber another writer's change, and never conflict with a write
//! that touches nothing they depend on.
//!
//! Metadata and spec (labels, providerID, taints) are written with one JSON patch whose first
//! operations `test` exactly what the change was planned from
//! ([`SpecUpdate::preconditions`]: the UID, the taint list it replaces, the providerID it sets,
//! the labels it sets or read). If another writer changed one of those since (a user adding a
//! taint or the same label), the server rejects the patch (422), and we re-read the node with
//! a GET and plan again, a bounded number of times. A write to anything else, above all
//! kubelet's status writes right after it registers a Node, fails no test: no round trip. Why
//! not a `test` of `metadata.resourceVersion`: every write bumps it, so on a real cluster a
//! third of the spec patches of freshly registered Nodes failed on kubelet's first status
//! write. Nothing is ever PUT from the informer cache (cached Nodes are stripped).
//!
//! `status.addresses` is written with a JSON merge patch of just that list on the `status`
//! subresource. Why merge and not strategic merge: the strategic merge key of
//! `status.addresses` is `type`, so a node with two `InternalIP`s (dual-stack) merges badly;
//! a merge patch replaces the list as a whole. Why no resourceVersion guard there: the list is
//! owned by the cloud-node controller (kubelet `--cloud-provider=external` leaves it to the
//! CCM), and kubelet's frequent status heartbeats would make a guarded patch conflict for
//! nothing.

use ccm_core::{Node, NodeAddress};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use super::spec::SpecUpdate;
use crate::machinery::lean_node::lean_api;

/// How many times a conflicting spec patch is re-planned from a fresh read before giving up
/// (the work queue then retries with backoff).
pub(crate) const MAX_CONFLICT_RETRIES: usize = 5;

/// Why a guarded node patch did not apply.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PatchError<E: std::error::Error + 'static> {
    /// Planning against the fresh node failed.
    #[error(transparent)]
    Plan(E),
    /// The node no longer exists.
    #[error("node not found")]
    NotFound,
    /// Every attempt conflicted with another writer.
    #[error("node kept changing: gave up after {0} conflicting writes")]
    Conflicts(usize),
    /// The patch was refused or the API failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

fn is_status(err: &kube::Error, codes: &[u16]) -> bool {
    matches!(err, kube::Error::Api(s) if codes.contains(&s.code))
}

/// Builds the JSON patch for `update` planned from `node`, guarded by the preconditions of
/// that plan.
pub(crate) fn guarded_patch(
    node: &Node,
    update: &SpecUpdate,
) -> Result<json_patch::Patch, serde_json::Error> {
    let mut ops = update.preconditions(node);
    ops.extend(update.json_patch_ops(node));
    serde_json::from_value(Value::Array(ops))
}

/// Plans a change with `plan` against `node` (usually the cached copy) and writes it with a
/// JSON patch guarded by the plan's preconditions; on a conflict, re-reads the node (GET) and plans again, at most
/// [`MAX_CONFLICT_RETRIES`] times. A fresh read with another UID is another Node under the same
/// name (deleted and re-created meanwhile): the Node the change was planned for is gone
/// ([`PatchError::NotFound`]), and nothing planned for it (e.g. from its cloud answer) is written
/// to its successor, which gets its own sync. Returns the node as the server has it after the write (or
/// as planned from, when `plan` found nothing to change) and whether a write happened.
pub(crate) async fn patch_node_spec<E, F>(
    api: &Api<Node>,
    node: Node,
    mut plan: F,
) -> Result<(Node, bool), PatchError<E>>
where
    E: std::error::Error + 'static,
    F: FnMut(&Node) -> Result<SpecUpdate, E>,
{
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut node = node;
    for _ in 0..=MAX_CONFLICT_RETRIES {
        let update = plan(&node).map_err(PatchError::Plan)?;
        if update.is_empty() {
            return Ok((node, false));
        }
        let patch = guarded_patch(&node, &update)
            .map_err(|e| PatchError::Kube(kube::Error::SerdeError(e)))?;
        match lean_api(api)
            .patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await
        {
            Ok(updated) => return Ok((updated.into(), true)),
            // 409: resourceVersion conflict inside the server; 422: one of our `test`s failed
            // (the API server reports a failed JSON-patch test as 422 Unprocessable Entity).
            Err(err) if is_status(&err, &[409, 422]) => {
                let fresh = match api.get(&name).await {
                    Ok(fresh) => fresh,
                    Err(e) if is_status(&e, &[404]) => return Err(PatchError::NotFound),
                    Err(e) => return Err(PatchError::Kube(e)),
                };
                if fresh.metadata.uid != node.metadata.uid {
                    tracing::debug!(node = %name, "node was deleted and re-created; not writing to the new one");
                    return Err(PatchError::NotFound);
                }
                if fresh.metadata.resource_version == node.metadata.resource_version {
                    // The node did not change: the server refused the change itself (e.g. an
                    // invalid label value, or a providerID change). Retrying cannot help.
                    return Err(PatchError::Kube(err));
                }
                tracing::debug!(node = %name, "node changed concurrently; re-planning from a fresh read");
                node = fresh;
            }
            Err(err) if is_status(&err, &[404]) => return Err(PatchError::NotFound),
            Err(err) => return Err(PatchError::Kube(err)),
        }
    }
    Err(PatchError::Conflicts(MAX_CONFLICT_RETRIES + 1))
}

/// Replaces `status.addresses` with a merge patch on the status subresource. The patch carries
/// the node's `metadata.uid`, which the API server takes as a precondition (409 when it differs,
/// as kubelet's pod status patches do): addresses from one Node's cloud answer never land on a
/// Node re-created under the same name.
pub(crate) async fn patch_addresses(
    api: &Api<Node>,
    node: &Node,
    addresses: &[NodeAddress],
) -> Result<Node, kube::Error> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let mut body = json!({ "status": { "addresses": addresses } });
    if let Some(uid) = &node.metadata.uid {
        body["metadata"] = json!({ "uid": uid });
    }
    lean_api(api)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(body))
        .await
        .map(Node::from)
}

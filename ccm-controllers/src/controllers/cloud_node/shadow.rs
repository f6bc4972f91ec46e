//! Shadow mode (`--shadow`): an initialised Node is normally left alone (Go re-checks only
//! its addresses), so a shadow re-plans its initialisation once, with the same planner, and
//! makes the writes it would have made. In shadow mode every write is a dry run that the
//! runtime's write guard compares with the Node (`machinery/shadow`), so a zone, an instance
//! type, a providerID or addresses that differ from the incumbent's become divergences.

use std::hash::{DefaultHasher, Hash, Hasher};

use ccm_core::{CloudError, Node};

use super::plan;
use super::sync::Reconciler;
use crate::controllers::node::patch;

/// A digest of what the initialisation sets (labels, providerID, addresses): the Node is
/// re-planned when it changes.
fn digest(node: &Node) -> u64 {
    let mut h = DefaultHasher::new();
    node.metadata.labels.hash(&mut h);
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_ref())
        .hash(&mut h);
    if let Some(addresses) = node.status.as_ref().and_then(|s| s.addresses.as_ref()) {
        for a in addresses {
            (&a.type_, &a.address).hash(&mut h);
        }
    }
    h.finish()
}

impl Reconciler {
    /// Re-plans the initialisation of the initialised `node` and writes it (as a dry run),
    /// once per Node and state of the fields it sets.
    /// An error means the Node could not be compared (its metadata could not be fetched).
    pub(crate) async fn verify_initialized(&self, node: Node) -> Result<(), String> {
        let uid = node.metadata.uid.clone().unwrap_or_default();
        let digest = digest(&node);
        {
            let verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
            if verified.get(&uid) == Some(&digest) {
                return Ok(());
            }
        }
        let name = node.metadata.name.clone().unwrap_or_default();
        let fetched = match self.fetch_metadata(&node).await {
            Ok(f) => f,
            // The instance is gone: compared (the lifecycle controller reports the Node as a
            // would-delete when it is NotReady); asking again would repeat the same answer.
            Err(e) if matches!(e.source, CloudError::InstanceNotFound) => {
                tracing::debug!(node = %name, "shadow: the node's instance is gone; nothing to re-plan");
                self.verified
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(uid, digest);
                return Ok(());
            }
            Err(e) => {
                tracing::debug!(node = %name, error = %e.source, "shadow: cannot re-plan the node's initialisation");
                return Err(format!("instance metadata: {}", e.source));
            }
        };
        let (meta, require) = (&fetched.meta, fetched.require_provider_id);
        let planned = match plan::plan_init(&node, meta, require) {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(node = %name, error = %e, "shadow: the node's initialisation would fail");
                return Ok(());
            }
        };
        if let Some(addresses) = &planned.addresses
            && let Err(e) = patch::patch_addresses(&self.api, &node, addresses).await
        {
            tracing::debug!(node = %name, error = %e, "shadow: dry-run address write failed");
        }
        if !planned.spec.is_empty() {
            let result = patch::patch_node_spec(&self.api, node, |current| {
                plan::plan_init(current, meta, require).map(|p| p.spec)
            })
            .await;
            if let Err(e) = result {
                tracing::debug!(node = %name, error = %e, "shadow: dry-run node write failed");
            }
        }
        self.verified
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid, digest);
        Ok(())
    }
}

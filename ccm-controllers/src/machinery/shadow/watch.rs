//! The shadow's view of the shared informers: resolves divergences when an object changes
//! (the incumbent converged, or the object moved on and the controllers plan again), settles
//! pending objects, promotes pending changes whose grace period passed, and counts the objects
//! compared.

use ccm_core::NodeView;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Service};

use super::Shadow;
use super::fields::{
    FIELD_NODE_DELETED, node_fields, node_pending, node_ready, service_fields, service_pending,
};
use crate::machinery::informer::{Change, Informer};
use crate::machinery::ownership::Ownership;

/// How often pending changes are checked against the grace period.
const TICK: Duration = Duration::from_secs(1);

/// A field the write guard compares (the cloud guard's own fields are resolved by it).
fn is_object_field(field: &str) -> bool {
    field.starts_with("metadata.") || field.starts_with("spec.") || field.starts_with("status.")
}

impl Shadow {
    /// Follows the shared informers until they stop; run it beside them.
    pub(crate) async fn watch(
        self: Arc<Self>,
        nodes: Informer<Node, NodeView>,
        services: Informer<Service>,
        ownership: Arc<Ownership>,
    ) {
        let _ = self.stores.set((nodes.clone(), services.clone()));
        let _ = self.ownership.set(ownership);
        let (Some(mut node_changes), Some(mut service_changes)) =
            (nodes.subscribe().await, services.subscribe().await)
        else {
            return;
        };
        let mut tick = tokio::time::interval(TICK);
        loop {
            tokio::select! {
                change = node_changes.recv() => match change {
                    Some(change) => self.node_changed(change),
                    None => return,
                },
                change = service_changes.recv() => match change {
                    Some(change) => self.service_changed(change),
                    None => return,
                },
                _ = tick.tick() => {
                    self.promote_expired();
                    self.set_compared("Node", nodes.list().len());
                    self.set_compared("Service", services.list().len());
                }
            }
        }
    }

    fn node_changed(&self, change: Change<NodeView>) {
        match change {
            Change::Applied { new, .. } => {
                // The shadow's comparisons read the whole Node: a copy of the cached view.
                let new = new.to_node();
                let name = new.metadata.name.clone().unwrap_or_default();
                let fields = node_fields(&new);
                let ready = node_ready(&new);
                self.resolve_where("Node", &name, |d| {
                    if d.field == FIELD_NODE_DELETED {
                        ready
                    } else {
                        is_object_field(&d.field) && Shadow::stale_in(d, &fields)
                    }
                });
                if !node_pending(&new) {
                    self.settled("Node", &name);
                }
            }
            Change::Deleted(old) => {
                let name = old.name().to_owned();
                self.resolve_where("Node", &name, |_| true);
                self.settled("Node", &name);
                self.forget_object("Node", &name);
            }
            Change::Resync => {}
        }
    }

    fn service_changed(&self, change: Change<Arc<Service>>) {
        match change {
            Change::Applied { new, .. } => {
                let object = service_object(&new);
                let fields = service_fields(&new);
                self.resolve_where("Service", &object, |d| {
                    is_object_field(&d.field) && Shadow::stale_in(d, &fields)
                });
                if !service_pending(&new) {
                    self.settled("Service", &object);
                }
            }
            Change::Deleted(old) => {
                let object = service_object(&old);
                self.resolve_where("Service", &object, |_| true);
                self.settled("Service", &object);
                self.forget_object("Service", &object);
            }
            Change::Resync => {}
        }
    }
}

/// `namespace/name` of a Service.
pub(crate) fn service_object(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or_default(),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

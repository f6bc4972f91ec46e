//! The cloud-node-lifecycle controller's cloud calls: does the instance exist, is it shut down.

use ccm_core::{CloudError, CloudProvider, Node};
use kube::ResourceExt;

use crate::controllers::node::cloud::legacy_provider_id;
use crate::controllers::node::node_provider_id;

/// Whether the instance exists (Go's `ensureNodeExistsByProviderID`). On the legacy path an
/// `InstanceNotFound` from the provider-ID lookup means "gone"; from the exists call itself,
/// like any error, it means "unknown".
pub(super) async fn instance_exists(
    cloud: &dyn CloudProvider,
    node: &Node,
) -> Result<bool, CloudError> {
    if let Some(v2) = cloud.instances_v2() {
        return v2
            .instance_exists(&ccm_core::NodeView::from_node(node))
            .await;
    }
    let Some(instances) = cloud.instances() else {
        return Err(CloudError::msg(
            "instances interface not supported in the cloud provider",
        ));
    };
    let mut id = node_provider_id(node).to_owned();
    if id.is_empty() {
        id = match legacy_provider_id(cloud, instances, &node.name_any()).await {
            Ok(id) => id,
            Err(CloudError::InstanceNotFound) => return Ok(false),
            Err(e) => return Err(e),
        };
    }
    instances.instance_exists_by_provider_id(&id).await
}

/// Whether the instance is shut down (Go's `shutdownInCloudProvider`); `NotImplemented`, and an
/// `InstanceNotFound` from the legacy provider-ID lookup, mean "not shut down".
pub(super) async fn instance_shutdown(
    cloud: &dyn CloudProvider,
    node: &Node,
) -> Result<bool, CloudError> {
    let result = if let Some(v2) = cloud.instances_v2() {
        v2.instance_shutdown(&ccm_core::NodeView::from_node(node))
            .await
    } else if let Some(instances) = cloud.instances() {
        let mut id = node_provider_id(node).to_owned();
        if id.is_empty() {
            id = match legacy_provider_id(cloud, instances, &node.name_any()).await {
                Ok(id) => id,
                Err(CloudError::InstanceNotFound) => return Ok(false),
                Err(e) => return Err(e),
            };
        }
        instances.instance_shutdown_by_provider_id(&id).await
    } else {
        Err(CloudError::msg("cloud provider does not support instances"))
    };
    match result {
        Err(CloudError::NotImplemented) => Ok(false),
        other => other,
    }
}

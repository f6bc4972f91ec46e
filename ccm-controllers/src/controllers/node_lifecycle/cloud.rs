//! The cloud-node-lifecycle controller's cloud calls: does the instance exist, is it shut down.

use ccm_core::{CloudError, CloudProvider, NodeView};

use crate::controllers::node::cloud::legacy_provider_id;

/// Whether the instance exists (Go's `ensureNodeExistsByProviderID`). On the legacy path an
/// `InstanceNotFound` from the provider-ID lookup means "gone"; from the exists call itself,
/// like any error, it means "unknown".
pub(super) async fn instance_exists(
    cloud: &dyn CloudProvider,
    node: &NodeView,
) -> Result<bool, CloudError> {
    if let Some(v2) = cloud.instances_v2() {
        return v2.instance_exists(node).await;
    }
    let Some(instances) = cloud.instances() else {
        return Err(CloudError::msg(
            "instances interface not supported in the cloud provider",
        ));
    };
    let mut id = node.provider_id().to_owned();
    if id.is_empty() {
        id = match legacy_provider_id(cloud, instances, node.name()).await {
            Ok(id) => id,
            Err(CloudError::InstanceNotFound) => return Ok(false),
            Err(e) => return Err(e),
        };
    }
    instances.instance_exists_by_provider_id(&id).await
}

/// Whether the instance is shut down (Go's `shutdownInCloudProvider`; `NotImplemented`, and an
/// `InstanceNotFound` from the legacy provider-ID lookup, mean "not shut down"), and whether
/// the answer is the cloud's own: false when `Ok(false)` stands for `NotImplemented` or for
/// the legacy provider-ID lookup's `InstanceNotFound` (Go's "not shut down", but no evidence
/// that the instance runs: the out-of-service taint is never removed on it).
pub(super) async fn instance_shutdown_known(
    cloud: &dyn CloudProvider,
    node: &NodeView,
) -> (Result<bool, CloudError>, bool) {
    let result = if let Some(v2) = cloud.instances_v2() {
        v2.instance_shutdown(node).await
    } else if let Some(instances) = cloud.instances() {
        let mut id = node.provider_id().to_owned();
        if id.is_empty() {
            id = match legacy_provider_id(cloud, instances, node.name()).await {
                Ok(id) => id,
                Err(CloudError::InstanceNotFound) => return (Ok(false), false),
                Err(e) => return (Err(e), true),
            };
        }
        instances.instance_shutdown_by_provider_id(&id).await
    } else {
        Err(CloudError::msg("cloud provider does not support instances"))
    };
    match result {
        Err(CloudError::NotImplemented) => (Ok(false), false),
        other => (other, true),
    }
}

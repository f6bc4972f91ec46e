//! Cloud lookups both node controllers make.

use ccm_core::{CloudError, CloudProvider, Instances, ProviderId};

/// The provider ID of a node on the legacy path (Go's `GetInstanceProviderID`):
/// `<provider_name>://<instance_id(node name)>`. `NotImplemented` and `InstanceNotFound` pass
/// through unchanged.
pub(crate) async fn legacy_provider_id(
    cloud: &dyn CloudProvider,
    instances: &dyn Instances,
    node_name: &str,
) -> Result<String, CloudError> {
    let id = instances.instance_id(node_name).await?;
    ProviderId::new(cloud.provider_name(), id)
        .map(|p| p.to_string())
        .map_err(CloudError::other)
}

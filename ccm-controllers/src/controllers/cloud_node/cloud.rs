//! Cloud lookups of the cloud-node controller: instance metadata through `InstancesV2`, or the
//! legacy `Instances` (+ `Zones`) fallbacks of Go's `getInstanceMetadata` (reference §2.3).

use ccm_core::{
    CloudError, CloudProvider, InstanceMetadata, Instances, Node, NodeAddress, NodeView,
};

use super::plan::Step;
use crate::controllers::node::cloud::legacy_provider_id;
use crate::controllers::node::{node_name, node_provider_id};

/// Metadata for a node, and whether an empty providerID is an error.
#[derive(Clone, Debug)]
pub(crate) struct Fetched {
    /// The metadata (on the legacy path: assembled from several calls).
    pub(crate) meta: InstanceMetadata,
    /// True on the `InstancesV2` path; false on the legacy path, where `instance_id`
    /// answering `NotImplemented` leaves the providerID empty and initialisation continues.
    pub(crate) require_provider_id: bool,
}

/// A failed lookup and the step it belongs to.
#[derive(Debug, thiserror::Error)]
#[error("{source}")]
pub(crate) struct FetchError {
    /// The step named in the Warning event.
    pub(crate) step: Step,
    /// The cloud's error (a `Retry` is honoured by the caller).
    #[source]
    pub(crate) source: CloudError,
}

impl FetchError {
    fn metadata(source: CloudError) -> Self {
        FetchError {
            step: Step::Metadata,
            source,
        }
    }
}

/// Tries the by-provider-ID lookup, then the by-name one (Go's `...ByProviderIDOrName`).
/// The by-provider-ID call is skipped when the node has no providerID (Go calls it with an
/// empty string). A `Retry` from the first call is returned at once: the provider asked us to
/// wait, not to try another way.
async fn by_id_or_name<T, A, B>(
    what: &str,
    provider_id: &str,
    by_id: A,
    by_name: B,
) -> Result<T, CloudError>
where
    A: Future<Output = Result<T, CloudError>>,
    B: Future<Output = Result<T, CloudError>>,
{
    if provider_id.is_empty() {
        return by_name.await;
    }
    let id_err = match by_id.await {
        Ok(v) => return Ok(v),
        Err(e @ CloudError::Retry { .. }) => return Err(e),
        Err(e) => e,
    };
    match by_name.await {
        Ok(v) => Ok(v),
        Err(e @ CloudError::Retry { .. }) => Err(e),
        Err(name_err) => Err(CloudError::msg(format!(
            "{what}: error fetching by providerID: {id_err}, error fetching by node name: {name_err}"
        ))),
    }
}

/// The node's instance metadata: one `instance_metadata` call with `InstancesV2`, else three
/// to six legacy calls (instance ID when the node has no providerID, instance type, addresses,
/// and the zone when the provider offers `Zones`).
pub(crate) async fn fetch_metadata(
    cloud: &dyn CloudProvider,
    node: &Node,
) -> Result<Fetched, FetchError> {
    if let Some(v2) = cloud.instances_v2() {
        let meta = v2
            .instance_metadata(&ccm_core::NodeView::from_node(node))
            .await
            .map_err(FetchError::metadata)?;
        return Ok(Fetched {
            meta,
            require_provider_id: true,
        });
    }
    let Some(instances) = cloud.instances() else {
        return Err(FetchError::metadata(CloudError::msg(
            "failed to get instances from cloud provider",
        )));
    };
    let name = node_name(node);
    let mut provider_id = node_provider_id(node).to_owned();
    if provider_id.is_empty() {
        provider_id = match legacy_provider_id(cloud, instances, name).await {
            Ok(id) => id,
            Err(CloudError::NotImplemented) => String::new(),
            Err(source) => {
                return Err(FetchError {
                    step: Step::ProviderId,
                    source,
                });
            }
        };
    }
    let instance_type = by_id_or_name(
        "instance type",
        &provider_id,
        instances.instance_type_by_provider_id(&provider_id),
        instances.instance_type(name),
    )
    .await
    .map_err(FetchError::metadata)?;
    let node_addresses = legacy_addresses(instances, &provider_id, name)
        .await
        .map_err(FetchError::metadata)?;
    let mut meta = InstanceMetadata {
        provider_id,
        instance_type,
        node_addresses,
        ..Default::default()
    };
    if let Some(zones) = cloud.zones() {
        let zone = by_id_or_name(
            "zone",
            &meta.provider_id,
            zones.get_zone_by_provider_id(&meta.provider_id),
            zones.get_zone_by_node_name(name),
        )
        .await
        .map_err(|e| match e {
            e @ CloudError::Retry { .. } => FetchError::metadata(e),
            e => FetchError::metadata(CloudError::msg(format!(
                "failed to get zone from cloud provider: {e}"
            ))),
        })?;
        meta.zone = zone.failure_domain;
        meta.region = zone.region;
    }
    Ok(Fetched {
        meta,
        require_provider_id: false,
    })
}

async fn legacy_addresses(
    instances: &dyn Instances,
    provider_id: &str,
    name: &str,
) -> Result<Vec<NodeAddress>, CloudError> {
    by_id_or_name(
        "node addresses",
        provider_id,
        instances.node_addresses_by_provider_id(provider_id),
        instances.node_addresses(name),
    )
    .await
}

/// The cloud's answer for the periodic refresh.
#[derive(Clone, Debug)]
pub(crate) struct RefreshAnswer {
    /// The instance's metadata: whole with `InstancesV2` (one `instance_metadata` call), only
    /// its addresses with the legacy `Instances`.
    pub(crate) meta: InstanceMetadata,
    /// Whether `meta` holds the zone, region, instance type and additional labels (false on
    /// the legacy path, where they would cost further calls the refresh does not make).
    pub(crate) labels_known: bool,
}

/// The node's current addresses (and, with `InstancesV2`, the rest of its metadata, from the
/// same call) for the periodic refresh (Go's `getInstanceNodeAddresses`): `instance_metadata`
/// with `InstancesV2`, else `node_addresses_by_provider_id` falling back to `node_addresses`.
pub(crate) async fn fetch_refresh(
    cloud: &dyn CloudProvider,
    node: &NodeView,
) -> Result<RefreshAnswer, CloudError> {
    if let Some(v2) = cloud.instances_v2() {
        return Ok(RefreshAnswer {
            meta: v2.instance_metadata(node).await?,
            labels_known: true,
        });
    }
    let Some(instances) = cloud.instances() else {
        return Err(CloudError::msg(
            "failed to get instances from cloud provider",
        ));
    };
    let node_addresses = legacy_addresses(instances, node.provider_id(), node.name()).await?;
    Ok(RefreshAnswer {
        meta: InstanceMetadata {
            node_addresses,
            ..Default::default()
        },
        labels_known: false,
    })
}

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ccm_core::{
    BoxError, CloudError, CloudProvider, CloudResult, InstanceMetadata, InstancesV2, LoadBalancer,
    LoadBalancerIngress, LoadBalancerStatus, NodeAddress, NodeView, ProviderId, Route, Routes,
    Service, async_trait,
};
use serde::Deserialize;

use acme_api::{ApiError, Machine, MachineState};

/// The provider's name: `--cloud-provider=acme`, and the scheme of provider IDs
/// (`acme://<zone>/<machine-id>`).
pub const PROVIDER_NAME: &str = "acme";

/// The contents of the `--cloud-config` file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcmeConfig {
    /// The API endpoint, e.g. `https://api.fra.acme.example`.
    pub endpoint: String,
    /// The API token. In production, mount it from a Secret.
    pub token: String,
    /// The private network whose route table carries the pod CIDRs. Without it the provider
    /// offers no routes (the route controller does not run).
    #[serde(default)]
    pub network: Option<String>,
}

//! # ccm-core: the cloud provider contract
//!
//! This crate is everything a cloud vendor reads to implement a cloud provider for a Rust
//! cloud-controller-manager (CCM). It holds the provider traits (the Rust counterpart of Go's
//! `k8s.io/cloud-provider` `cloudprovider.Interface`), the [`CloudError`] every method returns,
//! the plain data types ([`InstanceMetadata`], [`Zone`], [`Route`], [`ProviderId`]), the
//! registry ([`register_cloud_provider!`], [`build_provider`]) and the helpers Go gives vendors
//! ([`default_load_balancer_name`], [`load_balancer_source_ranges`], ...).
//!
//! It knows nothing of kube's client, tokio's runtime or the controllers: those live in
//! `ccm-controllers`, which calls your provider, and `ccm-testing`, which tests it. The
//! Kubernetes types the traits take are re-exported here ([`Service`], [`Node`], ...; the whole
//! crate as [`k8s_openapi`]) so your provider needs no `k8s-openapi` version pick of its own.
//! Nodes reach a provider as [`NodeView`]s: the framework's compact, shared, read-only view of
//! a cached Node, with [`NodeView::to_node`] for the rare provider that needs a full `Node`.
//!
//! ## The shape of a provider
//!
//! - [`CloudProvider`] is the entry point: a name, and one method per optional capability,
//!   each defaulting to `None` (unsupported).
//! - Capabilities: [`InstancesV2`] (preferred) or the legacy [`Instances`] + [`Zones`] for the
//!   node controllers, with the optional [`InstancesBatch`] (many Nodes per cloud call);
//!   [`LoadBalancer`] for `type: LoadBalancer` Services, with the optional
//!   [`LoadBalancerHostsBatch`] (the hosts of many load balancers per cloud call), serving the
//!   [`LoadBalancerClasses`] the provider declares (by default Services without a class, as
//!   in Go); [`Routes`] for
//!   pod-CIDR routes; [`Clusters`] (never called by the framework).
//! - Each method's documentation states its contract: what "not found" means, whether it must
//!   be idempotent, and what the framework does with each answer.
//! - Cancellation: the framework drops a call's future to cancel it (shutdown, per-call
//!   timeout). There is no context parameter.
//!
//! ## A complete minimal provider
//!
//! A provider with instances and load balancers, registered under the name `tiny`:
//!
//! ```
//! use std::collections::BTreeMap;
//! use std::sync::{Arc, Mutex};
//!
//! use ccm_core::async_trait;
//! use ccm_core::{
//!     register_cloud_provider, BoxError, CloudError, CloudProvider, CloudResult, InstanceMetadata,
//!     InstancesV2, LoadBalancer, LoadBalancerIngress, LoadBalancerStatus, Node, NodeAddress,
//!     NodeView, ProviderId, Service,
//! };
//!
//! /// The vendor's config, read from `--cloud-config`.
//! #[derive(serde::Deserialize)]
//! struct TinyConfig {
//!     zone: String,
//! }
//!
//! struct TinyCloud {
//!     zone: String,
//!     /// Load balancers by the default name, with their host names.
//!     balancers: Mutex<BTreeMap<String, Vec<String>>>,
//! }
//!
//! #[async_trait]
//! impl CloudProvider for TinyCloud {
//!     fn provider_name(&self) -> &str {
//!         "tiny"
//!     }
//!     fn instances_v2(&self) -> Option<&dyn InstancesV2> {
//!         Some(self)
//!     }
//!     fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
//!         Some(self)
//!     }
//! }
//!
//! #[async_trait]
//! impl InstancesV2 for TinyCloud {
//!     async fn instance_exists(&self, node: &NodeView) -> CloudResult<bool> {
//!         // A real provider asks its cloud; stopped machines still exist.
//!         Ok(!node.name().starts_with("gone-"))
//!     }
//!     async fn instance_shutdown(&self, _node: &NodeView) -> CloudResult<bool> {
//!         Ok(false)
//!     }
//!     async fn instance_metadata(&self, node: &NodeView) -> CloudResult<InstanceMetadata> {
//!         let id = ProviderId::new("tiny", node.name()).map_err(CloudError::other)?;
//!         Ok(InstanceMetadata {
//!             provider_id: id.to_string(),
//!             instance_type: "tiny-1".into(),
//!             node_addresses: vec![NodeAddress {
//!                 type_: "InternalIP".into(),
//!                 address: "10.0.0.7".into(),
//!             }],
//!             zone: self.zone.clone(),
//!             region: "tiny-region".into(),
//!             additional_labels: BTreeMap::new(),
//!         })
//!     }
//! }
//!
//! #[async_trait]
//! impl LoadBalancer for TinyCloud {
//!     async fn get_load_balancer(
//!         &self,
//!         _cluster: &str,
//!         svc: &Service,
//!     ) -> CloudResult<Option<LoadBalancerStatus>> {
//!         let name = ccm_core::default_load_balancer_name(svc);
//!         let exists = self.balancers.lock().map_err(|e| CloudError::msg(e.to_string()))?.contains_key(&name);
//!         Ok(exists.then(status))
//!     }
//!     async fn ensure_load_balancer(
//!         &self,
//!         _cluster: &str,
//!         svc: &Service,
//!         hosts: &[NodeView],
//!     ) -> CloudResult<LoadBalancerStatus> {
//!         self.update_load_balancer(_cluster, svc, hosts).await?;
//!         Ok(status())
//!     }
//!     async fn update_load_balancer(&self, _cluster: &str, svc: &Service, hosts: &[NodeView]) -> CloudResult<()> {
//!         let hosts = hosts.iter().map(|n| n.name().to_owned()).collect();
//!         let mut lbs = self.balancers.lock().map_err(|e| CloudError::msg(e.to_string()))?;
//!         lbs.insert(ccm_core::default_load_balancer_name(svc), hosts);
//!         Ok(())
//!     }
//!     async fn ensure_load_balancer_deleted(&self, _cluster: &str, svc: &Service) -> CloudResult<()> {
//!         // Succeeds when nothing exists: deletion is idempotent.
//!         let mut lbs = self.balancers.lock().map_err(|e| CloudError::msg(e.to_string()))?;
//!         lbs.remove(&ccm_core::default_load_balancer_name(svc));
//!         Ok(())
//!     }
//! }
//!
//! fn status() -> LoadBalancerStatus {
//!     LoadBalancerStatus {
//!         ingress: Some(vec![LoadBalancerIngress { ip: Some("192.0.2.1".into()), ..Default::default() }]),
//!     }
//! }
//!
//! /// The factory: builds the provider from the `--cloud-config` contents.
//! fn build_tiny(cloud_config: Option<&[u8]>) -> Result<Arc<dyn CloudProvider>, BoxError> {
//!     let config: TinyConfig = ccm_core::parse_cloud_config(cloud_config.unwrap_or_default())?;
//!     Ok(Arc::new(TinyCloud { zone: config.zone, balancers: Mutex::default() }))
//! }
//!
//! register_cloud_provider!("tiny", build_tiny);
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // What the framework does at startup with `--cloud-provider=tiny --cloud-config=...`:
//! let provider = ccm_core::build_provider("tiny", Some(b"zone: tiny-a\n")).unwrap();
//! let node = Node {
//!     metadata: ccm_core::ObjectMeta { name: Some("worker-1".into()), ..Default::default() },
//!     ..Default::default()
//! };
//! let view = NodeView::from_node(&node);
//! let meta = provider.instances_v2().unwrap().instance_metadata(&view).await.unwrap();
//! assert_eq!(meta.provider_id, "tiny://worker-1");
//! assert_eq!(meta.zone, "tiny-a");
//! assert!(provider.routes().is_none());
//!
//! // A config the factory cannot read is reported with the provider's name and the line.
//! let err = ccm_core::build_provider("tiny", Some(b"zone: [")).err().unwrap();
//! assert!(err.to_string().starts_with("could not init cloud provider \"tiny\": invalid cloud config at line"));
//! # }
//! ```
//!
//! ## Keeping a provider crate linked
//!
//! When the provider lives in its own library crate, the binary's `main.rs` must name it
//! (`use acme_cloud_provider as _;`): the linker drops crates the binary never names, and the
//! registration goes with them. See [`registry`].

#![warn(missing_docs)]

mod classes;
mod error;
mod helpers;
mod ip_mode;
mod node_view;
mod provider;
pub mod registry;
mod types;
pub mod well_known;

pub use classes::{LoadBalancerClassError, LoadBalancerClasses, check_load_balancer_class};
pub use error::{BoxError, CloudError};
pub use helpers::{
    SourceRangeError, default_load_balancer_name, health_check_path_port, is_allow_all,
    load_balancer_source_ranges, needs_health_check, requests_only_local_traffic,
};
pub use ip_mode::{ANNOTATION_IP_MODE, IpMode, IpModes};
pub use node_view::{NodeView, NodeViewCondition, NodeViewInterner};
pub use provider::{
    CloudProvider, CloudResult, Clusters, InitContext, Instances, InstancesBatch, InstancesV2,
    LoadBalancer, LoadBalancerHostsBatch, Routes, Zones,
};
pub use registry::{
    CloudConfigError, ProviderFactory, ProviderRegistration, RegistryError, build_provider,
    is_registered, parse_cloud_config, registered_providers,
};
pub use types::{
    InstanceAnswer, InstanceAnswers, InstanceMetadata, LoadBalancerHostsAnswers, ProviderId,
    ProviderIdError, Route, Zone,
};

/// Re-exported so providers implement the traits with the same macro version the traits use.
pub use async_trait::async_trait;
/// Re-exported: the CIDR type of [`load_balancer_source_ranges`].
pub use ipnet;
/// Re-exported: the Kubernetes API types of the contract. Vendors use this instead of picking
/// their own `k8s-openapi` version.
pub use k8s_openapi;
/// Re-exported: the shutdown token type of [`InitContext::shutdown`].
pub use tokio_util::sync::CancellationToken;

pub use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, Node, NodeAddress, PortStatus, Service,
};
pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

#[doc(hidden)]
pub mod __private {
    pub use inventory;
}

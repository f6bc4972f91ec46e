//! The Acme cloud provider of docs/writing-a-provider.md (steps 4 to 9, generated).

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

/// Maps an Acme API error onto the provider contract's error.
///
/// "Not found" is *not* mapped here: what it means depends on the call (an instance that is gone
/// is `Ok(false)` for `instance_exists`, a load balancer that is gone is success for
/// `ensure_load_balancer_deleted`), so each method handles it before calling this.
fn cloud_error(error: ApiError) -> CloudError {
    match error {
        // The cloud says when to come back: the framework requeues after exactly that delay,
        // without counting a failure or emitting a warning event.
        ApiError::RateLimited { retry_after } => {
            CloudError::retry(retry_after, "Acme API rate limit")
        }
        // Everything else is a failure the framework retries with backoff; keep the source.
        other => CloudError::other(other),
    }
}

/// Instances: what the cloud-node and node-lifecycle controllers ask about Nodes.
pub struct AcmeInstances {
    api: acme_api::Client,
}

impl AcmeInstances {
    /// The Node's machine, or `None` if it does not exist. Looks it up by `spec.providerID`
    /// once the Node has one (names can be reused, IDs cannot), else by the Node's name.
    async fn machine(&self, node: &NodeView) -> CloudResult<Option<Machine>> {
        match node.provider_id() {
            "" => self.api.find_machine(node.name()).await.map_err(cloud_error),
            id => {
                let id: ProviderId = id.parse().map_err(CloudError::other)?;
                if id.provider() != PROVIDER_NAME {
                    return Err(CloudError::msg(format!("{id} is not an Acme machine")));
                }
                // The instance part is `<zone>/<machine-id>`.
                let machine_id = id.instance_id().rsplit('/').next().unwrap_or_default();
                match self.api.get_machine(machine_id).await {
                    Ok(machine) => Ok(Some(machine)),
                    Err(ApiError::NotFound) => Ok(None),
                    Err(e) => Err(cloud_error(e)),
                }
            }
        }
    }
}

#[async_trait]
impl InstancesV2 for AcmeInstances {
    async fn instance_exists(&self, node: &NodeView) -> CloudResult<bool> {
        // Ok(false) only when the cloud says the machine is gone: the Node is then deleted.
        // A stopped machine exists. An API failure is an error, never "gone".
        Ok(self.machine(node).await?.is_some())
    }

    async fn instance_shutdown(&self, node: &NodeView) -> CloudResult<bool> {
        // A machine that does not exist is not "shut down" (it is gone).
        Ok(self
            .machine(node)
            .await?
            .is_some_and(|m| m.state == MachineState::Stopped))
    }

    async fn instance_metadata(&self, node: &NodeView) -> CloudResult<InstanceMetadata> {
        let machine = self
            .machine(node)
            .await?
            .ok_or(CloudError::InstanceNotFound)?;
        let provider_id = ProviderId::new(PROVIDER_NAME, format!("{}/{}", machine.zone, machine.id))
            .map_err(CloudError::other)?;
        let mut addresses = vec![NodeAddress {
            type_: "InternalIP".into(),
            address: machine.private_ip.clone(),
        }];
        if let Some(ip) = &machine.public_ip {
            addresses.push(NodeAddress {
                type_: "ExternalIP".into(),
                address: ip.clone(),
            });
        }
        Ok(InstanceMetadata {
            provider_id: provider_id.to_string(),
            instance_type: machine.plan.clone(),
            node_addresses: addresses,
            // Acme zones are `<region>-<letter>`, e.g. `fra-1a` in region `fra-1`.
            region: machine.zone.trim_end_matches(char::is_alphabetic).to_owned(),
            zone: machine.zone.clone(),
            additional_labels: BTreeMap::from([(
                "acme.example.com/machine-id".to_owned(),
                machine.id.clone(),
            )]),
        })
    }
}

/// Services annotated with this are served by Acme's own ingress controller, not by the CCM.
pub const ANNOTATION_MANAGED_BY: &str = "acme.example.com/managed-by";

/// Load balancers for `type: LoadBalancer` Services.
pub struct AcmeLoadBalancers {
    api: acme_api::Client,
}

/// The Acme name of a Service's load balancer. It carries the cluster name, so two clusters in
/// one Acme account never adopt (or delete) each other's load balancers.
pub fn balancer_name(cluster_name: &str, service: &Service) -> String {
    format!("k8s-{cluster_name}-{}", ccm_core::default_load_balancer_name(service))
}

fn managed_elsewhere(service: &Service) -> bool {
    let annotations = service.metadata.annotations.as_ref();
    annotations.is_some_and(|a| a.contains_key(ANNOTATION_MANAGED_BY))
}

fn host_names(hosts: &[NodeView]) -> Vec<String> {
    let mut names: Vec<String> = hosts.iter().map(|n| n.name().to_owned()).collect();
    names.sort();
    names
}

fn status(address: &str) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: Some(vec![LoadBalancerIngress {
            ip: Some(address.to_owned()),
            ..Default::default()
        }]),
    }
}

#[async_trait]
impl LoadBalancer for AcmeLoadBalancers {
    async fn get_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        match self.api.get_balancer(&balancer_name(cluster_name, service)).await {
            Ok(balancer) => Ok(Some(balancer.address.as_deref().map(status).unwrap_or_default())),
            Err(ApiError::NotFound) => Ok(None),
            Err(e) => Err(cloud_error(e)),
        }
    }

    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        hosts: &[NodeView],
    ) -> CloudResult<LoadBalancerStatus> {
        if managed_elsewhere(service) {
            // Another controller of ours owns it: the CCM keeps its finalizer but writes no
            // status.
            return Err(CloudError::ImplementedElsewhere);
        }
        // Invalid source ranges are the user's mistake: the error becomes a warning Event.
        let sources = ccm_core::load_balancer_source_ranges(service).map_err(CloudError::other)?;
        let ports = service.spec.as_ref().and_then(|s| s.ports.as_ref());
        let balancer = acme_api::Balancer {
            name: balancer_name(cluster_name, service),
            tags: BTreeMap::from([("kubernetes-cluster".to_owned(), cluster_name.to_owned())]),
            ports: ports.map(|p| p.iter().map(|p| p.port).collect()).unwrap_or_default(),
            allowed_sources: sources.iter().map(ToString::to_string).collect(),
            targets: host_names(hosts),
            address: None,
        };
        // PUT creates or replaces: calling it again with the same input changes nothing.
        let balancer = self.api.put_balancer(balancer).await.map_err(cloud_error)?;
        match balancer.address {
            Some(address) => Ok(status(&address)),
            // Still provisioning: come back in 10 s (no failure event, no backoff).
            None => Err(CloudError::retry(
                Duration::from_secs(10),
                "Acme load balancer is being provisioned",
            )),
        }
    }

    async fn update_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        hosts: &[NodeView],
    ) -> CloudResult<()> {
        if managed_elsewhere(service) {
            return Err(CloudError::ImplementedElsewhere);
        }
        let name = balancer_name(cluster_name, service);
        // A load balancer that vanished is an error here: the framework then falls back to a
        // full ensure_load_balancer, which re-creates it.
        self.api
            .set_balancer_targets(&name, host_names(hosts))
            .await
            .map_err(cloud_error)
    }

    async fn ensure_load_balancer_deleted(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<()> {
        if managed_elsewhere(service) {
            // Not ours to delete; never answer ImplementedElsewhere here.
            return Ok(());
        }
        match self.api.delete_balancer(&balancer_name(cluster_name, service)).await {
            // Gone already is success: the Service's finalizer is removed only after Ok.
            Ok(()) | Err(ApiError::NotFound) => Ok(()),
            Err(e) => Err(cloud_error(e)),
        }
    }
}

/// Pod-CIDR routes in the route table of an Acme private network.
pub struct AcmeRoutes {
    api: acme_api::Client,
    network: String,
}

#[async_trait]
impl Routes for AcmeRoutes {
    async fn list_routes(&self, cluster_name: &str) -> CloudResult<Vec<Route>> {
        let routes = self.api.list_routes(&self.network).await.map_err(cloud_error)?;
        Ok(routes
            .into_iter()
            // Only this cluster's routes: the route controller deletes what it does not expect.
            .filter(|r| r.tags.get("kubernetes-cluster").map(String::as_str) == Some(cluster_name))
            .map(|r| Route {
                name: r.id,
                target_node: r.next_hop,
                destination_cidr: r.destination,
                blackhole: r.blackhole,
                ..Default::default()
            })
            .collect())
    }

    async fn create_route(
        &self,
        cluster_name: &str,
        name_hint: &str,
        route: &Route,
    ) -> CloudResult<()> {
        let tags = BTreeMap::from([
            ("kubernetes-cluster".to_owned(), cluster_name.to_owned()),
            ("kubernetes-node-uid".to_owned(), name_hint.to_owned()),
        ]);
        let created = self
            .api
            .create_route(&self.network, &route.destination_cidr, &route.target_node, tags)
            .await;
        match created {
            // After a restart the controller may create a route that exists: that is success.
            Ok(_) | Err(ApiError::AlreadyExists) => Ok(()),
            Err(e) => Err(cloud_error(e)),
        }
    }

    async fn delete_route(&self, _cluster_name: &str, route: &Route) -> CloudResult<()> {
        match self.api.delete_route(&self.network, &route.name).await {
            Ok(()) | Err(ApiError::NotFound) => Ok(()),
            Err(e) => Err(cloud_error(e)),
        }
    }
}

/// The Acme cloud provider.
pub struct AcmeCloud {
    instances: AcmeInstances,
    load_balancers: AcmeLoadBalancers,
    /// Only with a private network (`network:` in the cloud-config).
    routes: Option<AcmeRoutes>,
}

#[async_trait]
impl CloudProvider for AcmeCloud {
    fn provider_name(&self) -> &str {
        PROVIDER_NAME
    }

    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(&self.instances)
    }

    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        Some(&self.load_balancers)
    }

    fn routes(&self) -> Option<&dyn Routes> {
        self.routes.as_ref().map(|r| r as &dyn Routes)
    }
}

/// The factory: builds the provider from the bytes of the `--cloud-config` file.
pub fn build_acme(cloud_config: Option<&[u8]>) -> Result<Arc<dyn CloudProvider>, BoxError> {
    let bytes = cloud_config.ok_or("the acme provider needs --cloud-config")?;
    // YAML or JSON; a mistake is reported with its line and column.
    let config: AcmeConfig = ccm_core::parse_cloud_config(bytes)?;
    let api = acme_api::Client::connect(&config.endpoint, &config.token)?;
    Ok(Arc::new(AcmeCloud {
        instances: AcmeInstances { api: api.clone() },
        load_balancers: AcmeLoadBalancers { api: api.clone() },
        routes: config.network.map(|network| AcmeRoutes { api, network }),
    }))
}

ccm_core::register_cloud_provider!("acme", build_acme);

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

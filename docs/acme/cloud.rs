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

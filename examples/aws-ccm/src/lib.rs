//! A reference cloud provider for AWS built on ccm-rs: EC2 instances (`InstancesV2` and the
//! batch `InstancesBatch`), ELBv2 network load balancers (`LoadBalancer` and the batch
//! `LoadBalancerHostsBatch`) and VPC routes (`Routes`), through the official AWS SDK.
//!
//! The provider registers itself as `aws`; the binary (`src/main.rs`) is the framework's
//! template. See the crate's README for the cloud-config and every difference from the public
//! AWS cloud-controller-manager.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use aws_credential_types::Credentials;
use ccm_core::{
    BoxError, CloudProvider, InstancesBatch, InstancesV2, LoadBalancer, LoadBalancerHostsBatch,
    Routes, register_cloud_provider,
};

pub mod clients;
pub mod config;
pub mod errors;
pub mod instances;
pub mod load_balancer;
pub mod routes;
pub mod target_groups;

pub use clients::{Clients, RequestCounter};
pub use config::AwsConfig;

/// The AWS provider: one set of SDK clients and the cloud-config.
#[derive(Debug)]
pub struct AwsCloud {
    config: AwsConfig,
    clients: Clients,
    locks: load_balancer::Locks,
    batch: bool,
    page_size: i32,
    calls: Mutex<BTreeMap<&'static str, u64>>,
}

impl AwsCloud {
    /// A provider for `config`. `credentials` replaces the SDK's default credential chain
    /// (environment, profile, web identity, ECS, IMDS); tests pass static ones.
    pub fn new(config: AwsConfig, credentials: Option<Credentials>) -> AwsCloud {
        let clients = Clients::new(&config, credentials);
        AwsCloud {
            config,
            clients,
            locks: Default::default(),
            batch: true,
            page_size: instances::PAGE_SIZE,
            calls: Mutex::default(),
        }
    }

    /// Turns the batch capabilities (`InstancesBatch`, `LoadBalancerHostsBatch`) off or on
    /// (on by default); the benchmark compares both.
    pub fn with_batch(mut self, batch: bool) -> AwsCloud {
        self.batch = batch;
        self
    }

    /// The page size of filtered `DescribeInstances` calls (AWS allows 5 to 1,000; default
    /// 1,000). Tests lower it to see `NextToken` followed.
    pub fn with_page_size(mut self, page_size: i32) -> AwsCloud {
        self.page_size = page_size.clamp(5, 1000);
        self
    }

    /// The cloud-config the provider was built from.
    pub fn config(&self) -> &AwsConfig {
        &self.config
    }

    /// The SDK clients (tests use them to look at what the provider did).
    pub fn clients(&self) -> &Clients {
        &self.clients
    }

    /// The HTTP requests sent to AWS so far.
    pub fn requests(&self) -> u64 {
        self.clients.requests.get()
    }

    /// How often the framework called each provider method so far (the calls its cloud-call
    /// budget counts), by method name.
    pub fn cloud_calls(&self) -> BTreeMap<&'static str, u64> {
        self.calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn count(&self, method: &'static str) {
        let mut calls = self
            .calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *calls.entry(method).or_default() += 1;
    }
}

impl CloudProvider for AwsCloud {
    fn provider_name(&self) -> &str {
        "aws"
    }

    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }

    fn instances_batch(&self) -> Option<&dyn InstancesBatch> {
        self.batch.then_some(self as &dyn InstancesBatch)
    }

    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        (!self.config.subnets.is_empty()).then_some(self as &dyn LoadBalancer)
    }

    fn load_balancer_hosts_batch(&self) -> Option<&dyn LoadBalancerHostsBatch> {
        (self.batch && !self.config.subnets.is_empty())
            .then_some(self as &dyn LoadBalancerHostsBatch)
    }

    fn routes(&self) -> Option<&dyn Routes> {
        self.config
            .route_table
            .is_some()
            .then_some(self as &dyn Routes)
    }
}

/// The registry's factory for `--cloud-provider=aws`: parses the cloud-config (required).
pub fn build_aws(cloud_config: Option<&[u8]>) -> Result<Arc<dyn CloudProvider>, BoxError> {
    let contents =
        cloud_config.ok_or("the aws provider needs --cloud-config (region, vpc, subnets, ...)")?;
    Ok(Arc::new(AwsCloud::new(AwsConfig::parse(contents)?, None)))
}

register_cloud_provider!("aws", build_aws);

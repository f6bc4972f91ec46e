//! A reference cloud provider for AWS built on ccm-rs: EC2 instances (`InstancesV2` and the
//! batch `InstancesBatch`), ELBv2 network load balancers (`LoadBalancer` and the batch
//! `LoadBalancerHostsBatch`) and VPC routes (`Routes`), through the official AWS SDK.
//!
//! Two load-balancer classes: Services without a class get network load balancers of the
//! configured scheme in `subnets`, Services of class [`INTERNAL_NLB_CLASS`] internal ones in
//! `internalSubnets` (one implementation, [`NetworkLoadBalancers`], configured per kind).
//!
//! The provider registers itself as `aws`; the binary (`src/main.rs`) is the framework's
//! template. See the crate's README for the cloud-config and every difference from the public
//! AWS cloud-controller-manager.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use aws_credential_types::Credentials;
use aws_sdk_elasticloadbalancingv2::types::LoadBalancerSchemeEnum;
use ccm_core::{
    BoxError, CloudProvider, InstancesBatch, InstancesV2, IpModes, LoadBalancer,
    LoadBalancerClasses, LoadBalancerHostsBatch, Routes, register_cloud_provider,
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
use load_balancer::NlbKind;
pub use load_balancer::{INTERNAL_NLB_CLASS, NetworkLoadBalancers};

/// How often the framework called each provider method, by method name; shared by the
/// provider and its load-balancer implementations.
#[derive(Clone, Debug, Default)]
pub(crate) struct CallCounts(Arc<Mutex<BTreeMap<&'static str, u64>>>);

impl CallCounts {
    pub(crate) fn count(&self, method: &'static str) {
        let mut calls = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *calls.entry(method).or_default() += 1;
    }

    fn get(&self) -> BTreeMap<&'static str, u64> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// The AWS provider: one set of SDK clients, the cloud-config and a load-balancer
/// implementation per class served.
#[derive(Debug)]
pub struct AwsCloud {
    config: AwsConfig,
    clients: Clients,
    /// One per kind with subnets: Services without a class, [`INTERNAL_NLB_CLASS`].
    load_balancers: Vec<NetworkLoadBalancers>,
    batch: bool,
    page_size: i32,
    calls: CallCounts,
}

impl AwsCloud {
    /// A provider for `config`. `credentials` replaces the SDK's default credential chain
    /// (environment, profile, web identity, ECS, IMDS); tests pass static ones.
    pub fn new(config: AwsConfig, credentials: Option<Credentials>) -> AwsCloud {
        let clients = Clients::new(&config, credentials);
        let calls = CallCounts::default();
        let locks = Arc::new(load_balancer::Locks::default());
        let load_balancers = Self::nlb_kinds(&config)
            .into_iter()
            .filter(|kind| !kind.subnets.is_empty())
            .map(|kind| {
                let elb = clients.elb.clone();
                NetworkLoadBalancers::new(kind, &config, elb, locks.clone(), calls.clone())
            })
            .collect();
        AwsCloud {
            config,
            clients,
            load_balancers,
            batch: true,
            page_size: instances::PAGE_SIZE,
            calls,
        }
    }

    /// The kinds of network load balancer the cloud-config asks for, by class; a kind without
    /// subnets is not served.
    fn nlb_kinds(config: &AwsConfig) -> Vec<NlbKind> {
        vec![
            NlbKind {
                class: None,
                scheme: LoadBalancerSchemeEnum::from(config.load_balancer_scheme.as_str()),
                subnets: config.subnets.clone(),
            },
            NlbKind {
                class: Some(INTERNAL_NLB_CLASS),
                scheme: LoadBalancerSchemeEnum::Internal,
                subnets: config.internal_load_balancer_subnets().to_vec(),
            },
        ]
    }

    /// The load-balancer implementation of a declared class (`None`: Services without a
    /// class), if the cloud-config gives it subnets.
    pub fn network_load_balancers(&self, class: Option<&str>) -> Option<&NetworkLoadBalancers> {
        self.load_balancers.iter().find(|lbs| lbs.class() == class)
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
        self.calls.get()
    }

    fn count(&self, method: &'static str) {
        self.calls.count(method);
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
        self.load_balancer_for_class(None)
    }

    fn load_balancer_hosts_batch(&self) -> Option<&dyn LoadBalancerHostsBatch> {
        self.load_balancer_hosts_batch_for_class(None)
    }

    /// Each kind with subnets. Without any: Services without a class, as a provider that
    /// declares nothing (with no `load_balancer()`, the framework then skips the service
    /// controller, as before classes).
    fn load_balancer_classes(&self) -> LoadBalancerClasses {
        if self.load_balancers.is_empty() {
            return LoadBalancerClasses::default();
        }
        self.load_balancers
            .iter()
            .fold(LoadBalancerClasses::none(), |classes, lbs| {
                match lbs.class() {
                    None => classes.and_without_class(),
                    Some(class) => classes.with_class(class),
                }
            })
    }

    /// `VIP` only, for every class: an NLB with instance targets forwards packets keeping the
    /// client's IP (it does not proxy), and a `service.ccm-rs.io/ip-mode: Proxy` annotation is
    /// refused (a Warning Event `IPModeNotAllowed`). Its ingress entries are the NLB's DNS name
    /// (a hostname, no IP), which carry no `ipMode` at all: the API server rejects one there.
    fn load_balancer_ip_modes(&self, _class: Option<&str>) -> IpModes {
        IpModes::vip()
    }

    fn load_balancer_for_class(&self, class: Option<&str>) -> Option<&dyn LoadBalancer> {
        self.network_load_balancers(class)
            .map(|lbs| lbs as &dyn LoadBalancer)
    }

    fn load_balancer_hosts_batch_for_class(
        &self,
        class: Option<&str>,
    ) -> Option<&dyn LoadBalancerHostsBatch> {
        self.network_load_balancers(class)
            .filter(|_| self.batch)
            .map(|lbs| lbs as &dyn LoadBalancerHostsBatch)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cloud(config: &str) -> AwsCloud {
        let text = format!("region: us-east-1\nvpc: vpc-1\n{config}");
        match AwsConfig::parse(text.as_bytes()) {
            Ok(config) => AwsCloud::new(
                config,
                Some(Credentials::new("test", "test", None, None, "unit-test")),
            ),
            Err(e) => panic!("{e}"),
        }
    }

    fn scheme(cloud: &AwsCloud, class: Option<&str>) -> Option<&'static str> {
        let scheme = cloud.network_load_balancers(class)?.scheme().clone();
        Some(match scheme {
            LoadBalancerSchemeEnum::Internal => "internal",
            LoadBalancerSchemeEnum::InternetFacing => "internet-facing",
            _ => "other",
        })
    }

    #[test]
    fn serves_the_internal_class_beside_the_default() {
        let aws = cloud("subnets: [subnet-a]\n");
        let classes = aws.load_balancer_classes();
        assert_eq!(
            classes.entries().collect::<Vec<_>>(),
            [None, Some(INTERNAL_NLB_CLASS)]
        );
        assert_eq!(scheme(&aws, None), Some("internet-facing"));
        assert_eq!(scheme(&aws, Some(INTERNAL_NLB_CLASS)), Some("internal"));
        assert!(
            aws.load_balancer_for_class(Some(INTERNAL_NLB_CLASS))
                .is_some()
        );
        assert!(
            aws.load_balancer_for_class(Some("service.k8s.aws/nlb"))
                .is_none()
        );
        assert!(
            aws.load_balancer_hosts_batch_for_class(Some(INTERNAL_NLB_CLASS))
                .is_some()
        );
        let unbatched = cloud("subnets: [subnet-a]\n").with_batch(false);
        assert!(
            unbatched
                .load_balancer_hosts_batch_for_class(Some(INTERNAL_NLB_CLASS))
                .is_none()
        );
        assert!(unbatched.load_balancer_hosts_batch().is_none());
    }

    #[test]
    fn the_cloud_config_picks_the_kinds_served() {
        // Only internal subnets: the internal class alone.
        let aws = cloud("internalSubnets: [subnet-b]\n");
        assert_eq!(
            aws.load_balancer_classes().entries().collect::<Vec<_>>(),
            [Some(INTERNAL_NLB_CLASS)]
        );
        assert!(aws.load_balancer().is_none());
        // An empty internalSubnets turns the class off.
        let aws = cloud("subnets: [subnet-a]\ninternalSubnets: []\nloadBalancerScheme: internal\n");
        assert_eq!(
            aws.load_balancer_classes().entries().collect::<Vec<_>>(),
            [None]
        );
        assert_eq!(scheme(&aws, None), Some("internal"));
        // No subnets at all: Go's default declaration, and no load balancer.
        let aws = cloud("");
        assert_eq!(aws.load_balancer_classes(), LoadBalancerClasses::default());
        assert!(aws.load_balancer_for_class(None).is_none());
    }
}

//! [`FakeCloudBuilder`]: a [`FakeCloud`] configured in code, one field at a time.

use std::time::Duration;

use std::path::PathBuf;

use super::{
    Capabilities, FakeCloud, FakeCloudConfig, FakeCloudConfigError, Fault, NodeAnswer, Rate,
};

/// Builds a [`FakeCloud`]; every method sets one field of [`FakeCloudConfig`].
#[derive(Clone, Debug, Default)]
pub struct FakeCloudBuilder {
    config: FakeCloudConfig,
}

impl FakeCloudBuilder {
    /// Starts from a configuration instead of the default.
    pub fn from_config(config: FakeCloudConfig) -> Self {
        FakeCloudBuilder { config }
    }

    /// The provider name it answers as, and the scheme of its provider IDs (`provider_name`,
    /// default `fake`).
    pub fn provider_name(mut self, name: &str) -> Self {
        self.config.provider_name = name.to_owned();
        self
    }

    /// Delay of every call (`latency_ms`).
    pub fn latency(mut self, latency: Duration) -> Self {
        self.config.latency_ms = u64::try_from(latency.as_millis()).unwrap_or(u64::MAX);
        self
    }

    /// Delay of one operation (`operation_latency_ms`), overriding [`FakeCloudBuilder::latency`].
    pub fn operation_latency(mut self, op: &str, latency: Duration) -> Self {
        self.config.operation_latency_ms.insert(
            op.to_owned(),
            u64::try_from(latency.as_millis()).unwrap_or(u64::MAX),
        );
        self
    }

    /// The zone of every instance (`zone`).
    pub fn zone(mut self, zone: &str) -> Self {
        self.config.zone = zone.to_owned();
        self
    }

    /// The region of every instance (`region`).
    pub fn region(mut self, region: &str) -> Self {
        self.config.region = region.to_owned();
        self
    }

    /// The instance type of every instance (`instance_type`).
    pub fn instance_type(mut self, instance_type: &str) -> Self {
        self.config.instance_type = instance_type.to_owned();
        self
    }

    /// Whether instances also report an `ExternalIP` (`external_ip`).
    pub fn external_ip(mut self, on: bool) -> Self {
        self.config.external_ip = on;
        self
    }

    /// Adds a label to every instance's metadata (`additional_labels`).
    pub fn additional_label(mut self, key: &str, value: &str) -> Self {
        self.config
            .additional_labels
            .insert(key.to_owned(), value.to_owned());
        self
    }

    /// Adds a pattern of nodes whose instances do not exist (`missing_nodes`).
    pub fn missing_node(mut self, pattern: &str) -> Self {
        self.config.missing_nodes.push(pattern.to_owned());
        self
    }

    /// Adds a pattern of nodes whose instances are shut down (`shutdown_nodes`).
    pub fn shutdown_node(mut self, pattern: &str) -> Self {
        self.config.shutdown_nodes.push(pattern.to_owned());
        self
    }

    /// One ingress IP for every load balancer (`lb_ip`) instead of one each from
    /// `lb_ip_range`.
    pub fn lb_ip(mut self, ip: &str) -> Self {
        self.config.lb_ip = Some(ip.to_owned());
        self
    }

    /// The range each load balancer gets its own ingress IP from (`lb_ip_range`).
    pub fn lb_ip_range(mut self, cidr: &str) -> Self {
        self.config.lb_ip_range = cidr.to_owned();
        self
    }

    /// Chosen answers for one Node (`nodes.<name>`).
    pub fn node(mut self, name: &str, answer: NodeAnswer) -> Self {
        self.config.nodes.insert(name.to_owned(), answer);
        self
    }

    /// The overall quota (`quota.overall`): `per_second` calls per second, `burst` saved.
    pub fn quota(mut self, per_second: f64, burst: u32) -> Self {
        self.config.quota.overall = Some(Rate { per_second, burst });
        self
    }

    /// The quota of one operation (`quota.operations.<op>`).
    pub fn operation_quota(mut self, op: &str, per_second: f64, burst: u32) -> Self {
        self.config
            .quota
            .operations
            .insert(op.to_owned(), Rate { per_second, burst });
        self
    }

    /// Offer [`InstancesBatch`](ccm_core::InstancesBatch) or not (default off).
    pub fn instances_batch(mut self, on: bool) -> Self {
        self.config.capabilities.instances_batch = on;
        self
    }

    /// The load-balancer classes the provider declares (`load_balancer_classes`): `-` for
    /// Services without a class, else a class name; e.g. `&["-", "fake.example/internal"]`.
    /// Default `["-"]` (Services without a class only, as Go).
    pub fn load_balancer_classes(mut self, classes: &[&str]) -> Self {
        self.config.load_balancer_classes = classes.iter().map(|c| (*c).to_owned()).collect();
        self
    }

    /// The `ipMode`s of one declared class (`-`: Services without a class):
    /// `vip`, `proxy` or `vip_or_proxy_on_request` (see
    /// [`FakeCloudConfig::load_balancer_ip_modes`]).
    pub fn load_balancer_ip_modes(mut self, class: &str, modes: &str) -> Self {
        self.config
            .load_balancer_ip_modes
            .insert(class.to_owned(), modes.to_owned());
        self
    }

    /// Offer [`LoadBalancerHostsBatch`](ccm_core::LoadBalancerHostsBatch) or not (default
    /// off; it needs `load_balancer`).
    pub fn load_balancer_hosts_batch(mut self, on: bool) -> Self {
        self.config.capabilities.load_balancer_hosts_batch = on;
        self
    }

    /// The most Nodes one `describe_instances` call, and the most Services one
    /// `update_load_balancer_hosts` call, accepts (`max_batch_size`).
    pub fn max_batch_size(mut self, max: usize) -> Self {
        self.config.max_batch_size = max;
        self
    }

    /// Keep at most the `limit` most recent calls in the call log (`call_log_limit`).
    pub fn call_log_limit(mut self, limit: usize) -> Self {
        self.config.call_log_limit = limit;
        self
    }

    /// Keep the load balancers and routes in this file (`state_file`).
    pub fn state_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.config.state_file = Some(path.into());
        self
    }

    /// Report this ingress hostname instead of an IP (`lb_hostname`).
    pub fn lb_hostname(mut self, hostname: &str) -> Self {
        self.config.lb_hostname = Some(hostname.to_owned());
        self
    }

    /// Whether `list_routes` sets `enable_node_addresses` (`track_node_addresses`).
    pub fn track_node_addresses(mut self, on: bool) -> Self {
        self.config.track_node_addresses = on;
        self
    }

    /// The cluster names `list_clusters` answers (`clusters`).
    pub fn clusters(mut self, clusters: &[&str]) -> Self {
        self.config.clusters = clusters.iter().map(|c| (*c).to_owned()).collect();
        self
    }

    /// All capability switches at once (`capabilities`).
    pub fn capabilities(mut self, capabilities: Capabilities) -> Self {
        self.config.capabilities = capabilities;
        self
    }

    /// Offer [`InstancesV2`](ccm_core::InstancesV2) or not (default on).
    pub fn instances_v2(mut self, on: bool) -> Self {
        self.config.capabilities.instances_v2 = on;
        self
    }

    /// Offer the legacy v1 [`Instances`](ccm_core::Instances) and
    /// [`Zones`](ccm_core::Zones) or not (default off).
    pub fn legacy_instances(mut self, on: bool) -> Self {
        self.config.capabilities.instances = on;
        self.config.capabilities.zones = on;
        self
    }

    /// Offer [`LoadBalancer`](ccm_core::LoadBalancer) or not (default on).
    pub fn load_balancer(mut self, on: bool) -> Self {
        self.config.capabilities.load_balancer = on;
        self
    }

    /// Offer [`Routes`](ccm_core::Routes) or not (default on).
    pub fn routes(mut self, on: bool) -> Self {
        self.config.capabilities.routes = on;
        self
    }

    /// Offer [`Clusters`](ccm_core::Clusters) or not (default on).
    pub fn cluster_listing(mut self, on: bool) -> Self {
        self.config.capabilities.clusters = on;
        self
    }

    /// Arms a fault on an operation from the start (`faults`).
    pub fn fault(mut self, op: &str, fault: Fault) -> Self {
        self.config
            .faults
            .entry(op.to_owned())
            .or_default()
            .push(fault);
        self
    }

    /// The configuration built so far.
    pub fn config(&self) -> &FakeCloudConfig {
        &self.config
    }

    /// Builds the fake cloud; invalid entries are logged and ignored (see [`FakeCloud::new`]).
    pub fn build(self) -> FakeCloud {
        FakeCloud::new(self.config)
    }

    /// Builds the fake cloud after validating the configuration.
    pub fn try_build(self) -> Result<FakeCloud, FakeCloudConfigError> {
        FakeCloud::try_new(self.config)
    }
}

//! The configuration of [`FakeCloud`](super::FakeCloud): the serde schema read from
//! `--cloud-config` and the faults that can be injected.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use ccm_core::NodeAddress;
use serde::{Deserialize, Serialize};

/// Every operation name [`FakeCloud`](super::FakeCloud) counts, logs and accepts faults and
/// latency overrides for: the snake_case name of the trait method.
pub const OPERATIONS: &[&str] = &[
    // InstancesV2
    "instance_exists",
    "instance_shutdown",
    "instance_metadata",
    // InstancesBatch
    "describe_instances",
    // Instances (v1)
    "node_addresses",
    "node_addresses_by_provider_id",
    "instance_id",
    "instance_type",
    "instance_type_by_provider_id",
    "add_ssh_key_to_all_instances",
    "current_node_name",
    "instance_exists_by_provider_id",
    "instance_shutdown_by_provider_id",
    // Zones
    "get_zone",
    "get_zone_by_provider_id",
    "get_zone_by_node_name",
    // LoadBalancer
    "get_load_balancer",
    "ensure_load_balancer",
    "update_load_balancer",
    "ensure_load_balancer_deleted",
    // LoadBalancerHostsBatch
    "update_load_balancer_hosts",
    // Routes
    "list_routes",
    "create_route",
    "delete_route",
    // Clusters
    "list_clusters",
    "master",
    // CloudProvider
    "initialize",
];

/// Default of [`FakeCloudConfig::call_log_limit`]: enough for any test's assertions, about
/// 2 MB of records at most.
pub const DEFAULT_CALL_LOG_LIMIT: usize = 10_000;

/// Whether `op` is one of [`OPERATIONS`].
pub(crate) fn is_operation(op: &str) -> bool {
    OPERATIONS.contains(&op)
}

/// The configuration of a [`FakeCloud`](super::FakeCloud), as read from `--cloud-config` (YAML
/// or JSON, see [`ccm_core::parse_cloud_config`]) or built with
/// [`FakeCloud::builder`](super::FakeCloud::builder).
///
/// Every field has a default, so an empty file is a valid configuration. Unknown fields are
/// rejected. The schema with every field is documented, with a sample, in the
/// [module documentation](super).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct FakeCloudConfig {
    /// The provider name the fake cloud answers as, and the scheme of its provider IDs
    /// (`<provider_name>://<node-name>`; default `fake`). Give a second fake cloud another one
    /// (e.g. `fake-b`) to play another cloud in the same cluster: each then manages only the
    /// Nodes of its own scheme.
    pub provider_name: String,
    /// Delay added to every call before it takes effect, in milliseconds (default 0).
    pub latency_ms: u64,
    /// Per-operation delay overrides in milliseconds, keyed by operation name
    /// ([`OPERATIONS`]); they replace `latency_ms` for that operation.
    pub operation_latency_ms: BTreeMap<String, u64>,
    /// The zone of every instance (default `zone-a`).
    pub zone: String,
    /// The region of every instance (default `region-1`).
    pub region: String,
    /// The instance type of every instance (default `fake-small`).
    pub instance_type: String,
    /// Also report an `ExternalIP` for every instance, derived stably from the node name in
    /// `198.18.0.0/15` (default false).
    pub external_ip: bool,
    /// Extra labels reported in every instance's metadata (default none).
    pub additional_labels: BTreeMap<String, String>,
    /// Chosen answers per Node, keyed by node name; each field set overrides the default for
    /// that Node (and `exists`/`shutdown` override `missing_nodes`/`shutdown_nodes`).
    pub nodes: BTreeMap<String, NodeAnswer>,
    /// Regular expressions matched against the whole node name: matching instances do not
    /// exist (`instance_exists` answers `Ok(false)`, lookups answer `InstanceNotFound`).
    pub missing_nodes: Vec<String>,
    /// Regular expressions matched against the whole node name: matching instances exist but
    /// are shut down. `missing_nodes` wins when both match.
    pub shutdown_nodes: Vec<String>,
    /// When set, every load balancer reports this one ingress IP (the behaviour before
    /// `lb_ip_range`); ignored when `lb_hostname` is set. Default unset.
    pub lb_ip: Option<String>,
    /// The range each load balancer gets its own ingress IP from (default `198.18.0.0/15`,
    /// RFC 2544's benchmarking range: 131,070 addresses, enough for any test size): the lowest
    /// free address (not the network or broadcast address of an IPv4 range), kept while the
    /// load balancer exists, freed when it is deleted. An `ensure_load_balancer` that finds
    /// the range exhausted fails with an error that names this setting.
    pub lb_ip_range: String,
    /// When set, load balancers report this ingress hostname instead of an IP.
    pub lb_hostname: Option<String>,
    /// When true, `list_routes` sets `enable_node_addresses` on every route, so the route
    /// controller compares `target_node_addresses` with the Node's addresses (default false).
    pub track_node_addresses: bool,
    /// The cluster names `list_clusters` reports (default `["kubernetes"]`).
    pub clusters: Vec<String>,
    /// Which capabilities the provider offers.
    pub capabilities: Capabilities,
    /// The load-balancer classes the provider declares
    /// ([`CloudProvider::load_balancer_classes`](ccm_core::CloudProvider::load_balancer_classes)),
    /// written as `--load-balancer-classes` writes them: `-` for Services without a class,
    /// else a class name. Default `["-"]`: Services without a class only, as Go. One
    /// implementation serves them all; the class of each load balancer is kept in its state.
    pub load_balancer_classes: Vec<String>,
    /// The `ipMode` of each declared class's ingress points
    /// ([`CloudProvider::load_balancer_ip_modes`](ccm_core::CloudProvider::load_balancer_ip_modes)),
    /// keyed as in `load_balancer_classes` (`-`: Services without a class): `vip` (`VIP` only),
    /// `proxy` (`Proxy` only) or `vip_or_proxy_on_request` (`VIP`, `Proxy` when the Service
    /// asks with `service.ccm-rs.io/ip-mode`). A class not listed is `vip`. The fake cloud's
    /// ingress entries carry no `ipMode` of their own. Default empty.
    pub load_balancer_ip_modes: BTreeMap<String, String>,
    /// The most Nodes one `describe_instances` call, and the most Services one
    /// `update_load_balancer_hosts` call, accepts (default 100); a larger batch fails.
    pub max_batch_size: usize,
    /// The cloud's API quota: calls per second, overall and per operation. Default none.
    pub quota: QuotaConfig,
    /// The most recent calls [`FakeCloud::call_log`](super::FakeCloud::call_log) keeps
    /// (default 10,000; 0 keeps none). The call counts are exact whatever the limit.
    pub call_log_limit: usize,
    /// When set, the load balancers and routes are kept in this file (JSON), read at start and
    /// rewritten atomically after every change, so the cloud outlives the process. Default
    /// unset (in memory only).
    pub state_file: Option<PathBuf>,
    /// When set, a file of node names, one a line, whose instances do not exist (as if they
    /// matched `missing_nodes`), read again at every lookup: a test terminates the instance of
    /// a Node while another process runs the cloud by adding the Node's name. A file that does
    /// not exist lists none. Default unset.
    pub missing_nodes_file: Option<PathBuf>,
    /// Faults armed at start, keyed by operation name ([`OPERATIONS`]).
    pub faults: BTreeMap<String, Vec<Fault>>,
}

/// The default `provider_name`.
pub const DEFAULT_PROVIDER_NAME: &str = "fake";

/// The default `lb_ip_range`: RFC 2544's benchmarking range, 131,070 load balancers.
pub(super) const DEFAULT_LB_IP_RANGE: &str = "198.18.0.0/15";

impl Default for FakeCloudConfig {
    fn default() -> Self {
        FakeCloudConfig {
            provider_name: DEFAULT_PROVIDER_NAME.into(),
            latency_ms: 0,
            operation_latency_ms: BTreeMap::new(),
            zone: "zone-a".into(),
            region: "region-1".into(),
            instance_type: "fake-small".into(),
            external_ip: false,
            additional_labels: BTreeMap::new(),
            missing_nodes: Vec::new(),
            nodes: BTreeMap::new(),
            shutdown_nodes: Vec::new(),
            lb_ip: None,
            lb_ip_range: DEFAULT_LB_IP_RANGE.into(),
            lb_hostname: None,
            track_node_addresses: false,
            clusters: vec!["kubernetes".into()],
            capabilities: Capabilities::default(),
            load_balancer_classes: vec![NO_CLASS.into()],
            load_balancer_ip_modes: BTreeMap::new(),
            max_batch_size: 100,
            quota: QuotaConfig::default(),
            call_log_limit: DEFAULT_CALL_LOG_LIMIT,
            state_file: None,
            missing_nodes_file: None,
            faults: BTreeMap::new(),
        }
    }
}

/// Which capabilities a [`FakeCloud`](super::FakeCloud) offers. A capability switched off makes
/// the matching [`CloudProvider`](ccm_core::CloudProvider) method return `None`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Capabilities {
    /// [`InstancesV2`](ccm_core::InstancesV2) (default true).
    pub instances_v2: bool,
    /// The legacy v1 [`Instances`](ccm_core::Instances) (default false).
    pub instances: bool,
    /// The legacy [`Zones`](ccm_core::Zones) (default false).
    pub zones: bool,
    /// [`LoadBalancer`](ccm_core::LoadBalancer) (default true).
    pub load_balancer: bool,
    /// [`Routes`](ccm_core::Routes) (default true).
    pub routes: bool,
    /// [`Clusters`](ccm_core::Clusters) (default true).
    pub clusters: bool,
    /// [`InstancesBatch`](ccm_core::InstancesBatch) (default false, so a test or benchmark
    /// chooses per-Node or batched lookups explicitly).
    pub instances_batch: bool,
    /// [`LoadBalancerHostsBatch`](ccm_core::LoadBalancerHostsBatch), offered only together
    /// with `load_balancer` (default false, so a test or benchmark chooses one
    /// `update_load_balancer` per load balancer or batched updates explicitly).
    pub load_balancer_hosts_batch: bool,
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities {
            instances_v2: true,
            instances: false,
            zones: false,
            load_balancer: true,
            routes: true,
            clusters: true,
            instances_batch: false,
            load_balancer_hosts_batch: false,
        }
    }
}

/// The chosen answers for one Node (`nodes:` in the config, [`FakeCloudBuilder::node`]).
/// Every field is optional; an unset one keeps the default answer.
///
/// [`FakeCloudBuilder::node`]: super::FakeCloudBuilder::node
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeAnswer {
    /// The provider ID (default `fake://<node-name>`). Lookups by this provider ID find the
    /// Node, and so do Nodes whose `spec.providerID` is it.
    pub provider_id: Option<String>,
    /// The addresses, replacing the derived InternalIP / ExternalIP / Hostname.
    pub addresses: Option<Vec<NodeAddress>>,
    /// The instance type.
    pub instance_type: Option<String>,
    /// The zone.
    pub zone: Option<String>,
    /// The region.
    pub region: Option<String>,
    /// The extra labels, replacing `additional_labels`.
    pub additional_labels: Option<BTreeMap<String, String>>,
    /// Whether the instance exists (overrides `missing_nodes`).
    pub exists: Option<bool>,
    /// Whether the instance is shut down (overrides `shutdown_nodes`; ignored when it does not
    /// exist).
    pub shutdown: Option<bool>,
    /// When set, every lookup of this Node fails with this message
    /// ([`CloudError::Other`](ccm_core::CloudError::Other)); a batch answers
    /// [`InstanceAnswer::Error`](ccm_core::InstanceAnswer::Error) for it.
    pub error: Option<String>,
}

/// A cloud API quota (`quota:` in the config): token buckets of `per_second` calls refilling up
/// to `burst`, one overall and one per operation. A call needs a token from each bucket that
/// applies; without one it is rejected at once with
/// [`CloudError::Retry`](ccm_core::CloudError::Retry) whose `after` is the time until the
/// token frees (a real cloud's 429 + Retry-After), takes no token, and changes nothing.
/// `initialize` is never limited.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct QuotaConfig {
    /// The limit on all calls together.
    pub overall: Option<Rate>,
    /// Limits per operation ([`OPERATIONS`]).
    pub operations: BTreeMap<String, Rate>,
}

/// A token-bucket rate: `per_second` tokens per second, at most `burst` saved.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rate {
    /// Tokens added per second (> 0).
    pub per_second: f64,
    /// The most tokens saved up (>= 1); the bucket starts full.
    pub burst: u32,
}

/// A fault injected into one operation of a [`FakeCloud`](super::FakeCloud).
///
/// Several faults can be armed on one operation; on each call they are consulted in the order
/// they were armed and the first that fires decides the answer. Faults with a count are removed
/// once used up; the others stay until [`FakeCloud::clear_faults`](super::FakeCloud::clear_faults).
/// A faulted call is counted and logged like any other, has its latency, and changes nothing.
///
/// In the config file (`faults:`), the variants are written `fail_next: 2`,
/// `fail_with_probability: {p: 0.5, seed: 7}`, `retry: {after_ms: 1500, count: 1}`,
/// `retry_with_probability: {p: 0.1, after_ms: 500, seed: 7}`,
/// `timeout_after_effect: {p: 0.1, seed: 7}`, `not_implemented` and `instance_not_found`.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// The next N calls fail with [`CloudError::Other`](ccm_core::CloudError::Other)
    /// (`fake cloud: injected failure of <operation>`).
    FailNext(usize),
    /// Every call fails with probability `p` (0.0 to 1.0), drawn from a generator seeded with
    /// `seed`: the same sequence of calls fails the same way on every run and platform.
    FailWithProbability {
        /// Probability that a call fails.
        p: f64,
        /// Seed of the random generator.
        seed: u64,
    },
    /// The next `count` calls answer [`CloudError::Retry`](ccm_core::CloudError::Retry) with
    /// this delay.
    Retry {
        /// The delay to ask for (`after_ms` in the config file).
        after: Duration,
        /// How many calls answer it.
        count: usize,
    },
    /// Every call answers [`CloudError::Retry`](ccm_core::CloudError::Retry) with this delay
    /// with probability `p`, drawn from a generator seeded with `seed` (a cloud's 429).
    RetryWithProbability {
        /// Probability that a call answers `Retry`.
        p: f64,
        /// The delay to ask for (`after_ms` in the config file).
        after: Duration,
        /// Seed of the random generator.
        seed: u64,
    },
    /// With probability `p` (seeded with `seed`), a call takes effect and then fails as if it
    /// had timed out (`fake cloud: injected timeout of <operation> after it took effect`): the
    /// load balancer or route exists although the caller was told the call failed.
    TimeoutAfterEffect {
        /// Probability that a call times out after taking effect.
        p: f64,
        /// Seed of the random generator.
        seed: u64,
    },
    /// Every call answers [`CloudError::NotImplemented`](ccm_core::CloudError::NotImplemented).
    NotImplemented,
    /// Every call answers
    /// [`CloudError::InstanceNotFound`](ccm_core::CloudError::InstanceNotFound).
    InstanceNotFound,
}

/// The on-disk form of the faults with a payload (serde_norway 0.9 reads externally tagged enums
/// only from YAML tags, `!fail_next 2`; the config schema uses one-key maps instead, which read
/// the same in YAML and JSON).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
struct FaultMap {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fail_next: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fail_with_probability: Option<ProbabilitySpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retry: Option<RetrySpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retry_with_probability: Option<RetryProbabilitySpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timeout_after_effect: Option<ProbabilitySpec>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RetryProbabilitySpec {
    p: f64,
    after_ms: u64,
    seed: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProbabilitySpec {
    p: f64,
    seed: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RetrySpec {
    after_ms: u64,
    count: usize,
}

impl Serialize for Fault {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let empty = FaultMap {
            fail_next: None,
            fail_with_probability: None,
            retry: None,
            retry_with_probability: None,
            timeout_after_effect: None,
        };
        let ms = |d: &Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        match self {
            Fault::NotImplemented => s.serialize_str("not_implemented"),
            Fault::InstanceNotFound => s.serialize_str("instance_not_found"),
            Fault::FailNext(n) => FaultMap {
                fail_next: Some(*n),
                ..empty
            }
            .serialize(s),
            Fault::FailWithProbability { p, seed } => FaultMap {
                fail_with_probability: Some(ProbabilitySpec { p: *p, seed: *seed }),
                ..empty
            }
            .serialize(s),
            Fault::Retry { after, count } => FaultMap {
                retry: Some(RetrySpec {
                    after_ms: ms(after),
                    count: *count,
                }),
                ..empty
            }
            .serialize(s),
            Fault::RetryWithProbability { p, after, seed } => FaultMap {
                retry_with_probability: Some(RetryProbabilitySpec {
                    p: *p,
                    after_ms: ms(after),
                    seed: *seed,
                }),
                ..empty
            }
            .serialize(s),
            Fault::TimeoutAfterEffect { p, seed } => FaultMap {
                timeout_after_effect: Some(ProbabilitySpec { p: *p, seed: *seed }),
                ..empty
            }
            .serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Fault {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct FaultVisitor;

        impl<'de> serde::de::Visitor<'de> for FaultVisitor {
            type Value = Fault;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "a fault: not_implemented, instance_not_found, {fail_next: N}, \
                     {fail_with_probability: {p: P, seed: S}}, {retry: {after_ms: MS, count: N}}, \
                     {retry_with_probability: {p: P, after_ms: MS, seed: S}} or \
                     {timeout_after_effect: {p: P, seed: S}}",
                )
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Fault, E> {
                match v {
                    "not_implemented" => Ok(Fault::NotImplemented),
                    "instance_not_found" => Ok(Fault::InstanceNotFound),
                    other => Err(E::unknown_variant(
                        other,
                        &[
                            "not_implemented",
                            "instance_not_found",
                            "fail_next",
                            "fail_with_probability",
                            "retry",
                            "retry_with_probability",
                            "timeout_after_effect",
                        ],
                    )),
                }
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Fault, A::Error> {
                let spec =
                    FaultMap::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                let keys = usize::from(spec.fail_next.is_some())
                    + usize::from(spec.fail_with_probability.is_some())
                    + usize::from(spec.retry.is_some())
                    + usize::from(spec.retry_with_probability.is_some())
                    + usize::from(spec.timeout_after_effect.is_some());
                let fault = if keys != 1 {
                    None
                } else if let Some(n) = spec.fail_next {
                    Some(Fault::FailNext(n))
                } else if let Some(ProbabilitySpec { p, seed }) = spec.fail_with_probability {
                    Some(Fault::FailWithProbability { p, seed })
                } else if let Some(RetrySpec { after_ms, count }) = spec.retry {
                    Some(Fault::Retry {
                        after: Duration::from_millis(after_ms),
                        count,
                    })
                } else if let Some(r) = spec.retry_with_probability {
                    Some(Fault::RetryWithProbability {
                        p: r.p,
                        after: Duration::from_millis(r.after_ms),
                        seed: r.seed,
                    })
                } else {
                    spec.timeout_after_effect
                        .map(|ProbabilitySpec { p, seed }| Fault::TimeoutAfterEffect { p, seed })
                };
                fault.ok_or_else(|| {
                    serde::de::Error::custom(
                        "a fault map must have exactly one key: fail_next, fail_with_probability, retry, retry_with_probability or timeout_after_effect",
                    )
                })
            }
        }

        d.deserialize_any(FaultVisitor)
    }
}

/// Why a [`FakeCloudConfig`] cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum FakeCloudConfigError {
    /// A `missing_nodes` or `shutdown_nodes` entry is not a valid regular expression.
    #[error(
        "fake cloud config: {field} pattern {pattern:?} is not a valid regular expression: {reason}"
    )]
    InvalidPattern {
        /// `missing_nodes` or `shutdown_nodes`.
        field: &'static str,
        /// The pattern.
        pattern: String,
        /// The regex error.
        reason: String,
    },
    /// An operation name in `faults` or `operation_latency_ms` is not one of [`OPERATIONS`].
    #[error(
        "fake cloud config: {field} names unknown operation {operation:?} (expected one of: {})",
        OPERATIONS.join(", ")
    )]
    UnknownOperation {
        /// `faults` or `operation_latency_ms`.
        field: &'static str,
        /// The unknown name.
        operation: String,
    },
    /// `provider_name` cannot be a provider-ID scheme.
    #[error(
        "fake cloud config: provider_name {0:?} is not a valid provider name (lowercase letters, digits, '-', '_' or '.')"
    )]
    InvalidProviderName(String),
    /// `lb_ip` is not an IP address.
    #[error("fake cloud config: lb_ip {0:?} is not an IP address")]
    InvalidLbIp(String),
    /// An entry of `load_balancer_classes` is not a valid class (nor `-`).
    #[error(
        "fake cloud config: load_balancer_classes: {0} (write \"-\" for Services without a class)"
    )]
    InvalidLoadBalancerClass(ccm_core::LoadBalancerClassError),
    /// A `load_balancer_ip_modes` value is not `vip`, `proxy` or `vip_or_proxy_on_request`.
    #[error(
        "fake cloud config: load_balancer_ip_modes: {class}: {value:?} is not vip, proxy or vip_or_proxy_on_request"
    )]
    InvalidIpModes {
        /// The class key (`-`: no class).
        class: String,
        /// The value given.
        value: String,
    },
    /// `lb_ip_range` is not a CIDR.
    #[error("fake cloud config: lb_ip_range {0:?} is not a CIDR (e.g. 203.0.113.0/24)")]
    InvalidLbIpRange(String),
    /// A quota rate is not usable.
    #[error(
        "fake cloud config: quota {scope} has per_second = {per_second}, burst = {burst}; expected per_second > 0 and burst >= 1"
    )]
    InvalidQuota {
        /// `overall` or the operation name.
        scope: String,
        /// The rate given.
        per_second: f64,
        /// The burst given.
        burst: u32,
    },
    /// A `nodes` entry has a provider ID that is not `<provider>://<id>`, or one another Node
    /// has too.
    #[error("fake cloud config: nodes.{node}.provider_id {provider_id:?}: {reason}")]
    InvalidNodeProviderId {
        /// The node name.
        node: String,
        /// The provider ID given.
        provider_id: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The `state_file` exists but cannot be read.
    #[error("{0}")]
    StateFile(String),
    /// `max_batch_size` is 0.
    #[error("fake cloud config: max_batch_size must be at least 1")]
    InvalidMaxBatchSize,
    /// A `fail_with_probability` fault has `p` outside 0.0..=1.0.
    #[error(
        "fake cloud config: fail_with_probability on {operation:?} has p = {p}, expected 0.0 to 1.0"
    )]
    InvalidProbability {
        /// The operation.
        operation: String,
        /// The probability given.
        p: f64,
    },
}

/// How `load_balancer_classes` writes "Services without a class" (as the
/// `--load-balancer-classes` flag does).
pub const NO_CLASS: &str = "-";

impl FakeCloudConfig {
    /// `load_balancer_classes` as the provider declares them.
    pub fn declared_load_balancer_classes(
        &self,
    ) -> Result<ccm_core::LoadBalancerClasses, FakeCloudConfigError> {
        let mut classes = ccm_core::LoadBalancerClasses::none();
        for entry in &self.load_balancer_classes {
            if entry == NO_CLASS {
                classes = classes.and_without_class();
            } else {
                ccm_core::check_load_balancer_class(entry)
                    .map_err(FakeCloudConfigError::InvalidLoadBalancerClass)?;
                classes = classes.with_class(entry.clone());
            }
        }
        Ok(classes)
    }

    /// The `ipMode`s of the declared class `class` (`None`: no class), from
    /// `load_balancer_ip_modes`.
    pub fn load_balancer_ip_modes_of(
        &self,
        class: Option<&str>,
    ) -> Result<ccm_core::IpModes, FakeCloudConfigError> {
        let key = class.unwrap_or(NO_CLASS);
        match self.load_balancer_ip_modes.get(key).map(String::as_str) {
            None | Some("vip") => Ok(ccm_core::IpModes::vip()),
            Some("proxy") => Ok(ccm_core::IpModes::proxy()),
            Some("vip_or_proxy_on_request") => Ok(ccm_core::IpModes::vip_or_proxy_on_request()),
            Some(other) => Err(FakeCloudConfigError::InvalidIpModes {
                class: key.to_owned(),
                value: other.to_owned(),
            }),
        }
    }

    /// Checks the configuration: regular expressions compile, operation names exist, `lb_ip` is
    /// an IP address, probabilities are in range.
    pub fn validate(&self) -> Result<(), FakeCloudConfigError> {
        if ccm_core::ProviderId::new(self.provider_name.as_str(), "i").is_err() {
            return Err(FakeCloudConfigError::InvalidProviderName(
                self.provider_name.clone(),
            ));
        }
        for (field, patterns) in [
            ("missing_nodes", &self.missing_nodes),
            ("shutdown_nodes", &self.shutdown_nodes),
        ] {
            for pattern in patterns {
                compile_name_pattern(pattern).map_err(|reason| {
                    FakeCloudConfigError::InvalidPattern {
                        field,
                        pattern: pattern.clone(),
                        reason,
                    }
                })?;
            }
        }
        for op in self.operation_latency_ms.keys() {
            if !is_operation(op) {
                return Err(FakeCloudConfigError::UnknownOperation {
                    field: "operation_latency_ms",
                    operation: op.clone(),
                });
            }
        }
        for (op, faults) in &self.faults {
            if !is_operation(op) {
                return Err(FakeCloudConfigError::UnknownOperation {
                    field: "faults",
                    operation: op.clone(),
                });
            }
            for fault in faults {
                if let Fault::FailWithProbability { p, .. } = fault
                    && !(0.0..=1.0).contains(p)
                {
                    return Err(FakeCloudConfigError::InvalidProbability {
                        operation: op.clone(),
                        p: *p,
                    });
                }
            }
        }
        if let Some(ip) = &self.lb_ip
            && ip.parse::<std::net::IpAddr>().is_err()
        {
            return Err(FakeCloudConfigError::InvalidLbIp(ip.clone()));
        }
        if self.lb_ip_range.parse::<ipnet::IpNet>().is_err() {
            return Err(FakeCloudConfigError::InvalidLbIpRange(
                self.lb_ip_range.clone(),
            ));
        }
        if self.max_batch_size == 0 {
            return Err(FakeCloudConfigError::InvalidMaxBatchSize);
        }
        self.declared_load_balancer_classes()?;
        for class in self.load_balancer_ip_modes.keys() {
            self.load_balancer_ip_modes_of(Some(class.as_str()).filter(|c| *c != NO_CLASS))?;
        }
        let rates = self
            .quota
            .overall
            .iter()
            .map(|r| ("overall".to_owned(), r))
            .chain(self.quota.operations.iter().map(|(op, r)| (op.clone(), r)));
        for (scope, rate) in rates {
            if scope != "overall" && !is_operation(&scope) {
                return Err(FakeCloudConfigError::UnknownOperation {
                    field: "quota.operations",
                    operation: scope,
                });
            }
            if !(rate.per_second.is_finite() && rate.per_second > 0.0) || rate.burst == 0 {
                return Err(FakeCloudConfigError::InvalidQuota {
                    scope,
                    per_second: rate.per_second,
                    burst: rate.burst,
                });
            }
        }
        let mut seen = BTreeMap::new();
        for (node, answer) in &self.nodes {
            let Some(pid) = &answer.provider_id else {
                continue;
            };
            let invalid = |reason: String| FakeCloudConfigError::InvalidNodeProviderId {
                node: node.clone(),
                provider_id: pid.clone(),
                reason,
            };
            pid.parse::<ccm_core::ProviderId>()
                .map_err(|e| invalid(e.to_string()))?;
            if let Some(other) = seen.insert(pid.clone(), node.clone()) {
                return Err(invalid(format!("node {other:?} has it too")));
            }
        }
        Ok(())
    }
}

/// Compiles a node-name pattern anchored at both ends (it must match the whole name).
pub(crate) fn compile_name_pattern(pattern: &str) -> Result<regex::Regex, String> {
    regex::Regex::new(&format!("^(?:{pattern})$")).map_err(|e| e.to_string())
}

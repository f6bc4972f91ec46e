//! `FakeCloud`: an in-memory cloud provider implementing every capability of `ccm-core`, with
//! call recording, latency and fault injection.
//!
//! It backs the framework's own controller tests and `examples/fake-ccm`, and is what a vendor
//! uses to test code that calls a provider. Clones share their state, and every method is safe
//! to call concurrently (state sits behind a `std::sync::Mutex` that is never held across an
//! `.await`). A call takes effect atomically after its latency has elapsed, so a call whose
//! future is dropped early (cancelled) changes nothing.
//!
//! # What it answers
//!
//! - **Instances** (`instances_v2`, and the legacy `instances` + `zones` when switched on): every
//!   node exists, with provider ID `fake://<node-name>` (`<provider_name>://<node-name>` for a
//!   fake cloud given another `provider_name`, which it also answers as), zone `zone-a`, region `region-1`,
//!   instance type `fake-small`, an `InternalIP` derived stably from the node name (a hash of
//!   the name into `10.0.0.0/8`, never ending in `.0` or `.255`), optionally an `ExternalIP`
//!   (hash into `198.18.0.0/15`), and a `Hostname` address equal to the node name. A Node's
//!   instance is found from `spec.providerID` when set (it must be `fake://...`, its own scheme), else from its
//!   name. Nodes whose name matches `missing_nodes` do not exist: `instance_exists` and
//!   `instance_exists_by_provider_id` answer `Ok(false)`, `instance_shutdown` `Ok(false)`, and
//!   every lookup (`instance_metadata`, `instance_id`, `node_addresses`, zones...) answers
//!   [`CloudError::InstanceNotFound`](ccm_core::CloudError::InstanceNotFound). Nodes matching
//!   `shutdown_nodes` exist and are shut down. Chosen answers per Node (`nodes:`,
//!   [`FakeCloudBuilder::node`], [`FakeCloud::set_node`], a [`NodeAnswer`]) override any of
//!   this for one Node: provider ID (lookups by it find the Node), addresses, type, zone,
//!   region, labels, existence, shutdown, or an error for every lookup.
//! - **Batches** (`instances_batch`, off by default): `describe_instances` answers every Node
//!   as the three single calls would (`Found`, `Shutdown`, `NotFound`, or `Error` for a Node
//!   with an `error` answer), in one call of at most `max_batch_size` Nodes.
//! - **Load balancers**: keyed by the Service's `<namespace>/<name>`; `ensure_load_balancer`
//!   creates or replaces one (remembering its hosts, ports and cluster) and answers an ingress
//!   with its own IP from `lb_ip_range` (default `198.18.0.0/15`: the lowest free address,
//!   kept while it exists, freed on delete), or the one `lb_ip` of every load balancer, or
//!   `lb_hostname`; `get_load_balancer` reports it until
//!   `ensure_load_balancer_deleted`, which succeeds when nothing exists;
//!   `update_load_balancer` replaces the hosts and fails for a load balancer that does not exist.
//!   A load balancer is reported only to the cluster name that created it.
//! - **Batched load-balancer updates** (`load_balancer_hosts_batch`, off by default):
//!   `update_load_balancer_hosts` gives each Service's load balancer the hosts, as
//!   `update_load_balancer` would (the same error for a missing one), in one call of at most
//!   `max_batch_size` Services; it costs one quota token.
//! - **Routes**: a route table. `create_route` names the route `<cluster>-<name_hint>`, or
//!   `<cluster>-<name_hint>-<cidr with / : . as ->` when that name holds another CIDR (the
//!   route controller passes one hint, the Node UID, for both families of a dual-stack Node;
//!   the route to a CIDR keeps its name while it exists);
//!   creating an existing route replaces it and succeeds, deleting a missing route succeeds.
//!   Routes seeded with [`FakeCloud::insert_route`] are listed for every cluster name.
//! - **Clusters**: `list_clusters` answers `clusters`; `master` answers
//!   `https://<cluster>.fake.invalid:6443` for a known cluster.
//!
//! # Inspection, faults, quota and the state file
//!
//! Every call is counted and logged under its snake_case trait method name ([`OPERATIONS`]),
//! with its arguments ([`CallArgs`]: node names, Service key and host list, route and name
//! hint...), including calls that then fail, are cancelled or rejected: see
//! [`FakeCloud::call_count`], [`FakeCloud::call_log`], [`FakeCloud::calls_of`].
//! [`FakeCloud::inject`] arms a [`Fault`] on one operation.
//!
//! A process running FakeCloud tells what its load balancers hold through its log: after every
//! `ensure_load_balancer`, `update_load_balancer`, `update_load_balancer_hosts` or
//! `ensure_load_balancer_deleted` call that changed some load balancer's hosts, one `debug`
//! line of the target `ccm_testing::fake_cloud::host_counts` with the message
//! `fake cloud: load balancers by host count` and the fields `load_balancers` (how many exist)
//! and `by_host_count` (`<hosts>=<load balancers>` pairs, e.g. `50=190,51=10`; `none`), over
//! every load balancer of any cluster name. The counts are kept as calls change them, so the
//! line is cheap at any size. `RUST_LOG=info,ccm_testing::fake_cloud::host_counts=debug`
//! enables it.
//!
//! A quota (`quota:`, [`QuotaConfig`]) limits calls per second overall and per operation; a
//! call over it is answered at once (after its latency) with [`CloudError::Retry`](ccm_core::CloudError::Retry) carrying
//! the time until a token frees, as a real cloud's 429 + Retry-After, and changes nothing.
//! Rejected calls are in the log (`rejected: true`) and counted by
//! [`FakeCloud::rejected_count`]. A `describe_instances` call costs one token whatever its size.
//!
//! With `state_file:` set, the load balancers and routes are read from that file at start and
//! written to it (JSON, atomically: temporary file + rename) after every change, so a CCM
//! killed and started again sees what it made, and a test or an operator lists them from
//! outside ([`FakeCloudState::load`], or `jq` on the file). One process should use a file at a
//! time.
//!
//! # The configuration schema (`--cloud-config` of `examples/fake-ccm`)
//!
//! YAML or JSON, read with [`ccm_core::parse_cloud_config`] into [`FakeCloudConfig`]. Every
//! field is optional; unknown fields are rejected. This sample lists every field with a
//! non-default value:
//!
//! ```
//! use std::time::Duration;
//! use ccm_testing::fake_cloud::{FakeCloudConfig, Fault};
//!
//! let yaml = br#"
//! latency_ms: 5                  # delay before every call takes effect (default 0)
//! operation_latency_ms:          # per-operation overrides, by trait method name
//!   ensure_load_balancer: 200
//! zone: eu-1a                    # default zone-a
//! region: eu-1                   # default region-1
//! instance_type: fake-large      # default fake-small
//! external_ip: true              # also report an ExternalIP (default false)
//! additional_labels:             # extra labels in every instance's metadata
//!   example.com/pool: blue
//! missing_nodes: ["gone-.*"]     # regexes on the whole node name: instances that do not exist
//! shutdown_nodes: ["stopped-.*"] # regexes: instances that exist but are shut down
//! lb_ip_range: 198.51.100.0/24   # one ingress IP per load balancer (default 198.18.0.0/15)
//! lb_ip: 198.51.100.7            # when set, this one IP for every load balancer instead
//! lb_hostname: lb.example.com    # when set, ingress hostname instead of the IP
//! nodes:                         # chosen answers per node name; every field optional
//!   worker-7:
//!     provider_id: fake://i-0007 # lookups by this provider ID find worker-7
//!     addresses: [{type: InternalIP, address: 192.168.0.7}]
//!     instance_type: fake-gpu
//!     zone: eu-1b
//!     region: eu-1
//!     additional_labels: {example.com/pool: gpu}
//!     shutdown: true             # exists: false makes it gone
//!   worker-8: {error: "describe failed"} # every lookup of worker-8 fails
//! max_batch_size: 50             # most nodes/services per batch call (default 100)
//! call_log_limit: 1000           # most recent calls kept in the call log (default 10000)
//! quota:                         # token buckets; a call over quota answers Retry (429)
//!   overall: {per_second: 20, burst: 20}
//!   operations:
//!     describe_instances: {per_second: 5, burst: 5}
//! state_file: /tmp/fake-cloud.json # keep load balancers and routes across restarts
//! track_node_addresses: true     # list_routes sets enable_node_addresses (default false)
//! clusters: [prod]               # answered by list_clusters (default [kubernetes])
//! load_balancer_classes: ["-", fake.example/internal] # "-": no class (default ["-"])
//! load_balancer_ip_modes:        # ipMode per class: vip (default), proxy, vip_or_proxy_on_request
//!   fake.example/internal: vip_or_proxy_on_request
//! capabilities:                  # switch capabilities on and off (defaults shown)
//!   instances_v2: true
//!   instances: true              # legacy v1 Instances (default false)
//!   zones: true                  # legacy Zones (default false)
//!   load_balancer: true
//!   routes: true
//!   clusters: true
//!   instances_batch: true        # InstancesBatch (default false)
//!   load_balancer_hosts_batch: true # LoadBalancerHostsBatch (default false)
//! faults:                        # armed at start, by operation
//!   ensure_load_balancer:
//!     - fail_next: 2
//!     - retry: {after_ms: 1500, count: 1}
//!   instance_metadata:
//!     - fail_with_probability: {p: 0.25, seed: 42}
//!   create_route: [not_implemented]
//!   instance_id: [instance_not_found]
//! "#;
//! let config: FakeCloudConfig = ccm_core::parse_cloud_config(yaml).unwrap();
//! config.validate().unwrap();
//! assert_eq!(config.latency_ms, 5);
//! assert_eq!(config.zone, "eu-1a");
//! assert!(config.capabilities.instances);
//! assert_eq!(config.nodes["worker-7"].provider_id.as_deref(), Some("fake://i-0007"));
//! assert_eq!(config.quota.overall.unwrap().per_second, 20.0);
//! assert_eq!(
//!     config.faults["ensure_load_balancer"],
//!     vec![Fault::FailNext(2), Fault::Retry { after: Duration::from_millis(1500), count: 1 }]
//! );
//! assert_eq!(config.faults["create_route"], vec![Fault::NotImplemented]);
//!
//! // An empty file is the default configuration; a misspelt field is an error naming its line.
//! let empty: FakeCloudConfig = ccm_core::parse_cloud_config(b"").unwrap();
//! assert_eq!(empty, FakeCloudConfig::default());
//! let err = ccm_core::parse_cloud_config::<FakeCloudConfig>(b"zone: a\nzones: b\n").unwrap_err();
//! assert_eq!(err.line, Some(2));
//! ```
//!
//! # Example
//!
//! ```
//! use ccm_core::{CloudProvider, Node, NodeView, ObjectMeta};
//! use ccm_testing::fake_cloud::{FakeCloud, Fault};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let cloud = FakeCloud::builder().missing_node("gone-.*").build();
//! // Providers receive Nodes as the framework's cached views.
//! let node = |name: &str| NodeView::from(Node {
//!     metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
//!     ..Default::default()
//! });
//! let instances = cloud.instances_v2().unwrap();
//! let meta = instances.instance_metadata(&node("worker-1")).await.unwrap();
//! assert_eq!(meta.provider_id, "fake://worker-1");
//! assert!(!instances.instance_exists(&node("gone-1")).await.unwrap());
//!
//! cloud.inject("instance_metadata", Fault::FailNext(1));
//! assert!(instances.instance_metadata(&node("worker-1")).await.is_err());
//! assert_eq!(cloud.call_count("instance_metadata"), 2);
//! # }
//! ```
//!
//! In a binary, register it as a provider with
//! `ccm_core::register_cloud_provider!("fake", FakeCloud::from_cloud_config);`.

// The code is split by concern: the path every operation takes and the call log (`calls`),
// instances (`instances`), load balancers (`load_balancers`), routes and the state file's view
// of the cloud (`routes`), the load balancers by host count and their debug line
// (`host_counts`), faults (`faults`), the quota (`quota`), the builder (`builder`), the
// configuration (`config`), the state file's format (`state_file`) and the `CloudProvider`
// implementation that ties them together (`provider`). The stored state's types stay here, so
// every part reads their fields.
mod builder;
mod calls;
mod config;
mod faults;
mod host_counts;
mod instances;
mod load_balancers;
mod provider;
mod quota;
mod routes;
mod state_file;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ccm_core::{BoxError, CloudProvider, Route};
use rand_chacha::ChaCha8Rng;
use regex::Regex;

pub use builder::FakeCloudBuilder;
pub use calls::{CallArgs, CallRecord};
pub use config::{
    Capabilities, DEFAULT_CALL_LOG_LIMIT, DEFAULT_PROVIDER_NAME, FakeCloudConfig,
    FakeCloudConfigError, Fault, NO_CLASS, NodeAnswer, OPERATIONS, QuotaConfig, Rate,
};
use faults::arm;
pub use load_balancers::LoadBalancerState;
pub use state_file::{FakeCloudState, RouteState, StateFileError};

/// An in-memory cloud provider for tests and demos; see the [module documentation](self).
///
/// Clones share their state.
#[derive(Clone)]
pub struct FakeCloud {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for FakeCloud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeCloud")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

struct Inner {
    /// The configuration as given (the mutable parts are copied into `state`).
    config: FakeCloudConfig,
    /// The state file, when persistence is on (`state_file`, readable at start).
    state_file: Option<PathBuf>,
    /// The range load balancers get their ingress IPs from.
    lb_ip_range: ipnet::IpNet,
    state: Mutex<State>,
}

/// A route in the table, with the cluster that created it (`None` for seeded routes).
#[derive(Clone, Debug)]
struct StoredRoute {
    cluster: Option<String>,
    route: Route,
}

/// A [`Fault`] armed on an operation, with its remaining count or its random generator.
enum ArmedFault {
    FailNext(usize),
    Probability {
        p: f64,
        rng: Box<ChaCha8Rng>,
    },
    Retry {
        after: Duration,
        left: usize,
    },
    RetryProbability {
        p: f64,
        after: Duration,
        rng: Box<ChaCha8Rng>,
    },
    TimeoutAfterEffect {
        p: f64,
        rng: Box<ChaCha8Rng>,
    },
    NotImplemented,
    InstanceNotFound,
}

/// A load balancer as the fake cloud stores it: like [`LoadBalancerState`], with the host list
/// shared between every load balancer that has the same hosts (see [`HostSets`]).
#[derive(Clone, Debug)]
struct StoredLoadBalancer {
    name: String,
    class: Option<String>,
    hosts: Arc<[String]>,
    ports: Vec<i32>,
    cluster_name: String,
    ingress_ip: Option<IpAddr>,
}

impl StoredLoadBalancer {
    fn to_state(&self) -> LoadBalancerState {
        LoadBalancerState {
            name: self.name.clone(),
            class: self.class.clone(),
            hosts: self.hosts.to_vec(),
            ports: self.ports.clone(),
            cluster_name: self.cluster_name.clone(),
            ingress_ip: self.ingress_ip.map(|ip| ip.to_string()),
        }
    }
}

/// The distinct host lists of the stored load balancers, each held once.
///
/// Every load balancer of a cluster usually has the same hosts, so keeping one copy per load
/// balancer would cost load balancers × nodes names, hundreds of MB at 1,000 load balancers and
/// 5,000 nodes inside the process under test (docs/performance.md, the `steady` memory
/// section).
/// Interned, it is one list per distinct host set.
#[derive(Default)]
struct HostSets {
    sets: Vec<Arc<[String]>>,
}

impl HostSets {
    /// The shared list of these host names (sorted, each once).
    fn intern(&mut self, names: &[&str]) -> Arc<[String]> {
        // Sets no load balancer holds any more (only this list does) are forgotten here.
        self.sets.retain(|set| Arc::strong_count(set) > 1);
        let same = |set: &&Arc<[String]>| {
            set.len() == names.len() && set.iter().map(String::as_str).eq(names.iter().copied())
        };
        if let Some(set) = self.sets.iter().find(same) {
            return set.clone();
        }
        let set: Arc<[String]> = names.iter().map(|n| (*n).to_owned()).collect();
        self.sets.push(set.clone());
        set
    }
}

#[derive(Default)]
struct State {
    /// `provider_name` of the configuration: the scheme of the provider IDs it knows.
    provider_name: String,
    /// The most recent calls, at most `call_log_limit` of them.
    calls: std::collections::VecDeque<CallRecord>,
    counts: BTreeMap<String, usize>,
    rejected: BTreeMap<String, usize>,
    quota: quota::Quota,
    nodes: BTreeMap<String, NodeAnswer>,
    missing: Vec<Regex>,
    shutdown: Vec<Regex>,
    /// `missing_nodes_file`: node names, one a line, read at every lookup.
    missing_file: Option<PathBuf>,
    faults: BTreeMap<String, Vec<ArmedFault>>,
    load_balancers: BTreeMap<String, StoredLoadBalancer>,
    host_sets: HostSets,
    /// The load balancers by host count, logged after every call that changes them.
    host_counts: host_counts::HostCounts,
    routes: BTreeMap<String, StoredRoute>,
    latency: Duration,
    operation_latency: BTreeMap<String, Duration>,
}

/// The default `lb_ip_range` ([`config::DEFAULT_LB_IP_RANGE`]): RFC 2544's benchmarking range.
const DEFAULT_LB_IP_RANGE: ipnet::Ipv4Net =
    ipnet::Ipv4Net::new_assert(std::net::Ipv4Addr::new(198, 18, 0, 0), 15);

/// Compiles name patterns, logging and skipping invalid ones.
fn compile_patterns(field: &str, patterns: &[impl AsRef<str>]) -> Vec<Regex> {
    patterns
        .iter()
        .filter_map(|p| match config::compile_name_pattern(p.as_ref()) {
            Ok(r) => Some(r),
            Err(reason) => {
                tracing::error!(
                    field,
                    pattern = p.as_ref(),
                    %reason,
                    "fake cloud: invalid node-name pattern ignored"
                );
                None
            }
        })
        .collect()
}

/// Logs unknown operation names; returns whether the name is known.
fn warn_unknown_operation(op: &str) -> bool {
    let known = config::is_operation(op);
    if !known {
        tracing::warn!(
            operation = op,
            "fake cloud: unknown operation name (see ccm_testing::fake_cloud::OPERATIONS)"
        );
    }
    known
}

impl Default for FakeCloud {
    fn default() -> Self {
        FakeCloud::new(FakeCloudConfig::default())
    }
}

impl FakeCloud {
    /// Builds a fake cloud from a configuration.
    ///
    /// Never fails: invalid entries (a pattern that is not a regular expression, an unknown
    /// operation name) are logged with `tracing` and ignored. Use [`FakeCloud::try_new`] to get
    /// them as an error.
    ///
    /// With `state_file` set, the load balancers and routes of the file are loaded; a file
    /// that cannot be read is logged and persistence is switched off (so the file is never
    /// overwritten with an empty cloud).
    pub fn new(config: FakeCloudConfig) -> Self {
        let saved = config
            .state_file
            .as_ref()
            .map(|path| (path.clone(), FakeCloudState::load(path)));
        let (state_file, saved) = match saved {
            None => (None, None),
            Some((path, Ok(saved))) => (Some(path), Some(saved)),
            Some((_, Err(e))) => {
                tracing::error!(error = %e, "fake cloud: state file not loaded, persistence off");
                (None, None)
            }
        };
        Self::with_state(config, state_file, saved)
    }

    fn with_state(
        config: FakeCloudConfig,
        state_file: Option<PathBuf>,
        saved: Option<FakeCloudState>,
    ) -> Self {
        let lb_ip_range = match config.lb_ip_range.parse() {
            Ok(range) => range,
            Err(_) => {
                tracing::error!(
                    lb_ip_range = config.lb_ip_range,
                    default = %DEFAULT_LB_IP_RANGE,
                    "fake cloud: lb_ip_range is not a CIDR, using the default"
                );
                ipnet::IpNet::V4(DEFAULT_LB_IP_RANGE)
            }
        };
        let mut state = State {
            provider_name: config.provider_name.clone(),
            nodes: config.nodes.clone(),
            quota: quota::Quota::new(&config.quota),
            missing: compile_patterns("missing_nodes", &config.missing_nodes),
            shutdown: compile_patterns("shutdown_nodes", &config.shutdown_nodes),
            missing_file: config.missing_nodes_file.clone(),
            latency: Duration::from_millis(config.latency_ms),
            ..State::default()
        };
        for (op, ms) in &config.operation_latency_ms {
            if warn_unknown_operation(op) {
                state
                    .operation_latency
                    .insert(op.clone(), Duration::from_millis(*ms));
            }
        }
        for (op, faults) in &config.faults {
            if warn_unknown_operation(op) {
                state
                    .faults
                    .entry(op.clone())
                    .or_default()
                    .extend(faults.iter().cloned().map(arm));
            }
        }
        if let Some(saved) = saved {
            state.restore(saved);
        }
        FakeCloud {
            inner: Arc::new(Inner {
                config,
                state_file,
                lb_ip_range,
                state: Mutex::new(state),
            }),
        }
    }

    /// Builds a fake cloud from a configuration after [validating](FakeCloudConfig::validate)
    /// it; a `state_file` that exists but cannot be read is an error too.
    pub fn try_new(config: FakeCloudConfig) -> Result<Self, FakeCloudConfigError> {
        config.validate()?;
        let saved = match &config.state_file {
            Some(path) => Some(
                FakeCloudState::load(path)
                    .map_err(|e| FakeCloudConfigError::StateFile(e.to_string()))?,
            ),
            None => None,
        };
        let state_file = config.state_file.clone();
        Ok(Self::with_state(config, state_file, saved))
    }

    /// A builder starting from the default configuration.
    pub fn builder() -> FakeCloudBuilder {
        FakeCloudBuilder::default()
    }

    /// The provider factory: builds a fake cloud from the contents of `--cloud-config` (YAML or
    /// JSON, see the [module documentation](self); `None` means the default configuration).
    ///
    /// Register it in a binary with
    /// `ccm_core::register_cloud_provider!("fake", FakeCloud::from_cloud_config);`.
    pub fn from_cloud_config(
        cloud_config: Option<&[u8]>,
    ) -> Result<Arc<dyn CloudProvider>, BoxError> {
        Self::from_cloud_config_as(DEFAULT_PROVIDER_NAME, cloud_config)
    }

    /// As [`from_cloud_config`](Self::from_cloud_config), for a fake cloud registered under
    /// another name (a second cloud in one cluster): it answers as `provider_name` (and hands
    /// out `<provider_name>://` provider IDs) unless the file sets `provider_name` itself, and
    /// then it must be the same.
    ///
    /// ```ignore
    /// fn fake_b(config: Option<&[u8]>) -> Result<Arc<dyn CloudProvider>, BoxError> {
    ///     FakeCloud::from_cloud_config_as("fake-b", config)
    /// }
    /// ccm_core::register_cloud_provider!("fake-b", fake_b);
    /// ```
    pub fn from_cloud_config_as(
        provider_name: &str,
        cloud_config: Option<&[u8]>,
    ) -> Result<Arc<dyn CloudProvider>, BoxError> {
        let mut config: FakeCloudConfig = match cloud_config {
            Some(bytes) => ccm_core::parse_cloud_config(bytes)?,
            None => FakeCloudConfig::default(),
        };
        if config.provider_name == DEFAULT_PROVIDER_NAME {
            config.provider_name = provider_name.to_owned();
        } else if config.provider_name != provider_name {
            return Err(format!(
                "fake cloud config: provider_name {:?} differs from the name it is registered under, {provider_name:?}",
                config.provider_name
            )
            .into());
        }
        Ok(Arc::new(FakeCloud::try_new(config)?))
    }

    /// The configuration this fake cloud was built with.
    pub fn config(&self) -> &FakeCloudConfig {
        &self.inner.config
    }

    /// This fake cloud (sharing its state) as a provider trait object.
    pub fn provider(&self) -> Arc<dyn CloudProvider> {
        Arc::new(self.clone())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave State half-updated in a way that matters
        // to a test double; keep serving rather than poisoning every later call.
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ccm_core::{Node, NodeView, Service};

    use super::FakeCloud;

    fn node(name: &str) -> NodeView {
        let mut node = Node::default();
        node.metadata.name = Some(name.to_owned());
        NodeView::from(node)
    }

    fn service(name: &str) -> Service {
        let mut service = Service::default();
        service.metadata.name = Some(name.to_owned());
        service.metadata.namespace = Some("ns".to_owned());
        service.metadata.uid = Some(format!("uid-{name}"));
        service
    }

    /// Load balancers with the same hosts share one host list; a changed list is a new one,
    /// and a list no load balancer holds any more is dropped.
    #[tokio::test]
    async fn load_balancers_with_the_same_hosts_share_one_host_list() {
        let cloud = FakeCloud::default();
        let provider = cloud.provider();
        let lb = provider.load_balancer().unwrap();
        let hosts = [node("b"), node("a"), node("b")];
        for name in ["one", "two", "three"] {
            lb.ensure_load_balancer("c", &service(name), &hosts)
                .await
                .unwrap();
        }
        let shared = |key: &str| cloud.lock().load_balancers[key].hosts.clone();
        assert!(Arc::ptr_eq(&shared("ns/one"), &shared("ns/two")));
        assert!(Arc::ptr_eq(&shared("ns/one"), &shared("ns/three")));
        assert_eq!(&*shared("ns/one"), ["a", "b"]);
        assert_eq!(cloud.lock().host_sets.sets.len(), 1);

        // Reordered input is the same set.
        lb.update_load_balancer("c", &service("two"), &[node("a"), node("b")])
            .await
            .unwrap();
        assert!(Arc::ptr_eq(&shared("ns/one"), &shared("ns/two")));

        lb.update_load_balancer("c", &service("two"), &[node("c")])
            .await
            .unwrap();
        assert!(!Arc::ptr_eq(&shared("ns/one"), &shared("ns/two")));
        assert_eq!(&*shared("ns/two"), ["c"]);
        assert_eq!(cloud.load_balancers()["ns/two"].hosts, ["c"]);
        assert_eq!(cloud.load_balancers()["ns/one"].hosts, ["a", "b"]);

        // Once no load balancer (and no recorded call) holds {a, b}, the next intern forgets
        // it.
        for name in ["one", "three"] {
            lb.update_load_balancer("c", &service(name), &[node("c")])
                .await
                .unwrap();
        }
        cloud.reset_calls();
        lb.update_load_balancer("c", &service("one"), &[node("c")])
            .await
            .unwrap();
        assert_eq!(cloud.lock().host_sets.sets.len(), 1);
    }

    /// The load balancers by host count (the debug line's figures) follow every call that
    /// changes hosts: ensure, update, the batch update and delete.
    #[tokio::test]
    async fn load_balancers_by_host_count_follow_every_change() {
        let cloud = FakeCloud::builder().load_balancer_hosts_batch(true).build();
        let provider = cloud.provider();
        let lb = provider.load_balancer().unwrap();
        let by_count = || cloud.lock().host_counts.by_count().clone();
        let three = [node("a"), node("b"), node("c")];
        let four = [node("a"), node("b"), node("c"), node("d")];
        for name in ["one", "two"] {
            lb.ensure_load_balancer("c", &service(name), &three)
                .await
                .unwrap();
        }
        assert_eq!(by_count(), [(3, 2)].into_iter().collect());
        lb.update_load_balancer("c", &service("two"), &four)
            .await
            .unwrap();
        assert_eq!(by_count(), [(3, 1), (4, 1)].into_iter().collect());
        // Ensuring the same hosts again changes nothing.
        lb.ensure_load_balancer("c", &service("one"), &three)
            .await
            .unwrap();
        assert_eq!(by_count(), [(3, 1), (4, 1)].into_iter().collect());

        let batch = provider.load_balancer_hosts_batch().unwrap();
        let services = [Arc::new(service("one")), Arc::new(service("two"))];
        batch
            .update_load_balancer_hosts("c", &services, &four)
            .await
            .unwrap();
        assert_eq!(by_count(), [(4, 2)].into_iter().collect());

        lb.ensure_load_balancer_deleted("c", &service("one"))
            .await
            .unwrap();
        assert_eq!(by_count(), [(4, 1)].into_iter().collect());
        assert_eq!(cloud.lock().host_counts.summary(), "4=1");
    }
}

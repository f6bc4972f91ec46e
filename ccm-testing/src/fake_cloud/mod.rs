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
//!   node exists, with provider ID `fake://<node-name>`, zone `zone-a`, region `region-1`,
//!   instance type `fake-small`, an `InternalIP` derived stably from the node name (a hash of
//!   the name into `10.0.0.0/8`, never ending in `.0` or `.255`), optionally an `ExternalIP`
//!   (hash into `198.18.0.0/15`), and a `Hostname` address equal to the node name. A Node's
//!   instance is found from `spec.providerID` when set (it must be `fake://...`), else from its
//!   name. Nodes whose name matches `missing_nodes` do not exist: `instance_exists` and
//!   `instance_exists_by_provider_id` answer `Ok(false)`, `instance_shutdown` `Ok(false)`, and
//!   every lookup (`instance_metadata`, `instance_id`, `node_addresses`, zones...) answers
//!   [`CloudError::InstanceNotFound`]. Nodes matching
//!   `shutdown_nodes` exist and are shut down. Chosen answers per Node (`nodes:`,
//!   [`FakeCloudBuilder::node`], [`FakeCloud::set_node`], a [`NodeAnswer`]) override any of
//!   this for one Node: provider ID (lookups by it find the Node), addresses, type, zone,
//!   region, labels, existence, shutdown, or an error for every lookup.
//! - **Batches** (`instances_batch`, off by default): `describe_instances` answers every Node
//!   as the three single calls would (`Found`, `Shutdown`, `NotFound`, or `Error` for a Node
//!   with an `error` answer), in one call of at most `max_batch_size` Nodes.
//! - **Load balancers**: keyed by the Service's `<namespace>/<name>`; `ensure_load_balancer`
//!   creates or replaces one (remembering its hosts, ports and cluster) and answers an ingress
//!   with its own IP from `lb_ip_range` (default `203.0.113.0/24`: the lowest free address,
//!   kept while it exists, freed on delete), or the one `lb_ip` of every load balancer, or
//!   `lb_hostname`; `get_load_balancer` reports it until
//!   `ensure_load_balancer_deleted`, which succeeds when nothing exists;
//!   `update_load_balancer` replaces the hosts and fails for a load balancer that does not exist.
//!   A load balancer is reported only to the cluster name that created it.
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
//! A quota (`quota:`, [`QuotaConfig`]) limits calls per second overall and per operation; a
//! call over it is answered at once (after its latency) with [`CloudError::Retry`] carrying
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
//! lb_ip_range: 198.51.100.0/24   # one ingress IP per load balancer (default 203.0.113.0/24)
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
//! max_batch_size: 50             # most nodes per describe_instances (default 100)
//! quota:                         # token buckets; a call over quota answers Retry (429)
//!   overall: {per_second: 20, burst: 20}
//!   operations:
//!     describe_instances: {per_second: 5, burst: 5}
//! state_file: /tmp/fake-cloud.json # keep load balancers and routes across restarts
//! track_node_addresses: true     # list_routes sets enable_node_addresses (default false)
//! clusters: [prod]               # answered by list_clusters (default [kubernetes])
//! capabilities:                  # switch capabilities on and off (defaults shown)
//!   instances_v2: true
//!   instances: true              # legacy v1 Instances (default false)
//!   zones: true                  # legacy Zones (default false)
//!   load_balancer: true
//!   routes: true
//!   clusters: true
//!   instances_batch: true        # InstancesBatch (default false)
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
//! use ccm_core::{CloudProvider, Node, ObjectMeta};
//! use ccm_testing::fake_cloud::{FakeCloud, Fault};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let cloud = FakeCloud::builder().missing_node("gone-.*").build();
//! let node = |name: &str| Node {
//!     metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
//!     ..Default::default()
//! };
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

mod config;
mod provider;
mod quota;
mod state_file;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ccm_core::{
    BoxError, CloudError, CloudProvider, CloudResult, InstanceMetadata, LoadBalancerIngress,
    LoadBalancerStatus, NodeAddress, Route,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use regex::Regex;
use serde::{Deserialize, Serialize};

pub use config::{
    Capabilities, FakeCloudConfig, FakeCloudConfigError, Fault, NodeAnswer, OPERATIONS,
    QuotaConfig, Rate,
};
pub use state_file::{FakeCloudState, RouteState, StateFileError};

/// One call to a [`FakeCloud`], as recorded in [`FakeCloud::call_log`].
#[derive(Clone, Debug, PartialEq)]
pub struct CallRecord {
    /// The operation: the snake_case trait method name, e.g. `ensure_load_balancer`.
    pub operation: String,
    /// What the call was about: the node name (`instance_*`, `node_addresses`...), the provider
    /// ID (`*_by_provider_id`), `<namespace>/<name>` of the Service (load balancers), the
    /// destination CIDR (`create_route`, `delete_route`), the cluster name (`list_routes`,
    /// `master`), the number of Nodes (`describe_instances`: `3 nodes`), or empty.
    pub subject: String,
    /// The call's arguments.
    pub args: CallArgs,
    /// True when the quota rejected the call ([`CloudError::Retry`], nothing done).
    pub rejected: bool,
}

impl CallRecord {
    /// The backend host names of a load-balancer call (sorted, each once), if it had hosts.
    pub fn hosts(&self) -> Option<&[String]> {
        match &self.args {
            CallArgs::LoadBalancer {
                hosts: Some(hosts), ..
            } => Some(hosts),
            _ => None,
        }
    }

    /// The node names of an instance call: one for the single calls, every Node of a
    /// `describe_instances` batch in the order given.
    pub fn node_names(&self) -> Vec<&str> {
        match &self.args {
            CallArgs::Node { name, .. } | CallArgs::NodeName(name) => vec![name.as_str()],
            CallArgs::Nodes(names) => names.iter().map(String::as_str).collect(),
            _ => Vec::new(),
        }
    }
}

/// The arguments of one recorded call ([`CallRecord::args`]).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum CallArgs {
    /// No arguments (`initialize`, `get_zone`, `list_clusters`).
    None,
    /// An `InstancesV2` call: the Node's name and `spec.providerID`.
    Node {
        /// `metadata.name`.
        name: String,
        /// `spec.providerID`, when set.
        provider_id: Option<String>,
    },
    /// `describe_instances`: the Nodes' names, in the order given.
    Nodes(Vec<String>),
    /// A legacy lookup by node name.
    NodeName(String),
    /// A lookup by provider ID.
    ProviderId(String),
    /// `current_node_name`'s hostname or `add_ssh_key_to_all_instances`' user.
    Text(String),
    /// A load-balancer call.
    LoadBalancer {
        /// The cluster name.
        cluster_name: String,
        /// `<namespace>/<name>` of the Service.
        service: String,
        /// The backend host names (sorted, each once) of `ensure_load_balancer` and
        /// `update_load_balancer`; `None` for the calls without hosts. Shared with the
        /// stored load balancers, not copied.
        hosts: Option<Arc<[String]>>,
    },
    /// `list_routes` or `master`: the cluster name.
    Cluster(String),
    /// `create_route` or `delete_route`.
    Route {
        /// The cluster name.
        cluster_name: String,
        /// The name hint (`create_route` only).
        name_hint: Option<String>,
        /// The route as passed.
        route: Route,
    },
}

/// A load balancer held by a [`FakeCloud`], as returned by [`FakeCloud::load_balancers`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadBalancerState {
    /// The load balancer's name: [`ccm_core::default_load_balancer_name`] of the Service.
    pub name: String,
    /// The names of the backend Nodes, sorted, each once.
    pub hosts: Vec<String>,
    /// The Service's ports (`spec.ports[].port`) at the last ensure.
    pub ports: Vec<i32>,
    /// The cluster name of the last ensure.
    pub cluster_name: String,
    /// The ingress IP it was given (`None` with `lb_hostname`).
    #[serde(default)]
    pub ingress_ip: Option<String>,
}

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
    Probability { p: f64, rng: Box<ChaCha8Rng> },
    Retry { after: Duration, left: usize },
    NotImplemented,
    InstanceNotFound,
}

/// A load balancer as the fake cloud stores it: like [`LoadBalancerState`], with the host list
/// shared between every load balancer that has the same hosts (see [`HostSets`]).
#[derive(Clone, Debug)]
struct StoredLoadBalancer {
    name: String,
    hosts: Arc<[String]>,
    ports: Vec<i32>,
    cluster_name: String,
    ingress_ip: Option<IpAddr>,
}

impl StoredLoadBalancer {
    fn to_state(&self) -> LoadBalancerState {
        LoadBalancerState {
            name: self.name.clone(),
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
/// balancer would cost load balancers × nodes names: about 280 MB at 1,000 load balancers and
/// 5,000 nodes, inside the process under test (the `steady` benchmark measured exactly that).
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
    calls: Vec<CallRecord>,
    counts: BTreeMap<String, usize>,
    rejected: BTreeMap<String, usize>,
    quota: quota::Quota,
    nodes: BTreeMap<String, NodeAnswer>,
    missing: Vec<Regex>,
    shutdown: Vec<Regex>,
    faults: BTreeMap<String, Vec<ArmedFault>>,
    load_balancers: BTreeMap<String, StoredLoadBalancer>,
    host_sets: HostSets,
    routes: BTreeMap<String, StoredRoute>,
    latency: Duration,
    operation_latency: BTreeMap<String, Duration>,
}

impl State {
    /// Consults the faults armed on `op`; the first that fires gives the error.
    fn fire_fault(&mut self, op: &str) -> Option<CloudError> {
        let faults = self.faults.get_mut(op)?;
        let mut fired = None;
        for fault in faults.iter_mut() {
            fired = match fault {
                ArmedFault::FailNext(left) if *left > 0 => {
                    *left -= 1;
                    Some(injected(op))
                }
                ArmedFault::Probability { p, rng } => rng.random_bool(*p).then(|| injected(op)),
                ArmedFault::Retry { after, left } if *left > 0 => {
                    *left -= 1;
                    Some(CloudError::retry(
                        *after,
                        format!("fake cloud: injected retry of {op}"),
                    ))
                }
                ArmedFault::NotImplemented => Some(CloudError::NotImplemented),
                ArmedFault::InstanceNotFound => Some(CloudError::InstanceNotFound),
                _ => None,
            };
            if fired.is_some() {
                break;
            }
        }
        faults.retain(|f| {
            !matches!(
                f,
                ArmedFault::FailNext(0) | ArmedFault::Retry { left: 0, .. }
            )
        });
        fired
    }

    fn is_missing(&self, node_name: &str) -> bool {
        match self.nodes.get(node_name).and_then(|a| a.exists) {
            Some(exists) => !exists,
            None => self.missing.iter().any(|r| r.is_match(node_name)),
        }
    }

    fn is_shutdown(&self, node_name: &str) -> bool {
        !self.is_missing(node_name)
            && match self.nodes.get(node_name).and_then(|a| a.shutdown) {
                Some(shutdown) => shutdown,
                None => self.shutdown.iter().any(|r| r.is_match(node_name)),
            }
    }

    /// The error every lookup of this Node answers (`nodes.<name>.error`), if any.
    fn node_error(&self, node_name: &str) -> CloudResult<()> {
        match self.nodes.get(node_name).and_then(|a| a.error.as_deref()) {
            Some(message) => Err(CloudError::msg(format!(
                "fake cloud: node {node_name}: {message}"
            ))),
            None => Ok(()),
        }
    }

    /// The node name whose chosen answer has this provider ID, if any.
    fn node_with_provider_id(&self, provider_id: &str) -> Option<&str> {
        self.nodes
            .iter()
            .find(|(_, a)| a.provider_id.as_deref() == Some(provider_id))
            .map(|(name, _)| name.as_str())
    }

    /// The metadata of an existing, answering instance.
    fn metadata(&self, cfg: &FakeCloudConfig, name: &str) -> CloudResult<InstanceMetadata> {
        self.node_error(name)?;
        if self.is_missing(name) {
            return Err(CloudError::InstanceNotFound);
        }
        let answer = self.nodes.get(name);
        let pick = |field: Option<&String>, default: &String| field.unwrap_or(default).clone();
        Ok(InstanceMetadata {
            provider_id: answer
                .and_then(|a| a.provider_id.clone())
                .unwrap_or_else(|| format!("fake://{name}")),
            instance_type: pick(
                answer.and_then(|a| a.instance_type.as_ref()),
                &cfg.instance_type,
            ),
            node_addresses: answer
                .and_then(|a| a.addresses.clone())
                .unwrap_or_else(|| node_addresses(cfg, name)),
            zone: pick(answer.and_then(|a| a.zone.as_ref()), &cfg.zone),
            region: pick(answer.and_then(|a| a.region.as_ref()), &cfg.region),
            additional_labels: answer
                .and_then(|a| a.additional_labels.clone())
                .unwrap_or_else(|| cfg.additional_labels.clone()),
        })
    }

    /// The lowest address of `range` no load balancer holds (IPv4: neither the network nor
    /// the broadcast address, unless the range is a /31 or /32).
    fn free_ip(&self, range: &ipnet::IpNet) -> Option<IpAddr> {
        let used: std::collections::HashSet<IpAddr> = self
            .load_balancers
            .values()
            .filter_map(|lb| lb.ingress_ip)
            .collect();
        range.hosts().find(|ip| !used.contains(ip))
    }

    /// The load balancers and routes, as the state file holds them.
    fn snapshot(&self) -> FakeCloudState {
        FakeCloudState {
            load_balancers: self
                .load_balancers
                .iter()
                .map(|(key, lb)| (key.clone(), lb.to_state()))
                .collect(),
            routes: self
                .routes
                .values()
                .map(|r| RouteState {
                    name: r.route.name.clone(),
                    cluster_name: r.cluster.clone(),
                    target_node: r.route.target_node.clone(),
                    destination_cidr: r.route.destination_cidr.clone(),
                    target_node_addresses: r.route.target_node_addresses.clone(),
                    blackhole: r.route.blackhole,
                    enable_node_addresses: r.route.enable_node_addresses,
                })
                .collect(),
        }
    }

    /// Replaces the load balancers and routes with those of a state file.
    fn restore(&mut self, saved: FakeCloudState) {
        for (key, lb) in saved.load_balancers {
            let names: Vec<&str> = lb.hosts.iter().map(String::as_str).collect();
            let hosts = self.host_sets.intern(&names);
            self.load_balancers.insert(
                key,
                StoredLoadBalancer {
                    name: lb.name,
                    hosts,
                    ports: lb.ports,
                    cluster_name: lb.cluster_name,
                    ingress_ip: lb.ingress_ip.and_then(|ip| ip.parse().ok()),
                },
            );
        }
        for r in saved.routes {
            self.routes.insert(
                r.name.clone(),
                StoredRoute {
                    cluster: r.cluster_name,
                    route: Route {
                        name: r.name,
                        target_node: r.target_node,
                        enable_node_addresses: r.enable_node_addresses,
                        target_node_addresses: r.target_node_addresses,
                        destination_cidr: r.destination_cidr,
                        blackhole: r.blackhole,
                    },
                },
            );
        }
    }
}

/// The default `lb_ip_range`: TEST-NET-3 (RFC 5737), a range reserved for documentation.
const DEFAULT_LB_IP_RANGE: ipnet::Ipv4Net =
    ipnet::Ipv4Net::new_assert(std::net::Ipv4Addr::new(203, 0, 113, 0), 24);

/// The operations that change the load balancers or routes (and so rewrite the state file).
const MUTATING: &[&str] = &[
    "ensure_load_balancer",
    "update_load_balancer",
    "ensure_load_balancer_deleted",
    "create_route",
    "delete_route",
];

fn injected(op: &str) -> CloudError {
    CloudError::msg(format!("fake cloud: injected failure of {op}"))
}

fn arm(fault: Fault) -> ArmedFault {
    match fault {
        Fault::FailNext(n) => ArmedFault::FailNext(n),
        Fault::FailWithProbability { p, seed } => ArmedFault::Probability {
            // Out-of-range values are clamped (NaN never fails) rather than panicking in rand.
            p: if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) },
            rng: Box::new(ChaCha8Rng::seed_from_u64(seed)),
        },
        Fault::Retry { after, count } => ArmedFault::Retry { after, left: count },
        Fault::NotImplemented => ArmedFault::NotImplemented,
        Fault::InstanceNotFound => ArmedFault::InstanceNotFound,
    }
}

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
            nodes: config.nodes.clone(),
            quota: quota::Quota::new(&config.quota),
            missing: compile_patterns("missing_nodes", &config.missing_nodes),
            shutdown: compile_patterns("shutdown_nodes", &config.shutdown_nodes),
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
        let config: FakeCloudConfig = match cloud_config {
            Some(bytes) => ccm_core::parse_cloud_config(bytes)?,
            None => FakeCloudConfig::default(),
        };
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

    /// How many times `op` (a snake_case trait method name, see [`OPERATIONS`]) was called since
    /// the start or the last [`FakeCloud::reset_calls`], including calls that failed or were
    /// cancelled.
    pub fn call_count(&self, op: &str) -> usize {
        self.lock().counts.get(op).copied().unwrap_or(0)
    }

    /// The call counts of every operation called at least once.
    pub fn call_counts(&self) -> BTreeMap<String, usize> {
        self.lock().counts.clone()
    }

    /// Every call in the order it was made.
    pub fn call_log(&self) -> Vec<CallRecord> {
        self.lock().calls.clone()
    }

    /// The recorded calls of one operation, in the order they were made.
    pub fn calls_of(&self, op: &str) -> Vec<CallRecord> {
        self.lock()
            .calls
            .iter()
            .filter(|c| c.operation == op)
            .cloned()
            .collect()
    }

    /// How many calls of `op` the quota rejected (they are in [`FakeCloud::call_count`] too).
    pub fn rejected_count(&self, op: &str) -> usize {
        self.lock().rejected.get(op).copied().unwrap_or(0)
    }

    /// The rejected-call counts of every operation the quota rejected at least once.
    pub fn rejected_counts(&self) -> BTreeMap<String, usize> {
        self.lock().rejected.clone()
    }

    /// Forgets the recorded calls, counts and rejected counts.
    pub fn reset_calls(&self) {
        let mut st = self.lock();
        st.calls.clear();
        st.counts.clear();
        st.rejected.clear();
    }

    /// Sets the chosen answers for one Node (as `nodes.<name>` in the config), replacing any.
    pub fn set_node(&self, name: &str, answer: NodeAnswer) {
        self.lock().nodes.insert(name.to_owned(), answer);
    }

    /// Forgets the chosen answers for one Node: it gets the default answers again.
    pub fn remove_node(&self, name: &str) {
        self.lock().nodes.remove(name);
    }

    /// Replaces the quota (as `quota` in the config); the new buckets start full.
    pub fn set_quota(&self, quota: &QuotaConfig) {
        self.lock().quota = quota::Quota::new(quota);
    }

    /// The load balancers and routes, as the state file holds them (also without one).
    pub fn state(&self) -> FakeCloudState {
        self.lock().snapshot()
    }

    /// The load balancers that currently exist, keyed by `<namespace>/<name>` of the Service.
    pub fn load_balancers(&self) -> BTreeMap<String, LoadBalancerState> {
        self.lock()
            .load_balancers
            .iter()
            .map(|(key, lb)| (key.clone(), lb.to_state()))
            .collect()
    }

    /// The route table, in route-name order, with `enable_node_addresses` as stored.
    ///
    /// In method-call syntax this inherent method shadows [`CloudProvider::routes`] (the
    /// capability); reach that one with `CloudProvider::routes(&cloud)` or
    /// `cloud.provider().routes()`.
    pub fn routes(&self) -> Vec<Route> {
        self.lock()
            .routes
            .values()
            .map(|r| r.route.clone())
            .collect()
    }

    /// Seeds a route, e.g. a stale or blackhole route the route controller should delete. It
    /// is listed for every cluster name. A route without a name is named
    /// `seed-<destination_cidr>`; a route with the name of an existing one replaces it.
    pub fn insert_route(&self, route: Route) {
        let mut route = route;
        if route.name.is_empty() {
            route.name = format!("seed-{}", route.destination_cidr);
        }
        let mut st = self.lock();
        st.routes.insert(
            route.name.clone(),
            StoredRoute {
                cluster: None,
                route,
            },
        );
        if let Err(e) = self.persist(&st) {
            tracing::error!(error = %e, "fake cloud: state file not written");
        }
    }

    /// Replaces the patterns of nodes whose instances do not exist (regular expressions matched
    /// against the whole node name; invalid ones are logged and ignored).
    pub fn set_missing_nodes(&self, patterns: &[&str]) {
        let compiled = compile_patterns("missing_nodes", patterns);
        self.lock().missing = compiled;
    }

    /// Replaces the patterns of nodes whose instances are shut down (regular expressions matched
    /// against the whole node name; invalid ones are logged and ignored).
    pub fn set_shutdown_nodes(&self, patterns: &[&str]) {
        let compiled = compile_patterns("shutdown_nodes", patterns);
        self.lock().shutdown = compiled;
    }

    /// Arms a fault on an operation (a snake_case trait method name, see [`OPERATIONS`]; an
    /// unknown name is logged as a warning and never fires). Faults already armed on the
    /// operation stay armed and are consulted first.
    pub fn inject(&self, op: &str, fault: Fault) {
        warn_unknown_operation(op);
        self.lock()
            .faults
            .entry(op.to_owned())
            .or_default()
            .push(arm(fault));
    }

    /// Disarms every fault on every operation.
    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    /// Sets the delay of every operation without its own override.
    pub fn set_latency(&self, latency: Duration) {
        self.lock().latency = latency;
    }

    /// Sets the delay of one operation, overriding [`FakeCloud::set_latency`].
    pub fn set_operation_latency(&self, op: &str, latency: Duration) {
        warn_unknown_operation(op);
        self.lock().operation_latency.insert(op.to_owned(), latency);
    }

    /// Records a call (with the arguments `args` gives), applies the quota, waits the
    /// latency, consults the faults, then runs `f` under the lock; a successful change of the
    /// load balancers or routes is written to the state file.
    async fn call<T>(
        &self,
        op: &'static str,
        subject: impl Into<String>,
        args: impl FnOnce(&mut State) -> CallArgs,
        f: impl FnOnce(&FakeCloudConfig, &mut State) -> CloudResult<T>,
    ) -> CloudResult<T> {
        let (latency, throttled) = {
            let mut st = self.lock();
            let args = args(&mut st);
            let throttled = if op == "initialize" {
                None
            } else {
                st.quota.admit(op).err()
            };
            st.calls.push(CallRecord {
                operation: op.to_owned(),
                subject: subject.into(),
                args,
                rejected: throttled.is_some(),
            });
            *st.counts.entry(op.to_owned()).or_default() += 1;
            if throttled.is_some() {
                *st.rejected.entry(op.to_owned()).or_default() += 1;
            }
            let latency = st.operation_latency.get(op).copied().unwrap_or(st.latency);
            (latency, throttled)
        };
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        if let Some(after) = throttled {
            return Err(CloudError::retry(
                after,
                format!("fake cloud: quota exceeded for {op} (429 Too Many Requests)"),
            ));
        }
        let mut st = self.lock();
        if let Some(err) = st.fire_fault(op) {
            return Err(err);
        }
        let result = f(&self.inner.config, &mut st)?;
        if MUTATING.contains(&op) {
            self.persist(&st).map_err(CloudError::other)?;
        }
        Ok(result)
    }

    /// Writes the state file, when there is one.
    fn persist(&self, st: &State) -> Result<(), StateFileError> {
        // Under the state lock, so the file always follows the order of the changes. A test
        // double can afford the blocking write; the benchmarks run without a state file.
        match &self.inner.state_file {
            Some(path) => st.snapshot().save(path),
            None => Ok(()),
        }
    }

    /// The ingress IP for the load balancer `key`: its own when it has one, else a free one of
    /// `lb_ip_range` (or the fixed `lb_ip`); `None` with `lb_hostname`.
    fn ingress_ip_for(&self, st: &State, key: &str) -> CloudResult<Option<IpAddr>> {
        let config = &self.inner.config;
        if config.lb_hostname.is_some() {
            return Ok(None);
        }
        if let Some(ip) = &config.lb_ip {
            return ip.parse().map(Some).map_err(CloudError::other);
        }
        if let Some(ip) = st.load_balancers.get(key).and_then(|lb| lb.ingress_ip) {
            return Ok(Some(ip));
        }
        st.free_ip(&self.inner.lb_ip_range)
            .map(Some)
            .ok_or_else(|| {
                CloudError::msg(format!(
                    "fake cloud: lb_ip_range {} has no free address left",
                    self.inner.lb_ip_range
                ))
            })
    }

    /// The status of a load balancer with this ingress IP (or `lb_hostname`).
    fn ingress(&self, ip: Option<IpAddr>) -> LoadBalancerStatus {
        let config = &self.inner.config;
        let ingress = match (&config.lb_hostname, ip) {
            (Some(hostname), _) => LoadBalancerIngress {
                hostname: Some(hostname.clone()),
                ..Default::default()
            },
            (None, ip) => LoadBalancerIngress {
                ip: ip.map(|ip| ip.to_string()),
                ..Default::default()
            },
        };
        LoadBalancerStatus {
            ingress: Some(vec![ingress]),
        }
    }
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

/// FNV-1a, 64 bits. Hand-written (six lines) because the derived addresses must stay the same
/// across Rust releases, which `std`'s `DefaultHasher` does not promise.
fn stable_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The `InternalIP` of a node: `10.a.b.c` from a hash of its name, `c` in 1..=254.
pub(crate) fn internal_ip(node_name: &str) -> String {
    let h = stable_hash(node_name);
    format!(
        "10.{}.{}.{}",
        (h >> 8) & 0xff,
        (h >> 16) & 0xff,
        1 + (h % 254)
    )
}

/// The `ExternalIP` of a node: in `198.18.0.0/15` from a hash of its name, last octet 1..=254.
pub(crate) fn external_ip(node_name: &str) -> String {
    let h = stable_hash(node_name);
    format!(
        "198.{}.{}.{}",
        18 + ((h >> 24) & 1),
        (h >> 32) & 0xff,
        1 + ((h >> 40) % 254)
    )
}

/// The addresses of a node's instance: InternalIP, ExternalIP (when configured), Hostname.
pub(crate) fn node_addresses(config: &FakeCloudConfig, node_name: &str) -> Vec<NodeAddress> {
    let mut addresses = vec![NodeAddress {
        type_: "InternalIP".into(),
        address: internal_ip(node_name),
    }];
    if config.external_ip {
        addresses.push(NodeAddress {
            type_: "ExternalIP".into(),
            address: external_ip(node_name),
        });
    }
    addresses.push(NodeAddress {
        type_: "Hostname".into(),
        address: node_name.to_owned(),
    });
    addresses
}

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

    /// The most Nodes one `describe_instances` call accepts (`max_batch_size`).
    pub fn max_batch_size(mut self, max: usize) -> Self {
        self.config.max_batch_size = max;
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ccm_core::{Node, Service};

    use super::FakeCloud;

    fn node(name: &str) -> Arc<Node> {
        let mut node = Node::default();
        node.metadata.name = Some(name.to_owned());
        Arc::new(node)
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
}

//! What the cluster and the cloud look like at the end, the invariants checked on them, and
//! the report a run prints.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use ccm_testing::fake_cloud::{FakeCloudState, LoadBalancerState, RouteState};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, ListParams};

use crate::scenario::{Chaos, NS};

/// The most resident memory a `fake-ccm` process may use in this scenario.
const RSS_BOUND_KIB: u64 = 256 * 1024;

/// The cluster (through the API server) and the cloud (through its state file).
pub(crate) struct Observed {
    pub(crate) nodes: BTreeMap<String, Node>,
    pub(crate) services: BTreeMap<String, Service>,
    pub(crate) load_balancers: BTreeMap<String, LoadBalancerState>,
    pub(crate) routes: Vec<RouteState>,
}

/// Counts of every invariant broken (all zero in a clean run).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Violations {
    pub(crate) leaked_load_balancers: usize,
    pub(crate) missing_load_balancers: usize,
    pub(crate) wrong_hosts: usize,
    pub(crate) wrong_ports: usize,
    pub(crate) nodes_deleted_while_instance_existed: usize,
    pub(crate) nodes_kept_without_instance: usize,
    pub(crate) nodes_without_pod_cidr: usize,
    pub(crate) routes_missing: usize,
    pub(crate) routes_extra: usize,
    pub(crate) finalizers_left_on_deleted_services: usize,
    pub(crate) exited_on_its_own: usize,
    pub(crate) bad_exit: usize,
    pub(crate) panics: usize,
    pub(crate) memory_over_bound: usize,
}

impl Violations {
    fn rows(&self) -> [(&'static str, usize); 14] {
        [
            ("leaked load balancers", self.leaked_load_balancers),
            ("missing load balancers", self.missing_load_balancers),
            ("load balancers with wrong hosts", self.wrong_hosts),
            ("load balancers with wrong ports", self.wrong_ports),
            (
                "Nodes deleted while their instance existed",
                self.nodes_deleted_while_instance_existed,
            ),
            (
                "Nodes kept after their instance was gone",
                self.nodes_kept_without_instance,
            ),
            ("Nodes without a pod CIDR", self.nodes_without_pod_cidr),
            ("routes missing", self.routes_missing),
            ("routes extra", self.routes_extra),
            (
                "finalizers left on deleted Services",
                self.finalizers_left_on_deleted_services,
            ),
            ("exits on its own", self.exited_on_its_own),
            ("graceful stops that failed", self.bad_exit),
            ("panics", self.panics),
            ("memory over the bound", self.memory_over_bound),
        ]
    }

    pub(crate) fn total(&self) -> usize {
        self.rows().iter().map(|(_, n)| n).sum()
    }

    pub(crate) fn add(&mut self, other: &Violations) {
        self.leaked_load_balancers += other.leaked_load_balancers;
        self.missing_load_balancers += other.missing_load_balancers;
        self.wrong_hosts += other.wrong_hosts;
        self.wrong_ports += other.wrong_ports;
        self.nodes_deleted_while_instance_existed += other.nodes_deleted_while_instance_existed;
        self.nodes_kept_without_instance += other.nodes_kept_without_instance;
        self.nodes_without_pod_cidr += other.nodes_without_pod_cidr;
        self.routes_missing += other.routes_missing;
        self.routes_extra += other.routes_extra;
        self.finalizers_left_on_deleted_services += other.finalizers_left_on_deleted_services;
        self.exited_on_its_own += other.exited_on_its_own;
        self.bad_exit += other.bad_exit;
        self.panics += other.panics;
        self.memory_over_bound += other.memory_over_bound;
    }
}

fn is_ours(s: &Service) -> bool {
    s.spec.as_ref().is_some_and(|spec| {
        spec.type_.as_deref() == Some("LoadBalancer") && spec.load_balancer_class.is_none()
    }) && s.metadata.deletion_timestamp.is_none()
}

fn pod_cidrs(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.pod_cidrs.clone())
        .unwrap_or_default()
}

impl Observed {
    pub(crate) async fn take(chaos: &Chaos) -> Observed {
        let nodes: Api<Node> = Api::all(chaos.server.client());
        let services: Api<Service> = Api::namespaced(chaos.server.client(), NS);
        let nodes = nodes.list(&ListParams::default()).await.unwrap();
        let services = services.list(&ListParams::default()).await.unwrap();
        let cloud = FakeCloudState::load(&chaos.state_file).unwrap();
        Observed {
            nodes: nodes
                .items
                .into_iter()
                .map(|n| (n.metadata.name.clone().unwrap_or_default(), n))
                .collect(),
            services: services
                .items
                .into_iter()
                .map(|s| {
                    (
                        format!("{NS}/{}", s.metadata.name.clone().unwrap_or_default()),
                        s,
                    )
                })
                .collect(),
            load_balancers: cloud.load_balancers,
            routes: cloud.routes,
        }
    }

    fn expected_hosts(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.metadata.deletion_timestamp.is_none())
            .map(|(name, _)| name.clone())
            .collect()
    }

    fn expected_routes(&self) -> BTreeSet<(String, String)> {
        self.nodes
            .iter()
            .flat_map(|(name, n)| pod_cidrs(n).into_iter().map(|c| (name.clone(), c)))
            .collect()
    }

    fn actual_routes(&self) -> BTreeSet<(String, String)> {
        self.routes
            .iter()
            .map(|r| (r.target_node.clone(), r.destination_cidr.clone()))
            .collect()
    }

    pub(crate) fn violations(&self, chaos: &Chaos) -> Violations {
        let mut v = Violations::default();
        let ours: BTreeMap<&String, &Service> =
            self.services.iter().filter(|(_, s)| is_ours(s)).collect();
        let hosts = self.expected_hosts();
        v.leaked_load_balancers = self
            .load_balancers
            .keys()
            .filter(|k| !ours.contains_key(k))
            .count();
        for (key, service) in &ours {
            let Some(lb) = self.load_balancers.get(*key) else {
                v.missing_load_balancers += 1;
                continue;
            };
            if lb.hosts != hosts {
                v.wrong_hosts += 1;
            }
            let mut want: Vec<i32> = service
                .spec
                .as_ref()
                .and_then(|s| s.ports.as_ref())
                .map(|p| p.iter().map(|p| p.port).collect())
                .unwrap_or_default();
            want.sort_unstable();
            let mut have = lb.ports.clone();
            have.sort_unstable();
            if want != have {
                v.wrong_ports += 1;
            }
        }
        v.nodes_deleted_while_instance_existed = chaos
            .live_nodes()
            .iter()
            .filter(|n| !self.nodes.contains_key(*n))
            .count();
        // A Node whose instance went before it was initialised (still tainted, no provider
        // ID) is kept by design: nothing shows it was ours (docs/controllers.md, "When a Node
        // may be deleted").
        let initialised = |node: &Node| {
            let spec = node.spec.as_ref();
            spec.and_then(|s| s.provider_id.as_deref())
                .is_some_and(|p| !p.is_empty())
                || !spec.and_then(|s| s.taints.as_ref()).is_some_and(|t| {
                    t.iter()
                        .any(|t| t.key == ccm_core::well_known::TAINT_UNINITIALIZED)
                })
        };
        v.nodes_kept_without_instance = chaos
            .terminated
            .iter()
            .filter(|n| self.nodes.get(*n).is_some_and(initialised))
            .count();
        v.nodes_without_pod_cidr = self
            .nodes
            .values()
            .filter(|n| pod_cidrs(n).is_empty())
            .count();
        let (want, have) = (self.expected_routes(), self.actual_routes());
        v.routes_missing = want.difference(&have).count();
        v.routes_extra = have.difference(&want).count();
        v.finalizers_left_on_deleted_services = chaos
            .deleted_services
            .iter()
            .filter(|n| self.services.contains_key(&format!("{NS}/{n}")))
            .count()
            + self
                .services
                .values()
                .filter(|s| s.metadata.deletion_timestamp.is_some())
                .count();
        v
    }

    /// What is wrong, object by object, for the report of a run that did not converge.
    pub(crate) fn describe(&self, chaos: &Chaos, v: &Violations) -> Vec<String> {
        if v.total() == 0 {
            return Vec::new();
        }
        let ours: BTreeSet<&String> = self
            .services
            .iter()
            .filter(|(_, s)| is_ours(s))
            .map(|(k, _)| k)
            .collect();
        let out = vec![
            format!("services of ours: {ours:?}"),
            format!("load balancers: {:?}", self.load_balancers),
            format!("nodes: {:?}", self.nodes.keys().collect::<Vec<_>>()),
            format!("terminated: {:?}", chaos.terminated),
            format!("routes wanted: {:?}", self.expected_routes()),
            format!("routes in the cloud: {:?}", self.actual_routes()),
        ];
        out
    }
}

/// What a run did and found.
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub(crate) kills: usize,
    /// Kills by the cloud operation in flight at the time (`idle`: none).
    pub(crate) kills_during: BTreeMap<String, usize>,
    pub(crate) nodes_joined: usize,
    pub(crate) nodes_left: usize,
    pub(crate) services_created: usize,
    pub(crate) services_changed: usize,
    pub(crate) services_deleted: usize,
    pub(crate) api_faults: BTreeMap<String, u64>,
    pub(crate) cloud_faults: BTreeMap<String, u64>,
    pub(crate) churn_seconds: f64,
    pub(crate) convergence_seconds: f64,
    pub(crate) converged: bool,
    pub(crate) max_rss_kib: u64,
    pub(crate) final_load_balancers: usize,
    pub(crate) final_nodes: usize,
    pub(crate) final_routes: usize,
    pub(crate) violations: Violations,
    pub(crate) notes: Vec<String>,
}

impl Report {
    pub(crate) fn assert_clean(mut self) {
        if self.max_rss_kib > RSS_BOUND_KIB {
            self.violations.memory_over_bound += 1;
        }
        assert!(self.kills > 0);
        assert_eq!(
            self.violations,
            Violations::default(),
            "invariants broken:\n{self}"
        );
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "chaos: {} SIGKILLs in {:.1} s of churn",
            self.kills, self.churn_seconds
        )?;
        writeln!(f, "  kills during a cloud call: {:?}", self.kills_during)?;
        writeln!(
            f,
            "  churn: {} Nodes joined, {} left; {} Services created, {} changed, {} deleted",
            self.nodes_joined,
            self.nodes_left,
            self.services_created,
            self.services_changed,
            self.services_deleted
        )?;
        writeln!(f, "  API faults injected: {:?}", self.api_faults)?;
        writeln!(f, "  cloud faults injected: {:?}", self.cloud_faults)?;
        writeln!(
            f,
            "  converged: {} in {:.1} s after the last fault; at the end {} load balancers, {} Nodes, {} routes",
            self.converged,
            self.convergence_seconds,
            self.final_load_balancers,
            self.final_nodes,
            self.final_routes
        )?;
        writeln!(f, "  max RSS of fake-ccm: {} KiB", self.max_rss_kib)?;
        writeln!(f, "  invariants (violations):")?;
        for (name, n) in self.violations.rows() {
            writeln!(f, "    {name}: {n}")?;
        }
        for note in &self.notes {
            writeln!(f, "  note: {note}")?;
        }
        Ok(())
    }
}

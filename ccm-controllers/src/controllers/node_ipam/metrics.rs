//! Go's `cidrset` metrics (subsystem `node_ipam_controller`, label `clusterCIDR`), including
//! Go's misspelt `cirdset_max_cidrs`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use std::sync::atomic::AtomicU64;

use super::plan::CidrSet;
use crate::machinery::metrics::MetricsRegistry;

/// The `clusterCIDR` label (Go's spelling).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
#[allow(non_snake_case)]
pub(crate) struct ClusterCidrLabel {
    /// The cluster CIDR, e.g. `10.244.0.0/16`.
    pub(crate) clusterCIDR: String,
}

/// The pool's metrics.
#[derive(Clone, Debug)]
pub(crate) struct PoolMetrics {
    allocations: Family<ClusterCidrLabel, Counter>,
    releases: Family<ClusterCidrLabel, Counter>,
    max: Family<ClusterCidrLabel, Gauge>,
    usage: Family<ClusterCidrLabel, Gauge<f64, AtomicU64>>,
    tries: Family<ClusterCidrLabel, Histogram>,
}

fn label(set: &CidrSet) -> ClusterCidrLabel {
    ClusterCidrLabel {
        clusterCIDR: set.cluster().to_string(),
    }
}

impl PoolMetrics {
    /// Creates and registers the metrics (once per `run`).
    pub(crate) fn register(registry: &MetricsRegistry) -> Self {
        let m = PoolMetrics {
            allocations: Family::default(),
            releases: Family::default(),
            max: Family::default(),
            usage: Family::default(),
            // Go: metrics.ExponentialBuckets(1, 5, 5).
            tries: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(1.0, 5.0, 5))
            }),
        };
        registry.register(
            "node_ipam_controller_cidrset_cidrs_allocations",
            "Counter measuring total number of CIDR allocations.",
            m.allocations.clone(),
        );
        registry.register(
            "node_ipam_controller_cidrset_cidrs_releases",
            "Counter measuring total number of CIDR releases.",
            m.releases.clone(),
        );
        registry.register(
            "node_ipam_controller_cirdset_max_cidrs",
            "Maximum number of CIDRs that can be allocated.",
            m.max.clone(),
        );
        registry.register(
            "node_ipam_controller_cidrset_usage_cidrs",
            "Gauge measuring percentage of allocated CIDRs.",
            m.usage.clone(),
        );
        registry.register(
            "node_ipam_controller_cidrset_allocation_tries_per_request",
            "Number of endpoints added on each Service sync",
            m.tries.clone(),
        );
        m
    }

    /// Sets the gauges from the sets' state.
    pub(crate) fn observe(&self, sets: &[CidrSet]) {
        for set in sets {
            let l = label(set);
            self.max
                .get_or_create(&l)
                .set(i64::try_from(set.max()).unwrap_or(i64::MAX));
            self.usage.get_or_create(&l).set(set.usage());
        }
    }

    /// One allocation from `set` that passed over `tries` taken blocks.
    pub(crate) fn allocated(&self, set: &CidrSet, tries: u64) {
        let l = label(set);
        self.allocations.get_or_create(&l).inc();
        self.tries.get_or_create(&l).observe(tries as f64);
    }

    /// One release to `set`.
    pub(crate) fn released(&self, set: &CidrSet) {
        self.releases.get_or_create(&label(set)).inc();
    }
}

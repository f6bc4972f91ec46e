//! Which controllers run, and the cluster they run for: `--controllers`, `--cluster-name`,
//! `--cluster-cidr`, `--allocate-node-cidrs`, `--controller-start-interval`.

use std::time::Duration;

use clap::{ArgAction, Args};

use crate::machinery::go_syntax::parse_go_duration;

/// Which controllers run, and the cluster they run for.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Generic")]
pub struct GenericArgs {
    /// Controllers to run: `*` enables all (except those disabled by default), `name` enables,
    /// `-name` disables; the first explicit mention wins. Names: `cloud-node-controller`
    /// (`cloud-node`), `cloud-node-lifecycle-controller` (`cloud-node-lifecycle`),
    /// `service-lb-controller` (`service`), `node-route-controller` (`route`), plus the vendor's.
    #[arg(long, value_delimiter = ',', default_value = "*", value_name = "NAMES")]
    pub controllers: Vec<String>,
    /// The cluster's name, passed to every load-balancer and route call (Go's "instance
    /// prefix").
    #[arg(long, default_value = "kubernetes", value_name = "NAME")]
    pub cluster_name: String,
    /// The pod CIDR range of the cluster: one CIDR, or one IPv4 and one IPv6 CIDR separated by
    /// a comma. Required by the route controller.
    #[arg(long, default_value = "", value_name = "CIDRS")]
    pub cluster_cidr: String,
    /// Whether the node-IPAM controller (`node-ipam-controller`, alias `nodeipam`) gives every
    /// Node its pod CIDRs out of `--cluster-cidr`.
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub allocate_node_cidrs: bool,
    /// Sleep between starting two controllers (Go applies jitter 1.0; here without jitter).
    #[arg(long, default_value = "0s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub controller_start_interval: Duration,
}

//! The flags of the cloud-node and cloud-node-lifecycle controllers.

use std::time::Duration;

use clap::Args;

use crate::machinery::go_syntax::parse_go_duration;

/// Flags of the cloud-node and cloud-node-lifecycle controllers.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Node controllers")]
pub struct NodeControllerArgs {
    /// Workers initialising Nodes. Go's default is 1; 100 initialises 1000 nodes at 100 ms per
    /// cloud call in about a second (subject to `--cloud-api-qps`). Must be at least 1.
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub concurrent_node_syncs: u32,
    /// Workers refreshing Node addresses every `--node-status-update-frequency`; 0 means the
    /// value of `--concurrent-node-syncs` (Go semantics).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub concurrent_node_status_updates: u32,
    /// How often the node-lifecycle controller checks NotReady Nodes against the cloud.
    #[arg(long, default_value = "5s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub node_monitor_period: Duration,
    /// How often the cloud-node controller refreshes every Node's addresses.
    #[arg(long, default_value = "5m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub node_status_update_frequency: Duration,
    /// A Node is deleted only after its instance is reported gone on two checks at least this
    /// far apart (Go deletes at once; `0s` restores that).
    #[arg(long, default_value = "30s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub node_deletion_grace_period: Duration,
}

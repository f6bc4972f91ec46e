//! The leader-election flags (`--leader-elect*`).

use std::time::Duration;

use clap::{ArgAction, Args};

use crate::machinery::go_syntax::parse_go_duration;

/// Leader-election flags (Go's `--leader-elect*`).
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Leader election")]
pub struct LeaderElectionArgs {
    /// Elect a leader on a Lease before running controllers.
    #[arg(long, default_value_t = true, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub leader_elect: bool,
    /// How long a standby waits after the last renewal before taking over. Counted in whole
    /// seconds (rounded up) and at least 2s.
    #[arg(long, default_value = "15s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader keeps retrying a failing renewal before it gives up (and exits).
    /// Must be less than the lease duration.
    #[arg(long, default_value = "10s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub leader_elect_renew_deadline: Duration,
    /// How often the leader renews and a standby retries.
    #[arg(long, default_value = "2s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub leader_elect_retry_period: Duration,
    /// The lock type; only `leases` is supported (as in Go since 1.24).
    #[arg(long, default_value = "leases", value_name = "TYPE")]
    pub leader_elect_resource_lock: String,
    /// The Lease's name.
    #[arg(long, default_value = "cloud-controller-manager", value_name = "NAME")]
    pub leader_elect_resource_name: String,
    /// The Lease's namespace.
    #[arg(long, default_value = "kube-system", value_name = "NAMESPACE")]
    pub leader_elect_resource_namespace: String,
}

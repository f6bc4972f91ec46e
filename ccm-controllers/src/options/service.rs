//! The flags of the service (load balancer) controller.

use std::time::Duration;

use clap::{ArgAction, Args};

use crate::machinery::go_syntax::parse_go_duration;

/// Flags of the service (load balancer) controller.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Service controller")]
pub struct ServiceControllerArgs {
    /// Workers syncing load balancers. Go's default is 1 (hours to converge with many load
    /// balancers); must be at least 1.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub concurrent_service_syncs: u32,
    /// Node changes within this window are coalesced into one `update_load_balancer` per load
    /// balancer (`0s` disables coalescing).
    #[arg(long, default_value = "1s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub node_sync_window: Duration,
    /// While Nodes keep joining, the window for additions doubles from `--node-sync-window` up
    /// to this; removals still go out within `--node-sync-window`. No widening while the
    /// provider's hosts batch carries every load balancer in at most 3 calls.
    #[arg(long, default_value = "8s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub node_sync_max_window: Duration,
    /// The `type: LoadBalancer` Services this binary serves, by `spec.loadBalancerClass`: a
    /// comma-separated list of CLASS (served by the provider's implementation of that class)
    /// or CLASS=PROVIDER_CLASS (served by the implementation of another class the provider
    /// declares); `-` stands for Services without a class. Default: every class the provider
    /// declares, which for most providers means Services without a class only (Go's
    /// behaviour). E.g. `-,acme.example/internal`, or `team-b.example/lb=-` for a second
    /// instance serving one class with the default implementation. Checked at startup
    /// against what the provider declares (`ServedClass::parse_list` reads it).
    #[arg(long, value_name = "CLASSES")]
    pub load_balancer_classes: Option<String>,
    /// Beyond Go: also write each served Service's load-balancer state in its
    /// `status.conditions` (`LoadBalancerProvisioned`: `True`/`Provisioned`, or
    /// `False`/`SyncLoadBalancerFailed` with the error), in the same status patch as the
    /// ingress, and remove it when the Service is no longer served. Off: Go's writes only.
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub load_balancer_status_conditions: bool,
}

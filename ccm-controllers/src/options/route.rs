//! The flags of the route controller.

use std::time::Duration;

use clap::{ArgAction, Args};

use crate::machinery::go_syntax::parse_go_duration;

/// Flags of the route controller.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Route controller")]
pub struct RouteControllerArgs {
    /// Whether the route controller creates pod-CIDR routes in the cloud (needs a provider with
    /// routes and `--cluster-cidr`).
    #[arg(long, default_value_t = true, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub configure_cloud_routes: bool,
    /// Period of the full route reconcile (a safety net; Node changes trigger reconciles too).
    #[arg(long, default_value = "10s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub route_reconciliation_period: Duration,
}

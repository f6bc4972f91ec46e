//! The shadow mode's flags (`--shadow*`, ours only): run beside the CCM a cluster already has,
//! change nothing, and report every difference.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args};

use crate::machinery::go_syntax::parse_go_duration;

/// The shadow's default `--cloud-api-qps` when none is given: a shadow never eats the quota
/// the leader needs.
pub const SHADOW_DEFAULT_CLOUD_API_QPS: f64 = 5.0;

/// Shadow mode (no Go counterpart).
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Shadow mode")]
pub struct ShadowArgs {
    /// Run beside the cloud-controller-manager the cluster already has, changing nothing: no
    /// Lease is taken (leader election is off), every API write is sent with `dryRun=All`, no
    /// Event is written, no mutating cloud call is made, and every planned change to an object
    /// the incumbent already reconciled is reported (metrics, `/shadow/divergences`, logs).
    /// `--cloud-api-qps` defaults to 5 in this mode.
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub shadow: bool,
    /// One-shot shadow: run for `--shadow-duration` (and until every object was compared once,
    /// at most `--shadow-settle-time` longer), write the report (JSON) to this file and a
    /// summary to stdout, and exit 0 when every object was compared and there is no
    /// divergence, 3 when there are divergences, 4 when there is none but some objects could
    /// not be compared in time (the report lists them). Implies `--shadow`.
    #[arg(long, value_parser = crate::options::parse_path, value_name = "FILE")]
    pub shadow_report: Option<PathBuf>,
    /// How long the one-shot shadow runs at least, counted from the start of the controllers.
    #[arg(long, default_value = "2m0s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub shadow_duration: Duration,
    /// How much longer than `--shadow-duration` the one-shot shadow waits for the objects not
    /// compared yet (and the controllers' queues to go idle); then it ends whatever is still
    /// queued or in flight, and the report lists what was not compared.
    #[arg(long, default_value = "30s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub shadow_settle_time: Duration,
    /// How long a planned change to an object the incumbent is still reconciling (an
    /// uninitialised Node, a LoadBalancer Service without its finalizer, a route) stays
    /// "pending" before it counts as a divergence.
    #[arg(long, default_value = "1m0s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub shadow_pending_grace: Duration,
}

impl ShadowArgs {
    /// Whether the process runs as a shadow (`--shadow` or `--shadow-report`).
    pub fn enabled(&self) -> bool {
        self.shadow || self.shadow_report.is_some()
    }
}

//! The cloud-call budget's flags: `--cloud-api-qps`, `--cloud-api-burst`, `--cloud-api-timeout`.

use std::time::Duration;

use clap::Args;

use crate::machinery::go_syntax::parse_go_duration;

/// The cloud-call budget: every provider call goes through it.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Cloud-call budget")]
pub struct CloudBudgetArgs {
    /// Sustained cloud API calls per second, shared by all controllers (token bucket). Unset:
    /// unlimited.
    #[arg(long, value_name = "QPS")]
    pub cloud_api_qps: Option<f64>,
    /// Burst of cloud API calls (token bucket size). Defaults to `--cloud-api-qps` rounded up;
    /// needs `--cloud-api-qps`.
    #[arg(long, value_name = "N")]
    pub cloud_api_burst: Option<u32>,
    /// Timeout of one cloud call (the provider's future is dropped and the call fails with an
    /// error naming the operation); `0s` disables.
    #[arg(long, default_value = "2m0s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub cloud_api_timeout: Duration,
}

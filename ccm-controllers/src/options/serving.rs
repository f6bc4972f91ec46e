//! Health and metrics serving (the secure serving flags), and `--shutdown-grace-period`.

use std::time::Duration;

use clap::Args;

use crate::machinery::go_syntax::parse_go_duration;
use crate::secure_serving::SecureServingArgs;

/// Health and metrics serving, and shutdown.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Serving")]
pub struct ServingArgs {
    /// HTTPS serving of `/healthz`, `/livez`, `/readyz` and `/metrics` with delegated
    /// authentication and authorization (`--bind-address`, `--secure-port`, `--tls-*`,
    /// `--authentication-*`, `--authorization-*`, `--client-ca-file`, `--cert-dir`), as Go's.
    #[command(flatten)]
    pub secure: SecureServingArgs,
    /// On SIGTERM/SIGINT, how long to wait for in-flight reconciles and cloud calls before the
    /// lease is released and the process exits.
    // Its own heading: the flattened secure serving flags above set theirs.
    #[arg(help_heading = "Serving", long, default_value = "30s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub shutdown_grace_period: Duration,
}

//! [`run`] and [`Builder`]: the process around the controllers.
//!
//! Startup order (`start.rs`, one function per step): parse the flags → logging → validate the
//! flags → read `--cloud-config` → build the provider from the registry (`--cloud-provider`) →
//! check `has_cluster_id()` against `--allow-untagged-cloud` → check the route controller's
//! `--cluster-cidr` → wrap the provider in the cloud-call budget → Kubernetes clients →
//! serving (`/healthz`, `/livez`, `/readyz`, `/metrics`) → leader election (`lead.rs`) → when
//! leading: shared informers, wait for their sync, `provider.initialize(...)`, start the
//! enabled controllers.
//!
//! Shutdown (SIGTERM/SIGINT, or the future given to [`Builder::shutdown_signal`]): `/readyz`
//! turns 503, the controllers' `ctx.shutdown` fires (they stop taking work), in-flight
//! reconciles and cloud calls get `--shutdown-grace-period` to finish, the lease is released so a
//! standby takes over at once, exit code 0. Losing the lease exits with code 1 at once (another
//! process leads), as in Go.
//!
//! The files: `builder.rs` (what a vendor configures, the command line, the tokio runtime),
//! `start.rs` (the startup steps), `lead.rs` (leader election and the leading phase, with the
//! drain), `logging.rs`, `builtin.rs` (the start table of built-in controllers), `entry.rs`
//! (`ControllerEntry` and its start types, a leaf), `leader.rs` (the Lease), `client.rs` (the
//! Kubernetes clients), `health.rs` (the health and metrics endpoints), `shadow.rs` (what shadow
//! mode, `--shadow`, changes in the startup steps, its endpoint and one-shot report).

mod builder;
pub(crate) mod builtin;
pub(crate) mod client;
mod entry;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub(crate) mod health;
mod lead;
pub(crate) mod leader;
mod logging;
mod profiling;
mod shadow;
mod start;

use clap::{Args, Command, FromArgMatches};

use crate::options::Options;

pub use self::builder::Builder;
pub use self::entry::{ControllerEntry, ControllerFuture, NoArgs, StartArgs, StartFn};

/// Runs a cloud-controller-manager with the built-in controllers: parses `std::env::args`,
/// and runs until SIGTERM/SIGINT. The provider is the one registered under `--cloud-provider`.
///
/// ```no_run
/// fn main() -> std::process::ExitCode {
///     ccm_controllers::run()
/// }
/// ```
pub fn run() -> std::process::ExitCode {
    Builder::new().run()
}

/// Parses `args` (the first is the program name) into the runtime's [`Options`] and the
/// vendor's `V`, with the same command the runtime uses; for tests and tools.
pub fn parse_flags<V>(args: &[&str]) -> Result<(Options, V), clap::Error>
where
    V: Args + FromArgMatches,
{
    let cmd = V::augment_args(runtime_args(
        Command::new("cloud-controller-manager").args_override_self(true),
    ));
    let matches = cmd.try_get_matches_from(args)?;
    Ok((
        Options::from_arg_matches(&matches)?,
        V::from_arg_matches(&matches)?,
    ))
}

/// Adds the runtime's flags to `cmd`, before the vendor's.
fn runtime_args(cmd: Command) -> Command {
    // A group's help heading applies to every flag added after it (clap keeps it across
    // flattened groups): without this reset the vendor's flags that have no heading of their
    // own would be listed under the runtime's last group.
    Options::augment_args(cmd).next_help_heading(None::<&'static str>)
}

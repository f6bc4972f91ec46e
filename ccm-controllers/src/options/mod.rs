//! The command-line flags of a cloud-controller-manager, with Go's names, defaults and syntax.
//!
//! Every flag of Go's `k8s.io/cloud-provider` an operator is likely to pass is here (reference
//! §6.3). The syntax follows Go's `pflag`:
//!
//! - `--flag=value` and `--flag value` for flags with a value;
//! - booleans as a bare `--leader-elect` (true) or `--leader-elect=false`; `--leader-elect false`
//!   is rejected, as pflag does;
//! - durations in Go syntax: `15s`, `2m0s`, `1h30m`, `500ms`, `1.5h`;
//! - lists comma-separated: `--controllers=*,-route`.
//!
//! Deliberate differences from Go (each documented on its flag):
//!
//! | flag | Go default | here | why |
//! |---|---|---|---|
//! | `--concurrent-node-syncs` | 1 | 100 | 1000 nodes at 100 ms per cloud call initialise in about 1 s instead of 100 s |
//! | `--kube-api-qps` / `--kube-api-burst` | 20 / 30 | 1000 / 2000 | three requests per node at 20 QPS make a 1,000-node bring-up take 150 s; API Priority and Fairness protects the server |
//! | `--concurrent-service-syncs` | 1 | 10 | one worker makes many load balancers take half an hour to converge |
//! | zero workers | accepted (nothing runs) | rejected | a silent no-op configuration |
//!
//! New flags (no Go counterpart): `--node-deletion-grace-period`, `--node-sync-window`,
//! `--node-sync-max-window`,
//! `--cloud-api-qps`, `--cloud-api-burst`, `--cloud-api-timeout`, `--shutdown-grace-period`,
//! `--log-format`.
//!
//! Go flags that have no meaning here are still accepted where a Go manifest commonly passes
//! them, with a warning saying why they have no effect ([`Options::warnings`]), or rejected when
//! ignoring them would be unsafe ([`Options::validate`]); never silently ignored.

pub(crate) mod controllers;

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args, ValueEnum};
use ipnet::IpNet;

use crate::machinery::go_syntax::{format_go_duration, parse_go_duration};
use crate::secure_serving::SecureServingArgs;

/// A path flag; empty is accepted (and means "not set", as in Go).
fn parse_path(input: &str) -> Result<PathBuf, String> {
    Ok(PathBuf::from(input))
}

/// `--logging-format`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line (Go's `--logging-format=json`).
    Json,
}

/// All flags of the runtime. Flatten it into a vendor's own `clap::Parser` if you do not use
/// [`Builder`](crate::Builder) (which does this for you).
#[derive(Args, Clone, Debug)]
pub struct Options {
    /// The cloud provider and its configuration.
    #[command(flatten)]
    pub cloud: CloudArgs,
    /// Kubernetes client flags.
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Which controllers run, and the cluster they run for.
    #[command(flatten)]
    pub generic: GenericArgs,
    /// Node controllers' flags.
    #[command(flatten)]
    pub node: NodeControllerArgs,
    /// Service controller's flags.
    #[command(flatten)]
    pub service: ServiceControllerArgs,
    /// Route controller's flags.
    #[command(flatten)]
    pub route: RouteControllerArgs,
    /// Node-IPAM controller's flags.
    #[command(flatten)]
    pub node_ipam: NodeIpamArgs,
    /// Leader election.
    #[command(flatten)]
    pub leader_election: LeaderElectionArgs,
    /// Health and metrics serving.
    #[command(flatten)]
    pub serving: ServingArgs,
    /// The cloud-call budget.
    #[command(flatten)]
    pub budget: CloudBudgetArgs,
    /// Logging.
    #[command(flatten)]
    pub logging: LoggingArgs,
    /// Go flags accepted for compatibility (warned about) or rejected with a reason.
    #[command(flatten)]
    pub compat: GoCompatArgs,
}

/// The cloud provider and its configuration.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Cloud provider")]
pub struct CloudArgs {
    /// The provider to run, by its registered name (required).
    #[arg(long, value_name = "NAME")]
    pub cloud_provider: Option<String>,
    /// Path to the provider's configuration file; its bytes are passed to the provider's
    /// factory. An unreadable file stops startup.
    #[arg(long, value_name = "PATH", value_parser = parse_path)]
    pub cloud_config: Option<PathBuf>,
    /// Start even though the provider does not tag cloud resources with a cluster ID
    /// (deprecated in Go, still honoured).
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub allow_untagged_cloud: bool,
}

/// Default of `--kube-api-qps` (Go: 20; see the flag's docs for why it is higher).
pub const DEFAULT_KUBE_API_QPS: f64 = 1000.0;
/// Default of `--kube-api-burst` (Go: 30).
pub const DEFAULT_KUBE_API_BURST: u32 = 2000;

/// Kubernetes client flags.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Kubernetes client")]
pub struct KubeArgs {
    /// Path to a kubeconfig file. Without it and without `--master`, the in-cluster
    /// configuration is used (then `$KUBECONFIG` / `~/.kube/config`).
    #[arg(long, value_name = "PATH", value_parser = parse_path)]
    pub kubeconfig: Option<PathBuf>,
    /// The API server's address; overrides the kubeconfig's server.
    #[arg(long, value_name = "URL")]
    pub master: Option<String>,
    /// Sustained queries per second to the API server (client-side token bucket, Go semantics).
    ///
    /// Default 1000, not Go's 20: at 20 QPS a CCM needs about 150 s to initialise 1,000 nodes
    /// that register together (three requests per node), which is the bring-up delay this
    /// framework exists to remove. Since API Priority and Fairness (GA in Kubernetes 1.29) the
    /// API server protects itself per flow; this client-side limit only stops a runaway loop.
    /// Set it back to 20 to match a Go CCM exactly.
    #[arg(long, default_value_t = DEFAULT_KUBE_API_QPS, value_name = "QPS")]
    pub kube_api_qps: f64,
    /// Burst of queries to the API server (token bucket size). Default 2000 (Go: 30); see
    /// `--kube-api-qps`.
    #[arg(long, default_value_t = DEFAULT_KUBE_API_BURST, value_name = "N")]
    pub kube_api_burst: u32,
}

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
    /// to this; removals still go out within `--node-sync-window`.
    #[arg(long, default_value = "8s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub node_sync_max_window: Duration,
}

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

/// Flags of the node-IPAM controller (Go's `NodeIPAMControllerOptions` and
/// `--cidr-allocator-type`); they take effect with `--allocate-node-cidrs=true`.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Node IPAM controller")]
pub struct NodeIpamArgs {
    /// The allocator of pod CIDRs: `RangeAllocator` (built in), or one the provider registered
    /// (e.g. `CloudAllocator`); any other name stops startup.
    #[arg(long, default_value = "RangeAllocator", value_name = "TYPE")]
    pub cidr_allocator_type: String,
    /// Mask size of a Node's pod CIDR for a single-stack cluster; default 24 for IPv4 and 64
    /// for IPv6 (0 = not set). Not allowed with dual stack.
    #[arg(long, default_value_t = 0, value_name = "BITS", value_parser = clap::value_parser!(u8).range(0..=128))]
    pub node_cidr_mask_size: u8,
    /// Mask size of a Node's IPv4 pod CIDR; default 24 (0 = not set).
    #[arg(long, default_value_t = 0, value_name = "BITS", value_parser = clap::value_parser!(u8).range(0..=32))]
    pub node_cidr_mask_size_ipv4: u8,
    /// Mask size of a Node's IPv6 pod CIDR; default 64 (0 = not set).
    #[arg(long, default_value_t = 0, value_name = "BITS", value_parser = clap::value_parser!(u8).range(0..=128))]
    pub node_cidr_mask_size_ipv6: u8,
    /// The Service CIDR (or an IPv4 and an IPv6 one, comma-separated): kept out of the pod CIDRs
    /// given to Nodes.
    #[arg(long, default_value = "", value_name = "CIDRS")]
    pub service_cluster_ip_range: String,
}

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
    #[arg(long, default_value = "30s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub shutdown_grace_period: Duration,
}

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

/// Logging flags: Go's component-base logging flags (`k8s.io/component-base/logs/api/v1`),
/// mapped onto `tracing`.
#[derive(Args, Clone, Debug, Default)]
#[command(next_help_heading = "Logging")]
pub struct LoggingArgs {
    /// Log verbosity as in klog: 0-2 info, 3-4 debug, 5+ trace. `RUST_LOG`, when set, wins.
    #[arg(short = 'v', long = "v", default_value_t = 0, value_name = "LEVEL")]
    pub verbosity: u8,
    /// Log format: `text` or `json` (Go's `--logging-format`; `--log-format` is accepted too).
    #[arg(long = "logging-format", visible_alias = "log-format", value_enum, default_value_t = LogFormat::Text, value_name = "FORMAT")]
    pub log_format: LogFormat,
    /// Per-module verbosity, `pattern=N` comma-separated (Go: per source file). Here a pattern
    /// is a Rust module path (a `tracing` target, e.g. `ccm_controllers::controllers::node_ipam=4`); a
    /// trailing `*` is dropped. Text format only, as in Go.
    #[arg(long, value_delimiter = ',', value_name = "PATTERN=N")]
    pub vmodule: Vec<String>,
    /// Accepted for Go compatibility (default 5s); logs are written unbuffered, so there is
    /// nothing to flush.
    #[arg(long, value_parser = parse_go_duration, value_name = "DURATION")]
    pub log_flush_frequency: Option<Duration>,
    /// JSON format: errors to stderr, everything else to stdout (Go's alpha option; needs
    /// `--feature-gates=LoggingAlphaOptions=true` as in Go).
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub log_json_split_stream: bool,
    /// JSON format with split streams: Go buffers info messages up to this size. Accepted (a
    /// quantity such as `512`, `1K`, `2Ki`); logs here are never buffered.
    #[arg(long, value_parser = parse_quantity, value_name = "QUANTITY")]
    pub log_json_info_buffer_size: Option<String>,
    /// Text format: errors to stderr, everything else to stdout (Go's alpha option; needs
    /// `--feature-gates=LoggingAlphaOptions=true` as in Go).
    #[arg(long, default_value_t = false, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub log_text_split_stream: bool,
    /// Text format with split streams: Go buffers info messages up to this size. Accepted;
    /// logs here are never buffered.
    #[arg(long, value_parser = parse_quantity, value_name = "QUANTITY")]
    pub log_text_info_buffer_size: Option<String>,
}

/// A Kubernetes quantity as the logging buffer sizes take it (`512`, `1K`, `2Ki`, `3M`, `5Mi`).
fn parse_quantity(input: &str) -> Result<String, String> {
    let s = input.trim();
    let digits = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &s[digits.len()..];
    let number_ok = !digits.is_empty() && digits.parse::<f64>().is_ok_and(|n| n >= 0.0);
    let suffix_ok = matches!(
        suffix,
        "" | "k" | "K" | "M" | "G" | "T" | "P" | "E" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"
    );
    if number_ok && suffix_ok {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "{input:?} is not a quantity; use bytes (512), multiples of 1000 (1K) or of 1024 (2Ki)"
        ))
    }
}

/// Whether a quantity accepted by `parse_quantity` is more than zero.
fn quantity_is_nonzero(q: &str) -> bool {
    q.trim_end_matches(|c: char| c.is_ascii_alphabetic())
        .parse::<f64>()
        .is_ok_and(|n| n > 0.0)
}

impl LoggingArgs {
    /// `--vmodule` as `tracing` filter directives (`target=level`), and the patterns that have
    /// no such form (reported as warnings).
    pub fn vmodule_directives(&self) -> (Vec<String>, Vec<String>) {
        let mut directives = Vec::new();
        let mut unmapped = Vec::new();
        for item in self
            .vmodule
            .iter()
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
        {
            let Some((pattern, level)) = item.split_once('=') else {
                unmapped.push(item.to_owned());
                continue;
            };
            let target = pattern.trim().trim_end_matches('*');
            let valid = !target.is_empty()
                && target.split("::").all(|p| {
                    !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                });
            match (valid, level.trim().parse::<u8>()) {
                (true, Ok(n)) => directives.push(format!("{target}={}", verbosity_level(n))),
                _ => unmapped.push(item.to_owned()),
            }
        }
        (directives, unmapped)
    }

    /// The `tracing` level of `-v`.
    pub fn level(&self) -> &'static str {
        verbosity_level(self.verbosity)
    }

    /// Whether errors go to stderr and the rest to stdout.
    pub fn split_stream(&self) -> bool {
        match self.log_format {
            LogFormat::Text => self.log_text_split_stream,
            LogFormat::Json => self.log_json_split_stream,
        }
    }
}

/// klog verbosity to a `tracing` level: 0-2 info, 3-4 debug, 5+ trace.
fn verbosity_level(v: u8) -> &'static str {
    match v {
        0..=2 => "info",
        3..=4 => "debug",
        _ => "trace",
    }
}

/// Go flags kept so that a Go CCM's manifest still starts, each either warned about (no effect
/// here, and the warning says why) or rejected (ignoring it would be unsafe).
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Accepted for Go compatibility")]
pub struct GoCompatArgs {
    /// Accepted with a warning: the client always speaks JSON.
    #[arg(long, value_name = "TYPE")]
    pub kube_api_content_type: Option<String>,
    /// Accepted with a warning: there are no pprof endpoints.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub profiling: Option<bool>,
    /// Accepted with a warning: there are no pprof endpoints.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub contention_profiling: Option<bool>,
    /// Accepted with a warning: shared informers are watch-driven and never resync.
    #[arg(long, value_parser = parse_go_duration, value_name = "DURATION")]
    pub min_resync_period: Option<Duration>,
    /// Accepted with a warning: deprecated no-op in Go too.
    #[arg(long, value_parser = parse_go_duration, value_name = "DURATION")]
    pub node_sync_period: Option<Duration>,
    /// Accepted with a warning: volume plugins are not part of a CCM.
    #[arg(long, value_name = "NAME")]
    pub external_cloud_volume_plugin: Option<String>,
    /// Accepted with a warning: no feature gates; behaviour is documented per flag.
    #[arg(long, value_name = "GATES")]
    pub feature_gates: Option<String>,
    /// Give each controller the credentials of its own ServiceAccount in `kube-system`
    /// (`node-controller`, `service-controller`, `route-controller`), created if missing, with
    /// tokens from the TokenRequest API; the shared informers keep the main credentials.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub use_service_account_credentials: Option<bool>,
    /// `true` is rejected: leader migration is not implemented.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub enable_leader_migration: Option<bool>,
    /// Rejected: leader migration is not implemented.
    #[arg(long, value_name = "PATH")]
    pub leader_migration_config: Option<PathBuf>,
    /// Rejected when non-empty: admission webhooks are not implemented.
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    pub webhooks: Vec<String>,
    /// Accepted with a warning: no webhook server is started (Go starts one only when
    /// `--webhooks` names one). Go manifests commonly pass `--webhook-secure-port=0`.
    #[arg(long, value_name = "PORT")]
    pub webhook_secure_port: Option<u16>,
    /// Go's other webhook serving flags (`--webhook-bind-address`, `--webhook-cert-dir`,
    /// `--webhook-tls-*`): accepted with a warning, as no webhook server is started.
    #[command(flatten)]
    pub webhook_serving: WebhookServingCompatArgs,
    /// Go serving flags without an implementation here: accepted with a warning.
    #[command(flatten)]
    pub serving: ServingCompatArgs,
    /// Go's component-base metrics flags: accepted with a warning.
    #[command(flatten)]
    pub metrics: MetricsCompatArgs,
    /// Flags Go removed: rejected with the reason.
    #[command(flatten)]
    pub removed: RemovedGoArgs,
}

/// Go's webhook serving flags; no webhook server is started here, so each is warned about.
#[derive(Args, Clone, Debug)]
pub struct WebhookServingCompatArgs {
    /// Accepted with a warning (no webhook server).
    #[arg(long, value_name = "IP")]
    pub webhook_bind_address: Option<String>,
    /// Accepted with a warning (no webhook server).
    #[arg(long, value_name = "DIR")]
    pub webhook_cert_dir: Option<String>,
    /// Accepted with a warning (no webhook server).
    #[arg(long, value_name = "PATH")]
    pub webhook_tls_cert_file: Option<String>,
    /// Accepted with a warning (no webhook server).
    #[arg(long, value_name = "PATH")]
    pub webhook_tls_private_key_file: Option<String>,
    /// Accepted with a warning (no webhook server).
    #[arg(long, value_name = "SUITES")]
    pub webhook_tls_cipher_suites: Option<String>,
    /// Accepted with a warning (no webhook server).
    #[arg(long, value_name = "VERSION")]
    pub webhook_tls_min_version: Option<String>,
    /// Accepted with a warning (no webhook server).
    #[arg(long, value_name = "CURVES")]
    pub webhook_tls_curve_preferences: Option<String>,
    /// Accepted with a warning (no webhook server).
    #[arg(long, value_name = "CERT,KEY[:NAMES]")]
    pub webhook_tls_sni_cert_key: Vec<String>,
    /// Accepted with a warning (no webhook server).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub webhook_disable_http2_serving: Option<bool>,
}

impl WebhookServingCompatArgs {
    fn any_set(&self) -> bool {
        self.webhook_bind_address.is_some()
            || self.webhook_cert_dir.is_some()
            || self.webhook_tls_cert_file.is_some()
            || self.webhook_tls_private_key_file.is_some()
            || self.webhook_tls_cipher_suites.is_some()
            || self.webhook_tls_min_version.is_some()
            || self.webhook_tls_curve_preferences.is_some()
            || !self.webhook_tls_sni_cert_key.is_empty()
            || self.webhook_disable_http2_serving.is_some()
    }
}

/// Go serving flags (`SecureServingOptions`, `DelegatingAuthenticationOptions`) this framework
/// does not implement; accepted with a warning each.
#[derive(Args, Clone, Debug)]
pub struct ServingCompatArgs {
    /// Accepted with a warning: one certificate (`--tls-cert-file` or the generated one)
    /// serves every name.
    #[arg(long, value_name = "CERT,KEY[:NAMES]")]
    pub tls_sni_cert_key: Vec<String>,
    /// Accepted with a warning: rustls picks the key-exchange groups.
    #[arg(long, value_name = "CURVES")]
    pub tls_curve_preferences: Option<String>,
    /// Accepted with a warning.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub permit_port_sharing: Option<bool>,
    /// Accepted with a warning.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub permit_address_sharing: Option<bool>,
    /// Accepted with a warning.
    #[arg(long, value_name = "N")]
    pub http2_max_streams_per_connection: Option<u32>,
    /// Accepted with a warning: front-proxy (request header) authentication is not
    /// implemented; such requests are not authenticated by their headers.
    #[arg(long, value_name = "PATH")]
    pub requestheader_client_ca_file: Option<String>,
    /// Accepted with a warning (see `--requestheader-client-ca-file`).
    #[arg(long, value_name = "NAMES")]
    pub requestheader_allowed_names: Option<String>,
    /// Accepted with a warning (see `--requestheader-client-ca-file`).
    #[arg(long, value_name = "HEADERS")]
    pub requestheader_username_headers: Option<String>,
    /// Accepted with a warning (see `--requestheader-client-ca-file`).
    #[arg(long, value_name = "HEADERS")]
    pub requestheader_uid_headers: Option<String>,
    /// Accepted with a warning (see `--requestheader-client-ca-file`).
    #[arg(long, value_name = "HEADERS")]
    pub requestheader_group_headers: Option<String>,
    /// Accepted with a warning (see `--requestheader-client-ca-file`).
    #[arg(long, value_name = "PREFIXES")]
    pub requestheader_extra_headers_prefix: Option<String>,
}

/// Go's component-base metrics flags (`k8s.io/component-base/metrics` options).
#[derive(Args, Clone, Debug)]
pub struct MetricsCompatArgs {
    /// Accepted with a warning: no metric here is hidden.
    #[arg(long, value_name = "VERSION")]
    pub show_hidden_metrics_for_version: Option<String>,
    /// Accepted with a warning: every metric is served.
    #[arg(long, value_name = "NAMES")]
    pub disabled_metrics: Option<String>,
    /// Accepted with a warning: label values are not filtered.
    #[arg(long, value_name = "METRIC,LABEL=VALUES")]
    pub allow_metric_labels: Vec<String>,
    /// Accepted with a warning: label values are not filtered.
    #[arg(long, value_name = "PATH")]
    pub allow_metric_labels_manifest: Option<String>,
}

/// Flags a current Go cloud-controller-manager no longer has (it fails with "unknown flag"):
/// rejected here too, with the reason and the replacement.
#[derive(Args, Clone, Debug)]
pub struct RemovedGoArgs {
    /// Removed klog flag.
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "")]
    pub logtostderr: Option<String>,
    /// Removed klog flag.
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "")]
    pub alsologtostderr: Option<String>,
    /// Removed klog flag.
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "")]
    pub add_dir_header: Option<String>,
    /// Removed klog flag.
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "")]
    pub one_output: Option<String>,
    /// Removed klog flag.
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "")]
    pub skip_headers: Option<String>,
    /// Removed klog flag.
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "")]
    pub skip_log_headers: Option<String>,
    /// Removed klog flag.
    #[arg(long, hide = true, value_name = "DIR")]
    pub log_dir: Option<String>,
    /// Removed klog flag.
    #[arg(long, hide = true, value_name = "PATH")]
    pub log_file: Option<String>,
    /// Removed klog flag.
    #[arg(long, hide = true, value_name = "MB")]
    pub log_file_max_size: Option<String>,
    /// Removed klog flag.
    #[arg(long, hide = true, value_name = "SEVERITY")]
    pub stderrthreshold: Option<String>,
    /// Removed klog flag.
    #[arg(long, hide = true, value_name = "FILE:N")]
    pub log_backtrace_at: Option<String>,
    /// Removed insecure serving flag.
    #[arg(long, hide = true, value_name = "IP")]
    pub address: Option<String>,
    /// Removed insecure serving flag.
    #[arg(long, hide = true, value_name = "PORT")]
    pub port: Option<String>,
}

impl RemovedGoArgs {
    /// The removed flags that were passed, with the reason each is refused.
    fn errors(&self) -> Vec<FlagError> {
        const KLOG: &str = "this klog flag was removed from Kubernetes components in 1.26 and a current Go cloud-controller-manager rejects it too; logs always go to stderr (see --logging-format, --log-text-split-stream): remove it";
        const INSECURE: &str = "insecure serving was removed from the Go cloud-controller-manager, which rejects this flag too; health and metrics are served over HTTPS on --bind-address/--secure-port: remove it";
        let mut errors = Vec::new();
        for (flag, set, why) in [
            ("logtostderr", self.logtostderr.is_some(), KLOG),
            ("alsologtostderr", self.alsologtostderr.is_some(), KLOG),
            ("add-dir-header", self.add_dir_header.is_some(), KLOG),
            ("one-output", self.one_output.is_some(), KLOG),
            ("skip-headers", self.skip_headers.is_some(), KLOG),
            ("skip-log-headers", self.skip_log_headers.is_some(), KLOG),
            ("log-dir", self.log_dir.is_some(), KLOG),
            ("log-file", self.log_file.is_some(), KLOG),
            ("log-file-max-size", self.log_file_max_size.is_some(), KLOG),
            ("stderrthreshold", self.stderrthreshold.is_some(), KLOG),
            ("log-backtrace-at", self.log_backtrace_at.is_some(), KLOG),
            ("address", self.address.is_some(), INSECURE),
            ("port", self.port.is_some(), INSECURE),
        ] {
            if set {
                errors.push(flag_error(flag, why));
            }
        }
        errors
    }
}

/// One invalid flag value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid value for --{flag}: {message}")]
pub struct FlagError {
    /// The flag, without dashes.
    pub flag: &'static str,
    /// What is wrong and how to fix it.
    pub message: String,
}

fn flag_error(flag: &'static str, message: impl Into<String>) -> FlagError {
    FlagError {
        flag,
        message: message.into(),
    }
}

/// The `--cluster-cidr` value could not be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ClusterCidrError(pub String);

/// Rounds a duration up to whole seconds (what the Lease stores).
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

impl Options {
    /// Checks every value a parser cannot check alone. Returns every problem, each naming its
    /// flag. (`--controllers` names and the cloud-config file are checked by the runtime, which
    /// knows the registered controllers and reads the file.)
    pub fn validate(&self) -> Result<(), Vec<FlagError>> {
        let mut errors = Vec::new();
        match &self.cloud.cloud_provider {
            None => errors.push(flag_error(
                "cloud-provider",
                "must be set to the name of a registered cloud provider",
            )),
            Some(name) if name.trim().is_empty() => errors.push(flag_error(
                "cloud-provider",
                "must not be empty; pass the name of a registered cloud provider",
            )),
            Some(_) => {}
        }
        if self.generic.cluster_name.is_empty() {
            errors.push(flag_error(
                "cluster-name",
                "must not be empty (it names and tags cloud resources)",
            ));
        }
        if !(self.kube.kube_api_qps.is_finite() && self.kube.kube_api_qps > 0.0) {
            errors.push(flag_error(
                "kube-api-qps",
                format!("must be > 0, got {}", self.kube.kube_api_qps),
            ));
        }
        if self.kube.kube_api_burst == 0 {
            errors.push(flag_error("kube-api-burst", "must be >= 1, got 0"));
        }
        if self.node.concurrent_node_syncs == 0 {
            errors.push(flag_error(
                "concurrent-node-syncs",
                "must be >= 1: zero workers would never initialise a Node",
            ));
        }
        if self.service.concurrent_service_syncs == 0 {
            errors.push(flag_error(
                "concurrent-service-syncs",
                "must be >= 1: zero workers would never sync a load balancer",
            ));
        }
        for (flag, value) in [
            ("node-monitor-period", self.node.node_monitor_period),
            (
                "node-status-update-frequency",
                self.node.node_status_update_frequency,
            ),
            (
                "route-reconciliation-period",
                self.route.route_reconciliation_period,
            ),
        ] {
            if value.is_zero() {
                errors.push(flag_error(flag, "must be > 0"));
            }
        }
        let le = &self.leader_election;
        if le.leader_elect_resource_lock != "leases" {
            errors.push(flag_error(
                "leader-elect-resource-lock",
                format!(
                    "{:?} is not supported; only \"leases\" is (Go removed endpoints and configmaps locks)",
                    le.leader_elect_resource_lock
                ),
            ));
        }
        if le.leader_elect {
            if le.leader_elect_resource_name.is_empty() {
                errors.push(flag_error(
                    "leader-elect-resource-name",
                    "must not be empty",
                ));
            }
            if le.leader_elect_resource_namespace.is_empty() {
                errors.push(flag_error(
                    "leader-elect-resource-namespace",
                    "must not be empty",
                ));
            }
            if le.leader_elect_lease_duration < Duration::from_secs(2) {
                errors.push(flag_error(
                    "leader-elect-lease-duration",
                    format!(
                        "must be at least 2s (the Lease counts whole seconds), got {}",
                        format_go_duration(le.leader_elect_lease_duration)
                    ),
                ));
            }
            if le.leader_elect_renew_deadline.is_zero() {
                errors.push(flag_error("leader-elect-renew-deadline", "must be > 0"));
            } else if le.leader_elect_renew_deadline >= le.leader_elect_lease_duration {
                errors.push(flag_error(
                    "leader-elect-renew-deadline",
                    format!(
                        "must be less than --leader-elect-lease-duration ({} >= {})",
                        format_go_duration(le.leader_elect_renew_deadline),
                        format_go_duration(le.leader_elect_lease_duration)
                    ),
                ));
            }
            if le.leader_elect_retry_period.is_zero() {
                errors.push(flag_error("leader-elect-retry-period", "must be > 0"));
            } else if le.leader_elect_renew_deadline.as_secs_f64()
                <= 1.2 * le.leader_elect_retry_period.as_secs_f64()
            {
                errors.push(flag_error(
                    "leader-elect-renew-deadline",
                    format!(
                        "must be greater than 1.2 x --leader-elect-retry-period ({} <= 1.2 x {})",
                        format_go_duration(le.leader_elect_renew_deadline),
                        format_go_duration(le.leader_elect_retry_period)
                    ),
                ));
            }
        }
        if let Some(qps) = self.budget.cloud_api_qps
            && !(qps.is_finite() && qps > 0.0)
        {
            errors.push(flag_error(
                "cloud-api-qps",
                format!("must be > 0 (omit the flag for no limit), got {qps}"),
            ));
        }
        match (self.budget.cloud_api_qps, self.budget.cloud_api_burst) {
            (_, Some(0)) => errors.push(flag_error("cloud-api-burst", "must be >= 1, got 0")),
            (None, Some(_)) => errors.push(flag_error(
                "cloud-api-burst",
                "needs --cloud-api-qps (without it cloud calls are not limited)",
            )),
            _ => {}
        }
        let compat = &self.compat;
        if compat.enable_leader_migration == Some(true) {
            errors.push(flag_error(
                "enable-leader-migration",
                "leader migration is not implemented; migrate with kube-controller-manager's cloud loops already off",
            ));
        }
        if compat.leader_migration_config.is_some() {
            errors.push(flag_error(
                "leader-migration-config",
                "leader migration is not implemented",
            ));
        }
        if compat.webhooks.iter().any(|w| !w.is_empty()) {
            errors.push(flag_error(
                "webhooks",
                "admission webhooks are not implemented",
            ));
        }
        errors.extend(compat.removed.errors());
        let log = &self.logging;
        if log.vmodule.iter().any(|v| !v.trim().is_empty()) && log.log_format != LogFormat::Text {
            errors.push(flag_error(
                "vmodule",
                "only supported for the text log format (as in Go)",
            ));
        }
        let alpha = compat.feature_gates.as_deref().is_some_and(|g| {
            g.split(',')
                .any(|kv| kv.trim().eq_ignore_ascii_case("LoggingAlphaOptions=true"))
        });
        for (flag, set) in [
            ("log-json-split-stream", log.log_json_split_stream),
            ("log-text-split-stream", log.log_text_split_stream),
            (
                "log-json-info-buffer-size",
                log.log_json_info_buffer_size
                    .as_deref()
                    .is_some_and(quantity_is_nonzero),
            ),
            (
                "log-text-info-buffer-size",
                log.log_text_info_buffer_size
                    .as_deref()
                    .is_some_and(quantity_is_nonzero),
            ),
        ] {
            if set && !alpha {
                errors.push(flag_error(
                    flag,
                    "Feature LoggingAlphaOptions is disabled (as in Go, pass --feature-gates=LoggingAlphaOptions=true)",
                ));
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    /// Warnings about flags that are accepted but have no effect (or a changed one), each
    /// saying why. Logged at startup.
    pub fn warnings(&self) -> Vec<String> {
        let c = &self.compat;
        let mut w = Vec::new();
        let mut note = |set: bool, flag: &str, why: &str| {
            if set {
                w.push(format!("--{flag} has no effect: {why}"));
            }
        };
        note(
            c.kube_api_content_type.is_some(),
            "kube-api-content-type",
            "the Rust client always uses application/json",
        );
        note(
            c.profiling.is_some(),
            "profiling",
            "there are no pprof endpoints",
        );
        note(
            c.contention_profiling.is_some(),
            "contention-profiling",
            "there are no pprof endpoints",
        );
        note(
            c.min_resync_period.is_some(),
            "min-resync-period",
            "the shared informers are watch-driven and do not resync; controllers have their own periods",
        );
        note(
            c.webhook_secure_port.is_some_and(|p| p != 0),
            "webhook-secure-port",
            "admission webhooks are not implemented, so no webhook server is started",
        );
        note(
            c.node_sync_period.is_some(),
            "node-sync-period",
            "deprecated no-op (also in Go)",
        );
        note(
            c.external_cloud_volume_plugin.is_some(),
            "external-cloud-volume-plugin",
            "volume plugins are not part of a cloud-controller-manager",
        );
        note(
            c.feature_gates.is_some(),
            "feature-gates",
            "there are no feature gates; watch-based route reconciliation is always on",
        );
        note(
            c.enable_leader_migration == Some(false),
            "enable-leader-migration",
            "false is the only supported value (already the behaviour)",
        );
        let (_, unmapped) = self.logging.vmodule_directives();
        for item in unmapped {
            w.push(format!("--vmodule={item} has no effect: a pattern here is a Rust module path such as ccm_controllers::controllers::node_ipam=4 (Go's are source file names)"));
        }
        if self.logging.log_flush_frequency.is_some() {
            w.push("--log-flush-frequency has no effect: logs are written unbuffered".to_owned());
        }
        for (flag, set) in [
            (
                "log-json-info-buffer-size",
                self.logging.log_json_info_buffer_size.is_some(),
            ),
            (
                "log-text-info-buffer-size",
                self.logging.log_text_info_buffer_size.is_some(),
            ),
        ] {
            if set {
                w.push(format!("--{flag} has no effect: logs are never buffered"));
            }
        }
        if c.webhook_serving.any_set() {
            w.push("--webhook-* serving flags have no effect: admission webhooks are not implemented, so no webhook server is started".to_owned());
        }
        let s = &c.serving;
        let mut serving_note = |set: bool, flag: &str, why: &str| {
            if set {
                w.push(format!("--{flag} has no effect: {why}"));
            }
        };
        serving_note(
            !s.tls_sni_cert_key.is_empty(),
            "tls-sni-cert-key",
            "SNI certificates are not implemented; one certificate serves every name",
        );
        serving_note(
            s.tls_curve_preferences.is_some(),
            "tls-curve-preferences",
            "rustls chooses the key-exchange groups",
        );
        serving_note(
            s.permit_port_sharing.is_some(),
            "permit-port-sharing",
            "not implemented",
        );
        serving_note(
            s.permit_address_sharing.is_some(),
            "permit-address-sharing",
            "not implemented",
        );
        serving_note(
            s.http2_max_streams_per_connection.is_some(),
            "http2-max-streams-per-connection",
            "the HTTP/2 server's default applies",
        );
        serving_note(
            s.requestheader_client_ca_file.is_some()
                || s.requestheader_allowed_names.is_some()
                || s.requestheader_username_headers.is_some()
                || s.requestheader_uid_headers.is_some()
                || s.requestheader_group_headers.is_some()
                || s.requestheader_extra_headers_prefix.is_some(),
            "requestheader-*",
            "front-proxy (request header) authentication is not implemented; such requests are not authenticated by their headers",
        );
        let m = &c.metrics;
        serving_note(
            m.show_hidden_metrics_for_version.is_some(),
            "show-hidden-metrics-for-version",
            "no metric is hidden",
        );
        serving_note(
            m.disabled_metrics.is_some(),
            "disabled-metrics",
            "every metric is served",
        );
        serving_note(
            !m.allow_metric_labels.is_empty() || m.allow_metric_labels_manifest.is_some(),
            "allow-metric-labels",
            "label values are not filtered",
        );
        if !self.leader_election.leader_elect {
            w.push("--leader-elect=false: run a single replica, two replicas would both run every controller".to_owned());
        }
        w
    }

    /// `--cluster-cidr` parsed: empty when unset, one CIDR, or one IPv4 and one IPv6 CIDR.
    pub fn cluster_cidrs(&self) -> Result<Vec<IpNet>, ClusterCidrError> {
        let raw = self.generic.cluster_cidr.trim();
        if raw.is_empty() {
            return Ok(Vec::new());
        }
        let mut cidrs = Vec::new();
        for part in raw.split(',') {
            let part = part.trim();
            let net: IpNet = part.parse().map_err(|e| {
                ClusterCidrError(format!(
                    "--cluster-cidr: {part:?} is not a CIDR ({e}); expected e.g. 10.244.0.0/16"
                ))
            })?;
            cidrs.push(net);
        }
        match cidrs.as_slice() {
            [_] => Ok(cidrs),
            [a, b] if matches!(a, IpNet::V4(_)) != matches!(b, IpNet::V4(_)) => Ok(cidrs),
            [_, _] => Err(ClusterCidrError(format!(
                "--cluster-cidr: {raw:?} has two CIDRs of the same IP family; two CIDRs must be one IPv4 and one IPv6 (dual stack)"
            ))),
            _ => Err(ClusterCidrError(format!(
                "--cluster-cidr: {raw:?} has {} CIDRs; at most two (one IPv4 and one IPv6) are allowed",
                cidrs.len()
            ))),
        }
    }

    /// `--service-cluster-ip-range` parsed: empty when unset, else one or two CIDRs.
    pub fn service_cidrs(&self) -> Result<Vec<IpNet>, ClusterCidrError> {
        let raw = self.node_ipam.service_cluster_ip_range.trim();
        if raw.is_empty() {
            return Ok(Vec::new());
        }
        let parts: Vec<&str> = raw.split(',').map(str::trim).collect();
        if parts.len() > 2 {
            return Err(ClusterCidrError(
                "--service-cluster-ip-range can not contain more than two entries".to_owned(),
            ));
        }
        parts
            .into_iter()
            .map(|p| {
                p.parse::<IpNet>().map(|n| n.trunc()).map_err(|e| {
                    ClusterCidrError(format!(
                        "--service-cluster-ip-range: {p:?} is not a CIDR ({e}); expected e.g. 10.96.0.0/12"
                    ))
                })
            })
            .collect()
    }

    /// `--cluster-name`.
    pub fn cluster_name(&self) -> &str {
        &self.generic.cluster_name
    }

    /// `--concurrent-node-syncs`: cloud-node controller workers initialising Nodes.
    pub fn node_sync_workers(&self) -> usize {
        self.node.concurrent_node_syncs as usize
    }

    /// `--concurrent-node-status-updates`, with Go's rule that 0 means `--concurrent-node-syncs`.
    pub fn node_status_update_workers(&self) -> usize {
        match self.node.concurrent_node_status_updates {
            0 => self.node_sync_workers(),
            n => n as usize,
        }
    }

    /// `--node-status-update-frequency`.
    pub fn node_status_update_frequency(&self) -> Duration {
        self.node.node_status_update_frequency
    }

    /// `--node-monitor-period`.
    pub fn node_monitor_period(&self) -> Duration {
        self.node.node_monitor_period
    }

    /// `--node-deletion-grace-period`.
    pub fn node_deletion_grace_period(&self) -> Duration {
        self.node.node_deletion_grace_period
    }

    /// `--concurrent-service-syncs`.
    pub fn service_workers(&self) -> usize {
        self.service.concurrent_service_syncs as usize
    }

    /// `--node-sync-window`.
    pub fn node_sync_window(&self) -> Duration {
        self.service.node_sync_window
    }

    /// `--node-sync-max-window`.
    pub fn node_sync_max_window(&self) -> Duration {
        self.service.node_sync_max_window
    }

    /// `--use-service-account-credentials` (the bare flag is `true`).
    pub fn use_service_account_credentials(&self) -> bool {
        self.compat.use_service_account_credentials == Some(true)
    }

    /// `--configure-cloud-routes`.
    pub fn configure_cloud_routes(&self) -> bool {
        self.route.configure_cloud_routes
    }

    /// `--route-reconciliation-period`.
    pub fn route_reconciliation_period(&self) -> Duration {
        self.route.route_reconciliation_period
    }

    /// `--cloud-api-burst`, defaulting to `--cloud-api-qps` rounded up (at least 1).
    pub fn cloud_api_burst(&self) -> Option<u32> {
        let qps = self.budget.cloud_api_qps?;
        Some(
            self.budget
                .cloud_api_burst
                .unwrap_or_else(|| (qps.ceil() as u32).max(1)),
        )
    }

    /// `--cloud-api-timeout`, `None` when `0s`.
    pub fn cloud_api_timeout(&self) -> Option<Duration> {
        Some(self.budget.cloud_api_timeout).filter(|d| !d.is_zero())
    }
}

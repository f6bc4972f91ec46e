//! Go flags accepted for compatibility (each warned about, as it has no effect here) or
//! rejected with the reason (ignoring them would be unsafe, or Go removed them).

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args};

use super::{FlagError, flag_error};
use crate::machinery::go_syntax::parse_go_duration;

/// Go flags kept so that a Go CCM's manifest still starts, each either warned about (no effect
/// here, and the warning says why) or rejected (ignoring it would be unsafe).
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Accepted for Go compatibility")]
pub struct GoCompatArgs {
    /// Accepted with a warning: the client always speaks JSON.
    #[arg(long, value_name = "TYPE")]
    pub kube_api_content_type: Option<String>,
    /// Serve CPU profiles in pprof's format at `/debug/pprof/` on the secure port, authorized
    /// as `/metrics` (Go's flag; default true). See [`GoCompatArgs::profiling_enabled`].
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub profiling: Option<bool>,
    /// `true` is accepted with a warning: Go's block and mutex (lock-contention) profiles
    /// have no Rust counterpart; `/debug/pprof/profile` serves CPU profiles.
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

impl GoCompatArgs {
    /// Whether `/debug/pprof/` is served: `--profiling`, true unless set to false (Go's
    /// default).
    pub fn profiling_enabled(&self) -> bool {
        self.profiling.unwrap_or(true)
    }
}

/// Go's webhook serving flags; no webhook server is started here, so each is warned about.
#[derive(Args, Clone, Debug)]
#[command(next_help_heading = "Go webhook serving (accepted, no effect)")]
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
    pub(super) fn any_set(&self) -> bool {
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
#[command(next_help_heading = "Go serving (accepted, no effect)")]
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
#[command(next_help_heading = "Go metrics (accepted, no effect)")]
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
#[command(next_help_heading = "Removed Go flags (rejected)")]
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
    pub(super) fn errors(&self) -> Vec<FlagError> {
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

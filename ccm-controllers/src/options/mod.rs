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
//! | `--kube-api-qps` / `--kube-api-burst` | 20 / 30 | 5000 / 10000 | three requests per node at 20 QPS make a 1,000-node bring-up take 150 s; API Priority and Fairness protects the server, and the Node initialisation writes follow its latency |
//! | `--concurrent-service-syncs` | 1 | 10 | one worker makes many load balancers take half an hour to converge |
//! | zero workers | accepted (nothing runs) | rejected | a silent no-op configuration |
//!
//! New flags (no Go counterpart): `--node-deletion-grace-period`, `--node-sync-window`,
//! `--node-sync-max-window`,
//! `--cloud-api-qps`, `--cloud-api-burst`, `--cloud-api-timeout`, `--shutdown-grace-period`,
//! `--log-format`, `--shadow`, `--shadow-report`, `--shadow-duration`,
//! `--shadow-pending-grace`.
//!
//! Go flags that have no meaning here are still accepted where a Go manifest commonly passes
//! them, with a warning saying why they have no effect ([`Options::warnings`]), or rejected when
//! ignoring them would be unsafe ([`Options::validate`]); never silently ignored.

mod budget;
mod cloud;
pub(crate) mod controllers;
mod generic;
mod go_compat;
mod kube;
mod leader_election;
mod logging;
mod node;
mod node_cloud_state;
mod node_ipam;
mod route;
mod service;
mod serving;
mod shadow;

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use ipnet::IpNet;

pub use self::budget::CloudBudgetArgs;
pub use self::cloud::CloudArgs;
pub use self::generic::GenericArgs;
pub use self::go_compat::{
    GoCompatArgs, MetricsCompatArgs, RemovedGoArgs, ServingCompatArgs, WebhookServingCompatArgs,
};
pub use self::kube::{DEFAULT_KUBE_API_BURST, DEFAULT_KUBE_API_QPS, KubeArgs};
pub use self::leader_election::LeaderElectionArgs;
use self::logging::quantity_is_nonzero;
pub use self::logging::{LogFormat, LoggingArgs};
pub use self::node::NodeControllerArgs;
pub use self::node_cloud_state::{NodeCloudStateArgs, NodeDeletionMode};
pub use self::node_ipam::NodeIpamArgs;
pub use self::route::RouteControllerArgs;
pub use self::service::ServiceControllerArgs;
pub use self::serving::ServingArgs;
pub use self::shadow::{SHADOW_DEFAULT_CLOUD_API_QPS, ShadowArgs};
use crate::machinery::budget::BudgetConfig;
use crate::machinery::go_syntax::format_go_duration;

/// A path flag; empty is accepted (and means "not set", as in Go).
fn parse_path(input: &str) -> Result<PathBuf, String> {
    Ok(PathBuf::from(input))
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
    /// Node controllers' flags beyond Go, each off by default.
    #[command(flatten)]
    pub node_cloud_state: NodeCloudStateArgs,
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
    /// Shadow mode (ours only).
    #[command(flatten)]
    pub shadow: ShadowArgs,
    /// Go flags accepted for compatibility (warned about) or rejected with a reason.
    #[command(flatten)]
    pub compat: GoCompatArgs,
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
        if self
            .node_cloud_state
            .node_out_of_service_after
            .is_some_and(|d| d.is_zero())
        {
            errors.push(flag_error(
                "node-out-of-service-after",
                "must be > 0; leave it unset to keep the out-of-service taint off",
            ));
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
            c.contention_profiling == Some(true),
            "contention-profiling",
            "Go's block and mutex (lock-contention) profiles have no Rust counterpart; /debug/pprof/profile serves CPU profiles",
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

    /// `--reconcile-cloud-labels`.
    pub fn reconcile_cloud_labels(&self) -> bool {
        self.node_cloud_state.reconcile_cloud_labels
    }

    /// `--node-instance-not-found-condition`.
    pub fn node_instance_not_found_condition(&self) -> bool {
        self.node_cloud_state.node_instance_not_found_condition
    }

    /// `--node-deletion-mode`.
    pub fn node_deletion_mode(&self) -> NodeDeletionMode {
        self.node_cloud_state.node_deletion_mode
    }

    /// `--node-out-of-service-after` (`None`: off).
    pub fn node_out_of_service_after(&self) -> Option<Duration> {
        self.node_cloud_state.node_out_of_service_after
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

    /// The cloud-call budget these flags ask for (`--cloud-api-qps`, `--cloud-api-burst`,
    /// `--cloud-api-timeout`).
    pub fn budget_config(&self) -> BudgetConfig {
        BudgetConfig {
            rate_limit: self.budget.cloud_api_qps.zip(self.cloud_api_burst()),
            timeout: self.cloud_api_timeout(),
        }
    }
}

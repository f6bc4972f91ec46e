//! The Kubernetes client flags: `--kubeconfig`, `--master`, `--kube-api-qps`, `--kube-api-burst`.

use std::path::PathBuf;

use clap::Args;

use super::parse_path;

/// Default of `--kube-api-qps` (Go: 20; see the flag's docs for why it is higher).
pub const DEFAULT_KUBE_API_QPS: f64 = 5000.0;
/// Default of `--kube-api-burst` (Go: 30).
pub const DEFAULT_KUBE_API_BURST: u32 = 10000;

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
    /// Default 5000, not Go's 20: at 20 QPS a CCM needs about 150 s to initialise 1,000 nodes
    /// that register together (three requests per node), which is the bring-up delay this
    /// framework exists to remove. Since API Priority and Fairness (GA in Kubernetes 1.29) the
    /// API server protects itself per flow, and the Node initialisation writes follow the API
    /// server's latency; this client-side limit only stops a runaway loop, so it sits above
    /// what an API server takes from one client. Set it back to 20 to match a Go CCM exactly.
    #[arg(long, default_value_t = DEFAULT_KUBE_API_QPS, value_name = "QPS")]
    pub kube_api_qps: f64,
    /// Burst of queries to the API server (token bucket size). Default 10000 (Go: 30); see
    /// `--kube-api-qps`.
    #[arg(long, default_value_t = DEFAULT_KUBE_API_BURST, value_name = "N")]
    pub kube_api_burst: u32,
}

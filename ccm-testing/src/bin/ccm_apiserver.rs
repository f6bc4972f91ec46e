//! `ccm-apiserver`: the in-process API server of `ccm_testing::apiserver` as a process, for a smoke
//! test with no cluster. It serves plain HTTP on a chosen port and writes a kubeconfig for it, so
//! that `kubectl` and a CCM binary (`--kubeconfig`) can be pointed at it:
//!
//! ```sh
//! cargo run -p ccm-testing --features ccm-apiserver --bin ccm-apiserver -- \
//!     --port 8080 --kubeconfig /tmp/ccm-apiserver.kubeconfig --node worker-1 --node worker-2
//! kubectl --kubeconfig /tmp/ccm-apiserver.kubeconfig get nodes
//! ```
//!
//! It runs until SIGTERM or Ctrl-C. State lives in memory only: a restart starts empty.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use ccm_testing::apiserver::{ApiFaultRule, ApiFaults, ApiServer};
use ccm_testing::builders::kubelet_node;
use clap::Parser;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};

/// Serves the in-process Kubernetes API server of ccm-testing on a port and writes a kubeconfig
/// for it.
#[derive(Debug, Parser)]
#[command(name = "ccm-apiserver", version)]
struct Args {
    /// The address to listen on. The server has no authentication: keep it on loopback.
    #[arg(long, default_value = "127.0.0.1")]
    address: std::net::IpAddr,

    /// The port to listen on (0: any free port; the kubeconfig names the one chosen).
    #[arg(long, default_value_t = 8080)]
    port: u16,

    /// Where to write the kubeconfig (plain HTTP, no credentials). Written once the server
    /// listens, so a script can wait for the file.
    #[arg(long, default_value = "ccm-apiserver.kubeconfig")]
    kubeconfig: PathBuf,

    /// A Node to create at startup, as kubelet `--cloud-provider=external` registers it (with the
    /// `node.cloudprovider.kubernetes.io/uninitialized` taint). Repeat for more.
    #[arg(long = "node", value_name = "NAME")]
    nodes: Vec<String>,

    /// Delay every request by this many milliseconds.
    #[arg(long, default_value_t = 0, value_name = "MS")]
    latency_ms: u64,

    /// How often watches that allow bookmarks get a BOOKMARK, in milliseconds.
    #[arg(long, default_value_t = 5000, value_name = "MS")]
    bookmark_interval_ms: u64,

    /// A random fault: a share RATE (0 to 1) of the requests with VERB on RESOURCE (both
    /// default `*`) gets KIND: `500`, `429` (with Retry-After), `409` (writes only), `410`
    /// (watches only: answered expired), `hang` (served after --fault-hang-ms), `close` (watches
    /// only: closed within --fault-watch-close-ms). Repeat for more; none by default.
    #[arg(long = "fault", value_name = "KIND:RATE[:VERB[:RESOURCE]]")]
    faults: Vec<ApiFaultRule>,

    /// The seed of the generator that picks the requests the faults hit.
    #[arg(long, default_value_t = 0)]
    fault_seed: u64,

    /// The Retry-After of injected 429s, in seconds.
    #[arg(long, default_value_t = 1, value_name = "SECONDS")]
    fault_retry_after: u64,

    /// How long a request hit by `hang` waits before it is served, in milliseconds.
    #[arg(long, default_value_t = 5000, value_name = "MS")]
    fault_hang_ms: u64,

    /// A watch hit by `close` ends after a random time up to this, in milliseconds.
    #[arg(long, default_value_t = 5000, value_name = "MS")]
    fault_watch_close_ms: u64,

    /// The WatchList feature: with `false`, a watch asking for `sendInitialEvents=true` is
    /// refused with 422, as by a kube-apiserver whose WatchList feature gate is off, so clients
    /// list in pages. Default true, as recent kube-apiservers.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    watch_list: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    match serve(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            tracing::error!("{message}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: Args) -> Result<(), String> {
    let addr = SocketAddr::new(args.address, args.port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let server = ApiServer::serve(listener)
        .await
        .map_err(|e| format!("cannot serve on {addr}: {e}"))?;
    server.set_latency(Duration::from_millis(args.latency_ms));
    server.set_bookmark_interval(Duration::from_millis(args.bookmark_interval_ms));
    server.set_watch_list(args.watch_list);
    if !args.faults.is_empty() {
        let faults = args.faults.iter().cloned().fold(
            ApiFaults::seeded(args.fault_seed)
                .retry_after(Duration::from_secs(args.fault_retry_after))
                .hang_for(Duration::from_millis(args.fault_hang_ms))
                .close_watches_within(Duration::from_millis(args.fault_watch_close_ms)),
            ApiFaults::rule,
        );
        tracing::info!(rules = ?faults.rules(), seed = args.fault_seed, "fault injection on");
        server.set_faults(Some(faults));
    }

    let nodes: Api<Node> = Api::all(server.client());
    for name in &args.nodes {
        nodes
            .create(&PostParams::default(), &kubelet_node(name).build())
            .await
            .map_err(|e| format!("cannot create Node {name:?}: {e}"))?;
    }

    // Clients connect to loopback when the server listens on every address.
    let url = match server.url().parse::<SocketAddr>() {
        Ok(bound) if bound.ip().is_unspecified() => format!("http://127.0.0.1:{}", bound.port()),
        _ => server.url(),
    };
    write_kubeconfig(&args.kubeconfig, &url)?;
    tracing::info!(
        url,
        kubeconfig = %args.kubeconfig.display(),
        nodes = args.nodes.len(),
        "serving; stop with Ctrl-C or SIGTERM"
    );

    shutdown_signal().await;
    tracing::info!("stopping");
    Ok(())
}

/// Writes the kubeconfig atomically (a temporary file renamed into place), so whoever waits for
/// the file never reads half of it.
fn write_kubeconfig(path: &Path, url: &str) -> Result<(), String> {
    let name = "ccm-apiserver";
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": url}}],
        "users": [{"name": name, "user": {}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    });
    let yaml = serde_norway::to_string(&kubeconfig)
        .map_err(|e| format!("cannot render the kubeconfig: {e}"))?;
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = PathBuf::from(temporary);
    std::fs::write(&temporary, yaml)
        .and_then(|()| std::fs::rename(&temporary, path))
        .map_err(|e| format!("cannot write the kubeconfig {}: {e}", path.display()))
}

async fn shutdown_signal() {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(e) => {
                tracing::warn!("cannot listen for SIGTERM ({e}); stop with Ctrl-C");
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

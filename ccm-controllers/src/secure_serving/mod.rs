//! HTTPS serving on `--bind-address:--secure-port` with delegated authentication and
//! authorisation, as Go's cloud-controller-manager serves `/metrics` and `/healthz`.
//!
//! - TLS via rustls (ring provider): `--tls-cert-file`/`--tls-private-key-file` (re-read every
//!   two seconds; a changed valid pair is served from the next handshake on, an invalid one is
//!   logged and the last good pair kept), else the pair in `--cert-dir`, else a self-signed
//!   certificate for `localhost`/`127.0.0.1` generated in memory. `--tls-min-version`,
//!   `--tls-cipher-suites` with Go's names.
//! - Authentication: a client certificate signed by the client CA (`--client-ca-file`, or the
//!   ConfigMap `kube-system/extension-apiserver-authentication` read at start-up unless
//!   `--authentication-skip-lookup`) gives user = CommonName, groups = Organizations; otherwise
//!   `Authorization: Bearer <token>` is checked with a `TokenReview`, cached for
//!   `--authentication-token-webhook-cache-ttl`. Authorisation: a `SubjectAccessReview` with
//!   `nonResourceAttributes{path, verb}` (verb = lower-cased HTTP method), cached with the
//!   authorized / unauthorized TTLs. `--authorization-always-allow-paths` skip both.
//! - Outcomes: no or invalid token → 401; review of the token failed → 401; subject not allowed
//!   → 403; authorisation review failed → 500 (as Go). A request is never let through because
//!   the API server could not be asked.
//!
//! ```no_run
//! # async fn demo(client: kube::Client) -> Result<(), ccm_controllers::secure_serving::Error> {
//! use ccm_controllers::secure_serving::{serve, SecureServingArgs};
//! let router = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! if let Some(server) = serve(router, &SecureServingArgs::default(), client, shutdown).await? {
//!     server.wait().await?;
//! }
//! # Ok(()) }
//! ```

mod args;
mod auth;
mod client_ca;
mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

pub use args::{CipherSuite, SecureServingArgs, TlsVersion, parse_cipher_suite, parse_tls_version};
use auth::ClientCertUser;
pub use auth::{DelegatedAuth, DelegatedAuthLayer, DelegatedAuthService, UserInfo};

/// How long a TLS handshake may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open connections may finish their requests after shutdown.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors of secure serving setup.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag value is invalid or flags contradict each other.
    #[error("invalid serving flags: {0}")]
    InvalidFlag(String),
    /// A certificate or key file could not be read or written.
    #[error("certificate file {path}: {source}")]
    CertFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A certificate/key pair is not usable.
    #[error("serving certificate {path}: {reason}")]
    Certificate {
        /// The certificate file (`<self-signed>` for the generated one).
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Generating the self-signed certificate failed.
    #[error("generating the self-signed serving certificate: {0}")]
    SelfSigned(rcgen::Error),
    /// rustls rejected the configuration (e.g. no cipher suite usable with the TLS versions).
    #[error("TLS configuration: {0}")]
    Tls(rustls::Error),
    /// `--authentication-kubeconfig` / `--authorization-kubeconfig` could not be used.
    #[error("{flag} {path}: {message}")]
    Kubeconfig {
        /// The flag.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// The client CA could not be looked up in the cluster (see
    /// `--authentication-tolerate-lookup-failure`).
    #[error(
        "unable to load the client CA from configmap/extension-apiserver-authentication in kube-system: {0}"
    )]
    ClientCaLookup(String),
    /// The client CA bundle is not usable.
    #[error("client CA from {source_name}: {reason}")]
    ClientCa {
        /// The file or ConfigMap it came from.
        source_name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The listening socket could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The accept loop task panicked or was aborted.
    #[error("secure server task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// A running HTTPS server.
#[derive(Debug)]
pub struct SecureServer {
    local_addr: SocketAddr,
    task: JoinHandle<()>,
}

impl SecureServer {
    /// The address the server listens on (the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Waits until the server has stopped: after `shutdown` fired and open connections
    /// finished (at most ten seconds later).
    pub async fn wait(self) -> Result<(), Error> {
        self.task.await.map_err(Error::from)
    }
}

/// Serves `router` over HTTPS on `--bind-address:--secure-port` behind delegated authn/authz
/// until `shutdown` fires. Returns `Ok(None)` when `--secure-port` is 0 (serving disabled, as
/// in Go). `client` creates the reviews unless `--authentication-kubeconfig` /
/// `--authorization-kubeconfig` name other credentials.
pub async fn serve(
    router: axum::Router,
    args: &SecureServingArgs,
    client: kube::Client,
    shutdown: CancellationToken,
) -> Result<Option<SecureServer>, Error> {
    if args.secure_port == 0 {
        tracing::info!(
            "--secure-port is 0: HTTPS serving, authentication and authorization are off"
        );
        return Ok(None);
    }
    let addr = SocketAddr::new(args.bind_address, args.secure_port);
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })?;
    serve_on(listener, router, args, client, shutdown)
        .await
        .map(Some)
}

/// Like [`serve`], on a listener the caller bound (tests bind `127.0.0.1:0`); ignores
/// `--bind-address` and `--secure-port`.
pub async fn serve_on(
    listener: TcpListener,
    router: axum::Router,
    args: &SecureServingArgs,
    client: kube::Client,
    shutdown: CancellationToken,
) -> Result<SecureServer, Error> {
    let authn_client = review_client(
        "--authentication-kubeconfig",
        args.authentication_kubeconfig.as_ref(),
        &client,
    )
    .await?;
    let authz_client = review_client(
        "--authorization-kubeconfig",
        args.authorization_kubeconfig.as_ref(),
        &client,
    )
    .await?;
    let client_ca = client_ca::load(args, &authn_client).await?;
    let auth = DelegatedAuth::new(args, authn_client, authz_client)?;
    let tls = tls::server_config(args, client_ca, &shutdown)?;
    let local_addr = listener.local_addr().map_err(|source| Error::Bind {
        addr: SocketAddr::new(args.bind_address, args.secure_port),
        source,
    })?;
    let app = router.layer(auth.layer());
    tracing::info!(%local_addr, "serving securely");
    let task = tokio::spawn(accept_loop(listener, TlsAcceptor::from(tls), app, shutdown));
    Ok(SecureServer { local_addr, task })
}

async fn review_client(
    flag: &'static str,
    path: Option<&PathBuf>,
    default: &kube::Client,
) -> Result<kube::Client, Error> {
    let Some(path) = path else {
        return Ok(default.clone());
    };
    let err = |message: String| Error::Kubeconfig {
        flag,
        path: path.clone(),
        message,
    };
    let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .map_err(|e| err(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| err(e.to_string()))
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    app: axum::Router,
    shutdown: CancellationToken,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    // With a timer, hyper enforces its 30 s limit for reading request headers (slow clients).
    builder.timer(TokioTimer::new());
    let builder = Arc::new(builder);
    loop {
        let (tcp, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Usually EMFILE or a connection reset before accept; back off briefly.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        let builder = builder.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            // The verified client certificate (if any) authenticates every request on this
            // connection.
            let cert_user = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(|leaf| client_ca::user_from_cert(leaf));
            let service = hyper::service::service_fn(move |mut req: http::Request<Incoming>| {
                if let Some(user) = &cert_user {
                    req.extensions_mut().insert(ClientCertUser(user.clone()));
                }
                tower::ServiceExt::oneshot(app.clone(), req)
            });
            let conn = builder.serve_connection(TokioIo::new(tls), service);
            if let Err(e) = watcher.watch(conn).await {
                tracing::debug!(%peer, error = %e, "HTTPS connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("open HTTPS connections did not finish within {DRAIN_TIMEOUT:?}");
    }
    tracing::info!("secure server stopped");
}

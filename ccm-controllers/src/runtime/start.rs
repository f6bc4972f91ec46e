//! [`Builder::start`]: the startup steps in order, each a function named for what it does, then
//! leader election and the controllers (`lead.rs`), then the end of serving.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ccm_core::CloudProvider;
use clap::{ArgMatches, Args, FromArgMatches};
use kube::Client;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::AbortOnDropHandle;

use super::builder::{Builder, Signal};
use super::client::{ClientFactory, INFORMERS_CLIENT_NAME, ROOT_CLIENT_NAME};
use super::entry::ControllerEntry;
use super::health::{self, Health};
use super::lead::{LeadEnv, LeaseLabel, ManagedLabels, elect_and_lead};
use super::leader::LeaderState;
use super::logging::init_logging;
use crate::machinery::budget::BudgetedProvider;
use crate::machinery::metrics::{MetricsRegistry, WorkQueueMetrics};
use crate::machinery::shadow::Shadow;
use crate::options::controllers::{ControllerSelection, KnownController};
use crate::options::{LoggingArgs, Options};
use crate::secure_serving::{self, SecureServer};

/// An early exit with this code (the reason is already logged).
struct Exit(i32);

/// Logs `message` as an error; the exit code of a startup error.
fn fail(message: std::fmt::Arguments<'_>) -> Exit {
    tracing::error!("{message}");
    Exit(1)
}

impl<V> Builder<V>
where
    V: Args + FromArgMatches + Send + Sync + 'static,
{
    /// Starts the process and runs it until shutdown; returns the exit code (0 after a
    /// graceful shutdown, non-zero on a startup error or a lost lease).
    pub(super) async fn start(self) -> i32 {
        match self.try_start().await {
            Ok(code) | Err(Exit(code)) => code,
        }
    }

    /// [`Builder::start`], with an early exit as an error.
    async fn try_start(mut self) -> Result<i32, Exit> {
        let (options, vendor) = self.parse_command_line()?;
        start_logging(&options, self.version);
        validate_options(&options)?;
        let mut enabled = self.enabled_controllers(&options)?;
        let provider = self.build_provider(&options)?;
        check_cluster_id(&options, provider.as_ref())?;
        check_routes(&options, &enabled, provider.as_ref())?;
        check_load_balancer_classes(&options, &enabled, provider.as_ref())?;
        crate::runtime::builtin::check_node_ipam(&options, &mut enabled, &self.cidr_allocators)
            .map_err(|e| fail(format_args!("{e}")))?;

        let metrics = MetricsRegistry::new();
        let shadow = super::shadow::start(&options, &metrics);
        let budgeted = wrap_in_budget(provider, &options, &metrics, shadow.as_ref());
        let workqueue_metrics = WorkQueueMetrics::register(&metrics);
        let gauges = ManagerGauges::register(&metrics);
        let clients = build_clients(&options, self.version, &metrics, shadow.as_ref()).await?;

        // A shadow takes no Lease: it runs beside the leader, never competing with it.
        let election = options.leader_election.leader_elect && shadow.is_none();
        let health = Health::new(
            if election {
                LeaderState::Standby { healthy: true }
            } else {
                LeaderState::Disabled
            },
            clients.factory.watch_liveness(),
        );
        let mut router = health::router(health.clone(), metrics.clone());
        if options.compat.profiling_enabled() {
            router = router.merge(super::profiling::router());
        }
        let router = super::shadow::with_endpoint(router, shadow.as_ref());
        let serving = self.start_serving(&options, router, &clients.root).await?;
        let shutdown = CancellationToken::new();
        let signal_task = watch_shutdown_signal(
            self.shutdown_signal
                .take()
                .unwrap_or_else(|| Box::pin(os_signal())),
            shutdown.clone(),
        );

        let env = LeadEnv {
            options: Arc::new(options),
            vendor: Arc::new(vendor),
            client: clients.root,
            informer_client: clients.informers,
            clients: clients.factory,
            event_client: clients.events,
            budgeted,
            metrics,
            workqueue_metrics,
            running: gauges.running,
            health: health.clone(),
            identity: super::leader::default_identity(),
            enabled,
            strip_node: self.strip_node,
            shadow: shadow.clone(),
        };
        let code = elect_and_lead(&env, election, &gauges.master_status, &shutdown).await;
        let code = super::shadow::finish(
            &env.options,
            shadow.as_ref(),
            code,
            &mut std::io::stdout().lock(),
        );

        health.shutting_down.store(true, Ordering::SeqCst);
        shutdown.cancel();
        let _ = signal_task.await;
        serving.stop().await;
        tracing::info!(code, "cloud-controller-manager stopped");
        Ok(code)
    }

    /// The runtime's flags and the vendor's, from the given arguments or `std::env::args`.
    /// Help and `--version` print to stdout and exit 0; errors print to stderr and exit 2.
    fn parse_command_line(&mut self) -> Result<(Options, V), Exit> {
        let mut cmd = match self.command() {
            Ok(cmd) => cmd,
            Err(e) => {
                init_logging(&LoggingArgs::default());
                tracing::error!("{e}");
                return Err(Exit(1));
            }
        };
        let args = self
            .args
            .take()
            .unwrap_or_else(|| std::env::args_os().collect());
        let matches: ArgMatches = match cmd.try_get_matches_from_mut(args) {
            Ok(m) => m,
            Err(e) => {
                // Help and --version print to stdout and exit 0; errors to stderr, exit 2.
                let _ = e.print();
                return Err(Exit(e.exit_code()));
            }
        };
        match (
            Options::from_arg_matches(&matches),
            V::from_arg_matches(&matches),
        ) {
            (Ok(o), Ok(v)) => Ok((o, v)),
            (Err(e), _) | (_, Err(e)) => {
                let _ = e.format(&mut cmd).print();
                Err(Exit(2))
            }
        }
    }

    /// The entries `--controllers` enables, after checking that no name or alias is registered
    /// twice.
    fn enabled_controllers(&self, options: &Options) -> Result<Vec<ControllerEntry>, Exit> {
        let mut names: Vec<&str> = self
            .controllers
            .iter()
            .flat_map(|e| {
                std::iter::once(e.name.as_str()).chain(e.aliases.iter().map(String::as_str))
            })
            .collect();
        names.sort_unstable();
        if let Some(dup) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(fail(format_args!(
                "controller name or alias {:?} is registered twice; give each controller unique names",
                dup[0]
            )));
        }
        let known: Vec<KnownController> = self
            .controllers
            .iter()
            .map(|e| KnownController {
                name: e.name.clone(),
                aliases: e.aliases.clone(),
                disabled_by_default: e.disabled_by_default,
            })
            .collect();
        let selection = ControllerSelection::parse(&options.generic.controllers, &known)
            .map_err(|e| fail(format_args!("{e}")))?;
        let enabled: Vec<ControllerEntry> = self
            .controllers
            .iter()
            .filter(|e| selection.is_enabled(&e.name))
            .cloned()
            .collect();
        if enabled.is_empty() {
            tracing::warn!(
                "--controllers enables no controller; only leader election and serving run"
            );
        }
        Ok(enabled)
    }

    /// The provider given to [`Builder::provider`], else the one registered under
    /// `--cloud-provider`, built from `--cloud-config`.
    fn build_provider(&mut self, options: &Options) -> Result<Arc<dyn CloudProvider>, Exit> {
        if let Some(provider) = self.provider.take() {
            if options.cloud.cloud_config.is_some() {
                tracing::warn!(
                    "--cloud-config is not read: the provider was given to Builder::provider"
                );
            }
            return Ok(provider);
        }
        let cloud_config = load_cloud_config(options)?;
        let name = options.cloud.cloud_provider.as_deref().unwrap_or_default();
        ccm_core::build_provider(name, cloud_config.as_deref())
            .map_err(|e| fail(format_args!("--cloud-provider={name}: {e}")))
    }

    /// Serves `router` (`/healthz`, `/livez`, `/readyz`, `/metrics`) on the listener given to
    /// [`Builder::listener`], else on `--bind-address:--secure-port`.
    async fn start_serving(
        &mut self,
        options: &Options,
        router: axum::Router,
        client: &Client,
    ) -> Result<Serving, Exit> {
        let stop = CancellationToken::new();
        // Stops the server also when this future is dropped (a "killed" runtime).
        let guard = stop.clone().drop_guard();
        let secure = &options.serving.secure;
        let server = match self.listener.take() {
            Some(l) => {
                let listener = l
                    .set_nonblocking(true)
                    .and_then(|()| tokio::net::TcpListener::from_std(l))
                    .map_err(|e| fail(format_args!("cannot use the given listener: {e}")))?;
                Some(
                    secure_serving::serve_on(
                        listener,
                        router,
                        secure,
                        client.clone(),
                        stop.clone(),
                    )
                    .await
                    .map_err(|e| fail(format_args!("serving /healthz and /metrics: {e}")))?,
                )
            }
            None => secure_serving::serve(router, secure, client.clone(), stop.clone())
                .await
                .map_err(|e| {
                    fail(format_args!(
                        "serving on --bind-address={} --secure-port={}: {e}",
                        secure.bind_address, secure.secure_port
                    ))
                })?,
        };
        Ok(Serving {
            stop,
            _guard: guard,
            server,
        })
    }
}

/// Installs logging, then logs the start and the warnings about the flags.
fn start_logging(options: &Options, version: &str) {
    init_logging(&options.logging);
    tracing::info!(version, "starting cloud-controller-manager");
    for warning in options.warnings() {
        tracing::warn!("{warning}");
    }
}

/// Every flag value a parser cannot check alone ([`Options::validate`]), each problem logged.
fn validate_options(options: &Options) -> Result<(), Exit> {
    if let Err(errors) = options.validate() {
        for e in &errors {
            tracing::error!("{e}");
        }
        return Err(Exit(1));
    }
    Ok(())
}

/// The bytes of `--cloud-config`; `None` when unset or empty (an empty `--cloud-config=` means
/// none, as in Go).
fn load_cloud_config(options: &Options) -> Result<Option<Vec<u8>>, Exit> {
    let Some(path) = options
        .cloud
        .cloud_config
        .as_ref()
        .filter(|p| !p.as_os_str().is_empty())
    else {
        return Ok(None);
    };
    std::fs::read(path).map(Some).map_err(|e| {
        fail(format_args!(
            "invalid value for --cloud-config: cannot read {}: {e}",
            path.display()
        ))
    })
}

/// A provider without a cluster ID starts only with `--allow-untagged-cloud` (as in Go).
fn check_cluster_id(options: &Options, provider: &dyn CloudProvider) -> Result<(), Exit> {
    if provider.has_cluster_id() {
        return Ok(());
    }
    if options.cloud.allow_untagged_cloud {
        tracing::warn!(
            "detected a cluster without a ClusterID. A ClusterID will be required in the future. Please tag your cluster to avoid any future issues"
        );
        Ok(())
    } else {
        Err(fail(format_args!(
            "no ClusterID found. A ClusterID is required for the cloud provider to function properly. This check can be bypassed by setting --allow-untagged-cloud"
        )))
    }
}

/// The route controller needs `--cluster-cidr` when it would run.
fn check_routes(
    options: &Options,
    enabled: &[ControllerEntry],
    provider: &dyn CloudProvider,
) -> Result<(), Exit> {
    let route_enabled = enabled.iter().any(|e| e.name == "node-route-controller");
    if !route_enabled || !options.configure_cloud_routes() {
        return Ok(());
    }
    if provider.routes().is_none() {
        tracing::warn!(
            "--configure-cloud-routes is set, but the cloud provider does not support routes; the route controller will not run"
        );
        return Ok(());
    }
    match options.cluster_cidrs() {
        Ok(cidrs) if !cidrs.is_empty() => Ok(()),
        Ok(_) => Err(fail(format_args!(
            "--configure-cloud-routes=true needs --cluster-cidr (the pod CIDR, e.g. --cluster-cidr=10.244.0.0/16, or an IPv4 and an IPv6 CIDR separated by a comma); to run without cloud routes pass --configure-cloud-routes=false or --controllers=*,-node-route-controller"
        ))),
        Err(e) => Err(fail(format_args!(
            "{e}; the route controller (--configure-cloud-routes=true) needs a valid --cluster-cidr; to run without cloud routes pass --configure-cloud-routes=false"
        ))),
    }
}

/// The classes `--load-balancer-classes` names (or, without it, those the provider declares)
/// must be ones the provider declares, when the service controller would run: a bad value
/// exits before leader election, naming the problem.
fn check_load_balancer_classes(
    options: &Options,
    enabled: &[ControllerEntry],
    provider: &dyn CloudProvider,
) -> Result<(), Exit> {
    let config =
        crate::runtime::builtin::service_config(options).map_err(|e| fail(format_args!("{e}")))?;
    let service_enabled = enabled
        .iter()
        .any(|e| e.name == crate::controllers::service::NAME);
    // A provider without any load balancer: the controller is skipped (logged) anyway.
    let has_load_balancer = provider
        .load_balancer_classes()
        .entries()
        .any(|class| provider.load_balancer_for_class(class).is_some());
    if !service_enabled || !has_load_balancer {
        return Ok(());
    }
    crate::controllers::service::check_load_balancer_classes(provider, &config)
        .map_err(|e| fail(format_args!("{e}")))
}

/// The provider behind the cloud-call budget (`--cloud-api-qps`, `--cloud-api-burst`,
/// `--cloud-api-timeout`).
fn wrap_in_budget(
    provider: Arc<dyn CloudProvider>,
    options: &Options,
    metrics: &MetricsRegistry,
    shadow: Option<&Arc<Shadow>>,
) -> Arc<BudgetedProvider> {
    let budget_config = super::shadow::budget_config(options, shadow.is_some());
    BudgetedProvider::with_shadow(provider, &budget_config, metrics, shadow.cloned())
}

/// The gauges of Go's controller manager: which controllers run, and whether this process
/// holds the lease.
struct ManagerGauges {
    running: Family<ManagedLabels, Gauge>,
    master_status: Family<LeaseLabel, Gauge>,
}

impl ManagerGauges {
    fn register(metrics: &MetricsRegistry) -> Self {
        let running = Family::<ManagedLabels, Gauge>::default();
        metrics.register(
            "running_managed_controllers",
            "Indicates where instances of a controller are currently running",
            running.clone(),
        );
        let master_status = Family::<LeaseLabel, Gauge>::default();
        metrics.register(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master",
            master_status.clone(),
        );
        ManagerGauges {
            running,
            master_status,
        }
    }
}

/// The Kubernetes clients of the process.
struct Clients {
    /// Makes each controller's client.
    factory: ClientFactory,
    /// The root client (leader election, serving's reviews, the provider's `initialize`).
    root: Client,
    /// The shared informers' client (root credentials).
    informers: Client,
    /// The Event writer's own client, for Events not recorded by a controller.
    events: Client,
}

/// Clients: one per controller, as Go's client builders (see `crate::runtime::client`).
async fn build_clients(
    options: &Options,
    version: &'static str,
    metrics: &MetricsRegistry,
    shadow: Option<&Arc<Shadow>>,
) -> Result<Clients, Exit> {
    let config = crate::runtime::client::load_config(options)
        .await
        .map_err(|e| fail(format_args!("{e}")))?;
    // A shadow creates no ServiceAccount and asks for no token (`runtime/shadow.rs`).
    let use_service_accounts = options.use_service_account_credentials() && shadow.is_none();
    let factory = ClientFactory::with_shadow(
        config,
        options.kube.kube_api_qps,
        options.kube.kube_api_burst,
        version,
        metrics,
        use_service_accounts,
        shadow.cloned(),
    )
    .map_err(|e| fail(format_args!("{e}")))?;
    if use_service_accounts {
        tracing::info!(
            "--use-service-account-credentials: each controller authenticates as its own ServiceAccount in kube-system"
        );
    }
    let root = factory.root();
    let informers = factory
        .root_credentials_client(INFORMERS_CLIENT_NAME)
        .map_err(|e| fail(format_args!("{e}")))?;
    let events = factory
        .root_credentials_client(ROOT_CLIENT_NAME)
        .map_err(|e| fail(format_args!("{e}")))?;
    Ok(Clients {
        factory,
        root,
        informers,
        events,
    })
}

/// The health and metrics server while it runs.
struct Serving {
    stop: CancellationToken,
    /// Stops the server when dropped (a "killed" runtime).
    _guard: DropGuard,
    /// `None` when `--secure-port` is 0.
    server: Option<SecureServer>,
}

impl Serving {
    /// Stops serving; the server drains open connections for at most ten seconds.
    async fn stop(self) {
        self.stop.cancel();
        if let Some(server) = self.server {
            let _ = tokio::time::timeout(Duration::from_secs(15), server.wait()).await;
        }
    }
}

/// Cancels `shutdown` when `signal` completes; ends when `shutdown` is cancelled otherwise.
fn watch_shutdown_signal(signal: Signal, shutdown: CancellationToken) -> AbortOnDropHandle<()> {
    AbortOnDropHandle::new(tokio::spawn(async move {
        tokio::select! {
            () = signal => {
                tracing::info!("shutdown requested: finishing in-flight work");
                shutdown.cancel();
            }
            () = shutdown.cancelled() => {}
        }
    }))
}

/// SIGTERM or SIGINT.
async fn os_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(e) => {
                tracing::warn!("cannot listen for SIGTERM ({e}); only SIGINT stops the process");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

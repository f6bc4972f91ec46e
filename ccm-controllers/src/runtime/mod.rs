//! [`run`] and [`Builder`]: the process around the controllers.
//!
//! Startup order: parse the flags → logging → validate the flags → read `--cloud-config` →
//! build the provider from the registry (`--cloud-provider`) → check `has_cluster_id()` against
//! `--allow-untagged-cloud` → check the route controller's `--cluster-cidr` → wrap the provider
//! in the cloud-call budget → Kubernetes client → serving (`/healthz`, `/livez`, `/readyz`,
//! `/metrics`) → leader election → when leading: shared informers, wait for their sync,
//! `provider.initialize(...)`, start the enabled controllers.
//!
//! Shutdown (SIGTERM/SIGINT, or the future given to [`Builder::shutdown_signal`]): `/readyz`
//! turns 503, the controllers' `ctx.shutdown` fires (they stop taking work), in-flight
//! reconciles and cloud calls get `--shutdown-grace-period` to finish, the lease is released so a
//! standby takes over at once, exit code 0. Losing the lease exits with code 1 at once (another
//! process leads), as in Go.

pub(crate) mod builtin;
pub(crate) mod client;
mod entry;
pub(crate) mod health;
pub(crate) mod leader;

use std::any::Any;
use std::ffi::OsString;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ccm_core::{CloudProvider, InitContext, Node};
use clap::{ArgMatches, Args, Command, FromArgMatches};
use kube::Client;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use self::health::Health;
use self::leader::{ElectionConfig, LeaderState};
use crate::machinery::budget::{BudgetConfig, BudgetedProvider};
use crate::machinery::context::{ContextParams, ControllerContext};
use crate::machinery::error::ControllerError;
use crate::machinery::events::{DEFAULT_FLUSH_TIMEOUT, EventBroadcaster};
use crate::machinery::go_syntax::format_go_duration;
use crate::machinery::metrics::{MetricsRegistry, WorkQueueMetrics};
use crate::options::controllers::{ControllerSelection, KnownController};
use crate::options::{LogFormat, LoggingArgs, Options};
use crate::secure_serving;

pub use self::entry::{ControllerEntry, ControllerFuture, NoArgs, StartArgs, StartFn};

type Signal = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Builds and runs a cloud-controller-manager: the vendor's flags, controllers and defaults on
/// top of the runtime's, without forking.
///
/// ```no_run
/// # use ccm_controllers::{Builder, ControllerContext, ControllerError};
/// #[derive(clap::Args, Debug)]
/// struct AcmeArgs {
///     /// Tag every volume with the cluster name.
///     #[arg(long, default_value_t = false)]
///     acme_tag_volumes: bool,
/// }
///
/// fn main() -> std::process::ExitCode {
///     Builder::new()
///         .with_args::<AcmeArgs>()
///         .default_value("concurrent-service-syncs", "20")
///         .controller_with_args("acme-tagger", |ctx: ControllerContext, args| async move {
///             let tag = args.vendor::<AcmeArgs>().is_some_and(|a| a.acme_tag_volumes);
///             ctx.shutdown.cancelled().await;
///             let _ = tag;
///             Ok::<(), ControllerError>(())
///         })
///         .run()
/// }
/// ```
pub struct Builder<V = NoArgs> {
    controllers: Vec<ControllerEntry>,
    cidr_allocators: crate::controllers::node_ipam::CidrAllocators,
    defaults: Vec<(String, String)>,
    args: Option<Vec<OsString>>,
    shutdown_signal: Option<Signal>,
    version: &'static str,
    listener: Option<std::net::TcpListener>,
    provider: Option<Arc<dyn CloudProvider>>,
    strip_node: fn(&mut Node),
    worker_threads: Option<usize>,
    _vendor: std::marker::PhantomData<fn() -> V>,
}

impl std::fmt::Debug for Builder<NoArgs> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("controllers", &self.controllers)
            .field("defaults", &self.defaults)
            .finish_non_exhaustive()
    }
}

impl Default for Builder<NoArgs> {
    fn default() -> Self {
        Self::new()
    }
}

impl Builder<NoArgs> {
    /// The runtime with the built-in controllers and Go's flags.
    pub fn new() -> Self {
        Builder {
            controllers: crate::runtime::builtin::builtin_controllers(),
            cidr_allocators: Default::default(),
            defaults: Vec::new(),
            args: None,
            shutdown_signal: None,
            version: env!("CARGO_PKG_VERSION"),
            listener: None,
            provider: None,
            strip_node: crate::machinery::informer::strip_node,
            worker_threads: None,
            _vendor: std::marker::PhantomData,
        }
    }
}

/// Worker threads of the runtime by default: at most this many, fewer on a smaller machine.
///
/// A CCM waits on the network almost all the time, and every worker thread costs memory: glibc
/// gives each thread that allocates an arena of its own and keeps what it freed (tokio's
/// default is one worker per core). The resident memory per worker count is measured in
/// `docs/performance.md`, section "4. steady: memory".
pub(crate) const MAX_DEFAULT_WORKER_THREADS: usize = 2;

/// The worker threads [`Builder::run`] starts unless [`Builder::worker_threads`] says
/// otherwise: `TOKIO_WORKER_THREADS` when set to a positive number, else the machine's
/// parallelism capped at [`MAX_DEFAULT_WORKER_THREADS`].
pub(crate) fn default_worker_threads() -> usize {
    let from_env = std::env::var("TOKIO_WORKER_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0);
    from_env.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map_or(1, std::num::NonZeroUsize::get)
            .min(MAX_DEFAULT_WORKER_THREADS)
    })
}

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

impl<V> Builder<V>
where
    V: Args + FromArgMatches + Send + Sync + 'static,
{
    /// Adds the vendor's clap arguments (flattened next to the runtime's); controllers read the
    /// parsed values with [`StartArgs::vendor`].
    pub fn with_args<T>(self) -> Builder<T>
    where
        T: Args + FromArgMatches + Send + Sync + 'static,
    {
        Builder {
            controllers: self.controllers,
            cidr_allocators: self.cidr_allocators,
            defaults: self.defaults,
            args: self.args,
            shutdown_signal: self.shutdown_signal,
            version: self.version,
            listener: self.listener,
            provider: self.provider,
            strip_node: self.strip_node,
            worker_threads: self.worker_threads,
            _vendor: std::marker::PhantomData,
        }
    }

    /// Adds a controller that needs only the context. A controller with the name of a built-in
    /// one replaces it.
    pub fn controller<F, Fut>(self, name: &str, start: F) -> Self
    where
        F: Fn(ControllerContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), ControllerError>> + Send + 'static,
    {
        self.controller_entry(ControllerEntry::new(name, move |ctx, _| start(ctx)))
    }

    /// Adds a controller that also reads the parsed flags (the runtime's and the vendor's).
    pub fn controller_with_args<F, Fut>(self, name: &str, start: F) -> Self
    where
        F: Fn(ControllerContext, StartArgs) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), ControllerError>> + Send + 'static,
    {
        self.controller_entry(ControllerEntry::new(name, start))
    }

    /// Adds a controller entry (aliases, disabled by default). Replaces an entry of the same
    /// name.
    pub fn controller_entry(mut self, entry: ControllerEntry) -> Self {
        self.controllers.retain(|e| e.name != entry.name);
        self.controllers.push(entry);
        self
    }

    /// Registers a pod-CIDR allocator under a `--cidr-allocator-type` name (e.g.
    /// `"CloudAllocator"`), run by the node-IPAM controller with `--allocate-node-cidrs=true`.
    /// `"RangeAllocator"` replaces the built-in one.
    pub fn cidr_allocator(
        mut self,
        name: &str,
        allocator: impl crate::controllers::node_ipam::CidrAllocator,
    ) -> Self {
        self.cidr_allocators.insert(name, Arc::new(allocator));
        let entry = crate::runtime::builtin::node_ipam_controller(self.cidr_allocators.clone());
        if let Some(e) = self.controllers.iter_mut().find(|e| e.name == entry.name) {
            *e = entry;
        }
        self
    }

    /// Removes the built-in controllers (and any added so far).
    pub fn without_builtin_controllers(mut self) -> Self {
        self.controllers.clear();
        self
    }

    /// Changes the default of a flag (by its long name without dashes, e.g.
    /// `"concurrent-service-syncs"`), as if the user had not passed it. Unknown flags make
    /// startup fail.
    pub fn default_value(mut self, flag: &str, value: &str) -> Self {
        self.defaults.push((flag.to_owned(), value.to_owned()));
        self
    }

    /// Parses these arguments (the first is the program name) instead of `std::env::args`.
    pub fn args<I, T>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString>,
    {
        self.args = Some(args.into_iter().map(Into::into).collect());
        self
    }

    /// Shuts down when this future completes, instead of on SIGTERM/SIGINT.
    pub fn shutdown_signal(mut self, signal: impl Future<Output = ()> + Send + 'static) -> Self {
        self.shutdown_signal = Some(Box::pin(signal));
        self
    }

    /// The version shown by `--version` and in the user agent
    /// (`cloud-controller-manager/<version>`). Defaults to this crate's version.
    pub fn version(mut self, version: &'static str) -> Self {
        self.version = version;
        self
    }

    /// Serves health and metrics (HTTPS, as configured by the serving flags) on this listener
    /// instead of binding `--bind-address:--secure-port` (for embedding and tests).
    pub fn listener(mut self, listener: std::net::TcpListener) -> Self {
        self.listener = Some(listener);
        self
    }

    /// Uses this provider instead of building the one registered under `--cloud-provider`
    /// (which then defaults to the provider's name). For embedding and tests.
    pub fn provider(mut self, provider: Arc<dyn CloudProvider>) -> Self {
        self.provider = Some(provider);
        self
    }

    /// Replaces [`informer::strip_node`](crate::strip_node), which removes from every
    /// Node, before it is cached, the fields no built-in controller or typical provider reads
    /// (images, capacity, most conditions, ...). Cached Nodes are what every controller reads
    /// and what load-balancer calls receive as hosts; if your provider or your own controller
    /// reads one of those fields, pass a function that removes less, at the cost of memory:
    /// `|node| if let Some(s) = node.status.as_mut() { s.images = None }` keeps all but the
    /// images.
    pub fn strip_cached_node(mut self, strip: fn(&mut Node)) -> Self {
        self.strip_node = strip;
        self
    }

    /// The number of worker threads of the runtime [`Builder::run`] starts, instead of
    /// the default: `TOKIO_WORKER_THREADS` when set to a positive number,
    /// else the machine's parallelism capped at 2.
    pub fn worker_threads(mut self, threads: usize) -> Self {
        self.worker_threads = Some(threads.max(1));
        self
    }

    /// Runs on a new multi-threaded tokio runtime ([`Builder::worker_threads`] workers);
    /// returns the process exit code.
    pub fn run(self) -> std::process::ExitCode {
        let threads = self.worker_threads.unwrap_or_else(default_worker_threads);
        let runtime = match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                init_logging(&LoggingArgs::default());
                tracing::error!("cannot start the tokio runtime: {e}");
                return std::process::ExitCode::FAILURE;
            }
        };
        let code = runtime.block_on(self.run_async());
        std::process::ExitCode::from(u8::try_from(code).unwrap_or(1))
    }

    /// Runs on the current tokio runtime until shutdown; returns the exit code (0 after a
    /// graceful shutdown, non-zero on a startup error or a lost lease).
    pub async fn run_async(self) -> i32 {
        match self.start().await {
            Ok(code) => code,
            Err(Exit(code)) => code,
        }
    }

    fn command(&self) -> Result<Command, String> {
        let mut cmd = V::augment_args(Options::augment_args(Command::new(
            "cloud-controller-manager",
        )))
        .version(self.version)
        .about("The cloud controller manager is a daemon that embeds the cloud specific control loops shipped with Kubernetes.")
        .long_about(None)
        // pflag: a repeated flag overrides the earlier value.
        .args_override_self(true);
        let mut defaults = self.defaults.clone();
        if let Some(p) = &self.provider {
            defaults.insert(
                0,
                ("cloud-provider".to_owned(), p.provider_name().to_owned()),
            );
        }
        for (flag, value) in defaults {
            let id = cmd
                .get_arguments()
                .find(|a| a.get_long() == Some(flag.as_str()))
                .map(|a| a.get_id().clone())
                .ok_or_else(|| format!("Builder::default_value: there is no flag --{flag}"))?;
            cmd = cmd.mut_arg(id, |a| a.default_value(value));
        }
        Ok(cmd)
    }

    async fn start(mut self) -> Result<i32, Exit> {
        // 1. Flags.
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
        let (options, vendor) = match (
            Options::from_arg_matches(&matches),
            V::from_arg_matches(&matches),
        ) {
            (Ok(o), Ok(v)) => (o, v),
            (Err(e), _) | (_, Err(e)) => {
                let _ = e.format(&mut cmd).print();
                return Err(Exit(2));
            }
        };

        // 2. Logging.
        init_logging(&options.logging);
        tracing::info!(version = self.version, "starting cloud-controller-manager");
        for warning in options.warnings() {
            tracing::warn!("{warning}");
        }

        // 3. Validation.
        if let Err(errors) = options.validate() {
            for e in &errors {
                tracing::error!("{e}");
            }
            return Err(Exit(1));
        }
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
        let mut enabled: Vec<ControllerEntry> = self
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

        // 4. The provider.
        let provider = match self.provider.take() {
            Some(p) => {
                if options.cloud.cloud_config.is_some() {
                    tracing::warn!(
                        "--cloud-config is not read: the provider was given to Builder::provider"
                    );
                }
                p
            }
            None => {
                // An empty `--cloud-config=` means none, as in Go.
                let cloud_config = match options
                    .cloud
                    .cloud_config
                    .as_ref()
                    .filter(|p| !p.as_os_str().is_empty())
                {
                    Some(path) => Some(std::fs::read(path).map_err(|e| {
                        fail(format_args!(
                            "invalid value for --cloud-config: cannot read {}: {e}",
                            path.display()
                        ))
                    })?),
                    None => None,
                };
                let name = options.cloud.cloud_provider.as_deref().unwrap_or_default();
                ccm_core::build_provider(name, cloud_config.as_deref())
                    .map_err(|e| fail(format_args!("--cloud-provider={name}: {e}")))?
            }
        };
        if !provider.has_cluster_id() {
            if options.cloud.allow_untagged_cloud {
                tracing::warn!(
                    "detected a cluster without a ClusterID. A ClusterID will be required in the future. Please tag your cluster to avoid any future issues"
                );
            } else {
                return Err(fail(format_args!(
                    "no ClusterID found. A ClusterID is required for the cloud provider to function properly. This check can be bypassed by setting --allow-untagged-cloud"
                )));
            }
        }
        check_routes(&options, &enabled, provider.as_ref())?;
        crate::runtime::builtin::check_node_ipam(&options, &mut enabled, &self.cidr_allocators)
            .map_err(|e| fail(format_args!("{e}")))?;

        // 5. Metrics, budget.
        let metrics = MetricsRegistry::new();
        let budget_config = BudgetConfig {
            rate_limit: options.budget.cloud_api_qps.zip(options.cloud_api_burst()),
            timeout: options.cloud_api_timeout(),
        };
        let budgeted = BudgetedProvider::new(provider, &budget_config, &metrics);
        let workqueue_metrics = WorkQueueMetrics::register(&metrics);
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

        // 6. Clients: one per controller, as Go's client builders (see `crate::runtime::client`).
        let config = crate::runtime::client::load_config(&options)
            .await
            .map_err(|e| fail(format_args!("{e}")))?;
        let use_service_accounts = options.use_service_account_credentials();
        let clients = crate::runtime::client::ClientFactory::new(
            config,
            options.kube.kube_api_qps,
            options.kube.kube_api_burst,
            self.version,
            &metrics,
            use_service_accounts,
        )
        .map_err(|e| fail(format_args!("{e}")))?;
        if use_service_accounts {
            tracing::info!(
                "--use-service-account-credentials: each controller authenticates as its own ServiceAccount in kube-system"
            );
        }
        let client = clients.root();
        let informer_client = clients
            .root_credentials_client(crate::runtime::client::INFORMERS_CLIENT_NAME)
            .map_err(|e| fail(format_args!("{e}")))?;
        // The Event writer's own client, for Events not recorded by a controller.
        let event_client = clients
            .root_credentials_client(crate::runtime::client::ROOT_CLIENT_NAME)
            .map_err(|e| fail(format_args!("{e}")))?;

        // 7. Serving.
        let election = options.leader_election.leader_elect;
        let health = Health::new(if election {
            LeaderState::Standby { healthy: true }
        } else {
            LeaderState::Disabled
        });
        let serve_stop = CancellationToken::new();
        // Stops the server also when this future is dropped (a "killed" runtime).
        let _serve_guard = serve_stop.clone().drop_guard();
        let router = health::router(health.clone(), metrics.clone());
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
                        serve_stop.clone(),
                    )
                    .await
                    .map_err(|e| fail(format_args!("serving /healthz and /metrics: {e}")))?,
                )
            }
            None => secure_serving::serve(router, secure, client.clone(), serve_stop.clone())
                .await
                .map_err(|e| {
                    fail(format_args!(
                        "serving on --bind-address={} --secure-port={}: {e}",
                        secure.bind_address, secure.secure_port
                    ))
                })?,
        };

        // 8. Shutdown signal.
        let shutdown = CancellationToken::new();
        let signal = self
            .shutdown_signal
            .take()
            .unwrap_or_else(|| Box::pin(os_signal()));
        let signal_task = {
            let shutdown = shutdown.clone();
            AbortOnDropHandle::new(tokio::spawn(async move {
                tokio::select! {
                    () = signal => {
                        tracing::info!("shutdown requested: finishing in-flight work");
                        shutdown.cancel();
                    }
                    () = shutdown.cancelled() => {}
                }
            }))
        };

        // 9. Leader election, then the controllers.
        let identity = leader::default_identity();
        let env = LeadEnv {
            options: Arc::new(options),
            vendor: Arc::new(vendor),
            client,
            informer_client,
            clients,
            event_client,
            budgeted,
            metrics,
            workqueue_metrics,
            running,
            health: health.clone(),
            identity: identity.clone(),
            enabled,
            strip_node: self.strip_node,
        };
        let code = if election {
            let lease = LeaseLabel {
                name: env
                    .options
                    .leader_election
                    .leader_elect_resource_name
                    .clone(),
            };
            master_status.get_or_create(&lease).set(0);
            let config = ElectionConfig::from_args(&env.options.leader_election, identity);
            tracing::info!(identity = %config.identity, lease = %format!("{}/{}", config.namespace, config.name), "attempting to acquire the leader lease");
            match leader::acquire(&env.client, &config, &health.leader, &shutdown).await {
                None => 0,
                Some(manager) => {
                    tracing::info!(identity = %config.identity, "became the leader");
                    health.leader.send_replace(LeaderState::Leading);
                    master_status.get_or_create(&lease).set(1);
                    let mut held = leader::hold(manager, env.client.clone(), &config);
                    let outcome = env.lead(&shutdown, Some(&mut held.lost)).await;
                    match outcome {
                        Lead::Lost(reason) => {
                            tracing::error!("leaderelection lost: {reason}");
                            health.leader.send_replace(LeaderState::Lost);
                            master_status.get_or_create(&lease).set(0);
                            1
                        }
                        Lead::Done(code) => {
                            held.release(Duration::from_secs(5)).await;
                            master_status.get_or_create(&lease).set(0);
                            code
                        }
                    }
                }
            }
        } else {
            match env.lead(&shutdown, None).await {
                Lead::Lost(_) => 1,
                Lead::Done(code) => code,
            }
        };

        // 10. Stop serving.
        health.shutting_down.store(true, Ordering::SeqCst);
        shutdown.cancel();
        let _ = signal_task.await;
        serve_stop.cancel();
        if let Some(server) = server {
            // The server drains open connections for at most ten seconds.
            let _ = tokio::time::timeout(Duration::from_secs(15), server.wait()).await;
        }
        tracing::info!(code, "cloud-controller-manager stopped");
        Ok(code)
    }
}

/// An early exit with this code (the reason is already logged).
struct Exit(i32);

fn fail(message: std::fmt::Arguments<'_>) -> Exit {
    tracing::error!("{message}");
    Exit(1)
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ManagedLabels {
    manager: String,
    name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaseLabel {
    name: String,
}

enum Lead {
    /// Stopped (signal, or a fatal controller/initialize error) with this exit code; the lease
    /// may be released.
    Done(i32),
    /// The lease was lost.
    Lost(String),
}

struct LeadEnv {
    options: Arc<Options>,
    vendor: Arc<dyn Any + Send + Sync>,
    /// The root client (leader election, the provider's `initialize`).
    client: Client,
    /// The shared informers' client (root credentials).
    informer_client: Client,
    /// Makes each controller's client.
    clients: crate::runtime::client::ClientFactory,
    /// The Event writer's own client (Events of no controller).
    event_client: Client,
    budgeted: Arc<BudgetedProvider>,
    metrics: Arc<MetricsRegistry>,
    workqueue_metrics: WorkQueueMetrics,
    running: Family<ManagedLabels, Gauge>,
    health: Arc<Health>,
    identity: String,
    enabled: Vec<ControllerEntry>,
    strip_node: fn(&mut Node),
}

/// Resolves when the lease is lost (never when there is no election).
async fn lost_signal(lost: &mut Option<&mut oneshot::Receiver<String>>) -> String {
    match lost {
        Some(rx) => match (&mut **rx).await {
            Ok(reason) => reason,
            // The renewal task ended without a message: it was told to release.
            Err(_) => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

impl LeadEnv {
    fn managed(&self, entry: &ControllerEntry) -> ManagedLabels {
        ManagedLabels {
            manager: "cloud-controller-manager".to_owned(),
            name: entry.metric_name().to_owned(),
        }
    }

    /// Runs the informers, `initialize` and the controllers until shutdown, a lost lease or a
    /// fatal error; then drains.
    async fn lead(
        &self,
        shutdown: &CancellationToken,
        mut lost: Option<&mut oneshot::Receiver<String>>,
    ) -> Lead {
        let work = shutdown.child_token();
        let mut informers = JoinSet::new();
        // One Event writer for the process. It stops after the controllers drained (not with
        // `work`), so the Events of their last in-flight work are flushed too.
        let (events, event_writer) =
            EventBroadcaster::new(self.event_client.clone(), &self.identity, &self.metrics);
        let events_stop = CancellationToken::new();
        let event_writer = AbortOnDropHandle::new(tokio::spawn(
            event_writer.run(events_stop.clone(), DEFAULT_FLUSH_TIMEOUT),
        ));
        let ctx = ControllerContext::start(
            ContextParams {
                client: self.informer_client.clone(),
                clients: Some(self.clients.clone()),
                cloud: self.budgeted.clone(),
                metrics: self.metrics.clone(),
                workqueue_metrics: self.workqueue_metrics.clone(),
                shutdown: work.clone(),
                cluster_name: self.options.cluster_name().to_owned(),
                identity: self.identity.clone(),
                strip_node: self.strip_node,
                events,
            },
            &mut informers,
        );
        let mut controllers: JoinSet<(usize, Result<(), ControllerError>)> = JoinSet::new();

        let outcome: Option<Lead> = 'run: {
            // Wait for the shared informers.
            tokio::select! {
                synced = ctx.wait_for_sync() => {
                    if synced {
                        self.health.synced.store(true, Ordering::SeqCst);
                        tracing::info!("shared informers synced");
                    } else if !work.is_cancelled() {
                        tracing::error!("shared informers stopped before they synced");
                        break 'run Some(Lead::Done(1));
                    }
                }
                () = work.cancelled() => break 'run None,
                reason = lost_signal(&mut lost) => break 'run Some(Lead::Lost(reason)),
            }
            if work.is_cancelled() {
                break 'run None;
            }
            // Initialize the provider.
            let init = self.budgeted.initialize(InitContext::new(
                Some(self.client.clone()),
                work.clone(),
                self.options.cluster_name(),
            ));
            tokio::select! {
                result = init => if let Err(e) = result {
                    tracing::error!("cloud provider initialize failed: {e}");
                    break 'run Some(Lead::Done(1));
                },
                () = work.cancelled() => break 'run None,
                reason = lost_signal(&mut lost) => break 'run Some(Lead::Lost(reason)),
            }
            // Start the controllers.
            let args = StartArgs {
                options: self.options.clone(),
                vendor: self.vendor.clone(),
            };
            let interval = self.options.generic.controller_start_interval;
            for (i, entry) in self.enabled.iter().enumerate() {
                if work.is_cancelled() {
                    break;
                }
                tracing::info!(controller = %entry.name, client = entry.client_name(), "starting controller");
                // The controller's own client (with --use-service-account-credentials its
                // ServiceAccount's token, fetched now, as Go's `ClientOrDie`).
                let own = tokio::select! {
                    own = ctx.clone().for_client(entry.client_name()) => own,
                    () = work.cancelled() => break,
                    reason = lost_signal(&mut lost) => break 'run Some(Lead::Lost(reason)),
                };
                let own = match own {
                    Ok(own) => own,
                    Err(e) => {
                        tracing::error!(controller = %entry.name, "cannot start the controller: {e}");
                        break 'run Some(Lead::Done(1));
                    }
                };
                self.running.get_or_create(&self.managed(entry)).set(1);
                let fut = (entry.start)(own, args.clone());
                controllers.spawn(async move { (i, fut.await) });
                if !interval.is_zero() && i + 1 < self.enabled.len() {
                    tokio::select! {
                        () = tokio::time::sleep(interval) => {}
                        () = work.cancelled() => {}
                    }
                }
            }
            // Run until told to stop.
            loop {
                tokio::select! {
                    () = work.cancelled() => break 'run None,
                    reason = lost_signal(&mut lost) => break 'run Some(Lead::Lost(reason)),
                    Some(joined) = controllers.join_next() => {
                        match self.finished(joined) {
                            Ok(()) => {}
                            Err(()) => break 'run Some(Lead::Done(1)),
                        }
                    }
                }
            }
        };

        work.cancel();
        let lead = match outcome {
            Some(Lead::Lost(reason)) => {
                // Another process leads now: stop at once (queued Events are dropped, as the
                // Go process exits at once).
                controllers.abort_all();
                informers.abort_all();
                event_writer.abort();
                self.stop_all();
                return Lead::Lost(reason);
            }
            Some(Lead::Done(code)) => Lead::Done(code),
            None => Lead::Done(0),
        };
        self.health.shutting_down.store(true, Ordering::SeqCst);
        let grace = self.options.serving.shutdown_grace_period;
        tracing::info!(
            grace = %format_go_duration(grace),
            in_flight_cloud_calls = self.budgeted.in_flight(),
            "stopping controllers; waiting for in-flight work"
        );
        let drain = async {
            while let Some(joined) = controllers.join_next().await {
                let _ = self.finished(joined);
            }
            self.budgeted.wait_idle(grace).await
        };
        let drained = tokio::time::timeout(grace, drain).await.unwrap_or(false);
        if !drained {
            tracing::warn!(
                in_flight_cloud_calls = self.budgeted.in_flight(),
                "--shutdown-grace-period elapsed with work in flight; abandoning it"
            );
            controllers.abort_all();
        }
        // The controllers are done: flush their queued Events (bounded by the flush timeout).
        events_stop.cancel();
        let _ = event_writer.await;
        informers.abort_all();
        while informers.join_next().await.is_some() {}
        self.stop_all();
        lead
    }

    /// Handles a controller task that ended. `Err(())` means fatal.
    fn finished(
        &self,
        joined: Result<(usize, Result<(), ControllerError>), tokio::task::JoinError>,
    ) -> Result<(), ()> {
        match joined {
            Ok((i, result)) => {
                let Some(entry) = self.enabled.get(i) else {
                    return Ok(());
                };
                self.running.get_or_create(&self.managed(entry)).set(0);
                match result {
                    Ok(()) => {
                        tracing::info!(controller = %entry.name, "controller stopped");
                        Ok(())
                    }
                    Err(e @ ControllerError::MissingCapability { .. }) => {
                        tracing::warn!(controller = %entry.name, "skipping controller: {e}");
                        Ok(())
                    }
                    Err(e) => {
                        tracing::error!(controller = %entry.name, "controller failed: {e}");
                        Err(())
                    }
                }
            }
            Err(e) if e.is_cancelled() => Ok(()),
            Err(e) => {
                tracing::error!("a controller panicked: {e}");
                Err(())
            }
        }
    }

    fn stop_all(&self) {
        for entry in &self.enabled {
            self.running.get_or_create(&self.managed(entry)).set(0);
        }
    }
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

/// Installs the global tracing subscriber (once per process; later calls keep the first).
/// `RUST_LOG` wins over `-v` and `--vmodule`; `--logging-format` picks text or JSON; with
/// `--log-{text,json}-split-stream`, errors go to stderr and the rest to stdout (Go's split).
fn init_logging(args: &LoggingArgs) {
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        let (directives, _) = args.vmodule_directives();
        let spec = std::iter::once(args.level().to_owned())
            .chain(directives)
            .collect::<Vec<_>>()
            .join(",");
        EnvFilter::try_new(&spec).unwrap_or_else(|_| EnvFilter::new(args.level()))
    });
    let writer = if args.split_stream() {
        BoxMakeWriter::new(
            std::io::stderr
                .with_max_level(tracing::Level::ERROR)
                .or_else(std::io::stdout),
        )
    } else {
        BoxMakeWriter::new(std::io::stderr)
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    let _ = match args.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Parses `args` (the first is the program name) into the runtime's [`Options`] and the
/// vendor's `V`, with the same command the runtime uses; for tests and tools.
pub fn parse_flags<V>(args: &[&str]) -> Result<(Options, V), clap::Error>
where
    V: Args + FromArgMatches,
{
    let cmd = V::augment_args(Options::augment_args(
        Command::new("cloud-controller-manager").args_override_self(true),
    ));
    let matches = cmd.try_get_matches_from(args)?;
    Ok((
        Options::from_arg_matches(&matches)?,
        V::from_arg_matches(&matches)?,
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn the_runtime_starts_few_worker_threads_unless_told() {
        let threads = default_worker_threads();
        match std::env::var("TOKIO_WORKER_THREADS") {
            Ok(v) if v.trim().parse::<usize>().is_ok_and(|n| n > 0) => {
                assert_eq!(threads, v.trim().parse::<usize>().unwrap());
            }
            _ => {
                let cores = std::thread::available_parallelism().unwrap().get();
                assert_eq!(threads, cores.min(MAX_DEFAULT_WORKER_THREADS));
            }
        }
    }
}

//! [`Builder`]: what a vendor configures (flags, controllers, defaults, provider, listener),
//! the command line it parses, and the tokio runtime it runs on. The startup itself is in
//! `start.rs`.

use std::ffi::OsString;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use ccm_core::{CloudProvider, Node};
use clap::{Args, Command, FromArgMatches};

use super::entry::{ControllerEntry, NoArgs, StartArgs};
use super::logging::init_logging;
use super::runtime_args;
use crate::machinery::context::ControllerContext;
use crate::machinery::error::ControllerError;
use crate::options::LoggingArgs;

/// The future that stops the process (SIGTERM/SIGINT unless [`Builder::shutdown_signal`]).
pub(super) type Signal = Pin<Box<dyn Future<Output = ()> + Send>>;

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
    pub(super) controllers: Vec<ControllerEntry>,
    pub(super) cidr_allocators: crate::controllers::node_ipam::CidrAllocators,
    defaults: Vec<(String, String)>,
    pub(super) args: Option<Vec<OsString>>,
    pub(super) shutdown_signal: Option<Signal>,
    pub(super) version: &'static str,
    pub(super) listener: Option<std::net::TcpListener>,
    pub(super) provider: Option<Arc<dyn CloudProvider>>,
    pub(super) strip_node: fn(&mut Node),
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
    /// `|_| {}` keeps every field the informer decodes. Two fields are never decoded, so no
    /// function sees them: `metadata.managedFields` and `status.images` (most of a Node's
    /// size, and of the CPU time decoding it).
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
        // `start.rs` holds the startup steps; it imports this file, never the other way.
        self.start().await
    }

    pub(super) fn command(&self) -> Result<Command, String> {
        let mut cmd = V::augment_args(runtime_args(Command::new("cloud-controller-manager")))
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
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// A vendor's flags.
    #[derive(clap::Args, Debug)]
    struct VendorArgs {
        /// A flag of the vendor's, without a heading of its own.
        #[arg(long, default_value_t = false)]
        acme_tag_volumes: bool,
    }

    #[test]
    fn vendor_flags_without_a_heading_are_not_listed_in_a_runtime_group() {
        let mut cmd = Builder::new().with_args::<VendorArgs>().command().unwrap();
        let help = cmd.render_long_help().to_string();
        let vendor = help.find("--acme-tag-volumes").expect("the vendor's flag");
        let first_group = help
            .find("\nCloud provider:")
            .expect("the first runtime group");
        assert!(vendor < first_group, "listed in a runtime group:\n{help}");
    }

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

//! The controller table's entry and its start types: what [`Builder`](super::Builder) and the
//! built-in table ([`builtin`](super::builtin)) both name. A leaf of the runtime, so the table and
//! the builder do not import each other.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use clap::{ArgMatches, Args, Command, FromArgMatches};
use futures::FutureExt;

use crate::machinery::context::ControllerContext;
use crate::machinery::error::ControllerError;
use crate::options::Options;

/// The future a controller's start function returns.
pub type ControllerFuture = Pin<Box<dyn Future<Output = Result<(), ControllerError>> + Send>>;

/// A controller's start function: runs the controller until `ctx.shutdown` fires.
pub type StartFn = Arc<dyn Fn(ControllerContext, StartArgs) -> ControllerFuture + Send + Sync>;

/// What a controller's start function receives besides the context: the parsed flags.
#[derive(Clone)]
pub struct StartArgs {
    /// The runtime's flags.
    pub options: Arc<Options>,
    pub(crate) vendor: Arc<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for StartArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StartArgs")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl StartArgs {
    /// Start arguments with these flags and no vendor flags (for tests and embedding, e.g. the
    /// controller harness of `ccm-testing`; the runtime builds its own).
    pub fn new(options: Arc<Options>) -> Self {
        StartArgs {
            options,
            vendor: Arc::new(NoArgs),
        }
    }

    /// The vendor's own flags, as added with [`Builder::with_args`](crate::Builder::with_args); `None` if `V` is not that
    /// type.
    pub fn vendor<V: 'static>(&self) -> Option<&V> {
        self.vendor.downcast_ref::<V>()
    }
}

/// One entry of the controller table: a canonical name, aliases for `--controllers`, and the
/// start function.
#[derive(Clone)]
pub struct ControllerEntry {
    /// Canonical name (used in `--controllers`, logs and events).
    pub name: String,
    /// Other names accepted by `--controllers`; the first one is the
    /// `running_managed_controllers` label value (Go uses the short names there).
    pub aliases: Vec<String>,
    /// When true, `*` does not enable it (only an explicit `--controllers=name`).
    pub disabled_by_default: bool,
    /// The name of the controller's client (Go's `ControllerInitContext.ClientName`): the end
    /// of its user agent and, with `--use-service-account-credentials`, its ServiceAccount in
    /// `kube-system`. `None`: the controller's name.
    pub client_name: Option<String>,
    /// Starts the controller.
    pub start: StartFn,
}

impl std::fmt::Debug for ControllerEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerEntry")
            .field("name", &self.name)
            .field("aliases", &self.aliases)
            .field("disabled_by_default", &self.disabled_by_default)
            .field("client_name", &self.client_name)
            .finish_non_exhaustive()
    }
}

impl ControllerEntry {
    /// An entry enabled by `*`, without aliases.
    pub fn new<F, Fut>(name: &str, start: F) -> Self
    where
        F: Fn(ControllerContext, StartArgs) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), ControllerError>> + Send + 'static,
    {
        ControllerEntry {
            name: name.to_owned(),
            aliases: Vec::new(),
            disabled_by_default: false,
            client_name: None,
            start: Arc::new(move |ctx, args| start(ctx, args).boxed()),
        }
    }

    /// Adds an alias.
    pub fn alias(mut self, alias: &str) -> Self {
        self.aliases.push(alias.to_owned());
        self
    }

    /// Makes `*` skip it.
    pub fn disabled_by_default(mut self) -> Self {
        self.disabled_by_default = true;
        self
    }

    /// Names the controller's client (default: the controller's name). The controller's
    /// [`ControllerContext::client`] is then that client: with
    /// `--use-service-account-credentials` it authenticates as ServiceAccount
    /// `kube-system/<name>` (the built-in controllers use `node-controller`,
    /// `service-controller` and `route-controller`, whose RBAC kube-apiserver's bootstrap policy
    /// grants), else it has the main credentials and a user agent ending in `/<name>`.
    pub fn client(mut self, name: &str) -> Self {
        self.client_name = Some(name.to_owned());
        self
    }

    /// The name of the controller's client.
    pub fn client_name(&self) -> &str {
        self.client_name.as_deref().unwrap_or(&self.name)
    }

    pub(crate) fn metric_name(&self) -> &str {
        self.aliases.first().unwrap_or(&self.name)
    }
}

/// No vendor flags (the default of [`Builder`](crate::Builder)).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoArgs;

impl FromArgMatches for NoArgs {
    fn from_arg_matches(_: &ArgMatches) -> Result<Self, clap::Error> {
        Ok(NoArgs)
    }
    fn update_from_arg_matches(&mut self, _: &ArgMatches) -> Result<(), clap::Error> {
        Ok(())
    }
}

impl Args for NoArgs {
    fn augment_args(cmd: Command) -> Command {
        cmd
    }
    fn augment_args_for_update(cmd: Command) -> Command {
        cmd
    }
}

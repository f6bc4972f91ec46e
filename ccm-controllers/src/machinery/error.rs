//! The error a controller's `run` returns when it cannot run at all.

/// Why a controller could not start or keep running. Per-object failures are not errors of
/// this kind: they are retried with backoff and reported as events.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControllerError {
    /// The provider lacks a capability the controller needs (the controller is not started).
    #[error("{controller}: the cloud provider does not support {capability}")]
    MissingCapability {
        /// The controller's canonical name.
        controller: &'static str,
        /// The capability, e.g. `load_balancer`.
        capability: &'static str,
    },
    /// The shared informers stopped before their first list completed.
    #[error("{0}: shared informers stopped before they synced")]
    NotSynced(&'static str),
    /// The controller's configuration is invalid.
    #[error("{controller}: {message}")]
    Config {
        /// The controller's canonical name.
        controller: &'static str,
        /// What is wrong, naming the flag.
        message: String,
    },
    /// A Kubernetes API call the controller cannot continue without failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

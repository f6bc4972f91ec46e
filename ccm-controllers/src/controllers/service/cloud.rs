//! The service controller's calls to the provider's [`LoadBalancer`], each answer sorted into
//! what the caller does next, as Go's `syncLoadBalancerIfNeeded` and `nodeSyncService` read
//! them: `ImplementedElsewhere` means another component owns the load balancer, `Retry` is
//! honoured with exactly the provider's delay, anything else is reported and retried with the
//! work queue's backoff.

use std::time::Duration;

use ccm_core::{CloudError, LoadBalancer, NodeView};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Service};

/// A load-balancer call that did not succeed, by what the caller does next.
pub(super) enum CallError {
    /// `ImplementedElsewhere`: another component owns this load balancer; nothing to do.
    Elsewhere,
    /// `Retry`: call again after this delay.
    Retry(Duration),
    /// Any other error: reported (Event, log) and retried with backoff.
    Failed(CloudError),
}

impl std::fmt::Display for CallError {
    /// The provider's error, as the Events and logs quote it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Elsewhere => CloudError::ImplementedElsewhere.fmt(f),
            CallError::Retry(after) => write!(f, "retry after {after:?}"),
            CallError::Failed(error) => error.fmt(f),
        }
    }
}

impl From<CloudError> for CallError {
    fn from(error: CloudError) -> Self {
        match error {
            CloudError::ImplementedElsewhere => CallError::Elsewhere,
            CloudError::Retry { after, .. } => CallError::Retry(after),
            error => CallError::Failed(error),
        }
    }
}

/// `ensure_load_balancer` with `hosts`: the status to write.
pub(super) async fn ensure(
    lb: &dyn LoadBalancer,
    cluster: &str,
    service: &Service,
    hosts: &[NodeView],
) -> Result<LoadBalancerStatus, CallError> {
    Ok(lb.ensure_load_balancer(cluster, service, hosts).await?)
}

/// `update_load_balancer` with `hosts` (the node-sync path).
pub(super) async fn update(
    lb: &dyn LoadBalancer,
    cluster: &str,
    service: &Service,
    hosts: &[NodeView],
) -> Result<(), CallError> {
    Ok(lb.update_load_balancer(cluster, service, hosts).await?)
}

/// `ensure_load_balancer_deleted`. `ImplementedElsewhere` counts as deleted: there is nothing
/// of ours to delete.
pub(super) async fn delete(
    lb: &dyn LoadBalancer,
    cluster: &str,
    service: &Service,
) -> Result<(), CallError> {
    match lb.ensure_load_balancer_deleted(cluster, service).await {
        Ok(()) | Err(CloudError::ImplementedElsewhere) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// `get_load_balancer`: whether the load balancer exists. `ImplementedElsewhere` is no answer
/// to that question: the callers report it as a failure, as Go does.
pub(super) async fn exists(
    lb: &dyn LoadBalancer,
    cluster: &str,
    service: &Service,
) -> Result<bool, CallError> {
    Ok(lb.get_load_balancer(cluster, service).await?.is_some())
}

//! The error every provider method returns, and what the framework does with each variant.

use std::time::Duration;

/// A boxed error that keeps its source chain, as providers produce it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The error a cloud provider returns from any capability method.
///
/// The variants mirror the sentinel errors of Go's `k8s.io/cloud-provider` (`InstanceNotFound`,
/// `NotImplemented`, `ImplementedElsewhere`, `api.RetryError`) plus [`CloudError::Other`] for
/// everything else. Each variant documents how the framework's controllers treat it. New variants
/// may be added in a minor release, so match with a wildcard arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CloudError {
    /// The instance does not exist in the cloud.
    ///
    /// Only meaningful where a method documents it (the legacy [`Instances`](crate::Instances)
    /// lookups such as [`Instances::instance_id`](crate::Instances::instance_id)). The framework:
    /// - cloud-node controller (v1 path): the node stays tainted and is retried with backoff;
    /// - node-lifecycle controller: when returned by a *provider-ID lookup* it counts as "gone";
    ///   when returned by [`InstancesV2::instance_exists`](crate::InstancesV2::instance_exists) or
    ///   [`Instances::instance_exists_by_provider_id`](crate::Instances::instance_exists_by_provider_id)
    ///   it is an **error** and never deletes a Node (say "gone" with `Ok(false)` instead).
    #[error("instance not found")]
    InstanceNotFound,

    /// The provider does not implement this method.
    ///
    /// Tolerated where Go tolerates it: a missing instance ID leaves `spec.providerID` empty,
    /// a missing shutdown check means "not shut down". Elsewhere it is a failed call, retried
    /// with backoff.
    #[error("unimplemented")]
    NotImplemented,

    /// This load balancer is handled by another controller of the vendor.
    ///
    /// Returned by [`LoadBalancer::ensure_load_balancer`](crate::LoadBalancer::ensure_load_balancer)
    /// or [`LoadBalancer::update_load_balancer`](crate::LoadBalancer::update_load_balancer):
    /// the service controller treats the call as a success, keeps managing its finalizer, and
    /// does **not** write the Service status. It must never be returned by
    /// [`LoadBalancer::ensure_load_balancer_deleted`](crate::LoadBalancer::ensure_load_balancer_deleted).
    #[error("implemented elsewhere")]
    ImplementedElsewhere,

    /// The operation cannot complete yet; call again after `after`.
    ///
    /// Unlike Go (which honours `RetryError` only on `EnsureLoadBalancer`), every controller of
    /// this framework honours it on every path: the object is requeued after exactly `after`
    /// instead of its exponential backoff, and no failure event is emitted.
    #[error("{message} (retry after {after:?})")]
    Retry {
        /// How long to wait before the next attempt.
        after: Duration,
        /// Why the operation must be retried (shown in logs).
        message: String,
    },

    /// Any other failure: the call failed and is retried with the controller's backoff.
    ///
    /// Keep the original error as the source so its chain reaches the logs and events.
    #[error(transparent)]
    Other(BoxError),
}

impl CloudError {
    /// Wraps any error as [`CloudError::Other`], keeping it as the source.
    pub fn other<E>(error: E) -> Self
    where
        E: Into<BoxError>,
    {
        CloudError::Other(error.into())
    }

    /// Builds [`CloudError::Other`] from a message.
    pub fn msg(message: impl Into<String>) -> Self {
        CloudError::Other(message.into().into())
    }

    /// Builds [`CloudError::Retry`].
    pub fn retry(after: Duration, message: impl Into<String>) -> Self {
        CloudError::Retry {
            after,
            message: message.into(),
        }
    }

    /// The delay the provider asked for, when this is [`CloudError::Retry`].
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            CloudError::Retry { after, .. } => Some(*after),
            _ => None,
        }
    }

    /// True for [`CloudError::NotImplemented`].
    pub fn is_not_implemented(&self) -> bool {
        matches!(self, CloudError::NotImplemented)
    }

    /// True for [`CloudError::InstanceNotFound`].
    pub fn is_instance_not_found(&self) -> bool {
        matches!(self, CloudError::InstanceNotFound)
    }

    /// True for [`CloudError::ImplementedElsewhere`].
    pub fn is_implemented_elsewhere(&self) -> bool {
        matches!(self, CloudError::ImplementedElsewhere)
    }

    /// A short, stable, snake_case name of the variant, used as a metric label value.
    pub fn kind(&self) -> &'static str {
        match self {
            CloudError::InstanceNotFound => "instance_not_found",
            CloudError::NotImplemented => "not_implemented",
            CloudError::ImplementedElsewhere => "implemented_elsewhere",
            CloudError::Retry { .. } => "retry",
            CloudError::Other(_) => "error",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_keeps_source_and_message() {
        let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "cloud API timed out");
        let err = CloudError::other(io);
        assert_eq!(err.to_string(), "cloud API timed out");
        assert_eq!(err.kind(), "error");
    }

    #[test]
    fn retry_reports_delay() {
        let err = CloudError::retry(Duration::from_secs(7), "load balancer provisioning");
        assert_eq!(err.retry_after(), Some(Duration::from_secs(7)));
        assert_eq!(
            err.to_string(),
            "load balancer provisioning (retry after 7s)"
        );
        assert_eq!(CloudError::NotImplemented.retry_after(), None);
    }

    #[test]
    fn sentinel_messages_match_go() {
        assert_eq!(
            CloudError::InstanceNotFound.to_string(),
            "instance not found"
        );
        assert_eq!(CloudError::NotImplemented.to_string(), "unimplemented");
        assert_eq!(
            CloudError::ImplementedElsewhere.to_string(),
            "implemented elsewhere"
        );
        assert!(CloudError::NotImplemented.is_not_implemented());
        assert!(CloudError::InstanceNotFound.is_instance_not_found());
        assert!(CloudError::ImplementedElsewhere.is_implemented_elsewhere());
    }
}

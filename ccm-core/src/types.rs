//! Plain data types of the contract: instance metadata, zones, routes and provider IDs.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::NodeAddress;

/// Everything the cloud-node controller needs to initialise a Node, in one answer.
///
/// Returned by [`InstancesV2::instance_metadata`](crate::InstancesV2::instance_metadata); the
/// Rust counterpart of Go's `cloudprovider.InstanceMetadata`. Empty strings mean "unknown": the
/// corresponding labels are simply not written.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InstanceMetadata {
    /// The instance's provider ID, `<provider>://<id>` (see [`ProviderId`]). Must be stable for
    /// the life of the instance: `spec.providerID` is written once and never changed. May be
    /// empty only when the Node already carries a providerID.
    pub provider_id: String,
    /// The instance type, written to `node.kubernetes.io/instance-type` and
    /// `beta.kubernetes.io/instance-type`.
    pub instance_type: String,
    /// The instance's addresses, written to `status.addresses` (see the cloud-node controller
    /// docs for how kubelet's `Hostname` and `alpha.kubernetes.io/provided-node-ip` combine with
    /// them).
    pub node_addresses: Vec<NodeAddress>,
    /// The zone, written to `topology.kubernetes.io/zone` and
    /// `failure-domain.beta.kubernetes.io/zone`.
    pub zone: String,
    /// The region, written to `topology.kubernetes.io/region` and
    /// `failure-domain.beta.kubernetes.io/region`.
    pub region: String,
    /// Extra labels for the Node. Keys in the `kubernetes.io` or `k8s.io` namespaces are
    /// discarded, and labels the Node already has are never overwritten.
    pub additional_labels: BTreeMap<String, String>,
}

/// One Node's answer in a batch lookup
/// ([`InstancesBatch::describe_instances`](crate::InstancesBatch::describe_instances)).
///
/// Each variant says what the three [`InstancesV2`](crate::InstancesV2) calls would have
/// answered for that Node, so the framework treats it exactly like those answers:
///
/// | variant | `instance_exists` | `instance_shutdown` | `instance_metadata` |
/// |---|---|---|---|
/// | [`Found`](InstanceAnswer::Found) | `Ok(true)` | `Ok(false)` | `Ok(metadata)` |
/// | [`Shutdown`](InstanceAnswer::Shutdown) | `Ok(true)` | `Ok(true)` | `Ok(metadata)` |
/// | [`NotFound`](InstanceAnswer::NotFound) | `Ok(false)` | (not asked) | an error |
/// | [`Error`](InstanceAnswer::Error) | `Err(e)` | `Err(e)` | `Err(e)` |
///
/// ```
/// use ccm_core::{CloudError, InstanceAnswer, InstanceMetadata};
///
/// let found = InstanceAnswer::Found(InstanceMetadata::default());
/// assert_eq!(found.exists(), Some(true));
/// assert_eq!(found.is_shutdown(), Some(false));
/// assert_eq!(InstanceAnswer::NotFound.exists(), Some(false));
/// // An error is "unknown", never "gone".
/// assert_eq!(InstanceAnswer::Error(CloudError::msg("throttled")).exists(), None);
/// ```
#[derive(Debug)]
pub enum InstanceAnswer {
    /// The instance exists and is running; its metadata as
    /// [`InstancesV2::instance_metadata`](crate::InstancesV2::instance_metadata) would answer.
    Found(InstanceMetadata),
    /// The instance exists but is shut down (stopped); its metadata. The node-lifecycle
    /// controller adds the shutdown taint, as for `instance_shutdown` answering `Ok(true)`.
    Shutdown(InstanceMetadata),
    /// The instance is gone for good, as `instance_exists` answering `Ok(false)`: the
    /// node-lifecycle controller deletes the Node (with the same grace period). Only a provider
    /// that *knows* the instance is gone may answer this; never for an authorisation, network
    /// or rate-limit failure.
    NotFound,
    /// Nothing is known about this Node: the error a single call would have returned. The Node
    /// is left alone and looked up again later (a [`CloudError::Retry`](crate::CloudError::Retry)
    /// here delays only this Node). Never deletes a Node.
    Error(crate::CloudError),
}

impl InstanceAnswer {
    /// Whether the instance exists: `Some(true)` for `Found` and `Shutdown`, `Some(false)` for
    /// `NotFound`, `None` (unknown) for `Error`.
    pub fn exists(&self) -> Option<bool> {
        match self {
            InstanceAnswer::Found(_) | InstanceAnswer::Shutdown(_) => Some(true),
            InstanceAnswer::NotFound => Some(false),
            InstanceAnswer::Error(_) => None,
        }
    }

    /// Whether the instance is shut down: `Some(true)` for `Shutdown`, `Some(false)` for
    /// `Found` and `NotFound`, `None` (unknown) for `Error`.
    pub fn is_shutdown(&self) -> Option<bool> {
        match self {
            InstanceAnswer::Shutdown(_) => Some(true),
            InstanceAnswer::Found(_) | InstanceAnswer::NotFound => Some(false),
            InstanceAnswer::Error(_) => None,
        }
    }

    /// The metadata of an existing instance (`Found` or `Shutdown`).
    pub fn metadata(&self) -> Option<&InstanceMetadata> {
        match self {
            InstanceAnswer::Found(m) | InstanceAnswer::Shutdown(m) => Some(m),
            InstanceAnswer::NotFound | InstanceAnswer::Error(_) => None,
        }
    }

    /// The error of an `Error` answer.
    pub fn error(&self) -> Option<&crate::CloudError> {
        match self {
            InstanceAnswer::Error(e) => Some(e),
            _ => None,
        }
    }
}

/// The answer of one batch call ([`InstancesBatch::describe_instances`]): one
/// [`InstanceAnswer`] per Node, keyed by the Node's name (`metadata.name`).
///
/// A requested Node without an entry is **unknown** (as [`InstanceAnswer::Error`]), never
/// gone; entries for names that were not requested are ignored.
///
/// [`InstancesBatch::describe_instances`]: crate::InstancesBatch::describe_instances
pub type InstanceAnswers = BTreeMap<String, InstanceAnswer>;

/// The answer of one batch load-balancer call
/// ([`LoadBalancerHostsBatch::update_load_balancer_hosts`]): per Service, keyed
/// `namespace/name`, what [`LoadBalancer::update_load_balancer`] would have answered for it.
///
/// A requested Service without an entry was **not updated** (the framework updates it with a
/// single call); entries for Services that were not requested are ignored.
///
/// [`LoadBalancerHostsBatch::update_load_balancer_hosts`]: crate::LoadBalancerHostsBatch::update_load_balancer_hosts
/// [`LoadBalancer::update_load_balancer`]: crate::LoadBalancer::update_load_balancer
pub type LoadBalancerHostsAnswers = BTreeMap<String, Result<(), crate::CloudError>>;

/// A failure domain, as returned by the deprecated [`Zones`](crate::Zones) capability.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Zone {
    /// The zone (Go's `FailureDomain`).
    pub failure_domain: String,
    /// The region.
    pub region: String,
}

/// A route in the cloud's route table that sends a pod CIDR to a node.
///
/// The Rust counterpart of Go's `cloudprovider.Route`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Route {
    /// The cloud's name for the route. Ignored by
    /// [`Routes::create_route`](crate::Routes::create_route) (the name hint is passed
    /// separately); set it in [`Routes::list_routes`](crate::Routes::list_routes) results.
    pub name: String,
    /// The name of the Node the route targets. Routes with an empty target are never matched
    /// to a Node (and are deleted when inside the cluster CIDR).
    pub target_node: String,
    /// Set to true in `list_routes` results when the provider tracks
    /// [`Route::target_node_addresses`]: a route whose addresses no longer match the Node's
    /// `status.addresses` is then deleted and re-created. When false, address changes are
    /// ignored.
    pub enable_node_addresses: bool,
    /// The Node's addresses when the route was created (the framework passes the Node's
    /// `status.addresses` on create).
    pub target_node_addresses: Vec<NodeAddress>,
    /// The pod CIDR this route sends to the node, e.g. `10.244.3.0/24`.
    pub destination_cidr: String,
    /// True when the cloud reports the route as a blackhole (its target is gone). Blackhole
    /// routes inside the cluster CIDR are always deleted.
    pub blackhole: bool,
}

/// A parsed provider ID, `<provider>://<instance-id>`, the format of `spec.providerID`.
///
/// ```
/// use ccm_core::ProviderId;
///
/// let id: ProviderId = "acme://eu-1/vm-42".parse().unwrap();
/// assert_eq!(id.provider(), "acme");
/// assert_eq!(id.instance_id(), "eu-1/vm-42");
/// assert_eq!(id.to_string(), "acme://eu-1/vm-42");
/// assert!("vm-42".parse::<ProviderId>().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProviderId {
    provider: String,
    instance_id: String,
}

/// Why a string is not a valid provider ID.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProviderIdError {
    /// The string has no `://` separator.
    #[error("provider ID {0:?} is not of the form <provider>://<instance-id>")]
    MissingSeparator(String),
    /// The part before `://` is empty or not a valid provider name.
    #[error(
        "provider ID {0:?} has an invalid provider name (expected lowercase letters, digits, '-', '_' or '.' before \"://\")"
    )]
    InvalidProvider(String),
    /// The part after `://` is empty.
    #[error("provider ID {0:?} has an empty instance ID after \"://\"")]
    EmptyInstanceId(String),
    /// The string contains whitespace or control characters.
    #[error("provider ID {0:?} contains whitespace or control characters")]
    InvalidCharacters(String),
}

impl ProviderId {
    /// Builds a provider ID from its two parts, validating both.
    pub fn new(
        provider: impl Into<String>,
        instance_id: impl Into<String>,
    ) -> Result<Self, ProviderIdError> {
        let provider = provider.into();
        let instance_id = instance_id.into();
        let whole = format!("{provider}://{instance_id}");
        validate_provider_name(&provider, &whole)?;
        if instance_id.is_empty() {
            return Err(ProviderIdError::EmptyInstanceId(whole));
        }
        if instance_id
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(ProviderIdError::InvalidCharacters(whole));
        }
        Ok(ProviderId {
            provider,
            instance_id,
        })
    }

    /// The provider name, the part before `://`.
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// The instance ID, everything after `://` (may itself contain `/`).
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }
}

fn validate_provider_name(provider: &str, whole: &str) -> Result<(), ProviderIdError> {
    let valid = !provider.is_empty()
        && provider
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'));
    if valid {
        Ok(())
    } else {
        Err(ProviderIdError::InvalidProvider(whole.to_owned()))
    }
}

impl FromStr for ProviderId {
    type Err = ProviderIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let Some((provider, instance_id)) = s.split_once("://") else {
            return Err(ProviderIdError::MissingSeparator(s.to_owned()));
        };
        if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(ProviderIdError::InvalidCharacters(s.to_owned()));
        }
        validate_provider_name(provider, s)?;
        if instance_id.is_empty() {
            return Err(ProviderIdError::EmptyInstanceId(s.to_owned()));
        }
        Ok(ProviderId {
            provider: provider.to_owned(),
            instance_id: instance_id.to_owned(),
        })
    }
}

impl fmt::Display for ProviderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.provider, self.instance_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_answer_maps_to_the_single_calls() {
        let meta = InstanceMetadata {
            provider_id: "acme://vm-1".into(),
            ..Default::default()
        };
        let found = InstanceAnswer::Found(meta.clone());
        let shutdown = InstanceAnswer::Shutdown(meta.clone());
        let gone = InstanceAnswer::NotFound;
        let unknown = InstanceAnswer::Error(crate::CloudError::retry(
            std::time::Duration::from_secs(2),
            "429",
        ));
        assert_eq!(
            (found.exists(), found.is_shutdown(), found.metadata()),
            (Some(true), Some(false), Some(&meta))
        );
        assert_eq!(
            (
                shutdown.exists(),
                shutdown.is_shutdown(),
                shutdown.metadata()
            ),
            (Some(true), Some(true), Some(&meta))
        );
        assert_eq!(
            (gone.exists(), gone.is_shutdown(), gone.metadata()),
            (Some(false), Some(false), None)
        );
        assert_eq!(
            (unknown.exists(), unknown.is_shutdown(), unknown.metadata()),
            (None, None, None)
        );
        assert!(found.error().is_none());
        assert_eq!(
            unknown.error().and_then(crate::CloudError::retry_after),
            Some(std::time::Duration::from_secs(2))
        );
    }

    #[test]
    fn parses_and_formats() {
        let id: ProviderId = "gce://project/zone/vm-1".parse().unwrap();
        assert_eq!(id.provider(), "gce");
        assert_eq!(id.instance_id(), "project/zone/vm-1");
        assert_eq!(id.to_string(), "gce://project/zone/vm-1");
        assert_eq!(ProviderId::new("gce", "project/zone/vm-1").unwrap(), id);
    }

    #[test]
    fn aws_style_triple_slash_keeps_leading_slash_in_id() {
        let id: ProviderId = "aws:///us-east-1a/i-0abc".parse().unwrap();
        assert_eq!(id.provider(), "aws");
        assert_eq!(id.instance_id(), "/us-east-1a/i-0abc");
    }

    #[test]
    fn rejects_malformed() {
        assert_eq!(
            "vm-1".parse::<ProviderId>().unwrap_err(),
            ProviderIdError::MissingSeparator("vm-1".into())
        );
        assert_eq!(
            "://vm-1".parse::<ProviderId>().unwrap_err(),
            ProviderIdError::InvalidProvider("://vm-1".into())
        );
        assert_eq!(
            "Acme://vm-1".parse::<ProviderId>().unwrap_err(),
            ProviderIdError::InvalidProvider("Acme://vm-1".into())
        );
        assert_eq!(
            "acme://".parse::<ProviderId>().unwrap_err(),
            ProviderIdError::EmptyInstanceId("acme://".into())
        );
        assert_eq!(
            "acme://vm 1".parse::<ProviderId>().unwrap_err(),
            ProviderIdError::InvalidCharacters("acme://vm 1".into())
        );
        assert!(ProviderId::new("acme", "").is_err());
        let msg = "vm-1".parse::<ProviderId>().unwrap_err().to_string();
        assert!(msg.contains("<provider>://<instance-id>"), "{msg}");
    }
}

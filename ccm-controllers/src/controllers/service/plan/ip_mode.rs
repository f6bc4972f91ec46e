//! The `ipMode` of the ingress entries the controller writes (KEP-1860; beyond Go, which writes
//! whatever the provider returns). Pure: no I/O.
//!
//! The rule, for every ingress entry with an `ip`: the entry's own `ipMode` from the provider
//! (when it is `VIP` or `Proxy`), else the mode the Service asks for with
//! [`ANNOTATION_IP_MODE`] when the provider's [`IpModes`] for its class allow it, else the
//! class's [`IpModes::default_mode`] (by default `VIP`). An entry without an `ip` (a hostname)
//! never carries an `ipMode`: the API server rejects one there. A refused or invalid annotation
//! leaves the status at the class's default and is reported ([`IpModeRequest::Refused`]).

use ccm_core::{ANNOTATION_IP_MODE, IpMode, IpModes};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Service};

/// Event reason of a refused `service.ccm-rs.io/ip-mode` annotation (Warning).
pub(crate) const REASON_IP_MODE_NOT_ALLOWED: &str = "IPModeNotAllowed";

/// What the Service's [`ANNOTATION_IP_MODE`] asks for, judged against the class's [`IpModes`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum IpModeRequest {
    /// No annotation: the class's default.
    None,
    /// A mode the class allows.
    Allowed(IpMode),
    /// An invalid or not allowed value: the class's default is written; the note says why
    /// (the Warning Event's message).
    Refused(String),
}

/// Judges the Service's [`ANNOTATION_IP_MODE`] against `modes` (the class's declaration).
pub(crate) fn ip_mode_request(service: &Service, modes: IpModes) -> IpModeRequest {
    let Some(value) = service
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_IP_MODE))
    else {
        return IpModeRequest::None;
    };
    let default = modes.default_mode().as_str();
    match IpMode::parse(value.trim()) {
        None => IpModeRequest::Refused(format!(
            "annotation {ANNOTATION_IP_MODE}: {value:?} is not an ipMode (VIP or Proxy); using {default}"
        )),
        Some(mode) if !modes.allows(mode) => IpModeRequest::Refused(format!(
            "annotation {ANNOTATION_IP_MODE}: ipMode {} is not offered for this load balancer's class; using {default}",
            mode.as_str()
        )),
        Some(mode) => IpModeRequest::Allowed(mode),
    }
}

/// `status` with the `ipMode` of each ingress entry set by the rule of this module: explicit on
/// every entry with an `ip`, absent on every entry without one.
pub(crate) fn with_ip_modes(
    mut status: LoadBalancerStatus,
    request: &IpModeRequest,
    modes: IpModes,
) -> LoadBalancerStatus {
    let chosen = match request {
        IpModeRequest::Allowed(mode) => *mode,
        IpModeRequest::None | IpModeRequest::Refused(_) => modes.default_mode(),
    };
    for entry in status.ingress.iter_mut().flatten() {
        let has_ip = entry.ip.as_deref().is_some_and(|ip| !ip.is_empty());
        entry.ip_mode = if !has_ip {
            None
        } else {
            let own = entry.ip_mode.as_deref().and_then(IpMode::parse);
            Some(own.unwrap_or(chosen).as_str().to_owned())
        };
    }
    status
}

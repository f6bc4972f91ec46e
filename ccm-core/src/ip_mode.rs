//! The `ipMode` of load-balancer ingress points (KEP-1860, GA in Kubernetes 1.32): what a
//! provider declares per load-balancer class, and the Service annotation that asks for `Proxy`.

/// Annotation with which a Service owner asks for `ipMode: Proxy` (value `Proxy`) or `VIP` on
/// the ingress entries of the Service's load balancer. Honoured only where the provider's
/// [`IpModes`] for the Service's class allow it; otherwise the framework emits a Warning Event
/// (`IPModeNotAllowed`) and writes the class's default.
pub const ANNOTATION_IP_MODE: &str = "service.ccm-rs.io/ip-mode";

/// The `ipMode` of one ingress entry (`status.loadBalancer.ingress[].ipMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum IpMode {
    /// `VIP`: traffic arrives at the backends with the load balancer's IP as destination;
    /// kube-proxy may route in-cluster traffic to the IP straight to the backends. Kubernetes'
    /// default.
    #[default]
    Vip,
    /// `Proxy`: the load balancer proxies (PROXY protocol, TLS termination, a different
    /// destination IP); kube-proxy sends in-cluster traffic to the IP through the load balancer.
    Proxy,
}

impl IpMode {
    /// The value as the API spells it: `VIP` or `Proxy`.
    pub fn as_str(self) -> &'static str {
        match self {
            IpMode::Vip => "VIP",
            IpMode::Proxy => "Proxy",
        }
    }

    /// Parses the API's spelling (`VIP` or `Proxy`, case-sensitive as the API server is);
    /// `None` for anything else.
    pub fn parse(value: &str) -> Option<IpMode> {
        match value {
            "VIP" => Some(IpMode::Vip),
            "Proxy" => Some(IpMode::Proxy),
            _ => None,
        }
    }
}

/// What a provider declares about the `ipMode` of one load-balancer class's ingress points
/// ([`CloudProvider::load_balancer_ip_modes`](crate::CloudProvider::load_balancer_ip_modes)):
/// the mode written when neither the provider's status nor the Service asks for one, and
/// which modes a Service owner may ask for with [`ANNOTATION_IP_MODE`].
///
/// The framework writes, on every ingress entry with an `ip` (never on a hostname-only entry,
/// which the API server rejects): the entry's own `ip_mode` from
/// [`ensure_load_balancer`](crate::LoadBalancer::ensure_load_balancer) if it has one, else the
/// Service's annotation if allowed, else [`IpModes::default_mode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct IpModes {
    default: IpMode,
    proxy_allowed: bool,
    vip_allowed: bool,
}

impl Default for IpModes {
    fn default() -> Self {
        IpModes::vip()
    }
}

impl IpModes {
    /// `VIP` only (the default): a load balancer that forwards packets keeping the client's
    /// and its own IP, e.g. a network load balancer. A `Proxy` annotation is refused.
    pub const fn vip() -> IpModes {
        IpModes {
            default: IpMode::Vip,
            proxy_allowed: false,
            vip_allowed: true,
        }
    }

    /// `Proxy` only: a load balancer that always proxies (TLS termination, PROXY protocol).
    /// A `VIP` annotation is refused.
    pub const fn proxy() -> IpModes {
        IpModes {
            default: IpMode::Proxy,
            proxy_allowed: true,
            vip_allowed: false,
        }
    }

    /// `VIP` by default, `Proxy` when the Service asks for it with [`ANNOTATION_IP_MODE`]
    /// (a load balancer that can be configured either way, e.g. with the PROXY protocol on).
    pub const fn vip_or_proxy_on_request() -> IpModes {
        IpModes {
            default: IpMode::Vip,
            proxy_allowed: true,
            vip_allowed: true,
        }
    }

    /// The mode written when neither the provider's status entry nor the Service asks for one.
    pub const fn default_mode(&self) -> IpMode {
        self.default
    }

    /// Whether a Service may ask for `mode` with [`ANNOTATION_IP_MODE`].
    pub const fn allows(&self, mode: IpMode) -> bool {
        match mode {
            IpMode::Vip => self.vip_allowed,
            IpMode::Proxy => self.proxy_allowed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_as_the_api_spells_them() {
        assert_eq!(IpMode::parse("VIP"), Some(IpMode::Vip));
        assert_eq!(IpMode::parse("Proxy"), Some(IpMode::Proxy));
        assert_eq!(IpMode::parse("proxy"), None);
        assert_eq!(IpMode::Proxy.as_str(), "Proxy");
    }

    #[test]
    fn declarations_say_what_they_allow() {
        assert_eq!(IpModes::default(), IpModes::vip());
        assert!(!IpModes::vip().allows(IpMode::Proxy));
        assert!(IpModes::vip_or_proxy_on_request().allows(IpMode::Proxy));
        assert_eq!(IpModes::proxy().default_mode(), IpMode::Proxy);
        assert!(!IpModes::proxy().allows(IpMode::Vip));
    }
}

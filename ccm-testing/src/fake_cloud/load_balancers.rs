//! Load balancers: what a test reads of them, their ingress IPs and status.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ccm_core::{CloudError, CloudResult, LoadBalancerIngress, LoadBalancerStatus};
use serde::{Deserialize, Serialize};

use super::{FakeCloud, State};

/// A load balancer held by a [`FakeCloud`], as returned by [`FakeCloud::load_balancers`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadBalancerState {
    /// The load balancer's name: [`ccm_core::default_load_balancer_name`] of the Service.
    pub name: String,
    /// The Service's `spec.loadBalancerClass` at the last ensure (`None`: without a class).
    #[serde(default)]
    pub class: Option<String>,
    /// The names of the backend Nodes, sorted, each once.
    pub hosts: Vec<String>,
    /// The Service's ports (`spec.ports[].port`) at the last ensure.
    pub ports: Vec<i32>,
    /// The cluster name of the last ensure.
    pub cluster_name: String,
    /// The ingress IP it was given (`None` with `lb_hostname`).
    #[serde(default)]
    pub ingress_ip: Option<String>,
}

impl FakeCloud {
    /// The load balancers that currently exist, keyed by `<namespace>/<name>` of the Service.
    pub fn load_balancers(&self) -> BTreeMap<String, LoadBalancerState> {
        self.lock()
            .load_balancers
            .iter()
            .map(|(key, lb)| (key.clone(), lb.to_state()))
            .collect()
    }

    /// The ingress IP for the load balancer `key`: its own when it has one, else a free one of
    /// `lb_ip_range` (or the fixed `lb_ip`); `None` with `lb_hostname`.
    pub(super) fn ingress_ip_for(&self, st: &State, key: &str) -> CloudResult<Option<IpAddr>> {
        let config = &self.inner.config;
        if config.lb_hostname.is_some() {
            return Ok(None);
        }
        if let Some(ip) = &config.lb_ip {
            return ip.parse().map(Some).map_err(CloudError::other);
        }
        if let Some(ip) = st.load_balancers.get(key).and_then(|lb| lb.ingress_ip) {
            return Ok(Some(ip));
        }
        st.free_ip(&self.inner.lb_ip_range)
            .map(Some)
            .ok_or_else(|| {
                CloudError::msg(format!(
                    "fake cloud: lb_ip_range {} has no free address left ({} load balancers \
                     hold addresses); set a larger lb_ip_range in the fake cloud config \
                     (FakeCloudBuilder::lb_ip_range in a test)",
                    self.inner.lb_ip_range,
                    st.load_balancers.len()
                ))
            })
    }

    /// The status of a load balancer with this ingress IP (or `lb_hostname`).
    pub(super) fn ingress(&self, ip: Option<IpAddr>) -> LoadBalancerStatus {
        let config = &self.inner.config;
        let ingress = match (&config.lb_hostname, ip) {
            (Some(hostname), _) => LoadBalancerIngress {
                hostname: Some(hostname.clone()),
                ..Default::default()
            },
            (None, ip) => LoadBalancerIngress {
                ip: ip.map(|ip| ip.to_string()),
                ..Default::default()
            },
        };
        LoadBalancerStatus {
            ingress: Some(vec![ingress]),
        }
    }
}

impl State {
    /// The lowest address of `range` no load balancer holds (IPv4: neither the network nor
    /// the broadcast address, unless the range is a /31 or /32).
    pub(super) fn free_ip(&self, range: &ipnet::IpNet) -> Option<IpAddr> {
        let used: std::collections::HashSet<IpAddr> = self
            .load_balancers
            .values()
            .filter_map(|lb| lb.ingress_ip)
            .collect();
        range.hosts().find(|ip| !used.contains(ip))
    }
}

//! The conformance check of the ingress's `ipMode`: FakeCloud passes with any declaration; a
//! provider returning an `ipMode` the API server rejects (not `VIP`/`Proxy`, or on an entry
//! without an `ip`) or one its class does not declare fails it.

use std::sync::Arc;

use ccm_core::{
    CloudProvider, CloudResult, IpModes, LoadBalancer, LoadBalancerStatus, NodeView, Service,
    async_trait,
};
use ccm_testing::conformance::{Check, CheckResult, Suite};
use ccm_testing::fake_cloud::FakeCloud;

use crate::support::{fake, input};

const CHECK: Check = Check::LoadBalancerIngressIpModesValid;

/// FakeCloud with the `ipMode` of every returned ingress entry replaced by `mode`, and, with
/// `hostname`, a hostname instead of the IP.
struct Says {
    cloud: FakeCloud,
    mode: &'static str,
    hostname: bool,
}

impl CloudProvider for Says {
    fn provider_name(&self) -> &str {
        "fake"
    }
    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        Some(self)
    }
}

#[async_trait]
impl LoadBalancer for Says {
    async fn get_load_balancer(
        &self,
        cluster: &str,
        svc: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        self.cloud.get_load_balancer(cluster, svc).await
    }
    async fn ensure_load_balancer(
        &self,
        cluster: &str,
        svc: &Service,
        hosts: &[NodeView],
    ) -> CloudResult<LoadBalancerStatus> {
        let mut status = self.cloud.ensure_load_balancer(cluster, svc, hosts).await?;
        for entry in status.ingress.iter_mut().flatten() {
            entry.ip_mode = Some(self.mode.to_owned());
            if self.hostname {
                entry.ip = None;
                entry.hostname = Some("lb.example.com".into());
            }
        }
        Ok(status)
    }
    async fn update_load_balancer(
        &self,
        cluster: &str,
        svc: &Service,
        hosts: &[NodeView],
    ) -> CloudResult<()> {
        self.cloud.update_load_balancer(cluster, svc, hosts).await
    }
    async fn ensure_load_balancer_deleted(&self, cluster: &str, svc: &Service) -> CloudResult<()> {
        self.cloud.ensure_load_balancer_deleted(cluster, svc).await
    }
}

async fn run(mode: &'static str, hostname: bool) -> CheckResult {
    let cloud = fake().build();
    let provider = Arc::new(Says {
        cloud: cloud.clone(),
        mode,
        hostname,
    });
    Suite::new(provider, input(&cloud)).run_check(CHECK).await
}

#[tokio::test]
async fn fake_cloud_passes_whatever_it_declares() {
    for modes in ["vip", "proxy", "vip_or_proxy_on_request"] {
        let cloud = fake().load_balancer_ip_modes("-", modes).build();
        assert_eq!(
            cloud.load_balancer_ip_modes(None),
            match modes {
                "vip" => IpModes::vip(),
                "proxy" => IpModes::proxy(),
                _ => IpModes::vip_or_proxy_on_request(),
            }
        );
        let result = Suite::new(cloud.provider(), input(&cloud))
            .run_check(CHECK)
            .await;
        assert!(result.outcome.is_passed(), "{modes}: {result}");
    }
}

#[tokio::test]
async fn an_explicit_vip_on_an_ip_passes() {
    let result = run("VIP", false).await;
    assert!(result.outcome.is_passed(), "{result}");
}

#[tokio::test]
async fn proxy_from_a_vip_only_class_fails() {
    let result = run("Proxy", false).await;
    assert!(result.outcome.is_failed(), "{result}");
    assert!(result.to_string().contains("declares"), "{result}");
}

#[tokio::test]
async fn an_ip_mode_on_a_hostname_fails() {
    let result = run("VIP", true).await;
    assert!(result.outcome.is_failed(), "{result}");
    assert!(result.to_string().contains("without an ip"), "{result}");
}

#[tokio::test]
async fn a_mode_the_api_server_does_not_know_fails() {
    let result = run("vip", false).await;
    assert!(result.outcome.is_failed(), "{result}");
    assert!(result.to_string().contains("VIP or Proxy"), "{result}");
}

#[test]
fn fake_cloud_config_refuses_an_unknown_declaration() {
    let err = fake()
        .load_balancer_ip_modes("-", "sometimes")
        .try_build()
        .unwrap_err();
    assert!(err.to_string().contains("load_balancer_ip_modes"), "{err}");
}

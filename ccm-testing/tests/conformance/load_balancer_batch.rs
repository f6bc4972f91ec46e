//! The conformance suite's check of `LoadBalancerHostsBatch`: FakeCloud with the batch passes
//! it; a batch that answers success without changing the hosts, leaves the Service out of its
//! answer or declares a size of 0 fails it.

use std::sync::Arc;

use ccm_core::{
    CloudProvider, CloudResult, LoadBalancer, LoadBalancerHostsAnswers, LoadBalancerHostsBatch,
    NodeView, Service, async_trait,
};
use ccm_testing::conformance::{Check, CheckResult, Suite};
use ccm_testing::fake_cloud::FakeCloud;

use crate::support::{SERVICE_KEY, fake, input};

const CHECK: Check = Check::LoadBalancerHostsBatchAgreesWithUpdate;

/// How a broken batch breaks the contract.
#[derive(Clone, Copy)]
enum Breakage {
    /// Answers success for every Service, changes nothing.
    ChangesNothing,
    /// Leaves every Service out of its answer.
    LeavesOut,
    /// Declares `max_batch_size` 0.
    ZeroSize,
}

/// FakeCloud (with its batch on) whose batch is broken one way.
struct Broken {
    cloud: FakeCloud,
    breakage: Breakage,
}

#[async_trait]
impl CloudProvider for Broken {
    fn provider_name(&self) -> &str {
        "fake"
    }
    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        self.cloud.load_balancer()
    }
    fn load_balancer_hosts_batch(&self) -> Option<&dyn LoadBalancerHostsBatch> {
        Some(self)
    }
}

#[async_trait]
impl LoadBalancerHostsBatch for Broken {
    fn max_batch_size(&self) -> usize {
        match self.breakage {
            Breakage::ZeroSize => 0,
            _ => 100,
        }
    }
    async fn update_load_balancer_hosts(
        &self,
        cluster_name: &str,
        services: &[Arc<Service>],
        hosts: &[NodeView],
    ) -> CloudResult<LoadBalancerHostsAnswers> {
        match self.breakage {
            Breakage::ChangesNothing => Ok(services
                .iter()
                .map(|_| (SERVICE_KEY.to_owned(), Ok(())))
                .collect()),
            Breakage::LeavesOut => Ok(LoadBalancerHostsAnswers::new()),
            Breakage::ZeroSize => {
                let batch = self.cloud.load_balancer_hosts_batch().unwrap();
                batch
                    .update_load_balancer_hosts(cluster_name, services, hosts)
                    .await
            }
        }
    }
}

fn batch_cloud() -> FakeCloud {
    fake().load_balancer_hosts_batch(true).build()
}

async fn run_broken(breakage: Breakage) -> CheckResult {
    let cloud = batch_cloud();
    let provider = Arc::new(Broken {
        cloud: cloud.clone(),
        breakage,
    });
    Suite::new(provider, input(&cloud)).run_check(CHECK).await
}

#[tokio::test]
async fn fake_cloud_with_the_batch_passes() {
    let cloud = batch_cloud();
    let result = Suite::new(cloud.provider(), input(&cloud))
        .run_check(CHECK)
        .await;
    assert!(result.outcome.is_passed(), "{result}");
    assert!(cloud.call_count("update_load_balancer_hosts") >= 2);
    // The suite cleaned up the load balancer it created.
    assert!(cloud.load_balancers().is_empty());
}

#[tokio::test]
async fn a_batch_that_changes_nothing_fails() {
    let result = run_broken(Breakage::ChangesNothing).await;
    assert!(result.outcome.is_failed(), "{result}");
    assert!(result.to_string().contains("the probe reports"), "{result}");
}

#[tokio::test]
async fn a_batch_that_leaves_the_service_out_fails() {
    let result = run_broken(Breakage::LeavesOut).await;
    assert!(result.outcome.is_failed(), "{result}");
    assert!(result.to_string().contains(SERVICE_KEY), "{result}");
}

#[tokio::test]
async fn a_batch_of_size_zero_fails() {
    let result = run_broken(Breakage::ZeroSize).await;
    assert!(result.outcome.is_failed(), "{result}");
    assert!(result.to_string().contains("at least 1"), "{result}");
}

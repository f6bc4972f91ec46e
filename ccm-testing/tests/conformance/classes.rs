//! The conformance suite's check of the load-balancer classes a provider declares: FakeCloud
//! serving a class passes it (each class's load balancer made, reported and deleted); an
//! invalid class, a declared class without an implementation, or an implementation that does
//! not work for its class fails it.

use std::sync::Arc;

use ccm_core::{CloudProvider, LoadBalancer, LoadBalancerClasses, async_trait};
use ccm_testing::conformance::{Check, CheckResult, Suite};
use ccm_testing::fake_cloud::FakeCloud;

use crate::support::{fake, input};

const CHECK: Check = Check::LoadBalancerClassesDeclared;
const INTERNAL: &str = "fake.example/internal";

/// How a provider's declaration is broken.
#[derive(Clone, Copy)]
enum Breakage {
    /// Declares a class the API server would refuse.
    InvalidName,
    /// Declares a class it has no implementation for.
    NoImplementation,
    /// The class's implementation cannot make a load balancer (load balancers switched off
    /// in the cloud behind it: every call fails).
    Broken,
}

struct Declares {
    cloud: FakeCloud,
    broken_cloud: FakeCloud,
    breakage: Breakage,
}

#[async_trait]
impl CloudProvider for Declares {
    fn provider_name(&self) -> &str {
        "fake"
    }
    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        self.cloud.load_balancer()
    }
    fn load_balancer_classes(&self) -> LoadBalancerClasses {
        match self.breakage {
            Breakage::InvalidName => LoadBalancerClasses::without_class().with_class("Not Valid"),
            _ => LoadBalancerClasses::without_class().with_class(INTERNAL),
        }
    }
    fn load_balancer_for_class(&self, class: Option<&str>) -> Option<&dyn LoadBalancer> {
        match (class, self.breakage) {
            (None, _) | (_, Breakage::InvalidName) => self.cloud.load_balancer(),
            (Some(_), Breakage::NoImplementation) => None,
            (Some(_), Breakage::Broken) => Some(&self.broken_cloud as &dyn LoadBalancer),
        }
    }
}

async fn run_broken(breakage: Breakage) -> CheckResult {
    let cloud = fake().build();
    let broken_cloud = fake().build();
    broken_cloud.inject(
        "ensure_load_balancer",
        ccm_testing::fake_cloud::Fault::FailNext(100),
    );
    let provider = Arc::new(Declares {
        cloud: cloud.clone(),
        broken_cloud,
        breakage,
    });
    Suite::new(provider, input(&cloud)).run_check(CHECK).await
}

#[tokio::test]
async fn fake_cloud_serving_a_class_passes() {
    let cloud = fake().load_balancer_classes(&["-", INTERNAL]).build();
    let result = Suite::new(cloud.provider(), input(&cloud))
        .run_check(CHECK)
        .await;
    assert!(result.outcome.is_passed(), "{result}");
    assert!(cloud.call_count("ensure_load_balancer") >= 1);
    assert!(cloud.load_balancers().is_empty());
}

#[tokio::test]
async fn an_invalid_class_fails() {
    let result = run_broken(Breakage::InvalidName).await;
    assert!(result.outcome.is_failed(), "{result}");
    assert!(result.to_string().contains("\"Not Valid\""), "{result}");
}

#[tokio::test]
async fn a_class_without_an_implementation_fails() {
    let result = run_broken(Breakage::NoImplementation).await;
    assert!(result.outcome.is_failed(), "{result}");
    assert!(result.to_string().contains(INTERNAL), "{result}");
}

#[tokio::test]
async fn a_class_whose_implementation_fails_fails() {
    let result = run_broken(Breakage::Broken).await;
    assert!(result.outcome.is_failed(), "{result}");
    assert!(
        result.to_string().contains(&format!("of class {INTERNAL}")),
        "{result}"
    );
}

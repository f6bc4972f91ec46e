//! Start-up refused without a cluster CIDR or without a provider's routes.

use ccm_controllers::ControllerError;
use ccm_controllers::controllers::route::{self, RouteConfig};
use ccm_core::CloudProvider;
use ccm_testing::TestCluster;
use ccm_testing::fake_cloud::FakeCloud;
use ccm_testing::harness::ControllerHarness;
use std::sync::Arc;

use super::test_config;

#[tokio::test]
async fn startup_fails_without_a_cluster_cidr_naming_both_flags() {
    let cluster = TestCluster::start().await;
    let fake = FakeCloud::default();
    let err = ControllerHarness::builder(&cluster, fake.provider())
        .controller(route::NAME, |ctx, _| {
            route::run(ctx, RouteConfig::default())
        })
        .start()
        .await
        .stop()
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ControllerError::Config { .. }), "{err:?}");
    assert!(msg.contains("--cluster-cidr"), "{msg}");
    assert!(msg.contains("--configure-cloud-routes=false"), "{msg}");
    // No cloud call but the provider's `initialize`, which the runtime makes before any
    // controller starts.
    let calls: usize = fake
        .call_counts()
        .iter()
        .filter(|(op, _)| op.as_str() != "initialize")
        .map(|(_, n)| n)
        .sum();
    assert_eq!(calls, 0, "{:?}", fake.call_counts());

    // An invalid value (two IPv4 CIDRs) is refused too, by the parser the runtime uses.
    let e = route::parse_cluster_cidrs("10.0.0.0/16,10.1.0.0/16").unwrap_err();
    assert!(e.contains("one IPv4 and one IPv6"), "{e}");
    cluster.cleanup().await;
}

#[tokio::test]
async fn startup_fails_when_the_provider_has_no_routes() {
    struct NoRoutes;
    impl CloudProvider for NoRoutes {
        fn provider_name(&self) -> &str {
            "no-routes"
        }
    }
    let cluster = TestCluster::start().await;
    let err = ControllerHarness::builder(&cluster, Arc::new(NoRoutes))
        .controller(route::NAME, |ctx, _| {
            route::run(ctx, test_config("10.114.0.0/16"))
        })
        .start()
        .await
        .stop()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ControllerError::MissingCapability {
                capability: "routes",
                ..
            }
        ),
        "{err:?}"
    );
    cluster.cleanup().await;
}

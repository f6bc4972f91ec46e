//! The suite as a whole: FakeCloud passes every check, checks run one by one or are skipped,
//! missing inputs skip what needs them, leftovers are reported, panics and hung calls fail a
//! check without aborting the suite, Retry answers are honoured.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ccm_core::{
    CloudError, CloudProvider, CloudResult, InstanceMetadata, InstancesV2, NodeView, async_trait,
};
use ccm_testing::conformance::{Check, ConformanceInput, Outcome, SkipKind, Suite};

use crate::support::{CLUSTER, fake, input, node, service};

#[tokio::test]
async fn fake_cloud_passes_every_check() {
    // Latency makes the cancellation check cancel calls for real; legacy instances and zones
    // on make every check applicable.
    let cloud = fake()
        .legacy_instances(true)
        .instances_batch(true)
        .load_balancer_hosts_batch(true)
        .latency(Duration::from_millis(2))
        .build();
    let report = Suite::new(cloud.provider(), input(&cloud)).run().await;
    assert!(report.is_success(), "{report}");
    assert_eq!(report.skipped().count(), 0, "{report}");
    assert_eq!(report.passed().count(), Check::ALL.len(), "{report}");
    // The suite cleaned up after itself.
    assert!(
        cloud.load_balancers().is_empty(),
        "{:?}",
        cloud.load_balancers()
    );
    assert!(cloud.routes().is_empty(), "{:?}", cloud.routes());
    // And exercised what it claims to.
    for op in [
        "instance_metadata",
        "instance_exists",
        "instance_shutdown",
        "describe_instances",
        "instance_id",
        "instance_exists_by_provider_id",
        "instance_shutdown_by_provider_id",
        "instance_type_by_provider_id",
        "node_addresses_by_provider_id",
        "get_zone_by_provider_id",
        "get_zone_by_node_name",
        "node_addresses",
        "instance_type",
        "ensure_load_balancer",
        "update_load_balancer",
        "get_load_balancer",
        "ensure_load_balancer_deleted",
        "create_route",
        "list_routes",
        "delete_route",
    ] {
        assert!(cloud.call_count(op) > 0, "{op} never called");
    }
    report.assert_success();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_cloud_passes_on_a_multi_threaded_runtime_with_default_capabilities() {
    let cloud = fake().build();
    let report = Suite::new(cloud.provider(), input(&cloud)).run().await;
    assert!(report.is_success(), "{report}");
    // v1, Zones and batches are off by default: their checks are skipped with the reason.
    let skipped: BTreeSet<Check> = report.skipped().map(|r| r.check).collect();
    assert_eq!(
        skipped,
        BTreeSet::from([
            Check::ZonesNonEmpty,
            Check::LegacyV1ConsistentWithV2,
            Check::LegacyInstanceIdNotFoundForUnknown,
            Check::BatchAgreesWithSingleCalls,
            Check::BatchSameAnswerWhateverTheGrouping,
            Check::BatchMaxSizeHonoured,
            Check::LoadBalancerHostsBatchAgreesWithUpdate,
        ])
    );
    let zones = report.get(Check::ZonesNonEmpty).unwrap();
    assert_eq!(
        zones.outcome,
        Outcome::Skipped {
            kind: SkipKind::NotOffered,
            reason: "the provider offers no Zones".into()
        }
    );
    // Every skip is "not offered": nothing the fake cloud offers was left out.
    assert_eq!(report.skipped_but_maybe_offered().count(), 0, "{report}");
    report.assert_nothing_skipped_that_is_offered();
    assert!(
        report.to_string().contains(
            "SKIP zones_non_empty (capability not offered: the provider offers no Zones)"
        ),
        "{report}"
    );
}

#[tokio::test]
async fn checks_can_be_skipped_and_run_one_by_one() {
    let cloud = fake().build();
    let suite = Suite::new(cloud.provider(), input(&cloud))
        .skip(Check::RoutesRoundTrip)
        .skip(Check::ConcurrentCallsAreSafe);
    let one = suite.run_check(Check::RoutesRoundTrip).await;
    assert_eq!(
        one.outcome,
        Outcome::Skipped {
            kind: SkipKind::ByCaller,
            reason: "skipped by the caller".into()
        }
    );
    assert_eq!(
        one.to_string(),
        "SKIP routes_round_trip (skipped by the caller)"
    );
    cloud.reset_calls();
    let one = suite.run_check(Check::InstanceExistsFalseForUnknown).await;
    assert!(one.outcome.is_passed(), "{one}");
    // Only what that check needs was called.
    let ops: BTreeSet<String> = cloud.call_counts().into_keys().collect();
    assert_eq!(ops, BTreeSet::from(["instance_exists".to_owned()]));

    let report = suite.run().await;
    // Two by the caller, three legacy ones and four batch ones by capability.
    assert_eq!(report.skipped().count(), 2 + 3 + 4, "{report}");
    let kinds = |kind| {
        report
            .skipped()
            .filter(|r| r.outcome.skip_kind() == Some(kind))
            .count()
    };
    assert_eq!(kinds(SkipKind::ByCaller), 2, "{report}");
    assert_eq!(kinds(SkipKind::NotOffered), 3 + 4, "{report}");
    // The caller's own skips do not count against "nothing skipped that I offer".
    report.assert_nothing_skipped_that_is_offered();
    assert!(
        Check::ALL
            .iter()
            .all(|c| Check::from_name(c.name()) == Some(*c))
    );
}

#[tokio::test]
async fn missing_inputs_skip_the_checks_that_need_them() {
    let cloud = fake().build();
    let suite = Suite::new(
        cloud.provider(),
        ConformanceInput::new(CLUSTER, vec![node("n-0")]),
    );
    let report = suite.run().await;
    assert!(report.is_success(), "{report}");
    for check in [
        Check::InstanceExistsFalseForUnknown,
        Check::EnsureLoadBalancerIdempotentWithIngress,
        Check::RoutesRoundTrip,
    ] {
        let result = report.get(check).unwrap();
        assert!(result.outcome.is_skipped(), "{result}");
    }
    let text = report.to_string();
    assert!(text.contains("no Service given"), "{text}");
    assert!(text.contains("no route CIDR given"), "{text}");
    assert!(
        text.contains(
            "SKIP routes_dual_stack_same_name_hint_both_kept (input missing: no route CIDR given (ConformanceInput::route_cidr))"
        ),
        "{text}"
    );
    assert!(text.contains("no missing node given"), "{text}");
    assert!(cloud.call_count("ensure_load_balancer") == 0);
    // The fake cloud offers load balancers and routes: their checks were skipped for want of
    // input, which "nothing skipped that I offer" catches.
    let maybe_offered: BTreeSet<Check> = report
        .skipped_but_maybe_offered()
        .map(|r| r.check)
        .collect();
    assert!(maybe_offered.contains(&Check::EnsureLoadBalancerIdempotentWithIngress));
    assert!(maybe_offered.contains(&Check::RoutesRoundTrip));
    assert!(
        !maybe_offered.contains(&Check::ZonesNonEmpty),
        "no Zones is not offered: {report}"
    );
    let panic = std::panic::catch_unwind(|| report.assert_nothing_skipped_that_is_offered())
        .expect_err("input-missing skips fail the assertion");
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.contains("skipped that the provider may offer")
            && message.contains("routes_round_trip (input missing"),
        "{message}"
    );
}

#[tokio::test]
async fn the_dual_stack_route_check_needs_one_cidr_per_family() {
    let cloud = fake().build();
    let base = || ConformanceInput::new(CLUSTER, vec![node("n-0")]);
    for (input, reason) in [
        (
            base().route_cidr("10.244.250.0/24"),
            "no IPv6 route CIDR given (ConformanceInput::ipv6_route_cidr)",
        ),
        (
            base()
                .route_cidr("fd00:10:244:fb::/64")
                .ipv6_route_cidr("fd00:10:244:fa::/64"),
            r#"ConformanceInput::route_cidr "fd00:10:244:fb::/64" is not an IPv4 CIDR"#,
        ),
        (
            base()
                .route_cidr("10.244.250.0/24")
                .ipv6_route_cidr("10.244.251.0/24"),
            r#"ConformanceInput::ipv6_route_cidr "10.244.251.0/24" is not an IPv6 CIDR"#,
        ),
    ] {
        let result = Suite::new(cloud.provider(), input)
            .run_check(Check::RoutesDualStackSameNameHintBothKept)
            .await;
        assert_eq!(
            result.outcome,
            Outcome::Skipped {
                kind: SkipKind::InputMissing,
                reason: reason.into()
            },
            "{result}"
        );
    }
    assert_eq!(cloud.call_count("create_route"), 0);

    // Both routes of a dual-stack Node, then the IPv6 one re-created after the IPv4 one went:
    // FakeCloud keeps one route per CIDR under the shared hint and ends with none.
    let suite = Suite::new(cloud.provider(), input(&cloud));
    let result = suite
        .run_check(Check::RoutesDualStackSameNameHintBothKept)
        .await;
    assert!(result.outcome.is_passed(), "{result}");
    assert!(result.notes.is_empty(), "{result}");
    assert_eq!(cloud.call_count("create_route"), 3);
    assert!(cloud.routes().is_empty(), "{:?}", cloud.routes());
}

#[tokio::test]
async fn a_leftover_load_balancer_is_reported_not_adopted() {
    let cloud = fake().build();
    cloud
        .load_balancer()
        .unwrap()
        .ensure_load_balancer(CLUSTER, &service(), &[])
        .await
        .unwrap();
    let suite = Suite::new(cloud.provider(), input(&cloud));
    let result = suite
        .run_check(Check::GetLoadBalancerReportsExactlyBetweenEnsureAndDelete)
        .await;
    let text = result.to_string();
    assert!(result.outcome.is_failed(), "{text}");
    assert!(
        text.contains("must have no load balancer when the suite starts"),
        "{text}"
    );
}

/// A provider whose calls panic: the suite reports it as a failure instead of aborting.
struct Panicking;

#[async_trait]
impl CloudProvider for Panicking {
    fn provider_name(&self) -> &str {
        "panicking"
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }
}

#[async_trait]
impl InstancesV2 for Panicking {
    async fn instance_exists(&self, _node: &NodeView) -> CloudResult<bool> {
        panic!("boom in instance_exists")
    }
    async fn instance_shutdown(&self, _node: &NodeView) -> CloudResult<bool> {
        Ok(false)
    }
    async fn instance_metadata(&self, _node: &NodeView) -> CloudResult<InstanceMetadata> {
        Err(CloudError::NotImplemented)
    }
}

#[tokio::test]
async fn a_panicking_provider_fails_the_check_without_aborting_the_suite() {
    let suite = Suite::new(
        Arc::new(Panicking),
        ConformanceInput::new(CLUSTER, vec![node("n-0")]).missing_node(node("gone-1")),
    );
    let result = suite.run_check(Check::InstanceExistsFalseForUnknown).await;
    let text = result.to_string();
    assert!(result.outcome.is_failed(), "{text}");
    assert!(text.contains("panicked: boom in instance_exists"), "{text}");
    let report = suite.run().await;
    assert!(!report.is_success());
}

#[tokio::test(start_paused = true)]
async fn retry_answers_are_honoured_and_a_hung_call_times_out() {
    use ccm_testing::fake_cloud::Fault;
    let cloud = fake().build();
    cloud.inject(
        "ensure_load_balancer",
        Fault::Retry {
            after: Duration::from_secs(30),
            count: 2,
        },
    );
    let suite = Suite::new(cloud.provider(), input(&cloud));
    let result = suite
        .run_check(Check::EnsureLoadBalancerIdempotentWithIngress)
        .await;
    assert!(result.outcome.is_passed(), "{result}");
    assert_eq!(
        cloud.call_count("ensure_load_balancer"),
        4,
        "2 retries + 2 ensures"
    );

    let slow = fake()
        .operation_latency("instance_exists", Duration::from_secs(3600))
        .build();
    let suite = Suite::new(
        slow.provider(),
        input(&slow).call_timeout(Duration::from_secs(5)),
    );
    let result = suite.run_check(Check::InstanceExistsFalseForUnknown).await;
    let text = result.to_string();
    assert!(text.contains("did not answer within 5s"), "{text}");
}

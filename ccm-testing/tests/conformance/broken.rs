//! Each deliberately broken provider fails exactly the check for the contract it breaks, with
//! a report line that says what was expected and what was observed.

use std::collections::BTreeSet;
use std::sync::Arc;

use ccm_core::CloudProvider;
use ccm_testing::conformance::{Check, Suite};

use crate::broken_provider::{Broken, Flaw};
use crate::support::{failed, input};

/// Runs the whole suite against the broken provider and asserts that exactly `check` fails,
/// with a report line naming it.
async fn only_fails(flaw: Flaw, check: Check) -> String {
    let (broken, inner) = Broken::new(flaw);
    let provider: Arc<dyn CloudProvider> = broken;
    let report = Suite::new(provider, input(&inner)).run().await;
    assert_eq!(
        failed(&report),
        BTreeSet::from([check]),
        "{flaw:?} must fail exactly {check}:\n{report}"
    );
    let result = report.get(check).unwrap();
    let line = result.to_string();
    assert!(
        line.starts_with(&format!("FAIL {}", check.name())),
        "{line}"
    );
    assert!(
        line.contains("expected: ") && line.contains("observed: "),
        "{line}"
    );
    assert!(
        report
            .to_string()
            .contains(&format!("FAIL {}", check.name()))
    );
    line
}

macro_rules! broken_provider_tests {
    ($($test:ident: $flaw:ident => $check:ident,)*) => {$(
        #[tokio::test]
        async fn $test() {
            let _ = only_fails(Flaw::$flaw, Check::$check).await;
        }
    )*};
}

broken_provider_tests! {
    unstable_metadata_fails_instance_metadata_stable:
        MetadataChangesOnce => InstanceMetadataStable,
    provider_name_mismatch_fails_provider_id_well_formed:
        ProviderNameMismatch => ProviderIdWellFormed,
    no_schemes_declared_fails_provider_id_well_formed:
        NoSchemesDeclared => ProviderIdWellFormed,
    invalid_scheme_declared_fails_provider_id_well_formed:
        InvalidSchemeDeclared => ProviderIdWellFormed,
    error_for_unknown_instance_fails_instance_exists_false_for_unknown:
        ExistsErrorsForUnknown => InstanceExistsFalseForUnknown,
    shut_down_reported_gone_fails_instance_exists_true_for_existing_and_shut_down:
        ShutDownMeansGone => InstanceExistsTrueForExistingAndShutDown,
    shutdown_never_reported_fails_instance_shutdown_consistent_with_exists:
        ShutdownNeverReported => InstanceShutdownConsistentWithExists,
    empty_region_fails_zones_non_empty:
        EmptyRegion => ZonesNonEmpty,
    invalid_label_value_fails_instance_labels_valid:
        InvalidLabelValue => InstanceLabelsValid,
    legacy_type_differs_fails_legacy_v1_consistent_with_v2:
        LegacyTypeDiffers => LegacyV1ConsistentWithV2,
    legacy_id_for_unknown_fails_legacy_instance_id_not_found_for_unknown:
        LegacyIdForUnknown => LegacyInstanceIdNotFoundForUnknown,
    ensure_without_ingress_fails_ensure_load_balancer_idempotent_with_ingress:
        EnsureWithoutIngress => EnsureLoadBalancerIdempotentWithIngress,
    get_reporting_deleted_fails_get_load_balancer_reports_exactly_between:
        GetReportsDeleted => GetLoadBalancerReportsExactlyBetweenEnsureAndDelete,
    update_ignoring_hosts_fails_update_load_balancer_changes_hosts:
        UpdateIgnoresHosts => UpdateLoadBalancerChangesHosts,
    delete_failing_when_missing_fails_ensure_load_balancer_deleted_idempotent:
        DeleteFailsWhenMissing => EnsureLoadBalancerDeletedIdempotent,
    list_losing_target_fails_routes_round_trip:
        ListLosesTargetNode => RoutesRoundTrip,
    create_existing_route_failing_fails_routes_create_existing_succeeds:
        CreateExistingRouteFails => RoutesCreateExistingSucceeds,
    delete_missing_route_failing_fails_routes_delete_missing_succeeds:
        DeleteMissingRouteFails => RoutesDeleteMissingSucceeds,
    routes_keyed_by_hint_fail_routes_dual_stack_same_name_hint_both_kept:
        RoutesKeyedByHint => RoutesDualStackSameNameHintBothKept,
    cancel_leaking_load_balancer_fails_cancellation_leaves_consistent_state:
        CancelLeaksLoadBalancer => CancellationLeavesConsistentState,
    racy_metadata_fails_concurrent_calls_are_safe:
        RacyMetadata => ConcurrentCallsAreSafe,
}

#[tokio::test]
async fn failure_messages_show_what_changed() {
    let line = only_fails(Flaw::MetadataChangesOnce, Check::InstanceMetadataStable).await;
    assert!(
        line.contains(r#"observed: it changed: instance_type: "fake-small" -> "fake-resized""#),
        "{line}"
    );
    let line = only_fails(
        Flaw::ExistsErrorsForUnknown,
        Check::InstanceExistsFalseForUnknown,
    )
    .await;
    assert!(
        line.contains("observed: error (instance_not_found)"),
        "{line}"
    );
}

#[test]
fn every_check_has_a_broken_provider() {
    // Keep this list in step with the macro above: one flaw per check.
    let covered = [
        Check::InstanceMetadataStable,
        Check::ProviderIdWellFormed,
        Check::InstanceExistsFalseForUnknown,
        Check::InstanceExistsTrueForExistingAndShutDown,
        Check::InstanceShutdownConsistentWithExists,
        Check::ZonesNonEmpty,
        Check::InstanceLabelsValid,
        Check::LegacyV1ConsistentWithV2,
        Check::LegacyInstanceIdNotFoundForUnknown,
        Check::EnsureLoadBalancerIdempotentWithIngress,
        Check::GetLoadBalancerReportsExactlyBetweenEnsureAndDelete,
        Check::UpdateLoadBalancerChangesHosts,
        Check::EnsureLoadBalancerDeletedIdempotent,
        Check::RoutesRoundTrip,
        Check::RoutesCreateExistingSucceeds,
        Check::RoutesDeleteMissingSucceeds,
        Check::RoutesDualStackSameNameHintBothKept,
        Check::CancellationLeavesConsistentState,
        Check::ConcurrentCallsAreSafe,
        // Their broken batches are in batch.rs.
        Check::BatchAgreesWithSingleCalls,
        Check::BatchSameAnswerWhateverTheGrouping,
        Check::BatchMaxSizeHonoured,
        // Its broken batch is in load_balancer_batch.rs.
        Check::LoadBalancerHostsBatchAgreesWithUpdate,
        // Its broken declarations are in classes.rs.
        Check::LoadBalancerClassesDeclared,
        // Its broken providers are in ip_modes.rs.
        Check::LoadBalancerIngressIpModesValid,
    ];
    assert_eq!(
        covered.iter().collect::<BTreeSet<_>>(),
        Check::ALL.iter().collect::<BTreeSet<_>>()
    );
}

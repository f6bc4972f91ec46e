//! Latency (overall and per operation) and every fault mode.

use std::time::Duration;

use ccm_core::{CloudError, CloudProvider};
use ccm_testing::fake_cloud::{FakeCloud, Fault};

use crate::support::{UID, node, service};

#[tokio::test(start_paused = true)]
async fn latency_applies_to_every_call_and_can_be_overridden_per_operation() {
    let cloud = FakeCloud::builder()
        .latency(Duration::from_millis(100))
        .operation_latency("ensure_load_balancer", Duration::from_secs(5))
        .build();
    let v2 = cloud.instances_v2().unwrap();
    // Virtual time: the call cannot finish before its latency has elapsed.
    let n = node("n");
    let early = tokio::time::timeout(Duration::from_millis(99), v2.instance_exists(&n)).await;
    assert!(early.is_err(), "finished before latency_ms");
    let start = tokio::time::Instant::now();
    assert!(v2.instance_exists(&n).await.unwrap());
    assert_eq!(start.elapsed(), Duration::from_millis(100));

    let lb = cloud.load_balancer().unwrap();
    let svc = service("ns", "web", UID);
    let start = tokio::time::Instant::now();
    lb.ensure_load_balancer("c", &svc, &[]).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(5));

    cloud.set_latency(Duration::ZERO);
    let start = tokio::time::Instant::now();
    v2.instance_exists(&n).await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_call_cancelled_during_its_latency_changes_nothing() {
    let cloud = FakeCloud::builder().latency(Duration::from_secs(1)).build();
    let lb = cloud.load_balancer().unwrap();
    let svc = service("ns", "web", UID);
    let cancelled = tokio::time::timeout(
        Duration::from_millis(10),
        lb.ensure_load_balancer("c", &svc, &[]),
    )
    .await;
    assert!(cancelled.is_err());
    assert_eq!(cloud.call_count("ensure_load_balancer"), 1, "counted");
    assert!(cloud.load_balancers().is_empty(), "but created nothing");
    // A FailNext fault is not consumed by a cancelled call either.
    cloud.inject("ensure_load_balancer", Fault::FailNext(1));
    let _ = tokio::time::timeout(
        Duration::from_millis(10),
        lb.ensure_load_balancer("c", &svc, &[]),
    )
    .await;
    assert!(lb.ensure_load_balancer("c", &svc, &[]).await.is_err());
    assert!(lb.ensure_load_balancer("c", &svc, &[]).await.is_ok());
}

#[tokio::test]
async fn fail_next_fails_exactly_n_calls_and_changes_nothing() {
    let cloud = FakeCloud::default();
    cloud.inject("ensure_load_balancer", Fault::FailNext(2));
    let lb = cloud.load_balancer().unwrap();
    let svc = service("ns", "web", UID);
    for _ in 0..2 {
        let err = lb.ensure_load_balancer("c", &svc, &[]).await.unwrap_err();
        assert!(matches!(err, CloudError::Other(_)));
        assert_eq!(
            err.to_string(),
            "fake cloud: injected failure of ensure_load_balancer"
        );
        assert!(cloud.load_balancers().is_empty());
    }
    lb.ensure_load_balancer("c", &svc, &[]).await.unwrap();
    assert_eq!(cloud.call_count("ensure_load_balancer"), 3);
    // Other operations are not affected.
    assert!(lb.get_load_balancer("c", &svc).await.unwrap().is_some());
}

async fn probability_pattern(seed: u64, p: f64) -> Vec<bool> {
    let cloud = FakeCloud::default();
    cloud.inject("instance_exists", Fault::FailWithProbability { p, seed });
    let v2 = cloud.instances_v2().unwrap();
    let mut out = Vec::new();
    for _ in 0..200 {
        out.push(v2.instance_exists(&node("n")).await.is_err());
    }
    out
}

#[tokio::test]
async fn fail_with_probability_is_seeded_and_reproducible() {
    let a = probability_pattern(7, 0.3).await;
    let b = probability_pattern(7, 0.3).await;
    assert_eq!(a, b, "same seed, same failures");
    let c = probability_pattern(8, 0.3).await;
    assert_ne!(a, c, "another seed, other failures");
    let failures = a.iter().filter(|f| **f).count();
    assert!(
        (30..=90).contains(&failures),
        "p=0.3 of 200 calls: {failures}"
    );
    assert!(probability_pattern(1, 0.0).await.iter().all(|f| !f));
    assert!(probability_pattern(1, 1.0).await.iter().all(|f| *f));
    // Out-of-range probabilities given to inject() are clamped, never a panic.
    assert!(probability_pattern(1, f64::NAN).await.iter().all(|f| !f));
    assert!(probability_pattern(1, 7.0).await.iter().all(|f| *f));
}

#[tokio::test]
async fn retry_answers_retry_after_for_count_calls() {
    let cloud = FakeCloud::default();
    cloud.inject(
        "ensure_load_balancer",
        Fault::Retry {
            after: Duration::from_millis(1500),
            count: 2,
        },
    );
    let lb = cloud.load_balancer().unwrap();
    let svc = service("ns", "web", UID);
    for _ in 0..2 {
        let err = lb.ensure_load_balancer("c", &svc, &[]).await.unwrap_err();
        assert_eq!(err.retry_after(), Some(Duration::from_millis(1500)));
    }
    assert!(lb.ensure_load_balancer("c", &svc, &[]).await.is_ok());
}

#[tokio::test]
async fn not_implemented_and_instance_not_found_persist_until_cleared() {
    let cloud = FakeCloud::builder().legacy_instances(true).build();
    cloud.inject("instance_shutdown", Fault::NotImplemented);
    cloud.inject("instance_id", Fault::InstanceNotFound);
    let v2 = cloud.instances_v2().unwrap();
    let v1 = cloud.instances().unwrap();
    for _ in 0..3 {
        assert!(
            v2.instance_shutdown(&node("n"))
                .await
                .unwrap_err()
                .is_not_implemented()
        );
        assert!(
            v1.instance_id("n")
                .await
                .unwrap_err()
                .is_instance_not_found()
        );
    }
    cloud.clear_faults();
    assert!(!v2.instance_shutdown(&node("n")).await.unwrap());
    assert_eq!(v1.instance_id("n").await.unwrap(), "n");
}

#[tokio::test]
async fn faults_are_consulted_in_the_order_armed() {
    let cloud = FakeCloud::default();
    cloud.inject("instance_metadata", Fault::FailNext(1));
    cloud.inject(
        "instance_metadata",
        Fault::Retry {
            after: Duration::from_secs(3),
            count: 1,
        },
    );
    let v2 = cloud.instances_v2().unwrap();
    let first = v2.instance_metadata(&node("n")).await.unwrap_err();
    assert!(first.retry_after().is_none());
    let second = v2.instance_metadata(&node("n")).await.unwrap_err();
    assert_eq!(second.retry_after(), Some(Duration::from_secs(3)));
    assert!(v2.instance_metadata(&node("n")).await.is_ok());
}

#[tokio::test]
async fn initialize_is_counted_and_can_be_faulted() {
    let cloud = FakeCloud::default();
    let ctx =
        || ccm_core::InitContext::new(None::<()>, ccm_core::CancellationToken::new(), "kubernetes");
    cloud.initialize(ctx()).await.unwrap();
    cloud.inject("initialize", Fault::FailNext(1));
    assert!(cloud.initialize(ctx()).await.is_err());
    assert_eq!(cloud.call_count("initialize"), 2);
    // An unknown operation name never fires (and is logged).
    cloud.inject("instance_metadatas", Fault::NotImplemented);
    assert!(
        cloud
            .instances_v2()
            .unwrap()
            .instance_metadata(&node("n"))
            .await
            .is_ok()
    );
}

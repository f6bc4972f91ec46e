//! What a test inspects: call counts and the call log, under concurrent calls too.

use std::time::Duration;

use ccm_core::CloudProvider;
use ccm_testing::fake_cloud::{FakeCloud, OPERATIONS};

use crate::support::{UID, host, node, route, service};

#[tokio::test]
async fn call_counts_and_log_use_snake_case_method_names() {
    let cloud = FakeCloud::builder().legacy_instances(true).build();
    let provider = cloud.provider();
    let svc = service("ns", "web", UID);
    provider
        .instances_v2()
        .unwrap()
        .instance_metadata(&node("n1"))
        .await
        .unwrap();
    provider
        .instances()
        .unwrap()
        .instance_exists_by_provider_id("fake://n1")
        .await
        .unwrap();
    let lb = provider.load_balancer().unwrap();
    lb.ensure_load_balancer("c", &svc, &[host("n1")])
        .await
        .unwrap();
    lb.update_load_balancer("c", &svc, &[]).await.unwrap();
    provider
        .routes()
        .unwrap()
        .create_route("c", "u", &route("n1", "10.244.0.0/24"))
        .await
        .unwrap();

    assert_eq!(cloud.call_count("instance_metadata"), 1);
    assert_eq!(cloud.call_count("update_load_balancer"), 1);
    assert_eq!(cloud.call_count("get_load_balancer"), 0);
    let counts = cloud.call_counts();
    assert_eq!(
        counts.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "create_route",
            "ensure_load_balancer",
            "instance_exists_by_provider_id",
            "instance_metadata",
            "update_load_balancer"
        ]
    );
    for op in counts.keys() {
        assert!(OPERATIONS.contains(&op.as_str()), "{op}");
    }
    let log: Vec<(String, String)> = cloud
        .call_log()
        .into_iter()
        .map(|c| (c.operation, c.subject))
        .collect();
    let expected = [
        ("instance_metadata", "n1"),
        ("instance_exists_by_provider_id", "fake://n1"),
        ("ensure_load_balancer", "ns/web"),
        ("update_load_balancer", "ns/web"),
        ("create_route", "10.244.0.0/24"),
    ];
    assert_eq!(
        log,
        expected
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect::<Vec<_>>()
    );
    cloud.reset_calls();
    assert!(cloud.call_log().is_empty());
    assert_eq!(cloud.call_count("instance_metadata"), 0);
    // State survives a reset of the calls.
    assert_eq!(cloud.load_balancers().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_calls_from_many_tasks_are_all_recorded_and_consistent() {
    let cloud = FakeCloud::builder()
        .latency(Duration::from_millis(1))
        .build();
    let mut tasks = Vec::new();
    for i in 0..64 {
        let cloud = cloud.clone();
        tasks.push(tokio::spawn(async move {
            let lb = cloud.load_balancer().unwrap();
            let svc = service("ns", &format!("svc-{}", i % 8), &format!("uid-{}", i % 8));
            lb.ensure_load_balancer("c", &svc, &[host(&format!("n{i}"))])
                .await
                .unwrap();
            let meta = cloud
                .instances_v2()
                .unwrap()
                .instance_metadata(&node("shared"))
                .await
                .unwrap();
            meta.node_addresses
        }));
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    assert!(answers.windows(2).all(|w| w[0] == w[1]));
    assert_eq!(cloud.call_count("ensure_load_balancer"), 64);
    assert_eq!(cloud.call_count("instance_metadata"), 64);
    assert_eq!(cloud.call_log().len(), 128);
    assert_eq!(cloud.load_balancers().len(), 8);
}

/// The call log keeps the most recent `call_log_limit` calls, so a long-running fake cloud does
/// not grow with every call; the counts stay exact.
#[tokio::test]
async fn the_call_log_keeps_the_most_recent_calls_and_exact_counts() {
    let cloud = FakeCloud::builder().call_log_limit(3).build();
    let v2 = cloud.instances_v2().unwrap();
    for i in 0..5 {
        v2.instance_metadata(&node(&format!("n{i}"))).await.unwrap();
    }
    let subjects: Vec<String> = cloud.call_log().into_iter().map(|c| c.subject).collect();
    assert_eq!(subjects, ["n2", "n3", "n4"]);
    assert_eq!(cloud.calls_of("instance_metadata").len(), 3);
    assert_eq!(cloud.call_count("instance_metadata"), 5);

    let none = FakeCloud::builder().call_log_limit(0).build();
    none.instances_v2()
        .unwrap()
        .instance_metadata(&node("n1"))
        .await
        .unwrap();
    assert!(none.call_log().is_empty());
    assert_eq!(none.call_count("instance_metadata"), 1);
    assert_eq!(
        FakeCloud::default().config().call_log_limit,
        ccm_testing::fake_cloud::DEFAULT_CALL_LOG_LIMIT
    );
}

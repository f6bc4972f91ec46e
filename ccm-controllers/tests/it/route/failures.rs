//! Failed and retried cloud calls: Events, the `NetworkUnavailable` condition, `Retry`, and
//! backoff.

use ccm_testing::fake_cloud::{FakeCloud, Fault};
use ccm_testing::wait::eventually;
use std::time::Duration;

use super::{RouteTest, WAIT, cidr, failed_create_events, name, network_unavailable, test_config};

#[tokio::test]
async fn failed_create_emits_an_event_sets_no_route_created_and_is_retried_until_it_succeeds() {
    let log = ccm_testing::logging::record("warn");
    let fake = FakeCloud::default();
    fake.inject("create_route", Fault::FailNext(1_000));
    let h = RouteTest::start(fake.clone(), test_config(&cidr(109))).await;
    let node = h.node("flaky", &["10.109.1.0/24"]).await;
    let n = name(&node);

    let n2 = h.wait_condition(&n, "True", "NoRouteCreated").await;
    assert_eq!(
        network_unavailable(&n2).unwrap().message.as_deref(),
        Some("RouteController failed to create a route")
    );
    let client = h.cluster.client();
    assert!(
        eventually(WAIT, || async {
            !failed_create_events(client.clone(), &n).await.is_empty()
        })
        .await
    );
    let events = failed_create_events(client.clone(), &n).await;
    let e = &events[0];
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    let note = e.note.clone().unwrap_or_default();
    let uid = node.metadata.uid.clone().unwrap();
    assert!(
        note.starts_with(&format!(
            "Could not create route {uid} 10.109.1.0/24 for node {n} after "
        )),
        "{note}"
    );
    // Retried per route with backoff, without the (hour-long) periodic reconcile: each
    // reconcile (one list_routes each: the initial one and the Node's arrival) tries the
    // create once, so creates beyond the lists are per-route retries.
    assert!(
        eventually(WAIT, || async {
            fake.call_count("create_route") >= fake.call_count("list_routes") + 2
        })
        .await,
        "{:?}",
        fake.call_counts()
    );
    assert!(
        fake.call_count("list_routes") <= 2,
        "{:?}",
        fake.call_counts()
    );
    assert!(h.routes_of(&n).is_empty());
    // The Warning is in the log too, with the Node and the error, and the retries (each a
    // Warning Event of its own) do not add lines within the rate-limit interval (issue 28).
    let start = format!("Could not create route {uid} 10.109.1.0/24 for node {n} after ");
    crate::support::assert_warning_logged(&log, "FailedToCreateRoute", &n, &start);
    assert!(
        log.contains("injected failure of create_route"),
        "{}",
        log.text()
    );

    // The cloud recovers: the next retry creates the route and the condition flips.
    fake.clear_faults();
    h.wait_routes(&n, &["10.109.1.0/24"]).await;
    let n3 = h.wait_condition(&n, "False", "RouteCreated").await;
    let before = network_unavailable(&n2).unwrap().last_transition_time;
    let after = network_unavailable(&n3).unwrap().last_transition_time;
    assert!(after >= before);
    h.stop().await;
}

#[tokio::test]
async fn a_failed_create_does_not_fail_the_rest_of_the_reconcile() {
    let fake = FakeCloud::default();
    let h = RouteTest::start(fake.clone(), test_config(&cidr(110))).await;
    assert!(eventually(WAIT, || async { fake.call_count("list_routes") >= 1 }).await);
    // One of the next two creates fails.
    fake.inject("create_route", Fault::FailNext(1));
    let a = h.node("a", &["10.110.1.0/24"]).await;
    let b = h.node("b", &["10.110.2.0/24"]).await;
    h.wait_routes(&name(&a), &["10.110.1.0/24"]).await;
    h.wait_routes(&name(&b), &["10.110.2.0/24"]).await;
    h.wait_condition(&name(&a), "False", "RouteCreated").await;
    h.wait_condition(&name(&b), "False", "RouteCreated").await;
    h.stop().await;
}

#[tokio::test]
async fn retry_from_the_provider_is_honoured_without_a_failure_event() {
    let fake = FakeCloud::default();
    fake.inject(
        "create_route",
        Fault::Retry {
            after: Duration::from_millis(300),
            count: 1,
        },
    );
    let h = RouteTest::start(fake.clone(), test_config(&cidr(111))).await;
    let node = h.node("patient", &["10.111.1.0/24"]).await;
    let n = name(&node);
    h.wait_routes(&n, &["10.111.1.0/24"]).await;
    h.wait_condition(&n, "False", "RouteCreated").await;
    assert!(
        failed_create_events(h.cluster.client(), &n)
            .await
            .is_empty()
    );
    h.stop().await;
}

#[tokio::test]
async fn a_failed_or_retried_list_requeues_the_reconcile_without_waiting_for_the_period() {
    for fault in [
        Fault::FailNext(1),
        Fault::Retry {
            after: Duration::from_millis(300),
            count: 1,
        },
    ] {
        let fake = FakeCloud::default();
        let h = RouteTest::start(fake.clone(), test_config(&cidr(119))).await;
        assert!(eventually(WAIT, || async { fake.call_count("list_routes") >= 1 }).await);
        h.settle().await;
        fake.reset_calls();
        // The reconcile the Node's arrival triggers fails to list; only its requeue (the
        // period is an hour) can create the route.
        fake.inject("list_routes", fault.clone());
        let node = h.node("relist", &["10.119.1.0/24"]).await;
        h.wait_routes(&name(&node), &["10.119.1.0/24"]).await;
        assert!(
            fake.call_count("list_routes") >= 2,
            "{fault:?}: {:?}",
            fake.call_counts()
        );
        h.stop().await;
    }
}

#[tokio::test]
async fn a_failed_delete_is_retried_with_backoff() {
    let fake = FakeCloud::default();
    let h = RouteTest::start(fake.clone(), test_config(&cidr(120))).await;
    let node = h.node("undeletable", &["10.120.1.0/24"]).await;
    let n = name(&node);
    h.wait_routes(&n, &["10.120.1.0/24"]).await;
    h.settle().await;
    fake.inject("delete_route", Fault::FailNext(2));
    h.nodes().delete(&n, &Default::default()).await.unwrap();
    h.wait_routes(&n, &[]).await;
    assert_eq!(
        fake.call_count("delete_route"),
        3,
        "{:?}",
        fake.call_counts()
    );
    h.stop().await;
}

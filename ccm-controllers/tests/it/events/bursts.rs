//! Bursts: a burst as large as the queue is written in full, with the writer's bound of writes
//! in flight kept full.

use ccm_controllers::MAX_IN_FLIGHT;
use ccm_testing::wait::eventually;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use super::{HANG, WAIT, WriterTest, subject};

/// Object `i` of a burst: each its own Event (the spam filter allows 25 per object).
fn burst_subject(t: &WriterTest, i: usize) -> Service {
    subject(&t.ns, &format!("{}-{i}", t.name))
}

/// All Events in the test's namespace.
async fn all_events(t: &WriterTest) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(t.cluster.client(), &t.ns);
    api.list(&ListParams::default()).await.unwrap().items
}

#[tokio::test]
async fn a_burst_as_large_as_the_queue_is_written_in_full() {
    let (t, writer) = WriterTest::start(None).await;
    let n = t.events.capacity();
    // Queued before the writer runs: the whole queue at once, nothing dropped.
    for i in 0..n {
        t.recorder
            .normal(&burst_subject(&t, i), "Synced", "Node synced successfully");
    }
    assert_eq!(t.events.queued(), n);
    assert_eq!(t.counted("dropped"), 0);
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), WAIT));
    t.wait_counted("written", n as u64).await;
    let events = all_events(&t).await;
    assert_eq!(events.len(), n);
    let mut objects: Vec<String> = events
        .iter()
        .map(|e| e.regarding.as_ref().unwrap().name.clone().unwrap())
        .collect();
    objects.sort();
    objects.dedup();
    assert_eq!(objects.len(), n, "one Event per object");
    assert_eq!(t.counted("dropped"), 0);
    assert_eq!(t.counted("failed"), 0);
    stop.cancel();
    task.await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn the_writer_keeps_max_in_flight_writes_in_flight() {
    let (t, writer) = WriterTest::start(None).await;
    let Some(server) = t.cluster.api_server() else {
        return; // needs fault injection
    };
    let n = MAX_IN_FLIGHT + 8;
    // Every create hangs (the client waits an hour to retry the 429): each holds its slot.
    server.fail_next("create", "events", n, 429, Some(HANG));
    for i in 0..n {
        t.recorder
            .normal(&burst_subject(&t, i), "Synced", "Node synced successfully");
    }
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), Duration::from_millis(500)));
    let hung = || {
        server
            .requests()
            .iter()
            .filter(|r| r.resource == "events" && r.status == 429)
            .count()
    };
    assert!(eventually(WAIT, || async { hung() == MAX_IN_FLIGHT }).await);
    // The rest wait in the queue for a slot: no further write is made.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(hung(), MAX_IN_FLIGHT);
    assert_eq!(t.events.queued(), n - MAX_IN_FLIGHT);
    stop.cancel();
    tokio::time::timeout(WAIT, task)
        .await
        .expect("the writer stops at the flush deadline")
        .unwrap();
    assert_eq!(t.counted("dropped"), n as u64);
    assert_eq!(t.counted("written"), 0);
    t.cluster.cleanup().await;
}

//! Failed writes retried as client-go retries them: server errors retried, client errors not,
//! given up after the last try, and a stop during a retry sleep ending at the flush deadline.

use ccm_controllers::MAX_TRIES_PER_EVENT;
use ccm_testing::apiserver::ApiServer;
use ccm_testing::wait::eventually;
use k8s_openapi::api::events::v1::Event;
use kube::api::Api;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use super::{HANG, WAIT, WriterTest, reasons, repeats_at_once};

const QUICK: Duration = Duration::from_millis(20);

/// The statuses the server answered to Event creates, in order.
fn event_creates(server: &ApiServer) -> Vec<u16> {
    server
        .requests()
        .iter()
        .filter(|r| r.resource == "events" && r.verb == "create")
        .map(|r| r.status)
        .collect()
}

#[tokio::test]
async fn a_server_error_is_retried_and_does_not_hold_up_other_events() {
    let (t, writer) = WriterTest::start(None).await;
    let Some(server) = t.cluster.api_server() else {
        return; // needs fault injection
    };
    let writer = writer.with_retries(MAX_TRIES_PER_EVENT, QUICK);
    server.fail_next("create", "events", 1, 500, None);
    t.recorder
        .normal(&t.object, "First", "refused once with 500");
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), WAIT));
    t.wait_counted("written", 1).await;
    t.recorder.normal(&t.object, "Second", "recorded after it");

    let written = t.wait_events(2).await;
    assert_eq!(reasons(&written), ["First", "Second"], "{written:#?}");
    t.wait_counted("written", 2).await;
    assert_eq!(t.counted("retried"), 1);
    assert_eq!(t.counted("failed"), 0);
    // One refused create and its retry; each Event written once.
    assert_eq!(event_creates(server), [500, 201, 201]);

    stop.cancel();
    task.await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn an_event_the_server_rejects_with_a_client_error_is_not_retried() {
    let (t, writer) = WriterTest::start(None).await;
    let Some(server) = t.cluster.api_server() else {
        return; // needs fault injection
    };
    let writer = writer.with_retries(MAX_TRIES_PER_EVENT, QUICK);
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), WAIT));
    // Bad request, AlreadyExists, Forbidden (e.g. the namespace is terminating), Invalid.
    let statuses = [400, 409, 403, 422];
    for (i, status) in statuses.into_iter().enumerate() {
        server.fail_next("create", "events", 1, status, None);
        t.recorder
            .warning(&t.object, &format!("Rejected{status}"), "refused for good");
        // Given up on, not retried (a retry would meet no fault and be written).
        t.wait_counted("failed", i as u64 + 1).await;
    }
    // A retry would be made before the next queued Event is written.
    t.recorder.normal(&t.object, "Accepted", "written");
    let written = t.wait_events(1).await;
    assert_eq!(reasons(&written), ["Accepted"], "{written:#?}");
    assert_eq!(event_creates(server), [400, 409, 403, 422, 201]);
    assert_eq!(t.counted("retried"), 0);
    assert_eq!(t.counted("failed"), 4);
    assert_eq!(t.counted("written"), 1);

    stop.cancel();
    task.await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn an_event_that_keeps_failing_is_given_up_after_the_last_try() {
    let (t, writer) = WriterTest::start(None).await;
    let Some(server) = t.cluster.api_server() else {
        return; // needs fault injection
    };
    let writer = writer.with_retries(MAX_TRIES_PER_EVENT, QUICK);
    let tries = MAX_TRIES_PER_EVENT as usize;
    // One failure more than the tries: the extra one would be seen by a 13th try.
    server.fail_next("create", "events", tries + 1, 500, None);
    t.recorder.normal(&t.object, "Doomed", "refused every time");
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), WAIT));
    t.wait_counted("failed", 1).await;
    assert_eq!(t.counted("retried"), tries as u64 - 1);
    assert_eq!(event_creates(server), vec![500; tries]);
    // The writer goes on with the next Event (which meets the one fault left over).
    t.recorder
        .normal(&t.object, "Next", "written after one retry");
    let written = t.wait_events(1).await;
    assert_eq!(reasons(&written), ["Next"], "{written:#?}");
    assert_eq!(t.counted("failed"), 1);
    assert_eq!(t.counted("retried"), tries as u64);

    stop.cancel();
    task.await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn a_repeat_whose_series_event_is_gone_is_created_anew() {
    let (t, writer) = WriterTest::start(None).await;
    let writer = writer
        .with_retries(MAX_TRIES_PER_EVENT, QUICK)
        .with_normal_budget(repeats_at_once());
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), WAIT));
    t.recorder
        .normal(&t.object, "Synced", "Node synced successfully");
    let first = t.wait_events(1).await;
    let api: Api<Event> = Api::namespaced(t.cluster.client(), &t.ns);
    api.delete(
        first[0].metadata.name.as_deref().unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    assert!(eventually(WAIT, || async { t.events_now().await.is_empty() }).await);
    // The repeat's PATCH of the series meets 404: as client-go, the Event is created anew,
    // under its name and with its count.
    t.recorder
        .normal(&t.object, "Synced", "Node synced successfully");
    let again = t.wait_events(1).await;
    assert_eq!(reasons(&again), ["Synced"]);
    assert_eq!(again[0].metadata.name, first[0].metadata.name);
    assert_eq!(again[0].series.as_ref().map(|s| s.count), Some(2));
    t.wait_counted("written", 2).await;
    assert_eq!(t.counted("retried"), 1);
    assert_eq!(t.counted("failed"), 0);

    stop.cancel();
    task.await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn stopping_during_a_retry_sleep_ends_at_the_flush_deadline_and_flushes_the_rest() {
    let (t, writer) = WriterTest::start(None).await;
    let Some(server) = t.cluster.api_server() else {
        return; // needs fault injection
    };
    // Sleeps of up to an hour between tries: a retry never comes during the test.
    let writer = writer
        .with_retries(MAX_TRIES_PER_EVENT, HANG)
        .with_normal_budget(repeats_at_once());
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), Duration::from_secs(2)));
    t.recorder
        .normal(&t.object, "Retrying", "written, then its repeat is refused");
    t.wait_counted("written", 1).await;
    // The repeat is a PATCH of the series. Two failures: should the random first sleep be
    // short, the second try fails too and the writer sleeps the full hour. Creates (the Event
    // queued behind) meet no fault.
    server.fail_next("patch", "events", 2, 500, None);
    t.recorder
        .normal(&t.object, "Retrying", "written, then its repeat is refused");
    t.recorder.normal(&t.object, "Queued", "written meanwhile");
    assert!(
        eventually(WAIT, || async {
            server
                .requests()
                .iter()
                .any(|r| r.resource == "events" && r.verb == "patch" && r.status == 500)
        })
        .await
    );
    stop.cancel();
    // Bounded by the flush deadline, not by the hour.
    tokio::time::timeout(WAIT, task)
        .await
        .expect("the writer stops at the flush deadline")
        .unwrap();
    // The retrying Event is given up on (it was refused); the other one is written.
    assert_eq!(t.counted("failed"), 1);
    assert_eq!(t.counted("dropped"), 0);
    assert_eq!(t.counted("written"), 2);
    let written = t.events_now().await;
    assert_eq!(reasons(&written), ["Queued", "Retrying"], "{written:#?}");
    assert!(written.iter().all(|e| e.series.is_none()), "{written:#?}");
    t.cluster.cleanup().await;
}

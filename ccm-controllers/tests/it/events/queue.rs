//! The queue: Events arrive as recorded and repeats fold, a full queue drops and counts, and
//! stopping flushes within its deadline.

use ccm_controllers::{ControllerContext, NormalEventBudget};
use ccm_testing::TestCluster;
use ccm_testing::fake_cloud::FakeCloud;
use ccm_testing::wait::eventually;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use super::{HANG, WAIT, WriterTest, counted, events_of, reasons, subject, wait_events};

#[tokio::test]
async fn events_arrive_with_their_type_reason_note_and_reporter_and_repeats_fold() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let name = cluster.unique_name("subject");
    let (ctx, mut tasks) =
        ControllerContext::standalone(cluster.client(), FakeCloud::default().provider(), "k");
    let recorder = ctx.recorder("test-controller");
    let object = subject(&ns, &name);
    recorder.normal(&object, "EnsuringLoadBalancer", "Ensuring load balancer");
    recorder.warning(&object, "SyncLoadBalancerFailed", "Error syncing: boom");

    let events = wait_events(&cluster.client(), &ns, &name, 2).await;
    let normal = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("EnsuringLoadBalancer"))
        .unwrap();
    assert_eq!(normal.type_.as_deref(), Some("Normal"));
    assert_eq!(normal.note.as_deref(), Some("Ensuring load balancer"));
    assert_eq!(normal.action.as_deref(), Some("EnsuringLoadBalancer"));
    assert_eq!(
        normal.reporting_controller.as_deref(),
        Some("test-controller")
    );
    assert_eq!(normal.reporting_instance.as_deref(), Some("standalone"));
    let warning = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("SyncLoadBalancerFailed"))
        .unwrap();
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    assert_eq!(warning.note.as_deref(), Some("Error syncing: boom"));

    // A repeat is folded into the first Event's series (kube's Recorder), not a new Event. A
    // Normal repeat waits for the end of its Event's repeat window (30 s); stopping writes it.
    recorder.normal(&object, "EnsuringLoadBalancer", "Ensuring load balancer");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(counted(&ctx.metrics, "written"), 2, "the repeat waits");
    ctx.shutdown.cancel();
    while tasks.join_next().await.is_some() {}
    let events = events_of(&cluster.client(), &ns, &name).await;
    assert!(
        events
            .iter()
            .any(|e| e.series.as_ref().is_some_and(|s| s.count == 2)),
        "no series of 2: {events:#?}"
    );
    assert_eq!(events.len(), 2, "{events:#?}");
    assert_eq!(counted(&ctx.metrics, "written"), 3);
    assert_eq!(counted(&ctx.metrics, "dropped"), 0);
    cluster.cleanup().await;
}

/// A Normal Event that finds the queue full is not written (as client-go drops it) but
/// counted, and told by the summary Event of its reason.
#[tokio::test]
async fn a_full_queue_folds_new_normal_events_into_summaries_and_counts_them() {
    // The writer is not running yet: nothing leaves the queue.
    let (t, writer) = WriterTest::start(Some(2)).await;
    let long = Duration::from_secs(60);
    let writer =
        writer.with_normal_budget(NormalEventBudget::default().with_summary_delays(long, long));
    for i in 1..=5 {
        t.recorder
            .normal(&t.object, &format!("Reason{i}"), format!("event {i}"));
    }
    assert_eq!(t.events.queued(), 2);
    assert_eq!(t.counted("dropped"), 0);
    assert_eq!(t.counted("summarised"), 3);
    for i in 3..=5 {
        assert_eq!(t.not_written(&format!("Reason{i}"), "queue_full"), 1);
    }

    // As client-go's DropIfChannelFull: the queued ones are kept, the newer ones not written.
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), Duration::from_secs(5)));
    let written = t.wait_events(2).await;
    assert_eq!(reasons(&written), ["Reason1", "Reason2"]);
    t.wait_counted("written", 2).await;
    // Room again: the next one is written.
    t.recorder.normal(&t.object, "Reason6", "event 6");
    let written = t.wait_events(3).await;
    assert_eq!(reasons(&written), ["Reason1", "Reason2", "Reason6"]);
    // Stopping writes the summaries still waiting: one per reason.
    stop.cancel();
    task.await.unwrap();
    let events = t.events_now().await;
    assert_eq!(
        reasons(&events),
        [
            "Reason1", "Reason2", "Reason3", "Reason4", "Reason5", "Reason6"
        ]
    );
    let summary = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("Reason5"))
        .unwrap();
    let note = summary.note.as_deref().unwrap();
    assert!(
        note.starts_with("1 Reason5 Event(s) of test-controller not written one by one"),
        "{note}"
    );
    assert!(note.ends_with("the last: event 5"), "{note}");
    assert_eq!(t.counted("summaries"), 3);
    assert_eq!(t.counted("dropped"), 0);
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn stopping_flushes_the_queue_and_later_events_are_dropped() {
    let (t, writer) = WriterTest::start(None).await;
    for i in 1..=3 {
        t.recorder
            .warning(&t.object, &format!("Reason{i}"), format!("event {i}"));
    }
    // Told to stop before it wrote anything: it still writes what is queued, then returns.
    let stop = CancellationToken::new();
    stop.cancel();
    writer.run(stop, WAIT).await;
    t.events.stopped().await;
    let written = t.events_now().await;
    assert_eq!(reasons(&written), ["Reason1", "Reason2", "Reason3"]);
    assert_eq!(t.counted("written"), 3);

    // Nothing is written any more; what is recorded now is counted as dropped.
    t.recorder
        .normal(&t.object, "TooLate", "after the writer stopped");
    assert_eq!(t.counted("dropped"), 1);
    assert_eq!(t.events.queued(), 0);
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn a_hung_write_is_abandoned_at_the_flush_deadline_and_counted() {
    let (t, writer) = WriterTest::start(None).await;
    let Some(server) = t.cluster.api_server() else {
        return; // needs fault injection
    };
    server.fail_next("create", "events", 1, 429, Some(HANG));
    t.recorder
        .normal(&t.object, "Hangs", "the first write hangs");
    let stop = CancellationToken::new();
    let task = tokio::spawn(writer.run(stop.clone(), Duration::from_millis(200)));
    // The first write is in flight (answered 429, the client waits an hour to retry).
    assert!(
        eventually(WAIT, || async {
            server
                .requests()
                .iter()
                .any(|r| r.resource == "events" && r.status == 429)
        })
        .await
    );
    // Another Event is written meanwhile: the hung write holds one slot, not the writer.
    t.recorder.normal(&t.object, "Passes", "written beside it");
    let written = t.wait_events(1).await;
    assert_eq!(reasons(&written), ["Passes"]);
    stop.cancel();
    // Bounded by the flush deadline, not by the hour.
    tokio::time::timeout(WAIT, task)
        .await
        .expect("the writer stops at the flush deadline")
        .unwrap();
    assert_eq!(t.counted("dropped"), 1);
    assert_eq!(t.counted("written"), 1);
    assert_eq!(reasons(&t.events_now().await), ["Passes"]);
    t.cluster.cleanup().await;
}

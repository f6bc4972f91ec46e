//! kube-runtime machinery (watcher, reflector, Controller, events Recorder) and
//! kube-lease-manager running against the in-process API server.

use std::sync::Arc;
use std::time::Duration;

use ccm_testing::apiserver::ApiServer;
use ccm_testing::builders::kubelet_node;
use ccm_testing::wait::{eventually, wait_for};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Event as CoreEvent, Node};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector;
use kube::runtime::watcher::{self, Event as WEvent};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use crate::support::server_with_node;

const T: Duration = Duration::from_secs(20);

async fn next<S, K>(s: &mut S) -> WEvent<K>
where
    S: futures::Stream<Item = Result<WEvent<K>, watcher::Error>> + Unpin,
{
    tokio::time::timeout(T, s.try_next())
        .await
        .expect("a watcher event in time")
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn watcher_lists_then_watches_and_recovers() {
    let (s, nodes, _) = server_with_node("n1").await;
    let mut w = watcher(nodes.clone(), watcher::Config::default()).boxed();
    assert!(matches!(next(&mut w).await, WEvent::Init));
    match next(&mut w).await {
        WEvent::InitApply(n) => assert_eq!(n.name_any(), "n1"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(next(&mut w).await, WEvent::InitDone));
    nodes
        .create(&PostParams::default(), &kubelet_node("n2").build())
        .await
        .unwrap();
    match next(&mut w).await {
        WEvent::Apply(n) => assert_eq!(n.name_any(), "n2"),
        other => panic!("{other:?}"),
    }
    // What kube sent: a paged list, then a watch from the list's resourceVersion with bookmarks.
    let log = s.requests();
    let list = log.iter().find(|r| r.verb == "list").unwrap();
    assert!(list.query.contains("limit=500"), "{}", list.query);
    let watch = log.iter().find(|r| r.verb == "watch").unwrap();
    assert!(
        watch.query.contains("allowWatchBookmarks=true"),
        "{}",
        watch.query
    );
    assert!(
        watch.query.contains("timeoutSeconds=290"),
        "{}",
        watch.query
    );

    // Closed watches: the watcher re-watches from its last resourceVersion, losing nothing.
    s.close_watches();
    nodes.delete("n1", &DeleteParams::default()).await.unwrap();
    match next(&mut w).await {
        WEvent::Delete(n) => assert_eq!(n.name_any(), "n1"),
        other => panic!("{other:?}"),
    }
    assert!(s.requests().iter().filter(|r| r.verb == "watch").count() >= 2);

    // Compaction + closed watch: the re-watch gets 410 Gone, the watcher relists.
    let lists_before = s.requests().iter().filter(|r| r.verb == "list").count();
    // Move the global resourceVersion past the watcher's (another resource changes), then
    // compact: the watcher's version is now too old.
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(s.client(), "default");
    let mut cm = k8s_openapi::api::core::v1::ConfigMap::default();
    cm.metadata.name = Some("bump".into());
    cms.create(&PostParams::default(), &cm).await.unwrap();
    s.compact();
    s.close_watches();
    nodes
        .create(&PostParams::default(), &kubelet_node("n3").build())
        .await
        .unwrap();
    // After the relist the watcher restarts with Init .. InitDone, then carries on.
    let mut saw_n3 = false;
    let mut saw_gone = false;
    while !saw_n3 {
        match tokio::time::timeout(T, w.next()).await.unwrap().unwrap() {
            Ok(WEvent::InitApply(n)) | Ok(WEvent::Apply(n)) => saw_n3 |= n.name_any() == "n3",
            Ok(_) => {}
            // The watcher surfaces the 410 once, then relists on the next poll.
            Err(watcher::Error::WatchError(e)) => {
                assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
                saw_gone = true;
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(saw_gone);
    let lists_after = s.requests().iter().filter(|r| r.verb == "list").count();
    assert!(lists_after > lists_before, "the watcher relisted after 410");
}

use kube::runtime::watcher::watcher;

#[tokio::test]
async fn reflector_store_follows_the_server() {
    let s = ApiServer::start().await;
    let nodes: Api<Node> = Api::all(s.client());
    for i in 0..3 {
        nodes
            .create(
                &PostParams::default(),
                &kubelet_node(&format!("n{i}")).build(),
            )
            .await
            .unwrap();
    }
    let (store, writer) = reflector::store::<Node>();
    // A consistent read (resourceVersion unset) is paginated; `resourceVersion=0`, kube's
    // default, would come whole from the watch cache.
    let config = watcher::Config::default()
        .page_size(2)
        .list_semantic(watcher::ListSemantic::MostRecent);
    let stream = watcher(nodes.clone(), config)
        .default_backoff()
        .modify(|n| n.managed_fields_mut().clear())
        .reflect(writer)
        .applied_objects();
    let task = tokio::spawn(stream.for_each(|_| async {}));
    tokio::time::timeout(T, store.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.len(), 3);
    // The server reports managedFields; the stripped cache has none.
    assert!(
        !nodes
            .get("n0")
            .await
            .unwrap()
            .metadata
            .managed_fields
            .unwrap_or_default()
            .is_empty()
    );
    assert!(
        store
            .state()
            .iter()
            .all(|n| n.metadata.managed_fields.as_ref().is_none_or(Vec::is_empty))
    );
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"seen": "yes"}}})),
        )
        .await
        .unwrap();
    nodes.delete("n2", &DeleteParams::default()).await.unwrap();
    assert!(
        eventually(T, || async {
            store.len() == 2
                && store
                    .get(&reflector::ObjectRef::new("n1"))
                    .is_some_and(|n| n.labels().get("seen").map(String::as_str) == Some("yes"))
        })
        .await
    );
    // Paged initial list: limit=2 gives two list requests.
    assert_eq!(s.requests().iter().filter(|r| r.verb == "list").count(), 2);
    task.abort();
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct ReconcileError(#[from] kube::Error);

#[tokio::test]
async fn controller_reconciles_every_node() {
    let s = ApiServer::start().await;
    let nodes: Api<Node> = Api::all(s.client());
    for i in 0..4 {
        nodes
            .create(
                &PostParams::default(),
                &kubelet_node(&format!("n{i}")).build(),
            )
            .await
            .unwrap();
    }
    let ctx = Arc::new(nodes.clone());
    let controller = Controller::new(nodes.clone(), watcher::Config::default())
        .run(
            |node: Arc<Node>, api: Arc<Api<Node>>| async move {
                api.patch(
                    &node.name_any(),
                    &PatchParams::default(),
                    &Patch::Strategic(json!({"metadata": {"labels": {"reconciled": "true"}}})),
                )
                .await?;
                Ok::<_, ReconcileError>(Action::await_change())
            },
            |_, _, _| Action::requeue(Duration::from_secs(1)),
            ctx,
        )
        .for_each(|_| async {});
    let task = tokio::spawn(controller);
    for i in 0..4 {
        wait_for(&nodes, &format!("n{i}"), T, |n: &Node| {
            n.labels().contains_key("reconciled")
        })
        .await
        .unwrap();
    }
    // A node created later is reconciled too.
    nodes
        .create(&PostParams::default(), &kubelet_node("late").build())
        .await
        .unwrap();
    wait_for(&nodes, "late", T, |n: &Node| {
        n.labels().contains_key("reconciled")
    })
    .await
    .unwrap();
    let patches = s
        .requests()
        .into_iter()
        .filter(|r| r.verb == "patch")
        .collect::<Vec<_>>();
    assert!(patches.len() >= 5);
    assert!(
        patches
            .iter()
            .all(|r| r.content_type.as_deref() == Some("application/strategic-merge-patch+json"))
    );
    task.abort();
}

#[tokio::test]
async fn metadata_only_and_streaming_list_watchers() {
    let (s, nodes, _) = server_with_node("n1").await;
    let meta: Api<PartialObjectMeta<Node>> = Api::all(s.client());
    let mut w = watcher(meta, watcher::Config::default()).boxed();
    assert!(matches!(next(&mut w).await, WEvent::Init));
    match next(&mut w).await {
        WEvent::InitApply(m) => assert_eq!(m.name_any(), "n1"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(next(&mut w).await, WEvent::InitDone));

    // WatchList (sendInitialEvents): initial ADDED events, then the initial-events-end bookmark.
    let mut w = watcher(nodes.clone(), watcher::Config::default().streaming_lists()).boxed();
    assert!(matches!(next(&mut w).await, WEvent::Init));
    match next(&mut w).await {
        WEvent::InitApply(n) => assert_eq!(n.name_any(), "n1"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(next(&mut w).await, WEvent::InitDone));
    nodes
        .create(&PostParams::default(), &kubelet_node("n2").build())
        .await
        .unwrap();
    match next(&mut w).await {
        WEvent::Apply(n) => assert_eq!(n.name_any(), "n2"),
        other => panic!("{other:?}"),
    }
    assert!(
        s.requests()
            .iter()
            .any(|r| r.query.contains("sendInitialEvents=true"))
    );
}

#[tokio::test]
async fn recorder_events_show_up_in_both_event_apis() {
    let (s, _, node) = server_with_node("n1").await;
    let recorder = Recorder::new(s.client(), Reporter::from("cloud-node-controller"));
    recorder
        .publish(
            &Event {
                type_: EventType::Normal,
                reason: "Synced".into(),
                note: Some("Node synced successfully".into()),
                action: "Sync".into(),
                secondary: None,
            },
            &node.object_ref(&()),
        )
        .await
        .unwrap();
    let core: Api<CoreEvent> = Api::namespaced(s.client(), "default");
    let list = core
        .list(&ListParams::default().fields("involvedObject.name=n1"))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1);
    let ev = &list.items[0];
    assert_eq!(ev.reason.as_deref(), Some("Synced"));
    assert_eq!(ev.message.as_deref(), Some("Node synced successfully"));
    assert_eq!(ev.involved_object.kind.as_deref(), Some("Node"));
    assert_eq!(
        ev.reporting_component.as_deref(),
        Some("cloud-node-controller")
    );
    let v1: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(s.client(), "default");
    let list = v1.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(
        list.items[0].note.as_deref(),
        Some("Node synced successfully")
    );
    assert_eq!(
        list.items[0].regarding.as_ref().unwrap().name.as_deref(),
        Some("n1")
    );
}

#[tokio::test]
async fn lease_manager_elects_one_leader_and_hands_over() {
    use kube_lease_manager::LeaseManagerBuilder;
    let s = ApiServer::start().await;
    let a = LeaseManagerBuilder::new(s.client(), "ccm")
        .with_namespace("kube-system")
        .with_identity("a")
        .with_duration(3)
        .with_grace(1)
        .build()
        .await
        .unwrap();
    let b = LeaseManagerBuilder::new(s.client(), "ccm")
        .with_namespace("kube-system")
        .with_identity("b")
        .with_duration(3)
        .with_grace(1)
        .build()
        .await
        .unwrap();
    let (rx_a, task_a) = a.watch().await;
    let (rx_b, task_b) = b.watch().await;
    let one_leader = eventually(T, || {
        let (a, b) = (*rx_a.borrow(), *rx_b.borrow());
        async move { a ^ b }
    })
    .await;
    assert!(one_leader, "exactly one of the two must lead");
    // Both stay consistent for a while: never two leaders.
    for _ in 0..20 {
        assert!(!(*rx_a.borrow() && *rx_b.borrow()), "two leaders at once");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (leader_rx, follower_rx, leader_task, follower_task) = if *rx_a.borrow() {
        (rx_a, rx_b, task_a, task_b)
    } else {
        (rx_b, rx_a, task_b, task_a)
    };
    // The leader steps down (dropping its receiver releases the lease): the other takes over.
    drop(leader_rx);
    let _ = tokio::time::timeout(T, leader_task).await;
    assert!(
        eventually(T, || {
            let v = *follower_rx.borrow();
            async move { v }
        })
        .await
    );
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(s.client(), "kube-system");
    let lease = leases.get("ccm").await.unwrap();
    let holder = lease.spec.unwrap().holder_identity.unwrap();
    assert!(holder == "a" || holder == "b");
    drop(follower_rx);
    let _ = tokio::time::timeout(T, follower_task).await;
}

#[derive(Debug, thiserror::Error)]
#[error("cleanup failed")]
struct Never;

#[tokio::test]
async fn kube_finalizer_helper_adds_and_removes_its_finalizer() {
    use k8s_openapi::api::core::v1::Service;
    use kube::runtime::finalizer::{Event as Fin, finalizer};
    let s = ApiServer::start().await;
    let svcs: Api<Service> = Api::namespaced(s.client(), "default");
    svcs.create(
        &PostParams::default(),
        &ccm_testing::builders::load_balancer_service("default", "web").build(),
    )
    .await
    .unwrap();
    const F: &str = "service.kubernetes.io/load-balancer-cleanup";
    // First pass: no finalizers yet, the helper adds one (JSON patch: test null + add).
    let obj = Arc::new(svcs.get("web").await.unwrap());
    finalizer(&svcs, F, obj, |_ev| async {
        Ok::<_, Never>(Action::await_change())
    })
    .await
    .unwrap();
    let with = svcs.get("web").await.unwrap();
    assert_eq!(with.finalizers(), &[F.to_string()]);
    // Deletion: the object stays, the helper runs Cleanup and removes the finalizer.
    svcs.delete("web", &DeleteParams::default()).await.unwrap();
    let deleting = Arc::new(svcs.get("web").await.unwrap());
    let mut cleaned = false;
    finalizer(&svcs, F, deleting, |ev| {
        cleaned = matches!(ev, Fin::Cleanup(_));
        async { Ok::<_, Never>(Action::await_change()) }
    })
    .await
    .unwrap();
    assert!(cleaned);
    let e = svcs.get("web").await.unwrap_err();
    assert!(matches!(e, kube::Error::Api(s) if s.code == 404));
}

#[tokio::test]
async fn empty_lists_are_dropped_as_kube_apiserver_does() {
    let (_s, nodes, created) = server_with_node("n1").await;
    // Remove every taint (the builder's and admission's not-ready one) with a JSON patch: the
    // list disappears rather than staying [].
    let count = created.spec.unwrap().taints.unwrap().len();
    let ops: Vec<serde_json::Value> = (0..count)
        .rev()
        .map(|i| json!({"op": "remove", "path": format!("/spec/taints/{i}")}))
        .collect();
    let patch: json_patch::Patch = serde_json::from_value(json!(ops)).unwrap();
    let n = nodes
        .patch("n1", &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .unwrap();
    assert!(n.spec.as_ref().unwrap().taints.is_none());
    let n = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": null}, "spec": {"podCIDRs": []}})),
        )
        .await
        .unwrap();
    assert!(n.metadata.annotations.is_none());
    assert!(n.spec.unwrap().pod_cidrs.is_none());
}

#[tokio::test]
async fn an_injected_watch_expiry_makes_the_watcher_relist() {
    let (s, nodes, _) = server_with_node("n1").await;
    s.fail_next("watch", "nodes", 1, 410, None);
    let mut w = watcher(nodes.clone(), watcher::Config::default()).boxed();
    let mut gone = false;
    let mut init_done = 0;
    while init_done < 2 {
        match tokio::time::timeout(T, w.next()).await.unwrap().unwrap() {
            Ok(WEvent::InitDone) => init_done += 1,
            Ok(_) => {}
            Err(watcher::Error::WatchError(e)) => {
                assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
                gone = true;
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(gone);
    let log = s.requests();
    let expired = log.iter().find(|r| r.verb == "watch").unwrap();
    assert_eq!(
        expired.status, 200,
        "an expired watch is a 200 stream with an ERROR event"
    );
    assert_eq!(log.iter().filter(|r| r.verb == "list").count(), 2);
}

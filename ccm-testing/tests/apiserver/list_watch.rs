//! LIST and WATCH: selectors, pagination, exact resource versions, bookmarks, 410 Gone,
//! timeouts, selector transitions, open-watch counts and single-object watches.

use std::time::Duration;

use ccm_testing::apiserver::ApiServer;
use ccm_testing::builders::kubelet_node;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::support::{api_err, cm, configmap, rv, server_with_node};

#[tokio::test]
async fn list_selectors_and_pagination() {
    let s = ApiServer::start().await;
    let nodes: Api<Node> = Api::all(s.client());
    for i in 0..7 {
        let role = if i % 2 == 0 { "even" } else { "odd" };
        nodes
            .create(
                &PostParams::default(),
                &kubelet_node(&format!("n{i}")).label("role", role).build(),
            )
            .await
            .unwrap();
    }
    let even = nodes
        .list(&ListParams::default().labels("role=even"))
        .await
        .unwrap();
    assert_eq!(even.items.len(), 4);
    let not_even = nodes
        .list(&ListParams::default().labels("role!=even"))
        .await
        .unwrap();
    assert_eq!(not_even.items.len(), 3);
    let set = nodes
        .list(&ListParams::default().labels("role in (odd),kubernetes.io/os"))
        .await
        .unwrap();
    assert_eq!(set.items.len(), 3);
    let by_name = nodes
        .list(&ListParams::default().fields("metadata.name=n3"))
        .await
        .unwrap();
    assert_eq!(
        by_name
            .items
            .iter()
            .map(|n| n.name_any())
            .collect::<Vec<_>>(),
        vec!["n3"]
    );
    let e = api_err(
        nodes
            .list(&ListParams::default().fields("spec.bogus=1"))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (400, "BadRequest"));
    // Set-based and numeric requirements, as apimachinery's `labels.Parse` reads them.
    let by_set = nodes
        .list(&ListParams::default().labels("role notin (even), !absent"))
        .await
        .unwrap();
    assert_eq!(by_set.items.len(), 3);
    // A label selector kube-apiserver cannot parse is 400, never read leniently (an empty
    // requirement, an empty set, an invalid key or value, a number that is not one).
    for bad in [
        "role=even,",
        "role in ()",
        "-role=even",
        "role=a b",
        "role>x",
        "role in (odd",
    ] {
        let e = api_err(
            nodes
                .list(&ListParams::default().labels(bad))
                .await
                .unwrap_err(),
        );
        assert_eq!((e.code, e.reason.as_str()), (400, "BadRequest"), "{bad:?}");
    }

    // Namespaced lists across namespaces, with metadata.namespace.
    let all_cms: Api<ConfigMap> = Api::all(s.client());
    Api::<ConfigMap>::namespaced(s.client(), "default")
        .create(&PostParams::default(), &configmap("default", "a"))
        .await
        .unwrap();
    Api::<ConfigMap>::namespaced(s.client(), "kube-system")
        .create(&PostParams::default(), &configmap("kube-system", "a"))
        .await
        .unwrap();
    assert_eq!(
        all_cms
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        2
    );
    let ks = all_cms
        .list(&ListParams::default().fields("metadata.namespace=kube-system"))
        .await
        .unwrap();
    assert_eq!(ks.items.len(), 1);

    // Pages: limit + continue, consistent at the first page's resourceVersion.
    let first = nodes.list(&ListParams::default().limit(3)).await.unwrap();
    assert_eq!(first.items.len(), 3);
    let token = first.metadata.continue_.clone().unwrap();
    assert_eq!(first.metadata.remaining_item_count, Some(4));
    nodes
        .create(&PostParams::default(), &kubelet_node("n00").build())
        .await
        .unwrap();
    let second = nodes
        .list(&ListParams::default().limit(3).continue_token(&token))
        .await
        .unwrap();
    let third = nodes
        .list(
            &ListParams::default()
                .limit(3)
                .continue_token(second.metadata.continue_.as_ref().unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(
        second.metadata.resource_version,
        first.metadata.resource_version
    );
    let mut names: Vec<String> = first
        .items
        .iter()
        .chain(&second.items)
        .chain(&third.items)
        .map(|n| n.name_any())
        .collect();
    assert!(
        third
            .metadata
            .continue_
            .as_deref()
            .is_none_or(str::is_empty)
    );
    names.dedup();
    assert_eq!(names, vec!["n0", "n1", "n2", "n3", "n4", "n5", "n6"]);
    // `resourceVersion=0` is served from the watch cache, whole: kube-apiserver ignores the
    // limit there. (kube's `ListParams` never sends both, so this is a raw request.)
    let request = http::Request::get("/api/v1/nodes?limit=3&resourceVersion=0")
        .body(Vec::new())
        .unwrap();
    let whole: kube::core::ObjectList<Node> = s.client().request(request).await.unwrap();
    assert_eq!(whole.items.len(), 8);
    assert!(
        whole
            .metadata
            .continue_
            .as_deref()
            .is_none_or(str::is_empty)
    );
    // A continue token from before a compaction is gone.
    let first = nodes.list(&ListParams::default().limit(3)).await.unwrap();
    s.compact();
    let e = api_err(
        nodes
            .list(
                &ListParams::default()
                    .limit(3)
                    .continue_token(first.metadata.continue_.as_ref().unwrap()),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
}

#[tokio::test]
async fn list_at_an_exact_resource_version() {
    use kube::api::VersionMatch;
    let s = ApiServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let a = cms
        .create(&PostParams::default(), &cm("default", "a", &[("v", "1")]))
        .await
        .unwrap();
    cms.create(&PostParams::default(), &cm("default", "b", &[]))
        .await
        .unwrap();
    let at = s.resource_version().to_string();
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"v": "2"}}})),
    )
    .await
    .unwrap();
    cms.delete("b", &DeleteParams::default()).await.unwrap();
    cms.create(&PostParams::default(), &cm("default", "c", &[]))
        .await
        .unwrap();

    let then = cms
        .list(&ListParams::default().at(&at).matching(VersionMatch::Exact))
        .await
        .unwrap();
    assert_eq!(then.metadata.resource_version.as_deref(), Some(at.as_str()));
    let names: Vec<String> = then.items.iter().map(|c| c.name_any()).collect();
    assert_eq!(names, vec!["a", "b"]);
    assert_eq!(then.items[0].labels()["v"], "1");
    assert_eq!(then.items[0].resource_version(), a.resource_version());
    let now = cms.list(&ListParams::default()).await.unwrap();
    let names: Vec<String> = now.items.iter().map(|c| c.name_any()).collect();
    assert_eq!(names, vec!["a", "c"]);
    // NotOlderThan an old version serves the latest state.
    let latest = cms
        .list(
            &ListParams::default()
                .at(&at)
                .matching(VersionMatch::NotOlderThan),
        )
        .await
        .unwrap();
    assert_eq!(latest.items.len(), 2);
    assert_eq!(latest.items[0].labels()["v"], "2");
    // From the future: 504 (asked without client retries: kube retries 504 by itself);
    // compacted: 410.
    let mut cfg = kube::Config::new(s.url().parse().unwrap());
    cfg.default_retry = false;
    let no_retry: Api<ConfigMap> = Api::namespaced(kube::Client::try_from(cfg).unwrap(), "default");
    let future = (s.resource_version() + 10).to_string();
    let e = api_err(
        no_retry
            .list(
                &ListParams::default()
                    .at(&future)
                    .matching(VersionMatch::Exact),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (504, "Timeout"));
    s.compact();
    let e = api_err(
        cms.list(&ListParams::default().at(&at).matching(VersionMatch::Exact))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
}

#[tokio::test]
async fn watch_resource_versions_bookmarks_gone_and_timeout() {
    let s = ApiServer::start().await;
    s.set_bookmark_interval(Duration::from_millis(100));
    let cms: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let a = cms
        .create(&PostParams::default(), &configmap("default", "a"))
        .await
        .unwrap();
    let b = cms
        .create(&PostParams::default(), &configmap("default", "b"))
        .await
        .unwrap();

    // From "0": the current state as ADDED.
    let mut st = cms
        .watch(&WatchParams::default().timeout(2), "0")
        .await
        .unwrap()
        .boxed();
    let mut added = Vec::new();
    while added.len() < 2 {
        if let WatchEvent::Added(o) = st.try_next().await.unwrap().unwrap() {
            added.push(o.name_any());
        }
    }
    added.sort();
    assert_eq!(added, vec!["a", "b"]);
    drop(st);

    // From a's resourceVersion: only what happened after (b's ADDED, then later changes).
    let mut st = cms
        .watch(
            &WatchParams::default().timeout(5),
            &a.resource_version().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    cms.delete("a", &DeleteParams::default()).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match st.try_next().await.unwrap().unwrap() {
            WatchEvent::Added(o) => seen.push(format!("ADDED {}", o.name_any())),
            WatchEvent::Deleted(o) => seen.push(format!("DELETED {}", o.name_any())),
            WatchEvent::Bookmark(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, vec!["ADDED b", "DELETED a"]);
    drop(st);

    // Bookmarks carry a resourceVersion no older than what was sent.
    let mut st = cms
        .watch(
            &WatchParams::default().timeout(5),
            &b.resource_version().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    loop {
        match st.try_next().await.unwrap().unwrap() {
            WatchEvent::Bookmark(bm) => {
                assert!(bm.metadata.resource_version.parse::<u64>().unwrap() >= rv(&b));
                break;
            }
            WatchEvent::Deleted(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    drop(st);

    // timeoutSeconds ends the stream.
    let st = cms
        .watch(
            &WatchParams::default().timeout(1).disable_bookmarks(),
            &s.resource_version().to_string(),
        )
        .await
        .unwrap();
    let events: Vec<_> = tokio::time::timeout(Duration::from_secs(20), st.collect::<Vec<_>>())
        .await
        .expect("the watch ends");
    assert!(events.is_empty(), "{events:?}");

    // Compacted history: 410 Expired as an ERROR event.
    s.compact();
    let mut st = cms
        .watch(&WatchParams::default(), &a.resource_version().unwrap())
        .await
        .unwrap()
        .boxed();
    match st.try_next().await.unwrap().unwrap() {
        WatchEvent::Error(e) => {
            assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
            assert!(
                e.message.starts_with("too old resource version"),
                "{}",
                e.message
            );
        }
        other => panic!("expected 410, got {other:?}"),
    }
}

#[tokio::test]
async fn watch_label_selector_transitions() {
    let s = ApiServer::start().await;
    let nodes: Api<Node> = Api::all(s.client());
    let start = s.resource_version().to_string();
    let mut st = nodes
        .watch(
            &WatchParams::default().labels("pool=a").disable_bookmarks(),
            &start,
        )
        .await
        .unwrap()
        .boxed();
    nodes
        .create(&PostParams::default(), &kubelet_node("n1").build())
        .await
        .unwrap();
    let pp = PatchParams::default();
    nodes
        .patch(
            "n1",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"pool": "a"}}})),
        )
        .await
        .unwrap();
    nodes
        .patch(
            "n1",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
        )
        .await
        .unwrap();
    nodes
        .patch(
            "n1",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"pool": "b"}}})),
        )
        .await
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        seen.push(match st.try_next().await.unwrap().unwrap() {
            WatchEvent::Added(_) => "ADDED",
            WatchEvent::Modified(_) => "MODIFIED",
            WatchEvent::Deleted(_) => "DELETED",
            other => panic!("unexpected {other:?}"),
        });
    }
    assert_eq!(seen, vec!["ADDED", "MODIFIED", "DELETED"]);
}

#[tokio::test]
async fn open_watches_are_counted() {
    let s = ApiServer::start().await;
    let nodes: Api<Node> = Api::all(s.client());
    assert_eq!(s.open_watches("nodes"), 0);
    let st = nodes
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    let leases: Api<Lease> = Api::namespaced(s.client(), "default");
    let st2 = leases
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    assert_eq!(s.open_watches("nodes"), 1);
    assert_eq!(s.open_watches("leases.coordination.k8s.io"), 1);
    assert_eq!(s.open_watches("*"), 2);
    // close_watches ends them on the server side.
    s.close_watches();
    let ended = ccm_testing::wait::eventually(Duration::from_secs(20), || async {
        s.open_watches("*") == 0
    })
    .await;
    assert!(ended);
    let rest: Vec<_> = st.collect().await;
    assert!(rest.is_empty());
    drop(st2);
}

#[tokio::test]
async fn await_condition_uses_a_single_object_watch() {
    use kube::runtime::wait::{await_condition, conditions};
    let (s, nodes, n) = server_with_node("n1").await;
    let uid = n.uid().unwrap();
    let api = nodes.clone();
    let waiter =
        tokio::spawn(async move { await_condition(api, "n1", conditions::is_deleted(&uid)).await });
    ccm_testing::wait::eventually(Duration::from_secs(20), || async {
        s.open_watches("nodes") == 1
    })
    .await;
    nodes.delete("n1", &DeleteParams::default()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let watch = s
        .requests()
        .into_iter()
        .find(|r| r.verb == "watch")
        .unwrap();
    assert!(
        watch.query.contains("fieldSelector=metadata.name%3Dn1"),
        "{}",
        watch.query
    );
}

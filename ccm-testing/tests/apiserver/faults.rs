//! Random fault injection (`ApiServer::set_faults`): each kind, its scope by verb and resource,
//! its counts, and the seed.

use std::time::Duration;

use ccm_testing::apiserver::{ApiFaultKind, ApiFaultRule, ApiFaults, ApiServer};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::support::{api_err, server_with_node};

fn only(kind: ApiFaultKind, rate: f64) -> ApiFaults {
    ApiFaults::seeded(1).rule(ApiFaultRule::new(kind, rate))
}

/// A client that does not retry 429/503/504 by itself, with a short read timeout.
fn plain_client(s: &ApiServer, read_timeout: Duration) -> kube::Client {
    let mut cfg = kube::Config::new(s.url().parse().unwrap());
    cfg.default_retry = false;
    cfg.read_timeout = Some(read_timeout);
    kube::Client::try_from(cfg).unwrap()
}

#[tokio::test]
async fn errors_hit_the_verb_and_resource_named_and_stop_when_turned_off() {
    let (s, nodes, _) = server_with_node("n1").await;
    s.set_faults(Some(
        ApiFaults::seeded(3).rule(
            ApiFaultRule::new(ApiFaultKind::InternalError, 1.0)
                .verb("get")
                .resource("nodes"),
        ),
    ));
    for _ in 0..3 {
        assert_eq!(api_err(nodes.get("n1").await.unwrap_err()).code, 500);
    }
    // Another verb, another resource: untouched.
    assert_eq!(
        nodes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    s.client()
        .apiserver_version()
        .await
        .expect("/version is not a resource");
    assert_eq!(s.fault_counts(), [("500".to_string(), 3)].into());

    s.set_faults(None);
    assert_eq!(nodes.get("n1").await.unwrap().name_any(), "n1");
    assert_eq!(s.fault_counts()["500"], 3);
}

#[tokio::test]
async fn too_many_requests_carries_retry_after() {
    let (s, _, _) = server_with_node("n1").await;
    s.set_faults(Some(
        only(ApiFaultKind::TooManyRequests, 1.0).retry_after(Duration::from_millis(2500)),
    ));
    let client = plain_client(&s, Duration::from_secs(30));
    let req = http::Request::get("/api/v1/nodes/n1")
        .body(kube::client::Body::empty())
        .unwrap();
    let resp = client.send(req).await.unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    assert_eq!(resp.headers()["retry-after"], "3");
    assert_eq!(s.fault_counts()["429"], 1);
}

#[tokio::test]
async fn conflicts_hit_writes_only() {
    let (s, nodes, _) = server_with_node("n1").await;
    s.set_faults(Some(only(ApiFaultKind::Conflict, 1.0)));
    assert_eq!(nodes.get("n1").await.unwrap().name_any(), "n1");
    nodes.list(&ListParams::default()).await.unwrap();
    let patch = Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}}));
    let e = api_err(
        nodes
            .patch("n1", &PatchParams::default(), &patch)
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    s.set_faults(None);
    let n = nodes.get("n1").await.unwrap();
    assert!(
        n.labels().get("a").is_none(),
        "the refused patch changed nothing"
    );
    assert_eq!(s.fault_counts(), [("409".to_string(), 1)].into());
}

#[tokio::test]
async fn watches_can_be_answered_gone() {
    let (s, nodes, _) = server_with_node("n1").await;
    s.set_faults(Some(only(ApiFaultKind::WatchGone, 1.0)));
    // Reads are not watches: served.
    nodes.get("n1").await.unwrap();
    let events: Vec<_> = nodes
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    match events.as_slice() {
        [WatchEvent::Error(e)] => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected one 410 ERROR event, got {other:?}"),
    }
    assert_eq!(s.fault_counts()["410"], 1);
}

#[tokio::test]
async fn watches_can_be_closed_mid_stream() {
    let (s, nodes, _) = server_with_node("n1").await;
    s.set_faults(Some(
        only(ApiFaultKind::WatchClose, 1.0).close_watches_within(Duration::from_millis(300)),
    ));
    // Asked for 5 minutes, the stream ends within the close window (after the initial event
    // or before it).
    let stream = nodes
        .watch(&WatchParams::default().timeout(300), "0")
        .await
        .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(30), stream.collect::<Vec<_>>()).await;
    let events = ended.expect("the watch was closed");
    assert!(events.len() <= 1, "{events:?}");
    assert_eq!(s.fault_counts()["close"], 1);
}

#[tokio::test]
async fn hanging_requests_outlast_the_client_timeout() {
    let (s, _, _) = server_with_node("n1").await;
    s.set_faults(Some(
        only(ApiFaultKind::Hang, 1.0).hang_for(Duration::from_secs(2)),
    ));
    let nodes: Api<Node> = Api::all(plain_client(&s, Duration::from_millis(200)));
    let err = nodes.get("n1").await.unwrap_err();
    assert!(
        !matches!(err, kube::Error::Api(_)),
        "a client-side timeout, not an answer: {err:?}"
    );
    s.set_faults(None);
    nodes.get("n1").await.unwrap();
    assert_eq!(s.fault_counts()["hang"], 1);
}

/// The same seed picks the same requests; another seed picks others.
#[tokio::test]
async fn the_seed_makes_a_run_reproducible() {
    async fn statuses(seed: u64) -> Vec<u16> {
        let (s, nodes, _) = server_with_node("n1").await;
        s.set_faults(Some(
            ApiFaults::seeded(seed).rule(ApiFaultRule::new(ApiFaultKind::InternalError, 0.5)),
        ));
        let mut out = Vec::new();
        for _ in 0..40 {
            out.push(match nodes.get("n1").await {
                Ok(_) => 200,
                Err(e) => api_err(e).code,
            });
        }
        out
    }
    let a = statuses(11).await;
    assert_eq!(a, statuses(11).await);
    assert_ne!(a, statuses(12).await);
    assert!(a.contains(&500) && a.contains(&200), "{a:?}");
}

#[test]
fn fault_rules_parse_from_flags() {
    let rule: ApiFaultRule = "409:0.25:*:services".parse().unwrap();
    assert_eq!(
        rule,
        ApiFaultRule::new(ApiFaultKind::Conflict, 0.25).resource("services")
    );
    let rule: ApiFaultRule = "close:1".parse().unwrap();
    assert_eq!(rule, ApiFaultRule::new(ApiFaultKind::WatchClose, 1.0));
    let rule: ApiFaultRule = "500:0.1:patch:nodes/status".parse().unwrap();
    assert_eq!(
        rule,
        ApiFaultRule::new(ApiFaultKind::InternalError, 0.1)
            .verb("patch")
            .resource("nodes/status")
    );
    for bad in [
        "",
        "503:0.1",
        "500",
        "500:x",
        "500:-0.1",
        "500:1.5",
        "500:NaN",
        "500:0.1:get:nodes:x",
        "409:0.25::services",
    ] {
        let e = bad.parse::<ApiFaultRule>().unwrap_err().to_string();
        assert!(e.contains("KIND:RATE"), "{bad:?}: {e}");
    }
}

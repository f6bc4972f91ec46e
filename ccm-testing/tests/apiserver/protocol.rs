//! The HTTP side: raw-protocol details, discovery, latency, fault injection and the request
//! log.

use std::time::Duration;

use ccm_testing::apiserver::ApiServer;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::support::{api_err, raw, server_with_node};

#[tokio::test]
async fn raw_protocol_details() {
    let (s, nodes, _) = server_with_node("n1").await;

    // Unknown resources: kube-apiserver's generic 404.
    let (code, body) = raw(&s, http::Request::get("/api/v1/pods").body(vec![]).unwrap()).await;
    assert_eq!(code, 404);
    assert_eq!(
        body["message"],
        "the server could not find the requested resource"
    );
    // Cluster-scoped resources have no namespaced path.
    let (code, _) = raw(
        &s,
        http::Request::get("/api/v1/namespaces/default/nodes")
            .body(vec![])
            .unwrap(),
    )
    .await;
    assert_eq!(code, 404);
    // Unsupported patch content type.
    let (code, body) = raw(
        &s,
        http::Request::patch("/api/v1/nodes/n1")
            .header("content-type", "application/xml")
            .body(b"{}".to_vec())
            .unwrap(),
    )
    .await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (415, Some("UnsupportedMediaType"))
    );
    // Apply needs a field manager.
    let (code, body) = raw(
        &s,
        http::Request::patch("/api/v1/nodes/n1")
            .header("content-type", "application/apply-patch+yaml")
            .body(b"metadata:\n  labels:\n    a: b\n".to_vec())
            .unwrap(),
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (422, Some("Invalid")));
    // YAML apply bodies are accepted.
    let (code, body) = raw(
        &s,
        http::Request::patch("/api/v1/nodes/n1?fieldManager=yaml-user")
            .header("content-type", "application/apply-patch+yaml")
            .body(
                b"apiVersion: v1\nkind: Node\nmetadata:\n  labels:\n    from-yaml: \"yes\"\n"
                    .to_vec(),
            )
            .unwrap(),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["metadata"]["labels"]["from-yaml"], "yes");
    // A watch from a resourceVersion in the future: 504 Timeout (ResourceVersionTooLarge).
    let future = s.resource_version() + 100;
    let mut st = nodes
        .watch(&WatchParams::default(), &future.to_string())
        .await
        .unwrap()
        .boxed();
    match st.try_next().await.unwrap().unwrap() {
        WatchEvent::Error(e) => assert_eq!((e.code, e.reason.as_str()), (504, "Timeout")),
        other => panic!("{other:?}"),
    }
    // Metadata-only reads.
    let meta = nodes.get_metadata("n1").await.unwrap();
    assert_eq!(meta.name_any(), "n1");
    assert_eq!(meta.types.unwrap().kind, "PartialObjectMetadata");
    let metas = nodes.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(metas.items.len(), 1);
}

#[tokio::test]
async fn discovery_lists_the_served_resources() {
    let s = ApiServer::start().await;
    let discovery = kube::discovery::Discovery::new(s.client())
        .run()
        .await
        .unwrap();
    let (lease, caps) = discovery
        .resolve_gvk(&kube::core::GroupVersionKind::gvk(
            "coordination.k8s.io",
            "v1",
            "Lease",
        ))
        .unwrap();
    assert_eq!(lease.plural, "leases");
    assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);
    let (node, caps) = discovery
        .resolve_gvk(&kube::core::GroupVersionKind::gvk("", "v1", "Node"))
        .unwrap();
    assert_eq!(node.plural, "nodes");
    assert_eq!(caps.scope, kube::discovery::Scope::Cluster);
    assert!(
        caps.subresources
            .iter()
            .any(|(r, _)| r.plural == "nodes/status" || r.plural == "status")
    );
    // A dynamic client built from discovery works.
    let nodes: Api<kube::api::DynamicObject> = Api::all_with(s.client(), &node);
    assert!(
        nodes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

#[tokio::test]
async fn latency_delays_answers() {
    let s = ApiServer::start().await;
    s.set_latency(Duration::from_secs(3));
    let mut cfg = kube::Config::new(s.url().parse().unwrap());
    cfg.read_timeout = Some(Duration::from_millis(100));
    cfg.default_retry = false;
    let impatient = kube::Client::try_from(cfg).unwrap();
    let nodes: Api<Node> = Api::all(impatient);
    assert!(
        nodes.list(&ListParams::default()).await.is_err(),
        "3 s of latency outlasts a 100 ms read timeout"
    );
    s.set_latency(Duration::ZERO);
    nodes.list(&ListParams::default()).await.unwrap();
}

#[tokio::test]
async fn fault_injection_and_request_log() {
    let (s, nodes, _) = server_with_node("n1").await;
    s.clear_requests();

    s.fail_next("get", "nodes", 1, 500, None);
    let e = api_err(nodes.get("n1").await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (500, "InternalError"));
    nodes.get("n1").await.unwrap();

    // 429 with Retry-After: kube's client retries it by itself.
    s.fail_next(
        "patch",
        "nodes/status",
        1,
        429,
        Some(Duration::from_secs(1)),
    );
    nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "x"}})),
        )
        .await
        .unwrap();
    let log = s.requests();
    let statuses: Vec<(String, Option<String>, u16)> = log
        .iter()
        .map(|r| (r.verb.clone(), r.subresource.clone(), r.status))
        .collect();
    assert_eq!(
        statuses,
        vec![
            ("get".to_string(), None, 500),
            ("get".to_string(), None, 200),
            ("patch".to_string(), Some("status".to_string()), 429),
            ("patch".to_string(), Some("status".to_string()), 200),
        ]
    );
    assert_eq!(
        log[3].content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    assert_eq!(log[3].resource, "nodes");
    assert_eq!(log[3].name.as_deref(), Some("n1"));

    // The raw answer carries Retry-After (a client without retries sees it).
    let mut cfg = kube::Config::new(s.url().parse().unwrap());
    cfg.default_retry = false;
    let raw = kube::Client::try_from(cfg).unwrap();
    s.fail_next("*", "*", 1, 429, Some(Duration::from_millis(1500)));
    let req = http::Request::get("/api/v1/nodes/n1")
        .body(kube::client::Body::empty())
        .unwrap();
    let resp = raw.send(req).await.unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    assert_eq!(resp.headers()["retry-after"], "2");
}

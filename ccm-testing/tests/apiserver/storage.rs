//! How objects are stored at scale, seen from a client: the field ownership kept inside the
//! object's own text, and lists larger than one chunk of the streamed body.

use ccm_testing::apiserver::ApiServer;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::support::{api_err, raw};

#[tokio::test]
async fn apply_ownership_survives_label_keys_that_differ_by_a_dot() {
    // `metadata.managedFields` splits field paths at dots: the labels `a` and `a.b` are one
    // path there. The server must still know that mgr-a owns `a`.
    let s = ApiServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let a = json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "c", "labels": {"a": "1", "a.b": "2"}}});
    cms.patch("c", &PatchParams::apply("mgr-a"), &Patch::Apply(&a))
        .await
        .unwrap();
    // A later update by another manager reads the ownership back.
    cms.patch(
        "c",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "v"}})),
    )
    .await
    .unwrap();
    let b = json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "c", "labels": {"a": "3"}}});
    let e = api_err(
        cms.patch("c", &PatchParams::apply("mgr-b"), &Patch::Apply(&b))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        e.message.contains("mgr-a") && e.message.contains(".metadata.labels.a"),
        "{}",
        e.message
    );
}

#[tokio::test]
async fn a_list_larger_than_a_chunk_comes_whole_and_in_order() {
    let s = ApiServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    // 300 ConfigMaps of about 1.5 KB: a 450 KB list, streamed in chunks of 256 KB.
    let filler = "x".repeat(1500);
    for i in 0..300 {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": format!("cm-{i:03}")},
            "data": {"filler": filler},
        }))
        .unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    let all = cms.list(&ListParams::default()).await.unwrap();
    let names: Vec<String> = all.items.iter().map(|c| c.name_any()).collect();
    let expected: Vec<String> = (0..300).map(|i| format!("cm-{i:03}")).collect();
    assert_eq!(names, expected);
    assert!(
        all.items
            .iter()
            .all(|c| c.data.as_ref().unwrap()["filler"] == filler)
    );
    let rv: u64 = all.metadata.resource_version.unwrap().parse().unwrap();
    assert_eq!(rv, s.resource_version());
    // The same through a raw request: one JSON document with the list's kind.
    let req = http::Request::get("/api/v1/namespaces/default/configmaps")
        .body(Vec::new())
        .unwrap();
    let (status, body) = raw(&s, req).await;
    assert_eq!(status, 200);
    assert_eq!(body["kind"], "ConfigMapList");
    assert_eq!(body["items"].as_array().unwrap().len(), 300);
    // In pages: every object once, the last page without a continue token.
    let mut paged = Vec::new();
    let mut lp = ListParams::default().limit(120);
    loop {
        let page = cms.list(&lp).await.unwrap();
        paged.extend(page.items.iter().map(|c| c.name_any()));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => lp = lp.continue_token(&token),
            _ => break,
        }
    }
    assert_eq!(paged, expected);
}

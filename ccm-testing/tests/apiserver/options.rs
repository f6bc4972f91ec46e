//! Write options read where kube-apiserver reads them (`handlers/{create,update,patch,delete}.go`):
//! create, update and patch from the query; delete and deletecollection from the
//! `DeleteOptions` body when it is not empty, from the query only when it is empty; `dryRun`
//! other than `All` is `422 Unsupported value` wherever it is.

use ccm_testing::apiserver::ApiServer;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};

use crate::support::{api_err, cm};

/// A server with ConfigMaps `a` and `b` (label `app=opts`) in `default`.
async fn server() -> (ApiServer, Api<ConfigMap>) {
    let server = ApiServer::start().await;
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    for name in ["a", "b"] {
        api.create(
            &PostParams::default(),
            &cm("default", name, &[("app", "opts")]),
        )
        .await
        .unwrap();
    }
    (server, api)
}

/// Sends `method path` with `body` (JSON when not empty); the API error, if any.
async fn send(
    server: &ApiServer,
    method: &str,
    path: &str,
    body: &str,
) -> Result<(), Box<kube::core::Status>> {
    let mut req = http::Request::builder().method(method).uri(path);
    if !body.is_empty() {
        let ct = if method == "PATCH" {
            "application/merge-patch+json"
        } else {
            "application/json"
        };
        req = req.header(http::header::CONTENT_TYPE, ct);
    }
    let req = req.body(body.as_bytes().to_vec()).unwrap();
    server
        .client()
        .request_text(req)
        .await
        .map(drop)
        .map_err(api_err)
}

async fn names(api: &Api<ConfigMap>) -> Vec<String> {
    let list = api
        .list(&ListParams::default().labels("app=opts"))
        .await
        .unwrap();
    list.items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect()
}

const A: &str = "/api/v1/namespaces/default/configmaps/a";
const ALL: &str = "/api/v1/namespaces/default/configmaps?labelSelector=app%3Dopts";

#[tokio::test]
async fn a_delete_with_a_body_ignores_the_query() {
    let (server, api) = server().await;
    // kube's client sends `{}` for default options: the query's dryRun is not read.
    send(&server, "DELETE", &format!("{A}?dryRun=All"), "{}")
        .await
        .unwrap();
    assert_eq!(names(&api).await, ["b"]);
    let record = server
        .requests()
        .into_iter()
        .rfind(|r| r.verb == "delete")
        .unwrap();
    assert!(!record.dry_run);
}

#[tokio::test]
async fn a_delete_reads_dry_run_from_its_body_or_an_empty_bodys_query() {
    let (server, api) = server().await;
    send(
        &server,
        "DELETE",
        A,
        r#"{"kind":"DeleteOptions","apiVersion":"v1","dryRun":["All"]}"#,
    )
    .await
    .unwrap();
    api.delete("a", &DeleteParams::default().dry_run())
        .await
        .unwrap();
    send(&server, "DELETE", &format!("{A}?dryRun=All"), "")
        .await
        .unwrap();
    assert_eq!(names(&api).await, ["a", "b"]);
    let deletes: Vec<bool> = server
        .requests()
        .into_iter()
        .filter(|r| r.verb == "delete")
        .map(|r| r.dry_run)
        .collect();
    assert_eq!(deletes, [true, true, true]);
}

#[tokio::test]
async fn a_deletecollection_reads_its_options_as_a_delete_does() {
    let (server, api) = server().await;
    send(&server, "DELETE", ALL, r#"{"dryRun":["All"]}"#)
        .await
        .unwrap();
    send(&server, "DELETE", &format!("{ALL}&dryRun=All"), "")
        .await
        .unwrap();
    assert_eq!(names(&api).await, ["a", "b"]);
    send(&server, "DELETE", &format!("{ALL}&dryRun=All"), "{}")
        .await
        .unwrap();
    assert!(
        names(&api).await.is_empty(),
        "the body's options (no dryRun) win"
    );
}

#[tokio::test]
async fn dry_run_values_other_than_all_are_refused_in_every_verb() {
    let (server, api) = server().await;
    let unsupported = |e: &kube::core::Status, kind: &str| {
        assert_eq!(e.code, 422, "{e:?}");
        assert_eq!(
            e.message,
            format!(
                "{kind}.meta.k8s.io \"\" is invalid: dryRun: Unsupported value: []string{{\"Yes\"}}: supported values: \"All\""
            )
        );
    };
    let e = send(&server, "DELETE", A, r#"{"dryRun":["Yes"]}"#)
        .await
        .unwrap_err();
    unsupported(&e, "DeleteOptions");
    let e = send(&server, "DELETE", &format!("{A}?dryRun=Yes"), "")
        .await
        .unwrap_err();
    unsupported(&e, "DeleteOptions");
    let e = send(&server, "DELETE", ALL, r#"{"dryRun":["Yes"]}"#)
        .await
        .unwrap_err();
    unsupported(&e, "DeleteOptions");
    let created =
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","labels":{"app":"opts"}}}"#;
    let e = send(
        &server,
        "POST",
        "/api/v1/namespaces/default/configmaps?dryRun=Yes",
        created,
    )
    .await
    .unwrap_err();
    unsupported(&e, "CreateOptions");
    let updated = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","labels":{"app":"opts"}},"data":{"k":"new"}}"#;
    let e = send(&server, "PUT", &format!("{A}?dryRun=Yes"), updated)
        .await
        .unwrap_err();
    unsupported(&e, "UpdateOptions");
    let e = send(
        &server,
        "PATCH",
        &format!("{A}?dryRun=Yes"),
        r#"{"data":{"k":"new"}}"#,
    )
    .await
    .unwrap_err();
    unsupported(&e, "PatchOptions");
    // Nothing was written.
    assert_eq!(names(&api).await, ["a", "b"]);
    assert!(
        api.get("a").await.unwrap().data.is_none(),
        "a was not updated"
    );
}

#[tokio::test]
async fn create_update_and_patch_read_dry_run_from_the_query() {
    let (server, api) = server().await;
    let created =
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","labels":{"app":"opts"}}}"#;
    send(
        &server,
        "POST",
        "/api/v1/namespaces/default/configmaps?dryRun=All",
        created,
    )
    .await
    .unwrap();
    let updated = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","labels":{"app":"opts"}},"data":{"k":"new"}}"#;
    send(&server, "PUT", &format!("{A}?dryRun=All"), updated)
        .await
        .unwrap();
    send(
        &server,
        "PATCH",
        &format!("{A}?dryRun=All"),
        r#"{"data":{"k":"new"}}"#,
    )
    .await
    .unwrap();
    assert_eq!(names(&api).await, ["a", "b"]);
    assert!(
        api.get("a").await.unwrap().data.is_none(),
        "a was not updated"
    );
    assert!(
        server
            .requests()
            .iter()
            .filter(|r| r.is_write())
            .skip(2)
            .all(|r| r.dry_run)
    );
}

#[tokio::test]
async fn a_delete_body_that_is_not_delete_options_is_a_bad_request() {
    let (server, api) = server().await;
    let e = send(&server, "DELETE", A, r#"{"kind":"Pod","apiVersion":"v1"}"#)
        .await
        .unwrap_err();
    assert_eq!(e.code, 400, "{e:?}");
    let e = send(&server, "DELETE", A, "[]").await.unwrap_err();
    assert_eq!(e.code, 400, "{e:?}");
    let e = send(&server, "DELETE", A, r#"{"propagationPolicy":"Sometimes"}"#)
        .await
        .unwrap_err();
    assert_eq!(e.code, 422, "{e:?}");
    assert_eq!(names(&api).await, ["a", "b"]);
}

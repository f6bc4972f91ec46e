//! The guard against the in-process API server, which reads each write's options where
//! kube-apiserver reads them (`ccm-testing`'s `apiserver/http/options.rs`): every write verb
//! reaches the server as a dry run there, nothing persists, and what cannot be made a dry run
//! never reaches it.

use std::time::Duration;

use ccm_testing::apiserver::ApiServer;
use ccm_testing::builders::kubelet_node;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{
    DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams, Preconditions,
};
use kube::core::ObjectMeta;
use serde_json::json;

use super::*;
use crate::machinery::metrics::MetricsRegistry;

/// A client whose requests pass the guard, as a shadow's do; with `token`, as that user.
fn guarded(
    server: &ApiServer,
    token: Option<&str>,
) -> (kube::Client, Arc<Shadow>, Arc<MetricsRegistry>) {
    let metrics = MetricsRegistry::new();
    let shadow = Shadow::new(Duration::from_secs(60), &metrics);
    let mut config = kube::Config::new(server.url().parse().unwrap());
    if let Some(token) = token {
        config.auth_info.token = Some(token.to_owned().into());
    }
    let client = kube::client::ClientBuilder::try_from(config)
        .unwrap()
        .with_layer(&WriteGuardLayer::new(shadow.clone(), "test-controller"))
        .build();
    (client, shadow, metrics)
}

fn configmap(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            labels: Some([("app".to_owned(), "guard".to_owned())].into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn writes(metrics: &MetricsRegistry, resource: &str, verb: &str, result: &str) -> u64 {
    let text = metrics.encode().unwrap();
    let key = format!(
        "shadow_dry_run_writes_total{{resource=\"{resource}\",verb=\"{verb}\",result=\"{result}\"}} "
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test]
async fn every_write_verb_reaches_the_server_as_a_dry_run_where_it_reads_it() {
    let server = ApiServer::start().await;
    let admin = server.client();
    let nodes: Api<Node> = Api::all(admin.clone());
    let node = nodes
        .create(&PostParams::default(), &kubelet_node("n1").build())
        .await
        .unwrap();
    let configmaps: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    for name in ["a", "b"] {
        configmaps
            .create(&PostParams::default(), &configmap(name))
            .await
            .unwrap();
    }
    let mark = server.requests().len();
    let (client, _shadow, metrics) = guarded(&server, None);
    let g_nodes: Api<Node> = Api::all(client.clone());
    let g_configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

    // POST create.
    g_nodes
        .create(&PostParams::default(), &kubelet_node("n2").build())
        .await
        .unwrap();
    // PUT update.
    let mut changed = node.clone();
    changed
        .metadata
        .labels
        .get_or_insert_default()
        .insert("guard".into(), "put".into());
    g_nodes
        .replace("n1", &PostParams::default(), &changed)
        .await
        .unwrap();
    // PATCH, and PATCH of the status subresource.
    let label = json!({"metadata": {"labels": {"guard": "patch"}}});
    g_nodes
        .patch("n1", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    let status = json!({"status": {"addresses": [{"type": "InternalIP", "address": "10.9.9.9"}]}});
    g_nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    // DELETE: kube sends `{}` (default options), or options with a precondition.
    g_nodes
        .delete("n1", &DeleteParams::default())
        .await
        .unwrap();
    let preconditioned = DeleteParams {
        preconditions: Some(Preconditions {
            uid: node.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    g_nodes.delete("n1", &preconditioned).await.unwrap();
    // DELETECOLLECTION: an empty body (default options) and a body.
    let lp = ListParams::default().labels("app=guard");
    g_configmaps
        .delete_collection(&DeleteParams::default(), &lp)
        .await
        .unwrap();
    g_configmaps
        .delete_collection(&DeleteParams::background(), &lp)
        .await
        .unwrap();
    // An eviction (not served in-process: the request is checked below).
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let _ = pods.evict("p", &EvictParams::default()).await;
    // An Event: never sent.
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let event = Event {
        metadata: ObjectMeta {
            name: Some("e".into()),
            ..Default::default()
        },
        event_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            jiff::Timestamp::now(),
        )),
        ..Default::default()
    };
    events.create(&PostParams::default(), &event).await.unwrap();
    // A method the guard does not know: never sent.
    let odd = http::Request::builder()
        .method(Method::OPTIONS)
        .uri("/api/v1/nodes/n1")
        .body(Vec::new())
        .unwrap();
    let answer = client
        .send(odd.map(kube::client::Body::from))
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::BAD_REQUEST);

    // Nothing persisted.
    let n1 = nodes.get("n1").await.unwrap();
    assert_eq!(n1.metadata.resource_version, node.metadata.resource_version);
    assert!(nodes.get_opt("n2").await.unwrap().is_none());
    assert_eq!(configmaps.list(&lp).await.unwrap().items.len(), 2);
    // Every write the server saw was a dry run where it reads the options.
    let seen: Vec<_> = server.requests()[mark..]
        .iter()
        .filter(|r| r.method != "GET")
        .cloned()
        .collect();
    let verbs: Vec<&str> = seen.iter().map(|r| r.verb.as_str()).collect();
    assert_eq!(
        verbs,
        [
            "create",
            "update",
            "patch",
            "patch",
            "delete",
            "delete",
            "deletecollection",
            "deletecollection",
            "create"
        ],
        "{seen:#?}"
    );
    for r in &seen[..8] {
        assert!(r.dry_run, "not a dry run where the server reads it: {r:#?}");
    }
    // The delete kept its precondition; the eviction's options carry the dry run.
    assert_eq!(
        seen[5].body.as_ref().unwrap()["preconditions"]["uid"],
        json!(node.metadata.uid)
    );
    let eviction = &seen[8];
    assert_eq!(eviction.resource_path(), "pods/eviction");
    assert_eq!(
        eviction.body.as_ref().unwrap()["deleteOptions"]["dryRun"],
        json!(["All"])
    );
    assert!(eviction.query.split('&').any(|p| p == "dryRun=All"));
    assert_eq!(writes(&metrics, "nodes", "delete", "dry_run"), 2);
    assert_eq!(
        writes(&metrics, "configmaps", "deletecollection", "dry_run"),
        2
    );
    assert_eq!(writes(&metrics, "events", "create", "not_sent"), 1);
    assert_eq!(writes(&metrics, "nodes", "unknown", "refused"), 1);
}

#[tokio::test]
async fn a_forbidden_dry_run_delete_is_a_planned_deletion_answered_as_a_dry_run() {
    let server = ApiServer::start().await;
    let admin = server.client();
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .create(&PostParams::default(), &kubelet_node("n1").build())
        .await
        .unwrap();
    // A user who may patch Nodes but not delete them.
    server.add_token("shadow-token", "shadow", &[]);
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "shadow"},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]}],
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "shadow"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "shadow"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "shadow"}],
    });
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(admin.clone());
    roles
        .create(
            &PostParams::default(),
            &serde_json::from_value(role).unwrap(),
        )
        .await
        .unwrap();
    let bindings: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(admin.clone());
    bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(binding).unwrap(),
        )
        .await
        .unwrap();
    server.enable_rbac();
    let (client, shadow, metrics) = guarded(&server, Some("shadow-token"));
    let g_nodes: Api<Node> = Api::all(client);

    // The patch is allowed (a dry run), the delete refused by RBAC: answered as a dry run.
    let label = json!({"metadata": {"labels": {"guard": "patch"}}});
    g_nodes
        .patch("n1", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    let deleted = g_nodes
        .delete("n1", &DeleteParams::default())
        .await
        .unwrap();
    assert!(deleted.is_right(), "a Status of success: {deleted:?}");
    g_nodes
        .delete("n1", &DeleteParams::default())
        .await
        .unwrap();
    let refused = server
        .requests()
        .iter()
        .filter(|r| r.verb == "delete")
        .map(|r| r.status)
        .collect::<Vec<_>>();
    assert_eq!(
        refused,
        [403, 403],
        "the server refused the dry-run deletes"
    );
    assert!(nodes.get_opt("n1").await.unwrap().is_some());
    assert_eq!(writes(&metrics, "nodes", "delete", "forbidden"), 2);
    assert_eq!(writes(&metrics, "nodes", "patch", "dry_run"), 1);
    // The planned deletion is recorded (pending here: no informer shows the Node).
    assert_eq!(shadow.pending_count(), 1);
}

//! The server's behaviours beyond storing, as [`ApiServerBuilder`] switches: each default is
//! kube-apiserver's, and each switch turned off stores what a bare API (Go's fake clientset)
//! would.
//!
//! [`ApiServerBuilder`]: ccm_testing::apiserver::ApiServerBuilder

use ccm_testing::apiserver::ApiServer;
use ccm_testing::builders::kubelet_node;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Taint};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use kube::core::ObjectMeta;

use crate::support::{api_err, configmap, raw};

const NOT_READY: &str = "node.kubernetes.io/not-ready";

fn taint_keys(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| t.iter().map(|t| t.key.clone()).collect())
        .unwrap_or_default()
}

async fn create_node(server: &ApiServer, node: &Node) -> Result<Node, kube::Error> {
    let nodes: Api<Node> = Api::all(server.client());
    nodes.create(&PostParams::default(), node).await
}

#[tokio::test]
async fn the_not_ready_taint_is_on_by_default_and_can_be_turned_off() {
    let default = ApiServer::start().await;
    let built = ApiServer::builder().start().await;
    for server in [&default, &built] {
        let node = create_node(server, &kubelet_node("n1").build())
            .await
            .unwrap();
        assert!(taint_keys(&node).iter().any(|k| k == NOT_READY), "{node:?}");
    }
    let bare = ApiServer::builder().not_ready_taint(false).start().await;
    let node = create_node(&bare, &kubelet_node("n1").build())
        .await
        .unwrap();
    assert_eq!(
        taint_keys(&node),
        ["node.cloudprovider.kubernetes.io/uninitialized"],
        "stored as sent"
    );
    // The switch is about the taint only: the rest of admission is still on.
    let err = Api::<ConfigMap>::namespaced(bare.client(), "missing")
        .create(&PostParams::default(), &configmap("missing", "c"))
        .await
        .unwrap_err();
    assert_eq!(api_err(err).code, 404);
}

#[tokio::test]
async fn namespace_lifecycle_can_be_turned_off() {
    let default = ApiServer::start().await;
    let err = Api::<ConfigMap>::namespaced(default.client(), "missing")
        .create(&PostParams::default(), &configmap("missing", "c"))
        .await
        .unwrap_err();
    assert_eq!(api_err(err).code, 404, "a create in a missing namespace");
    let namespaces: Api<Namespace> = Api::all(default.client());
    let err = namespaces
        .delete("kube-system", &DeleteParams::default())
        .await
        .unwrap_err();
    assert_eq!(api_err(err).code, 403, "kube-system may not be deleted");

    let bare = ApiServer::builder()
        .namespace_lifecycle(false)
        .start()
        .await;
    let created = Api::<ConfigMap>::namespaced(bare.client(), "missing")
        .create(&PostParams::default(), &configmap("missing", "c"))
        .await
        .unwrap();
    assert_eq!(created.metadata.namespace.as_deref(), Some("missing"));
    Api::<Namespace>::all(bare.client())
        .delete("kube-system", &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn validation_can_be_turned_off_to_store_a_malformed_object() {
    let mut node = kubelet_node("n1").build();
    node.spec.get_or_insert_default().taints = Some(vec![Taint {
        key: "example.com/bad".into(),
        effect: "Sometimes".into(),
        ..Default::default()
    }]);
    let default = ApiServer::start().await;
    let err = create_node(&default, &node).await.unwrap_err();
    let status = api_err(err);
    assert_eq!(status.code, 422, "{status:?}");
    assert!(status.message.contains("Sometimes"), "{}", status.message);

    let lax = ApiServer::builder().validation(false).start().await;
    let stored = create_node(&lax, &node).await.unwrap();
    assert!(taint_keys(&stored).iter().any(|k| k == "example.com/bad"));
    // Defaulting and admission still happen.
    assert!(taint_keys(&stored).iter().any(|k| k == NOT_READY));
}

#[tokio::test]
async fn the_namespace_controller_and_rbac_are_builder_options_too() {
    let server = ApiServer::builder()
        .namespace_controller(false)
        .rbac(true)
        .start()
        .await;
    let namespaces: Api<Namespace> = Api::all(server.client());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some("gone".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    namespaces
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let still = namespaces.get("gone").await.unwrap();
    assert!(
        still.metadata.deletion_timestamp.is_some(),
        "no namespace controller: it stays Terminating"
    );

    // RBAC on: a user with no binding is refused; without credentials it is the admin.
    server.add_token("t-alice", "alice", &[]);
    let req = |token: Option<&str>| {
        let mut b = http::Request::get("/api/v1/nodes");
        if let Some(t) = token {
            b = b.header("Authorization", format!("Bearer {t}"));
        }
        b.body(Vec::new()).unwrap()
    };
    assert_eq!(raw(&server, req(Some("t-alice"))).await.0, 403);
    assert_eq!(raw(&server, req(None)).await.0, 200);
    let open = ApiServer::start().await;
    open.add_token("t-alice", "alice", &[]);
    assert_eq!(
        raw(&open, req(Some("t-alice"))).await.0,
        200,
        "RBAC is off by default"
    );
}

//! A shadow under the recommended shadow RBAC (`examples/deploy/shadow/`: no `delete`), with
//! RBAC on in the in-process API server: kube-apiserver authorises a dry run as the real
//! request, so the dry-run delete of a Node whose instance is gone is refused (403). The shadow
//! still reports the planned deletion, counts it `result="forbidden"`, goes on, and every other
//! request it makes is allowed. In-process only: it needs the server's RBAC switch and log.

use std::path::Path;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::PostParams;

use super::*;

const SHADOW_USER: &str = "system:serviceaccount:kube-system:cloud-controller-manager-shadow";

/// Creates every object of the YAML documents `yaml` (RBAC objects and ServiceAccounts).
async fn create_all(client: &kube::Client, yaml: &str) {
    for doc in serde_norway::Deserializer::from_str(yaml) {
        let v: Value = serde::Deserialize::deserialize(doc).unwrap();
        let ns = v["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        let kind = v["kind"].as_str().unwrap().to_owned();
        let c = client.clone();
        match kind.as_str() {
            "ClusterRole" => create(Api::<ClusterRole>::all(c), v).await,
            "ClusterRoleBinding" => create(Api::<ClusterRoleBinding>::all(c), v).await,
            "Role" => create(Api::<Role>::namespaced(c, &ns), v).await,
            "RoleBinding" => create(Api::<RoleBinding>::namespaced(c, &ns), v).await,
            "ServiceAccount" => create(Api::<ServiceAccount>::namespaced(c, &ns), v).await,
            other => panic!("unexpected kind {other}"),
        }
    }
}

/// Creates the object `v` through `api`.
async fn create<K>(api: Api<K>, v: Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    api.create(&PostParams::default(), &serde_json::from_value(v).unwrap())
        .await
        .unwrap();
}

fn shadow_manifest(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/deploy/shadow")
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[tokio::test]
async fn a_shadow_that_may_not_delete_reports_the_deletion_and_goes_on() {
    let r = Reconciled::start(2).await;
    let Some(server) = r.cluster.api_server() else {
        // The RBAC of a real cluster is not the test's to change.
        r.cluster.cleanup().await;
        return;
    };
    let gone = r.instance_gone(0).await;
    let admin = r.cluster.client();
    create_all(&admin, crate::rbac::BUILTIN_ROLES).await;
    create_all(&admin, &shadow_manifest("clusterrole.yaml")).await;
    create_all(&admin, &shadow_manifest("rbac.yaml")).await;
    server.add_token(
        "shadow-token",
        SHADOW_USER,
        &[
            "system:serviceaccounts",
            "system:serviceaccounts:kube-system",
        ],
    );
    server.enable_rbac();
    // The shadow authenticates as the shadow's ServiceAccount.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\nusers:\n- name: u\n  user:\n    token: shadow-token\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
            server.url()
        ),
    )
    .unwrap();
    let mut args = shadow_args(
        &r.cluster,
        &[format!("--kubeconfig={}", kubeconfig.display())],
    );
    args.retain(|a| !a.starts_with("--master="));
    let mark = r.log_mark();
    let shadow = ShadowRun::start_with_args(&r.cloud, args);
    let d = shadow.would_delete(&r, &gone).await;
    assert_eq!(
        (d["incumbent"].as_str(), d["ours"].as_str()),
        (Some("exists"), Some("deleted"))
    );
    let metrics = shadow.metrics().await;
    assert!(
        metrics.contains(
            "shadow_dry_run_writes_total{resource=\"nodes\",verb=\"delete\",result=\"forbidden\"}"
        ),
        "{metrics}"
    );
    assert_eq!(shadow.stop().await, 0);
    assert!(
        r.node_api().get_opt(&gone).await.unwrap().is_some(),
        "the Node still exists"
    );
    // Every request of the shadow was its identity's; only the dry-run deletes were refused.
    let shadow_requests: Vec<_> = server.requests()[mark..]
        .iter()
        .filter(|q| q.user.as_deref() == Some(SHADOW_USER))
        .cloned()
        .collect();
    assert!(shadow_requests.iter().any(|q| q.verb == "delete"));
    for q in &shadow_requests {
        if q.status == 403 {
            assert_eq!(q.verb, "delete", "refused: {q:#?}");
        }
    }
    r.assert_nothing_persisted(mark);
    r.assert_no_mutating_call();
    r.cluster.cleanup().await;
}

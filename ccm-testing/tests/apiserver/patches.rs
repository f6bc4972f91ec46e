//! PATCH: merge, JSON and strategic merge patches (with their directives), and server-side
//! apply with its conflicts.

use ccm_testing::apiserver::ApiServer;
use ccm_testing::builders::kubelet_node;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::support::{api_err, rv, server_with_node};

#[tokio::test]
async fn merge_json_and_strategic_patches() {
    let s = ApiServer::start().await;
    let nodes: Api<Node> = Api::all(s.client());
    nodes
        .create(
            &PostParams::default(),
            &kubelet_node("n1").taint("a", "", "NoExecute").build(),
        )
        .await
        .unwrap();
    let pp = PatchParams::default();

    // Merge patch: labels merge, null removes.
    let n = nodes
        .patch(
            "n1",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"x": "1", "kubernetes.io/os": null}}})),
        )
        .await
        .unwrap();
    assert_eq!(n.labels()["x"], "1");
    assert!(!n.labels().contains_key("kubernetes.io/os"));

    // Strategic: addresses merge by type, conditions by type, taints are replaced whole.
    let n = nodes
        .patch_status(
            "n1",
            &pp,
            &Patch::Strategic(json!({"status": {
                "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}],
                "conditions": [{"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated"}]
            }})),
        )
        .await
        .unwrap();
    let st = n.status.unwrap();
    let types: Vec<_> = st.addresses.unwrap().into_iter().map(|a| a.type_).collect();
    assert_eq!(types, vec!["Hostname", "InternalIP"]);
    assert_eq!(st.conditions.unwrap().len(), 5);
    let n = nodes
        .patch(
            "n1",
            &pp,
            &Patch::Strategic(json!({"spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}})),
        )
        .await
        .unwrap();
    let keys: Vec<_> = n
        .spec
        .unwrap()
        .taints
        .unwrap()
        .into_iter()
        .map(|t| t.key)
        .collect();
    assert_eq!(keys, vec!["b"]);
    // Finalizers merge as a set, $deleteFromPrimitiveList removes.
    nodes
        .patch(
            "n1",
            &pp,
            &Patch::Strategic(json!({"metadata": {"finalizers": ["a.io/x"]}})),
        )
        .await
        .unwrap();
    let n = nodes
        .patch(
            "n1",
            &pp,
            &Patch::Strategic(json!({"metadata": {"finalizers": ["b.io/y"]}})),
        )
        .await
        .unwrap();
    assert_eq!(
        n.finalizers(),
        &["a.io/x".to_string(), "b.io/y".to_string()]
    );
    let n = nodes
        .patch(
            "n1",
            &pp,
            &Patch::Strategic(
                json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a.io/x"]}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(n.finalizers(), &["b.io/y".to_string()]);

    // JSON patch with a failing test op: 422 Invalid, nothing changes.
    let before = nodes.get("n1").await.unwrap();
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
        {"op": "add", "path": "/metadata/labels/y", "value": "2"}
    ]))
    .unwrap();
    let e = api_err(
        nodes
            .patch("n1", &pp, &Patch::Json::<()>(patch))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert_eq!(rv(&nodes.get("n1").await.unwrap()), rv(&before));
    // ... and a passing one applies.
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": before.resource_version().unwrap()},
        {"op": "add", "path": "/metadata/labels/y", "value": "2"}
    ]))
    .unwrap();
    let n = nodes
        .patch("n1", &pp, &Patch::Json::<()>(patch))
        .await
        .unwrap();
    assert_eq!(n.labels()["y"], "2");

    // A merge patch carrying a stale resourceVersion conflicts.
    let e = api_err(
        nodes
            .patch("n1", &pp, &Patch::Merge(json!({"metadata": {"resourceVersion": before.resource_version().unwrap(), "labels": {"z": "1"}}})))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));

    // PATCH on a missing object: 404.
    let e = api_err(
        nodes
            .patch(
                "missing",
                &pp,
                &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));
}

#[tokio::test]
async fn strategic_merge_patch_directives_over_http() {
    let (_s, nodes, _) = server_with_node("n1").await;
    let pp = PatchParams::default();
    // $patch: delete removes one keyed list item.
    let n = nodes
        .patch_status(
            "n1",
            &pp,
            &Patch::Strategic(
                json!({"status": {"conditions": [{"type": "PIDPressure", "$patch": "delete"}]}}),
            ),
        )
        .await
        .unwrap();
    let types: Vec<String> = n
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .map(|c| c.type_)
        .collect();
    assert_eq!(types, vec!["MemoryPressure", "DiskPressure", "Ready"]);
    // $patch: replace replaces the whole keyed list.
    let n = nodes
        .patch_status(
            "n1",
            &pp,
            &Patch::Strategic(json!({"status": {"addresses": [{"$patch": "replace"}, {"type": "InternalIP", "address": "10.0.0.9"}]}})),
        )
        .await
        .unwrap();
    let addrs = n.status.unwrap().addresses.unwrap();
    assert_eq!(addrs.len(), 1);
    assert_eq!(addrs[0].address, "10.0.0.9");
    // $retainKeys keeps only the listed keys of a map.
    let n = nodes
        .patch(
            "n1",
            &pp,
            &Patch::Strategic(
                json!({"metadata": {"labels": {"$retainKeys": ["kubernetes.io/hostname"]}}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        n.labels().keys().collect::<Vec<_>>(),
        vec!["kubernetes.io/hostname"]
    );
}

#[tokio::test]
async fn server_side_apply_creates_and_detects_conflicts() {
    use k8s_openapi::api::coordination::v1::Lease;
    let s = ApiServer::start().await;
    let leases: Api<Lease> = Api::namespaced(s.client(), "kube-system");
    // Creating by apply needs the name in the configuration.
    let nameless = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": {"holderIdentity": "a"}});
    let e = api_err(
        leases
            .patch(
                "ccm",
                &PatchParams::apply("mgr-a"),
                &Patch::Apply(&nameless),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (400, "BadRequest"));
    let wrong_kind = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ccm"}});
    let e = api_err(
        leases
            .patch(
                "ccm",
                &PatchParams::apply("mgr-a"),
                &Patch::Apply(&wrong_kind),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 400);
    let a = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "ccm"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}});
    let l = leases
        .patch("ccm", &PatchParams::apply("mgr-a"), &Patch::Apply(&a))
        .await
        .unwrap();
    assert_eq!(l.spec.unwrap().holder_identity.as_deref(), Some("a"));
    // Same manager, same config: no change.
    let again = leases
        .patch("ccm", &PatchParams::apply("mgr-a"), &Patch::Apply(&a))
        .await
        .unwrap();
    assert_eq!(
        again.resource_version(),
        leases.get("ccm").await.unwrap().resource_version()
    );
    let b = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": {"holderIdentity": "b", "leaseDurationSeconds": 15}});
    let e = api_err(
        leases
            .patch("ccm", &PatchParams::apply("mgr-b"), &Patch::Apply(&b))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        e.message.contains("mgr-a") && e.message.contains(".spec.holderIdentity"),
        "{}",
        e.message
    );
    let l = leases
        .patch(
            "ccm",
            &PatchParams::apply("mgr-b").force(),
            &Patch::Apply(&b),
        )
        .await
        .unwrap();
    assert_eq!(l.spec.unwrap().holder_identity.as_deref(), Some("b"));
    // Non-apply patches never conflict.
    let l = leases
        .patch(
            "ccm",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"holderIdentity": null}})),
        )
        .await
        .unwrap();
    assert_eq!(l.spec.unwrap().holder_identity, None);
}

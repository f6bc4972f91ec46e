//! The in-process API server, checked against what kube-apiserver does, through a real
//! `kube::Client` over HTTP.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use ccm_testing::apiserver::ApiServer;
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Service};
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::ObjectMeta;
use kube::{Api, ResourceExt};
use serde_json::json;

fn api_err(e: kube::Error) -> Box<kube::core::Status> {
    match e {
        kube::Error::Api(s) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn rv<K: kube::Resource>(o: &K) -> u64 {
    o.meta().resource_version.as_ref().unwrap().parse().unwrap()
}

fn configmap(ns: &str, name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        data: Some([("k".to_string(), "v".to_string())].into()),
        ..Default::default()
    }
}

#[tokio::test]
async fn create_get_delete_and_errors() {
    let s = ApiServer::start().await;
    let nodes: Api<Node> = Api::all(s.client());
    let created = nodes
        .create(&PostParams::default(), &kubelet_node("n1").build())
        .await
        .unwrap();
    assert!(!created.uid().unwrap().is_empty());
    assert!(created.metadata.creation_timestamp.is_some());
    assert!(rv(&created) > 0);
    // Status is kept on create for Nodes (kubelet registers with status).
    assert!(created.status.as_ref().unwrap().conditions.is_some());
    let got = nodes.get("n1").await.unwrap();
    assert_eq!(got.uid(), created.uid());
    assert_eq!(rv(&got), rv(&created));

    let e = api_err(
        nodes
            .create(&PostParams::default(), &kubelet_node("n1").build())
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(e.message, "nodes \"n1\" already exists");
    let d = e.details.unwrap();
    assert_eq!(
        (d.name.as_str(), d.kind.as_str(), d.group.as_str()),
        ("n1", "nodes", "")
    );

    let mut gen_node = kubelet_node("ignored").build();
    gen_node.metadata.name = None;
    gen_node.metadata.generate_name = Some("gen-".into());
    let g = nodes
        .create(&PostParams::default(), &gen_node)
        .await
        .unwrap();
    assert!(
        g.name_any().starts_with("gen-") && g.name_any().len() == 9,
        "{}",
        g.name_any()
    );

    let deleted = nodes.delete("n1", &DeleteParams::default()).await.unwrap();
    let status = deleted.right().expect("a Status for an immediate delete");
    assert_eq!(status.details.unwrap().name, "n1");

    let e = api_err(nodes.get("n1").await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));
    assert_eq!(e.message, "nodes \"n1\" not found");
    let e = api_err(
        nodes
            .delete("n1", &DeleteParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 404);

    // Group-qualified messages.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(s.client(), "default");
    let e = api_err(leases.get("nope").await.unwrap_err());
    assert_eq!(e.message, "leases.coordination.k8s.io \"nope\" not found");
    assert_eq!(e.details.unwrap().group, "coordination.k8s.io");
}

#[tokio::test]
async fn namespaced_objects_need_their_namespace() {
    let s = ApiServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(s.client(), "missing");
    let e = api_err(
        cms.create(&PostParams::default(), &configmap("missing", "c"))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));
    assert_eq!(e.message, "namespaces \"missing\" not found");
    let cms: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let e = api_err(
        cms.create(&PostParams::default(), &configmap("other", "c"))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (400, "BadRequest"));
}

#[tokio::test]
async fn update_with_stale_resource_version_conflicts() {
    let s = ApiServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let c1 = cms
        .create(&PostParams::default(), &configmap("default", "c"))
        .await
        .unwrap();
    let mut c2 = c1.clone();
    c2.data = Some([("k".to_string(), "v2".to_string())].into());
    let c2 = cms.replace("c", &PostParams::default(), &c2).await.unwrap();
    assert!(rv(&c2) > rv(&c1));
    let mut stale = c1.clone();
    stale.data = Some([("k".to_string(), "v3".to_string())].into());
    let e = api_err(
        cms.replace("c", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        e.message,
        "Operation cannot be fulfilled on configmaps \"c\": the object has been modified; please apply your changes to the latest version and try again"
    );
    // Without a resourceVersion the update is unconditional.
    stale.metadata.resource_version = None;
    let c3 = cms
        .replace("c", &PostParams::default(), &stale)
        .await
        .unwrap();
    assert_eq!(c3.data.unwrap()["k"], "v3");
    // A write that changes nothing keeps the resourceVersion.
    let c4 = cms
        .replace("c", &PostParams::default(), &cms.get("c").await.unwrap())
        .await
        .unwrap();
    assert_eq!(rv(&c4), rv(&cms.get("c").await.unwrap()));
    // PUT on a missing ConfigMap is 404 (no create-on-update).
    let e = api_err(
        cms.replace(
            "nope",
            &PostParams::default(),
            &configmap("default", "nope"),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 404);
}

#[tokio::test]
async fn status_subresource_semantics() {
    let s = ApiServer::start().await;
    let nodes: Api<Node> = Api::all(s.client());
    let n = nodes
        .create(&PostParams::default(), &kubelet_node("n1").build())
        .await
        .unwrap();

    // Main resource writes ignore status.
    let mut main = n.clone();
    main.status.as_mut().unwrap().addresses = Some(vec![]);
    main.spec.as_mut().unwrap().provider_id = Some("fake://n1".into());
    let after = nodes
        .replace("n1", &PostParams::default(), &main)
        .await
        .unwrap();
    assert_eq!(
        after.spec.as_ref().unwrap().provider_id.as_deref(),
        Some("fake://n1")
    );
    assert_eq!(
        after
            .status
            .as_ref()
            .unwrap()
            .addresses
            .as_ref()
            .unwrap()
            .len(),
        1
    );

    // Status writes ignore spec, keep metadata changes.
    let mut st = after.clone();
    st.spec.as_mut().unwrap().unschedulable = Some(true);
    st.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("via-status".into(), "yes".into());
    st.status
        .as_mut()
        .unwrap()
        .addresses
        .as_mut()
        .unwrap()
        .push(k8s_openapi::api::core::v1::NodeAddress {
            type_: "InternalIP".into(),
            address: "10.0.0.1".into(),
        });
    let after = nodes
        .replace_status("n1", &PostParams::default(), &st)
        .await
        .unwrap();
    assert_eq!(after.spec.as_ref().unwrap().unschedulable, None);
    assert_eq!(
        after
            .status
            .as_ref()
            .unwrap()
            .addresses
            .as_ref()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(after.labels()["via-status"], "yes");

    // Patches to the main resource ignore status too; status patches ignore spec.
    let p = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"addresses": []}, "metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        p.status.as_ref().unwrap().addresses.as_ref().unwrap().len(),
        2
    );
    assert_eq!(p.labels()["a"], "b");
    let p = nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}, "status": {"phase": "Running"}})),
        )
        .await
        .unwrap();
    assert_eq!(p.spec.unwrap().unschedulable, None);
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Running"));

    // Services: create resets status; status subresource works the same.
    let svcs: Api<Service> = Api::namespaced(s.client(), "default");
    let mut svc = load_balancer_service("default", "s1").build();
    svc.status = Some(k8s_openapi::api::core::v1::ServiceStatus {
        load_balancer: Some(k8s_openapi::api::core::v1::LoadBalancerStatus {
            ingress: Some(vec![k8s_openapi::api::core::v1::LoadBalancerIngress {
                ip: Some("1.2.3.4".into()),
                ..Default::default()
            }]),
        }),
        ..Default::default()
    });
    let created = svcs.create(&PostParams::default(), &svc).await.unwrap();
    assert!(
        created
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref())
            .is_none()
    );
    let spec = created.spec.as_ref().unwrap();
    assert!(spec.cluster_ip.is_some());
    assert!(
        spec.ports
            .as_ref()
            .unwrap()
            .iter()
            .all(|p| p.node_port.is_some())
    );
    assert_eq!(spec.external_traffic_policy.as_deref(), Some("Cluster"));
    let p = svcs
        .patch_status(
            "s1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        p.status.unwrap().load_balancer.unwrap().ingress.unwrap()[0]
            .ip
            .as_deref(),
        Some("203.0.113.10")
    );
}

#[tokio::test]
async fn finalizers_delay_deletion_and_events_come_in_order() {
    let s = ApiServer::start().await;
    let svcs: Api<Service> = Api::namespaced(s.client(), "default");
    let created = svcs
        .create(
            &PostParams::default(),
            &load_balancer_service("default", "s1")
                .finalizer("service.kubernetes.io/load-balancer-cleanup")
                .build(),
        )
        .await
        .unwrap();
    let wp = WatchParams::default();
    let mut stream = svcs
        .watch(&wp, &created.resource_version().unwrap())
        .await
        .unwrap()
        .boxed();

    let deleted = svcs.delete("s1", &DeleteParams::default()).await.unwrap();
    let terminating = deleted
        .left()
        .expect("the object is returned while finalizers remain");
    assert!(terminating.metadata.deletion_timestamp.is_some());
    let still = svcs.get("s1").await.unwrap();
    assert!(still.metadata.deletion_timestamp.is_some());
    // Deleting again changes nothing.
    let again = svcs
        .delete("s1", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(again.resource_version(), still.resource_version());
    // No new finalizers on an object being deleted.
    let e = api_err(
        svcs.patch("s1", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": ["service.kubernetes.io/load-balancer-cleanup", "x.io/other"]}})))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));

    // Removing the last finalizer (JSON patch with a test op, as kube's finalizer helper does).
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers/0", "value": "service.kubernetes.io/load-balancer-cleanup"},
        {"op": "remove", "path": "/metadata/finalizers/0"}
    ]))
    .unwrap();
    svcs.patch("s1", &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .unwrap();
    let e = api_err(svcs.get("s1").await.unwrap_err());
    assert_eq!(e.code, 404);

    let mut seen = Vec::new();
    while seen.len() < 2 {
        match stream.try_next().await.unwrap().unwrap() {
            WatchEvent::Modified(o) => {
                seen.push(("MODIFIED", o.metadata.deletion_timestamp.is_some()))
            }
            WatchEvent::Deleted(o) => {
                seen.push(("DELETED", o.metadata.deletion_timestamp.is_some()))
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, vec![("MODIFIED", true), ("DELETED", true)]);
}

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

#[tokio::test]
async fn validation_answers_422_invalid() {
    let s = ApiServer::start().await;
    let nodes: Api<Node> = Api::all(s.client());
    nodes
        .create(
            &PostParams::default(),
            &kubelet_node("n1").provider_id("fake://n1").build(),
        )
        .await
        .unwrap();
    let pp = PatchParams::default();

    let e = api_err(
        nodes
            .patch(
                "n1",
                &pp,
                &Patch::Merge(json!({"spec": {"providerID": "fake://other"}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert!(
        e.message
            .starts_with("Node \"n1\" is invalid: spec.providerID: Forbidden"),
        "{}",
        e.message
    );
    let d = e.details.unwrap();
    assert_eq!((d.kind.as_str(), d.name.as_str()), ("Node", "n1"));
    assert_eq!(d.causes[0].field, "spec.providerID");
    assert_eq!(d.causes[0].reason, "FieldValueForbidden");
    // Setting it from empty is fine.
    nodes
        .create(&PostParams::default(), &kubelet_node("n2").build())
        .await
        .unwrap();
    nodes
        .patch(
            "n2",
            &pp,
            &Patch::Merge(json!({"spec": {"providerID": "fake://n2"}})),
        )
        .await
        .unwrap();

    let e = api_err(
        nodes
            .patch(
                "n1",
                &pp,
                &Patch::Merge(json!({"metadata": {"labels": {"bad key": "v"}}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert_eq!(e.details.unwrap().causes[0].field, "metadata.labels");
    let e = api_err(
        nodes
            .patch(
                "n1",
                &pp,
                &Patch::Merge(json!({"metadata": {"labels": {"k": "bad value!"}}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    let e = api_err(
        nodes
            .patch(
                "n1",
                &pp,
                &Patch::Merge(json!({"spec": {"taints": [{"key": "a", "effect": "Sometimes"}]}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert_eq!(
        e.details.unwrap().causes[0].reason,
        "FieldValueNotSupported"
    );
    let e = api_err(
        nodes
            .patch(
                "n1",
                &pp,
                &Patch::Merge(json!({"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}, {"key": "a", "value": "x", "effect": "NoSchedule"}]}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert_eq!(e.details.unwrap().causes[0].reason, "FieldValueDuplicate");
    let e = api_err(
        nodes
            .create(&PostParams::default(), &kubelet_node("Bad_Name").build())
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
}

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
async fn fault_injection_and_request_log() {
    let s = ApiServer::start().await;
    let nodes: Api<Node> = Api::all(s.client());
    nodes
        .create(&PostParams::default(), &kubelet_node("n1").build())
        .await
        .unwrap();
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

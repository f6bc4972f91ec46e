//! Object lifecycle: create, get, update and delete with their errors, namespaces, optimistic
//! concurrency, the status subresource, finalizers, create-on-update, delete preconditions,
//! dry runs and collections.

use std::time::Duration;

use ccm_testing::apiserver::ApiServer;
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use ccm_testing::wait::eventually;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service};
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent,
    WatchParams,
};
use kube::core::ObjectMeta;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::support::{api_err, cm, configmap, rv, server_with_node};

#[tokio::test]
async fn create_get_delete_and_errors() {
    let (s, nodes, created) = server_with_node("n1").await;
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

/// kube-apiserver refuses a create that sets `metadata.resourceVersion` with its storage layer's
/// plain error, reported as `500 InternalError` (a client that re-creates an object it read must
/// clear it); nothing is stored.
#[tokio::test]
async fn a_create_with_a_resource_version_is_an_internal_error_and_stores_nothing() {
    let s = ApiServer::start().await;
    let services: Api<Service> = Api::namespaced(s.client(), "default");
    let mut svc = load_balancer_service("default", "with-rv").build();
    svc.metadata.resource_version = Some("5".into());
    let e = api_err(
        services
            .create(&PostParams::default(), &svc)
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (500, "InternalError"));
    assert_eq!(
        e.message,
        "Internal error occurred: resourceVersion should not be set on objects to be created"
    );
    let e = api_err(services.get("with-rv").await.unwrap_err());
    assert_eq!(e.code, 404);
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
async fn optimistic_concurrency_under_contention() {
    let s = ApiServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let mut counter = cm("default", "counter", &[]);
    counter.data = Some([("n".to_string(), "0".to_string())].into());
    let start = cms.create(&PostParams::default(), &counter).await.unwrap();
    let mut watch = cms
        .watch(
            &WatchParams::default()
                .fields("metadata.name=counter")
                .disable_bookmarks(),
            &start.resource_version().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let cms = cms.clone();
            tokio::spawn(async move {
                let mut conflicts = 0;
                for _ in 0..5 {
                    loop {
                        let mut c = cms.get("counter").await.unwrap();
                        let n: u32 = c.data.as_ref().unwrap()["n"].parse().unwrap();
                        c.data
                            .as_mut()
                            .unwrap()
                            .insert("n".into(), (n + 1).to_string());
                        match cms.replace("counter", &PostParams::default(), &c).await {
                            Ok(_) => break,
                            Err(kube::Error::Api(e)) if e.code == 409 => conflicts += 1,
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
                conflicts
            })
        })
        .collect();
    let mut conflicts = 0;
    for t in tasks {
        conflicts += t.await.unwrap();
    }
    let end = cms.get("counter").await.unwrap();
    assert_eq!(
        end.data.unwrap()["n"],
        "40",
        "no lost update ({conflicts} conflicts retried)"
    );
    // Every successful write is one MODIFIED event, in resourceVersion order.
    let mut last = 0u64;
    for i in 1..=40 {
        match watch.try_next().await.unwrap().unwrap() {
            WatchEvent::Modified(c) => {
                let rv: u64 = c.resource_version().unwrap().parse().unwrap();
                assert!(rv > last);
                last = rv;
                assert_eq!(c.data.unwrap()["n"], i.to_string());
            }
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn status_subresource_semantics() {
    let (s, nodes, n) = server_with_node("n1").await;

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
async fn leases_are_created_by_put_and_delete_preconditions_hold() {
    let s = ApiServer::start().await;
    let leases: Api<Lease> = Api::namespaced(s.client(), "kube-system");
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("l".into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("me".into()),
            lease_duration_seconds: Some(15),
            ..Default::default()
        }),
    };
    let created = leases
        .replace("l", &PostParams::default(), &lease)
        .await
        .unwrap();
    assert!(created.uid().is_some());
    let mut bad = lease.clone();
    bad.spec.as_mut().unwrap().lease_duration_seconds = Some(0);
    let e = api_err(
        leases
            .replace("l", &PostParams::default(), &bad)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);

    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("not-the-uid".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let e = api_err(leases.delete("l", &dp).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        e.message
            .contains("Precondition failed: UID in precondition"),
        "{}",
        e.message
    );
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: None,
            resource_version: Some("1".into()),
        }),
        ..Default::default()
    };
    assert_eq!(
        api_err(leases.delete("l", &dp).await.unwrap_err()).code,
        409
    );
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: created.uid(),
            resource_version: created.resource_version(),
        }),
        ..Default::default()
    };
    leases.delete("l", &dp).await.unwrap();
    assert_eq!(api_err(leases.get("l").await.unwrap_err()).code, 404);
}

#[tokio::test]
async fn dry_run_and_delete_collection() {
    let s = ApiServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let before = s.resource_version();
    let dry = cms
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &cm("default", "d", &[]),
        )
        .await
        .unwrap();
    assert_eq!(dry.name_any(), "d");
    assert_eq!(api_err(cms.get("d").await.unwrap_err()).code, 404);
    assert_eq!(s.resource_version(), before);

    for (n, tier) in [("a", "x"), ("b", "x"), ("c", "y")] {
        cms.create(&PostParams::default(), &cm("default", n, &[("tier", tier)]))
            .await
            .unwrap();
    }
    let gone = cms
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("tier=x"),
        )
        .await
        .unwrap();
    let names: Vec<String> = gone
        .left()
        .unwrap()
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    assert_eq!(names, vec!["a", "b"]);
    let left: Vec<String> = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    assert_eq!(left, vec!["c"]);
}

#[tokio::test]
async fn namespace_deletion_terminates_then_removes_content() {
    let s = ApiServer::start().await;
    let nss: Api<Namespace> = Api::all(s.client());
    let mut ns = Namespace::default();
    ns.metadata.name = Some("team".into());
    let created = nss.create(&PostParams::default(), &ns).await.unwrap();
    assert_eq!(
        created.status.as_ref().unwrap().phase.as_deref(),
        Some("Active")
    );
    assert_eq!(created.labels()["kubernetes.io/metadata.name"], "team");
    let cms: Api<ConfigMap> = Api::namespaced(s.client(), "team");
    cms.create(&PostParams::default(), &cm("team", "plain", &[]))
        .await
        .unwrap();
    let mut held = cm("team", "held", &[]);
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    cms.create(&PostParams::default(), &held).await.unwrap();

    let mut ns_watch = nss
        .watch(
            &WatchParams::default()
                .fields("metadata.name=team")
                .disable_bookmarks(),
            &s.resource_version().to_string(),
        )
        .await
        .unwrap()
        .boxed();
    let terminating = nss
        .delete("team", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(
        terminating.status.unwrap().phase.as_deref(),
        Some("Terminating")
    );
    // The built-in namespace controller deletes the content: content without finalizers
    // goes, content with finalizers is terminating.
    assert!(
        eventually(Duration::from_secs(10), || async {
            cms.get_opt("plain").await.unwrap().is_none()
                && cms
                    .get("held")
                    .await
                    .unwrap()
                    .metadata
                    .deletion_timestamp
                    .is_some()
        })
        .await
    );
    // No new content in a terminating namespace.
    let e = api_err(
        cms.create(&PostParams::default(), &cm("team", "late", &[]))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
    assert!(
        e.message.contains("because it is being terminated"),
        "{}",
        e.message
    );
    // The namespace is still there until its last object goes.
    assert!(nss.get("team").await.is_ok());
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async {
            nss.get_opt("team").await.unwrap().is_none()
        })
        .await
    );
    let mut types = Vec::new();
    while types.len() < 2 {
        types.push(match ns_watch.try_next().await.unwrap().unwrap() {
            WatchEvent::Modified(_) => "MODIFIED",
            WatchEvent::Deleted(_) => "DELETED",
            other => panic!("{other:?}"),
        });
    }
    assert_eq!(types, vec!["MODIFIED", "DELETED"]);
}

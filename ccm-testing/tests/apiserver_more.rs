//! More kube-apiserver semantics of the in-process API server: namespaces, create-on-update,
//! delete preconditions, dry runs, collections, Service defaults and immutability, events,
//! latency, and raw-protocol details.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use ccm_testing::apiserver::ApiServer;
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use ccm_testing::wait::eventually;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Service};
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent,
    WatchParams,
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

fn cm(ns: &str, name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        ..Default::default()
    }
}

async fn raw(s: &ApiServer, req: http::Request<Vec<u8>>) -> (u16, serde_json::Value) {
    let mut cfg = kube::Config::new(s.url().parse().unwrap());
    cfg.default_retry = false;
    let client = kube::Client::try_from(cfg).unwrap();
    let (parts, body) = req.into_parts();
    let req = http::Request::from_parts(parts, kube::client::Body::from(body));
    let resp = client.send(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    )
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
async fn service_defaults_generation_and_immutable_fields() {
    let s = ApiServer::start().await;
    let svcs: Api<Service> = Api::namespaced(s.client(), "default");
    let svc = svcs
        .create(
            &PostParams::default(),
            &load_balancer_service("default", "web")
                .external_traffic_policy("Local")
                .build(),
        )
        .await
        .unwrap();
    assert_eq!(svc.metadata.generation, Some(1));
    let spec = svc.spec.clone().unwrap();
    assert!(spec.health_check_node_port.is_some());
    assert_eq!(spec.session_affinity.as_deref(), Some("None"));
    assert_eq!(spec.allocate_load_balancer_node_ports, Some(true));
    let ip = spec.cluster_ip.clone().unwrap();

    // Status writes do not bump generation; spec writes do.
    let st = svcs
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(st.metadata.generation, Some(1));
    let sp = svcs
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"spec": {"ports": [{"port": 80, "name": "http", "targetPort": 8080}]}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(sp.metadata.generation, Some(2));
    // Ports merge by `port`: 443 is still there, 80 got the new target port.
    let ports = sp.spec.as_ref().unwrap().ports.clone().unwrap();
    assert_eq!(ports.len(), 2);
    assert_eq!(
        ports[0].target_port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(8080))
    );
    // A PUT that leaves out allocated values keeps them.
    let mut put = sp.clone();
    put.spec.as_mut().unwrap().cluster_ip = None;
    put.spec.as_mut().unwrap().cluster_ips = None;
    for p in put.spec.as_mut().unwrap().ports.as_mut().unwrap() {
        p.node_port = None;
    }
    let after = svcs
        .replace("web", &PostParams::default(), &put)
        .await
        .unwrap();
    assert_eq!(
        after.spec.as_ref().unwrap().cluster_ip.as_deref(),
        Some(ip.as_str())
    );
    assert!(
        after
            .spec
            .as_ref()
            .unwrap()
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .all(|p| p.node_port.is_some())
    );
    // clusterIP and loadBalancerClass are immutable.
    let e = api_err(
        svcs.patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"clusterIP": "10.96.99.99"}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    let classy = svcs
        .create(
            &PostParams::default(),
            &load_balancer_service("default", "classy")
                .load_balancer_class("example.com/lb")
                .build(),
        )
        .await
        .unwrap();
    assert_eq!(
        classy.spec.unwrap().load_balancer_class.as_deref(),
        Some("example.com/lb")
    );
    let e = api_err(
        svcs.patch(
            "classy",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"loadBalancerClass": "other.io/lb"}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert_eq!(e.details.unwrap().causes[0].field, "spec.loadBalancerClass");
    // An invalid ingress IP in status is rejected.
    let e = api_err(
        svcs.patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": "not-an-ip"}]}}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 422);
}

#[tokio::test]
async fn events_share_storage_across_both_apis_and_are_validated() {
    use k8s_openapi::api::core::v1::{Event as CoreEvent, ObjectReference};
    use k8s_openapi::api::events::v1::Event as V1Event;
    let s = ApiServer::start().await;
    let core: Api<CoreEvent> = Api::namespaced(s.client(), "default");
    let v1: Api<V1Event> = Api::namespaced(s.client(), "default");
    let ev = CoreEvent {
        metadata: ObjectMeta {
            name: Some("n1.abc".into()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            kind: Some("Node".into()),
            name: Some("n1".into()),
            ..Default::default()
        },
        reason: Some("Synced".into()),
        message: Some("hello".into()),
        type_: Some("Normal".into()),
        count: Some(1),
        ..Default::default()
    };
    core.create(&PostParams::default(), &ev).await.unwrap();
    let seen = v1.get("n1.abc").await.unwrap();
    assert_eq!(seen.note.as_deref(), Some("hello"));
    assert_eq!(seen.regarding.unwrap().name.as_deref(), Some("n1"));
    assert_eq!(seen.deprecated_count, Some(1));
    // events.k8s.io/v1 create requires eventTime, reportingController, ...
    let bad = V1Event {
        metadata: ObjectMeta {
            name: Some("bad".into()),
            ..Default::default()
        },
        reason: Some("X".into()),
        type_: Some("Normal".into()),
        ..Default::default()
    };
    let e = api_err(v1.create(&PostParams::default(), &bad).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    let fields: Vec<String> = e
        .details
        .unwrap()
        .causes
        .into_iter()
        .map(|c| c.field)
        .collect();
    assert!(
        fields.contains(&"eventTime".to_string())
            && fields.contains(&"reportingController".to_string()),
        "{fields:?}"
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
async fn raw_protocol_details() {
    let s = ApiServer::start().await;
    let nodes: Api<Node> = Api::all(s.client());
    nodes
        .create(&PostParams::default(), &kubelet_node("n1").build())
        .await
        .unwrap();

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
async fn secrets_are_defaulted() {
    use k8s_openapi::api::core::v1::Secret;
    let s = ApiServer::start().await;
    let secrets: Api<Secret> = Api::namespaced(s.client(), "kube-system");
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("cloud-config".into()),
            ..Default::default()
        },
        string_data: Some([("cloud.yaml".to_string(), "zone: a\n".to_string())].into()),
        ..Default::default()
    };
    let created = secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    assert_eq!(created.type_.as_deref(), Some("Opaque"));
    assert!(created.string_data.is_none());
    assert_eq!(created.data.unwrap()["cloud.yaml"].0, b"zone: a\n".to_vec());
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
async fn pod_cidrs_are_normalised_set_once_and_validated() {
    let s = ApiServer::start().await;
    let nodes: Api<Node> = Api::all(s.client());
    nodes
        .create(&PostParams::default(), &kubelet_node("n1").build())
        .await
        .unwrap();
    let pp = PatchParams::default();
    // Setting only the singular field fills the list (and vice versa).
    let n = nodes
        .patch(
            "n1",
            &pp,
            &Patch::Merge(json!({"spec": {"podCIDR": "10.244.1.0/24"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        n.spec.as_ref().unwrap().pod_cidrs.as_deref(),
        Some(&["10.244.1.0/24".to_string()][..])
    );
    nodes
        .create(&PostParams::default(), &kubelet_node("n2").build())
        .await
        .unwrap();
    let n = nodes
        .patch(
            "n2",
            &pp,
            &Patch::Merge(json!({"spec": {"podCIDRs": ["10.244.2.0/24", "fd00:2::/64"]}})),
        )
        .await
        .unwrap();
    assert_eq!(
        n.spec.as_ref().unwrap().pod_cidr.as_deref(),
        Some("10.244.2.0/24")
    );
    // Set once: changing is Forbidden.
    let e = api_err(
        nodes
            .patch(
                "n1",
                &pp,
                &Patch::Merge(json!({"spec": {"podCIDRs": ["10.244.9.0/24"]}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert!(
        e.details
            .unwrap()
            .causes
            .iter()
            .any(|c| c.field == "spec.podCIDRs" && c.reason == "FieldValueForbidden")
    );
    // Invalid CIDRs and two of one family are Invalid.
    nodes
        .create(&PostParams::default(), &kubelet_node("n3").build())
        .await
        .unwrap();
    let e = api_err(
        nodes
            .patch(
                "n3",
                &pp,
                &Patch::Merge(json!({"spec": {"podCIDRs": ["banana"]}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    let e = api_err(
        nodes
            .patch(
                "n3",
                &pp,
                &Patch::Merge(json!({"spec": {"podCIDRs": ["10.0.0.0/24", "10.0.1.0/24"]}})),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
}

#[tokio::test]
async fn open_watches_are_counted() {
    let s = ApiServer::start().await;
    let nodes: Api<Node> = Api::all(s.client());
    assert_eq!(s.open_watches("nodes"), 0);
    let st = nodes
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    let leases: Api<Lease> = Api::namespaced(s.client(), "default");
    let st2 = leases
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    assert_eq!(s.open_watches("nodes"), 1);
    assert_eq!(s.open_watches("leases.coordination.k8s.io"), 1);
    assert_eq!(s.open_watches("*"), 2);
    // close_watches ends them on the server side.
    s.close_watches();
    let ended = ccm_testing::wait::eventually(Duration::from_secs(20), || async {
        s.open_watches("*") == 0
    })
    .await;
    assert!(ended);
    let rest: Vec<_> = st.collect().await;
    assert!(rest.is_empty());
    drop(st2);
}

#[tokio::test]
async fn strategic_merge_patch_directives_over_http() {
    let s = ApiServer::start().await;
    let nodes: Api<Node> = Api::all(s.client());
    nodes
        .create(&PostParams::default(), &kubelet_node("n1").build())
        .await
        .unwrap();
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
async fn await_condition_uses_a_single_object_watch() {
    use kube::runtime::wait::{await_condition, conditions};
    let s = ApiServer::start().await;
    let nodes: Api<Node> = Api::all(s.client());
    let n = nodes
        .create(&PostParams::default(), &kubelet_node("n1").build())
        .await
        .unwrap();
    let uid = n.uid().unwrap();
    let api = nodes.clone();
    let waiter =
        tokio::spawn(async move { await_condition(api, "n1", conditions::is_deleted(&uid)).await });
    ccm_testing::wait::eventually(Duration::from_secs(20), || async {
        s.open_watches("nodes") == 1
    })
    .await;
    nodes.delete("n1", &DeleteParams::default()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let watch = s
        .requests()
        .into_iter()
        .find(|r| r.verb == "watch")
        .unwrap();
    assert!(
        watch.query.contains("fieldSelector=metadata.name%3Dn1"),
        "{}",
        watch.query
    );
}

#[tokio::test]
async fn list_at_an_exact_resource_version() {
    use kube::api::VersionMatch;
    let s = ApiServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let a = cms
        .create(&PostParams::default(), &cm("default", "a", &[("v", "1")]))
        .await
        .unwrap();
    cms.create(&PostParams::default(), &cm("default", "b", &[]))
        .await
        .unwrap();
    let at = s.resource_version().to_string();
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"v": "2"}}})),
    )
    .await
    .unwrap();
    cms.delete("b", &DeleteParams::default()).await.unwrap();
    cms.create(&PostParams::default(), &cm("default", "c", &[]))
        .await
        .unwrap();

    let then = cms
        .list(&ListParams::default().at(&at).matching(VersionMatch::Exact))
        .await
        .unwrap();
    assert_eq!(then.metadata.resource_version.as_deref(), Some(at.as_str()));
    let names: Vec<String> = then.items.iter().map(|c| c.name_any()).collect();
    assert_eq!(names, vec!["a", "b"]);
    assert_eq!(then.items[0].labels()["v"], "1");
    assert_eq!(then.items[0].resource_version(), a.resource_version());
    let now = cms.list(&ListParams::default()).await.unwrap();
    let names: Vec<String> = now.items.iter().map(|c| c.name_any()).collect();
    assert_eq!(names, vec!["a", "c"]);
    // NotOlderThan an old version serves the latest state.
    let latest = cms
        .list(
            &ListParams::default()
                .at(&at)
                .matching(VersionMatch::NotOlderThan),
        )
        .await
        .unwrap();
    assert_eq!(latest.items.len(), 2);
    assert_eq!(latest.items[0].labels()["v"], "2");
    // From the future: 504 (asked without client retries: kube retries 504 by itself);
    // compacted: 410.
    let mut cfg = kube::Config::new(s.url().parse().unwrap());
    cfg.default_retry = false;
    let no_retry: Api<ConfigMap> = Api::namespaced(kube::Client::try_from(cfg).unwrap(), "default");
    let future = (s.resource_version() + 10).to_string();
    let e = api_err(
        no_retry
            .list(
                &ListParams::default()
                    .at(&future)
                    .matching(VersionMatch::Exact),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (504, "Timeout"));
    s.compact();
    let e = api_err(
        cms.list(&ListParams::default().at(&at).matching(VersionMatch::Exact))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
}

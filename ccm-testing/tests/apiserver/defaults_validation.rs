//! Defaulting and validation as kube-apiserver does them: 422 Invalid answers, Service
//! defaults and immutable fields, pod CIDRs, Secrets, Events in both APIs.

use ccm_testing::apiserver::ApiServer;
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kube::core::ObjectMeta;
use serde_json::json;

use crate::support::{api_err, server_with_node};

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
async fn pod_cidrs_are_normalised_set_once_and_validated() {
    let (_s, nodes, _) = server_with_node("n1").await;
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

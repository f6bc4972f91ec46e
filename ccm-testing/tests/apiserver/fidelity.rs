//! What kube-apiserver (and the controllers every cluster runs next to it) do to objects a
//! cloud-controller-manager touches, reproduced by the in-process API server: the
//! `TaintNodesByCondition` admission plugin, Service source-range validation, and namespace
//! finalization.
//!
//! The node and Service tests run against a real cluster too when `CCM_TEST_KUBECONFIG` is set
//! (they go through `TestCluster`); the namespace-controller switch is in-process only.

use std::time::Duration;

use ccm_testing::TestCluster;
use ccm_testing::apiserver::ApiServer;
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use ccm_testing::wait::eventually;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Service, Taint};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::core::ObjectMeta;
use serde_json::json;

use crate::support::api_err;

const NOT_READY: &str = "node.kubernetes.io/not-ready";
const SOURCE_RANGES: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";
const T: Duration = Duration::from_secs(20);

fn taints(node: &Node) -> Vec<(String, Option<String>, String)> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t: Taint| (t.key, t.value, t.effect))
        .collect()
}

fn not_ready_taints(node: &Node) -> usize {
    taints(node)
        .iter()
        .filter(|(k, _, e)| k == NOT_READY && e == "NoSchedule")
        .count()
}

#[tokio::test]
async fn every_created_node_gets_the_not_ready_taint_once() {
    let c = TestCluster::start().await;
    let nodes: Api<Node> = Api::all(c.client());

    // A Ready node without taints still gets it: the plugin does not look at conditions.
    let plain = c.unique_name("taint-plain");
    let created = c
        .create(
            &kubelet_node(&plain)
                .ready(true)
                .without_uninitialized_taint()
                .build(),
        )
        .await;
    assert_eq!(
        taints(&created),
        vec![(NOT_READY.to_string(), None, "NoSchedule".to_string())]
    );

    // Appended after the node's own taints; a taint with the same key and effect (any value)
    // is not duplicated.
    let own = c.unique_name("taint-own");
    let created = c.create(&kubelet_node(&own).build()).await;
    let t = taints(&created);
    assert_eq!(t.len(), 2, "{t:?}");
    assert_eq!(t[0].0, "node.cloudprovider.kubernetes.io/uninitialized");
    assert_eq!(t[1].0, NOT_READY);
    let valued = c.unique_name("taint-valued");
    let created = c
        .create(
            &kubelet_node(&valued)
                .without_uninitialized_taint()
                .taint(NOT_READY, "custom", "NoSchedule")
                .build(),
        )
        .await;
    assert_eq!(
        taints(&created),
        vec![(
            NOT_READY.to_string(),
            Some("custom".to_string()),
            "NoSchedule".to_string()
        )]
    );

    // Only at creation: an update that removes it is kept (on a real cluster the node
    // lifecycle controller may put it back while the node is not Ready, so look at the answer
    // of the write itself).
    let removed = nodes
        .patch(
            &plain,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": null}})),
        )
        .await
        .unwrap();
    assert_eq!(not_ready_taints(&removed), 0);
    c.cleanup().await;
}

#[tokio::test]
async fn a_node_created_by_apply_gets_the_not_ready_taint() {
    let c = TestCluster::start().await;
    let nodes: Api<Node> = Api::all(c.client());
    let name = c.unique_name("taint-apply");
    let applied = nodes
        .patch(
            &name,
            &PatchParams::apply("fidelity-test"),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})),
        )
        .await
        .unwrap();
    assert_eq!(not_ready_taints(&applied), 1);
    nodes.delete(&name, &DeleteParams::default()).await.unwrap();
}

async fn create_err(svcs: &Api<Service>, svc: &Service) -> Box<kube::core::Status> {
    api_err(
        svcs.create(&PostParams::default(), svc)
            .await
            .expect_err("kube-apiserver rejects this Service"),
    )
}

#[tokio::test]
async fn malformed_source_ranges_are_rejected() {
    let c = TestCluster::start().await;
    let ns = c.namespace().await;
    let svcs: Api<Service> = Api::namespaced(c.client(), &ns);

    // The annotation: every comma-separated entry must be a CIDR.
    let svc = load_balancer_service(&ns, &c.unique_name("bad-annotation"))
        .annotation(SOURCE_RANGES, "10.0.0.0/8, not-a-cidr")
        .build();
    let e = create_err(&svcs, &svc).await;
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert!(
        e.message.contains(&format!(
            "metadata.annotations[{SOURCE_RANGES}]: Invalid value: \"not-a-cidr\""
        )),
        "{}",
        e.message
    );
    assert!(
        e.message.contains("must be a valid CIDR value"),
        "{}",
        e.message
    );

    // The field: each entry, by index (kube-apiserver's capitalised field name).
    let mut svc = load_balancer_service(&ns, &c.unique_name("bad-field")).build();
    svc.spec.as_mut().unwrap().load_balancer_source_ranges =
        Some(vec!["192.168.0.0/16".into(), "192.168.0.1".into()]);
    let e = create_err(&svcs, &svc).await;
    assert_eq!(e.code, 422);
    assert!(
        e.message
            .contains("spec.LoadBalancerSourceRanges[1]: Invalid value: \"192.168.0.1\""),
        "{}",
        e.message
    );

    // Only LoadBalancer Services may have them.
    let mut svc = load_balancer_service(&ns, &c.unique_name("not-lb"))
        .type_("ClusterIP")
        .build();
    svc.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["10.0.0.0/8".into()]);
    let e = create_err(&svcs, &svc).await;
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains(
            "spec.LoadBalancerSourceRanges: Forbidden: may only be used when `type` is 'LoadBalancer'"
        ),
        "{}",
        e.message
    );

    // Well-formed values pass, space padding included; the field wins over the annotation,
    // which is then not validated.
    let good = c.unique_name("good");
    let mut svc = load_balancer_service(&ns, &good)
        .annotation(SOURCE_RANGES, "garbage")
        .build();
    svc.spec.as_mut().unwrap().load_balancer_source_ranges =
        Some(vec![" 10.0.0.0/8".into(), "2001:db8::/64".into()]);
    c.create(&svc).await;
    let annotated = c.unique_name("annotated");
    c.create(
        &load_balancer_service(&ns, &annotated)
            .annotation(SOURCE_RANGES, " 10.0.0.0/8 , 172.16.0.0/12 ")
            .build(),
    )
    .await;

    // And on update: breaking the annotation of an existing Service is rejected too.
    let e = api_err(
        svcs.patch(
            &annotated,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {SOURCE_RANGES: "10.0.0.0/33"}}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert!(e.message.contains("\"10.0.0.0/33\""), "{}", e.message);
    c.cleanup().await;
}

fn config_map(ns: &str, name: &str, finalizer: Option<&str>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            finalizers: finalizer.map(|f| vec![f.to_string()]),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn namespace(name: &str) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn phase(ns: &Namespace) -> Option<&str> {
    ns.status.as_ref().and_then(|s| s.phase.as_deref())
}

#[tokio::test]
async fn the_namespace_controller_empties_and_finalizes_a_deleted_namespace() {
    let s = ApiServer::start().await;
    let nss: Api<Namespace> = Api::all(s.client());
    let created = nss
        .create(&PostParams::default(), &namespace("fin"))
        .await
        .unwrap();
    assert_eq!(
        created.spec.unwrap().finalizers,
        Some(vec!["kubernetes".to_string()])
    );
    let cms: Api<ConfigMap> = Api::namespaced(s.client(), "fin");
    for name in ["a", "b"] {
        cms.create(&PostParams::default(), &config_map("fin", name, None))
            .await
            .unwrap();
    }
    let deleted = nss
        .delete("fin", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .expect("a namespace is never deleted at once");
    assert_eq!(phase(&deleted), Some("Terminating"));
    assert!(
        eventually(T, || async { nss.get_opt("fin").await.unwrap().is_none() }).await,
        "the namespace goes once the controller has emptied and finalized it"
    );
    // Its content went with it.
    assert!(
        cms.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

#[tokio::test]
async fn without_the_namespace_controller_a_namespace_stays_terminating_until_finalized() {
    let s = ApiServer::start().await;
    s.set_namespace_controller(false);
    let nss: Api<Namespace> = Api::all(s.client());
    nss.create(&PostParams::default(), &namespace("stuck"))
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(s.client(), "stuck");
    cms.create(&PostParams::default(), &config_map("stuck", "kept", None))
        .await
        .unwrap();
    nss.delete("stuck", &DeleteParams::default()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let ns = nss.get("stuck").await.unwrap();
    assert_eq!(phase(&ns), Some("Terminating"));
    assert!(cms.get_opt("kept").await.unwrap().is_some());
    // A second DELETE changes nothing while `spec.finalizers` is set.
    let again = nss
        .delete("stuck", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(phase(&again), Some("Terminating"));
    // A main-resource write cannot drop the finalizer; only `/finalize` can.
    let patched = nss
        .patch(
            "stuck",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"finalizers": []}})),
        )
        .await
        .unwrap();
    assert_eq!(
        patched.spec.unwrap().finalizers,
        Some(vec!["kubernetes".to_string()])
    );
    let mut ns = nss.get("stuck").await.unwrap();
    ns.spec.as_mut().unwrap().finalizers = Some(vec![]);
    nss.replace_subresource("finalize", "stuck", &PostParams::default(), &ns)
        .await
        .unwrap();
    assert!(nss.get_opt("stuck").await.unwrap().is_none());

    // Turned back on, it finalizes namespaces that were left terminating.
    nss.create(&PostParams::default(), &namespace("later"))
        .await
        .unwrap();
    nss.delete("later", &DeleteParams::default()).await.unwrap();
    s.set_namespace_controller(true);
    assert!(
        eventually(T, || async {
            nss.get_opt("later").await.unwrap().is_none()
        })
        .await
    );
}

#[tokio::test]
async fn load_balancer_ingress_gets_the_vip_ip_mode() {
    let c = TestCluster::start().await;
    let ns = c.namespace().await;
    let svcs: Api<Service> = Api::namespaced(c.client(), &ns);
    let name = c.unique_name("ipmode");
    c.create(&load_balancer_service(&ns, &name).build()).await;
    let written = svcs
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [
                {"ip": "203.0.113.7"},
                {"hostname": "lb.example.com"},
                {"ip": "203.0.113.8", "ipMode": "Proxy"}
            ]}}})),
        )
        .await
        .unwrap();
    let modes: Vec<Option<String>> = written
        .status
        .unwrap()
        .load_balancer
        .unwrap()
        .ingress
        .unwrap()
        .into_iter()
        .map(|i| i.ip_mode)
        .collect();
    assert_eq!(
        modes,
        vec![Some("VIP".to_string()), None, Some("Proxy".to_string())]
    );
    // An ipMode without an ip is rejected.
    let e = api_err(
        svcs.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [
                {"hostname": "lb.example.com", "ipMode": "VIP"}
            ]}}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains(
            "status.loadBalancer.ingress[0].ipMode: Forbidden: may not be specified when `ip` is not set"
        ),
        "{}",
        e.message
    );
    c.cleanup().await;
}

#[tokio::test]
async fn the_system_namespaces_may_not_be_deleted() {
    let c = TestCluster::start().await;
    let nss: Api<Namespace> = Api::all(c.client());
    for name in ["default", "kube-system", "kube-public"] {
        let e = api_err(
            nss.delete(name, &DeleteParams::default().dry_run())
                .await
                .unwrap_err(),
        );
        assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"), "{name}");
        assert!(
            e.message.contains("this namespace may not be deleted"),
            "{}",
            e.message
        );
    }
}

fn node_event(ns: &str, name: &str, with_time: bool) -> serde_json::Value {
    let mut e = json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": ns},
        "involvedObject": {"kind": "Node", "name": "some-node", "apiVersion": "v1"},
        "reason": "Synced",
        "message": "Node synced successfully",
        "type": "Normal",
        "source": {"component": "fidelity-test"},
    });
    if with_time {
        e["eventTime"] = json!("2026-01-01T00:00:00.000000Z");
        e["reportingComponent"] = json!("fidelity-test");
        e["reportingInstance"] = json!("fidelity-test-1");
        e["action"] = json!("Sync");
    }
    e
}

#[tokio::test]
async fn events_about_cluster_scoped_objects_live_in_default() {
    use k8s_openapi::api::core::v1::Event;
    let c = TestCluster::start().await;
    let ns = c.namespace().await;
    let post = |ns: String, body: serde_json::Value| {
        let events: Api<Event> = Api::namespaced(c.client(), &ns);
        async move {
            let event: Event = serde_json::from_value(body).unwrap();
            events.create(&PostParams::default(), &event).await
        }
    };
    // A Node's Event in another namespace: rejected, with or without eventTime.
    for with_time in [false, true] {
        let name = c.unique_name("ev");
        let e = api_err(
            post(ns.clone(), node_event(&ns, &name, with_time))
                .await
                .unwrap_err(),
        );
        assert_eq!(e.code, 422, "with eventTime: {with_time}");
        assert!(
            e.message.contains(
                "involvedObject.namespace: Invalid value: \"\": does not match event.namespace"
            ),
            "{}",
            e.message
        );
    }
    // In default it is fine; with eventTime, kube-system is too.
    let events: Api<Event> = Api::namespaced(c.client(), "default");
    let ok = c.unique_name("ev-ok");
    post("default".into(), node_event("default", &ok, false))
        .await
        .unwrap();
    events.delete(&ok, &DeleteParams::default()).await.unwrap();
    let ok = c.unique_name("ev-ok");
    post("kube-system".into(), node_event("kube-system", &ok, true))
        .await
        .unwrap();
    Api::<Event>::namespaced(c.client(), "kube-system")
        .delete(&ok, &DeleteParams::default())
        .await
        .unwrap();
    // An Event with eventTime needs its reporting fields.
    let mut incomplete = node_event("default", &c.unique_name("ev"), true);
    incomplete.as_object_mut().unwrap().remove("action");
    let e = api_err(post("default".into(), incomplete).await.unwrap_err());
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains("action: Required value"),
        "{}",
        e.message
    );
    c.cleanup().await;
}

use k8s_openapi::api::core::v1::Node;
use kube::core::WatchEvent;
use serde_json::json;

use super::LeanNode;

/// A kubelet's Node as the API server sends it: managed fields, 3 images, and, to show that
/// only the two paths are pruned, a label called `images` and an annotation called
/// `managedFields`, and `status` before `metadata`.
fn node_json() -> serde_json::Value {
    json!({
        "status": {
            "images": [
                {"names": ["registry.k8s.io/pause@sha256:1", "registry.k8s.io/pause:3.10"], "sizeBytes": 320000},
                {"names": ["docker.io/library/nginx:1.27"], "sizeBytes": 72000000},
                {"names": ["quay.io/cilium/cilium:v1.16"]}
            ],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}],
            "capacity": {"cpu": "4", "memory": "16Gi"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "nodeInfo": {
                "machineID": "m", "systemUUID": "ec2-uuid", "bootID": "b", "kernelVersion": "6.1",
                "osImage": "Debian", "containerRuntimeVersion": "containerd://2.0",
                "kubeletVersion": "v1.34.0", "kubeProxyVersion": "", "operatingSystem": "linux",
                "architecture": "amd64"
            }
        },
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": "lean-1",
            "uid": "u-1",
            "resourceVersion": "42",
            "labels": {"images": "kept", "kubernetes.io/hostname": "lean-1"},
            "annotations": {"managedFields": "kept too"},
            "managedFields": [{
                "manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                "time": "2026-11-29T03:00:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:status": {"f:images": {}, "f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}}}}}
            }]
        },
        "spec": {
            "providerID": "fake://lean-1",
            "taints": [{"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}]
        }
    })
}

/// The same Node decoded whole, less the two fields.
fn expected() -> Node {
    let mut node: Node = serde_json::from_value(node_json()).unwrap();
    assert!(node.metadata.managed_fields.is_some());
    node.metadata.managed_fields = None;
    let status = node.status.as_mut().unwrap();
    assert_eq!(status.images.as_ref().map(Vec::len), Some(3));
    status.images = None;
    node
}

#[test]
fn only_managed_fields_and_images_are_left_out() {
    let text = serde_json::to_string(&node_json()).unwrap();
    // Borrowed keys (a slice), owned keys (a reader), and a `Value`.
    let from_slice: LeanNode = serde_json::from_slice(text.as_bytes()).unwrap();
    let from_reader: LeanNode = serde_json::from_reader(text.as_bytes()).unwrap();
    let from_value: LeanNode = serde_json::from_value(node_json()).unwrap();
    for lean in [from_slice, from_reader, from_value] {
        assert_eq!(lean.0, expected());
        assert_eq!(lean.0.metadata.labels.as_ref().unwrap()["images"], "kept");
        assert_eq!(
            lean.0.metadata.annotations.as_ref().unwrap()["managedFields"],
            "kept too"
        );
        assert_eq!(
            lean.0
                .status
                .as_ref()
                .unwrap()
                .node_info
                .as_ref()
                .unwrap()
                .system_uuid,
            "ec2-uuid"
        );
    }
}

#[test]
fn a_node_without_status_or_with_null_fields_decodes() {
    let lean: LeanNode =
        serde_json::from_value(json!({"metadata": {"name": "bare"}, "status": null})).unwrap();
    assert_eq!(lean.0.metadata.name.as_deref(), Some("bare"));
    assert!(lean.0.status.is_none());
    let lean: LeanNode = serde_json::from_value(json!({
        "metadata": {"name": "nulls", "managedFields": null},
        "status": {"images": null, "addresses": null}
    }))
    .unwrap();
    assert!(lean.0.status.unwrap().addresses.is_none());
}

#[test]
fn malformed_nodes_are_errors_and_the_skipped_fields_only_need_to_be_json() {
    // Kept fields are checked as before...
    let err = serde_json::from_value::<LeanNode>(json!({"metadata": {"name": 5}})).unwrap_err();
    assert!(err.to_string().contains("invalid type"), "{err}");
    let err = serde_json::from_value::<LeanNode>(json!({"spec": "x"})).unwrap_err();
    assert!(err.to_string().contains("invalid type"), "{err}");
    assert!(serde_json::from_str::<LeanNode>(r#"{"metadata": {"name": "x""#).is_err());
    // ...the skipped ones are never built, so their shape does not matter (the API server
    // validated them).
    let lean: LeanNode = serde_json::from_value(json!({
        "metadata": {"name": "odd", "managedFields": "not a list"},
        "status": {"images": {"not": "a list"}}
    }))
    .unwrap();
    assert_eq!(lean.0.metadata.name.as_deref(), Some("odd"));
}

#[test]
fn watch_events_decode_with_the_node_pruned() {
    let line = serde_json::to_vec(&json!({"type": "MODIFIED", "object": node_json()})).unwrap();
    match serde_json::from_slice::<WatchEvent<LeanNode>>(&line).unwrap() {
        WatchEvent::Modified(lean) => assert_eq!(lean.0, expected()),
        other => panic!("expected MODIFIED, got {other:?}"),
    }
}

#[test]
fn a_watch_event_with_its_object_before_its_type_decodes_pruned() {
    // serde buffers the object when the tag comes after it; the pruning still applies.
    let line = serde_json::to_string(&json!({"object": node_json(), "type": "ADDED"})).unwrap();
    assert!(line.find("\"object\"") < line.find("\"type\""), "{line}");
    match serde_json::from_str::<WatchEvent<LeanNode>>(&line).unwrap() {
        WatchEvent::Added(lean) => assert_eq!(lean.0, expected()),
        other => panic!("expected ADDED, got {other:?}"),
    }
}

#[test]
fn a_list_page_of_nodes_decodes_pruned() {
    let page = json!({
        "apiVersion": "v1", "kind": "NodeList",
        "metadata": {"resourceVersion": "7", "continue": "next"},
        "items": [node_json(), node_json()]
    });
    let list: kube::core::ObjectList<LeanNode> =
        serde_json::from_slice(&serde_json::to_vec(&page).unwrap()).unwrap();
    assert_eq!(list.items.len(), 2);
    for lean in list.items {
        assert_eq!(lean.0, expected());
    }
}

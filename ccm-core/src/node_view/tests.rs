use super::*;
use crate::ObjectMeta;
use k8s_openapi::api::core::v1::{NodeConfigSource, NodeSwapStatus};

fn time(s: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap_or_default())
}

/// A kubelet-registered, initialised Node with some of every part.
fn full_node() -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some("worker-1".into()),
            uid: Some("uid-1".into()),
            resource_version: Some("42".into()),
            creation_timestamp: Some(time(1)),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/hostname".into(), "worker-1".into()),
                ("topology.kubernetes.io/zone".into(), "zone-a".into()),
                ("a".into(), String::new()),
            ])),
            annotations: Some(BTreeMap::from([(
                "node.alpha.kubernetes.io/ttl".into(),
                "0".into(),
            )])),
            finalizers: Some(vec!["example.com/keep".into()]),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some("acme://i-1".into()),
            pod_cidr: Some("10.244.1.0/24".into()),
            pod_cidrs: Some(vec!["10.244.1.0/24".into(), "fd00::/64".into()]),
            taints: Some(vec![Taint {
                key: "node.cloudprovider.kubernetes.io/uninitialized".into(),
                value: Some("true".into()),
                effect: "NoSchedule".into(),
                time_added: None,
            }]),
            unschedulable: Some(true),
            config_source: Some(NodeConfigSource::default()),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(vec![
                NodeAddress {
                    type_: "InternalIP".into(),
                    address: "10.0.0.1".into(),
                },
                NodeAddress {
                    type_: "Hostname".into(),
                    address: "worker-1".into(),
                },
            ]),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: Some("KubeletReady".into()),
                message: None,
                last_heartbeat_time: Some(time(3)),
                last_transition_time: Some(time(2)),
            }]),
            node_info: Some(NodeSystemInfo {
                architecture: "amd64".into(),
                operating_system: "linux".into(),
                machine_id: "m-1".into(),
                system_uuid: "SYS-UUID".into(),
                swap: Some(NodeSwapStatus::default()),
                ..Default::default()
            }),
            phase: Some("Running".into()),
            ..Default::default()
        }),
    }
}

#[test]
fn accessors_read_the_node() {
    let view = NodeView::from_node(&full_node());
    assert_eq!(view.name(), "worker-1");
    assert_eq!(view.uid(), Some("uid-1"));
    assert_eq!(view.resource_version(), Some("42"));
    assert_eq!(view.creation_timestamp(), Some(&time(1)));
    assert_eq!(view.deletion_timestamp(), None);
    assert_eq!(view.finalizers(), ["example.com/keep".to_string()]);
    assert_eq!(view.label("topology.kubernetes.io/zone"), Some("zone-a"));
    assert_eq!(view.label("a"), Some(""));
    assert_eq!(view.label("missing"), None);
    assert_eq!(
        view.labels().map(|(k, _)| k).collect::<Vec<_>>(),
        ["a", "kubernetes.io/hostname", "topology.kubernetes.io/zone"]
    );
    assert_eq!(view.annotation("node.alpha.kubernetes.io/ttl"), Some("0"));
    assert_eq!(view.provider_id(), "acme://i-1");
    assert_eq!(view.pod_cidr(), Some("10.244.1.0/24"));
    assert_eq!(
        view.pod_cidrs().collect::<Vec<_>>(),
        ["10.244.1.0/24", "fd00::/64"]
    );
    assert!(view.has_taint("node.cloudprovider.kubernetes.io/uninitialized"));
    assert!(view.unschedulable());
    assert_eq!(view.address("InternalIP"), Some("10.0.0.1"));
    assert_eq!(view.address("ExternalIP"), None);
    assert_eq!(view.addresses().len(), 2);
    let ready = view.condition("Ready").unwrap();
    assert_eq!(
        (ready.status(), ready.reason()),
        ("True", Some("KubeletReady"))
    );
    assert_eq!(ready.last_heartbeat_time(), Some(&time(3)));
    assert!(view.is_ready());
    assert_eq!(view.system_uuid(), "SYS-UUID");
    assert_eq!(view.machine_id(), "m-1");
    assert_eq!(view.architecture(), "amd64");
    assert_eq!(view.operating_system(), "linux");
}

#[test]
fn to_node_gives_back_the_node_field_for_field() {
    for node in [
        full_node(),
        Node::default(),
        Node {
            spec: Some(NodeSpec::default()),
            status: Some(NodeStatus {
                node_info: Some(NodeSystemInfo::default()),
                ..Default::default()
            }),
            metadata: ObjectMeta {
                labels: Some(BTreeMap::new()),
                ..Default::default()
            },
        },
    ] {
        assert_eq!(NodeView::from_node(&node).to_node(), node);
        assert_eq!(Node::from(&NodeView::from(node.clone())), node);
    }
}

#[test]
fn a_default_like_node_has_no_rest() {
    let mut node = full_node();
    node.metadata.finalizers = None;
    node.spec.as_mut().unwrap().config_source = None;
    let status = node.status.as_mut().unwrap();
    status.phase = None;
    status.node_info.as_mut().unwrap().swap = None;
    assert!(NodeView::from_node(&node).0.rest.is_none());
    assert!(NodeView::from_node(&full_node()).0.rest.is_some());
}

#[test]
fn views_of_one_interner_share_label_sets_strings_and_the_name() {
    let mut interner = NodeViewInterner::default();
    let a = interner.view(full_node());
    let mut other = full_node();
    other.metadata.name = Some("worker-2".into());
    other
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("kubernetes.io/hostname".into(), "worker-2".into());
    other.status.as_mut().unwrap().addresses.as_mut().unwrap()[1].address = "worker-2".into();
    let b = interner.view(other.clone());
    // The label sets differ only by the hostname, which stands for the name: one shared set.
    let (la, lb) = (a.0.labels.as_ref().unwrap(), b.0.labels.as_ref().unwrap());
    assert!(Arc::ptr_eq(la, lb));
    assert!(Arc::ptr_eq(
        a.0.annotations.as_ref().unwrap(),
        b.0.annotations.as_ref().unwrap()
    ));
    assert_eq!(a.label("kubernetes.io/hostname"), Some("worker-1"));
    assert_eq!(b.label("kubernetes.io/hostname"), Some("worker-2"));
    // The Hostname address shares the name's Arc; the address type is interned.
    let name = b.name_arc().unwrap().clone();
    match &b.0.lists[3] {
        Str::Shared(shared) => assert!(Arc::ptr_eq(shared, &name)),
        Str::Own { .. } => panic!("the Hostname address is not the name"),
    }
    match (&a.0.lists[0], &b.0.lists[0]) {
        (Str::Shared(x), Str::Shared(y)) => assert!(Arc::ptr_eq(x, y)),
        _ => panic!("address types are not interned"),
    }
    // The conditions' strings are interned too.
    assert!(Arc::ptr_eq(
        &a.conditions()[0].reason.clone().unwrap(),
        &b.conditions()[0].reason.clone().unwrap()
    ));
    assert_eq!(a.to_node(), full_node());
    assert_eq!(b.to_node(), other);
    assert!(a.ptr_eq(&a.clone()));
    assert!(!a.ptr_eq(&NodeView::from_node(&full_node())));
    assert_eq!(a, NodeView::from_node(&full_node()));
    assert_ne!(a, b);
}

#[test]
fn a_nodes_own_strings_are_one_allocation_read_back_by_the_accessors() {
    let view = NodeView::from_node(&full_node());
    // uid, resourceVersion, providerID, podCIDR, the InternalIP, both podCIDRs, machine ID,
    // system UUID: the Hostname address is the name, not a copy.
    assert_eq!(
        &*view.0.text,
        "uid-142acme://i-110.244.1.0/2410.0.0.110.244.1.0/24fd00::/64m-1SYS-UUID"
    );
    // Unset and empty strings read back as they were.
    let mut node = full_node();
    node.metadata.uid = Some(String::new());
    node.spec.as_mut().unwrap().provider_id = None;
    let view = NodeView::from_node(&node);
    assert_eq!(view.uid(), Some(""));
    assert_eq!((view.provider_id(), view.has_provider_id()), ("", false));
    assert_eq!(view.to_node(), node);
}

#[test]
fn a_string_past_the_texts_limit_is_kept_in_an_allocation_of_its_own() {
    let mut text = build::Text(String::new());
    assert!(text.push("") == Str::EMPTY);
    assert!(text.push("ab") == Str::Own { start: 0, len: 2 });
    assert!(text.push("c") == Str::Own { start: 2, len: 1 });
    assert_eq!(&*text.0, "abc");
    // Spans end before u32::MAX (a 4 GiB text is too much for a test: the limit is checked
    // on the numbers).
    let max = u32::MAX as usize;
    assert_eq!(build::span(max - 3, 2), Some((u32::MAX - 3, 2)));
    assert_eq!(build::span(max - 2, 2), None);
    assert_eq!(build::span(max, 0), None);
    assert_eq!(build::span(0, max), None);
    assert_eq!(build::span(0, max + 1), None);
}

fn labelled(name: &str, unique: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/hostname".into(), name.into()),
                ("topology.kubernetes.io/zone".into(), "zone-a".into()),
                ("example.com/unique".into(), unique.into()),
            ])),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[test]
fn shared_entries_are_held_once_and_swept_when_no_view_holds_them() {
    let mut interner = NodeViewInterner::default();
    let a = interner.view(labelled("a", "u-a"));
    let b = interner.view(labelled("b", "u-b"));
    // Three keys, one zone, two unique values; the hostname values stand for the names. Two
    // sets (the unique values differ).
    assert_eq!(interner.len(), 6 + 2);
    assert_eq!(a.label("topology.kubernetes.io/zone"), Some("zone-a"));
    assert_eq!(b.to_node(), labelled("b", "u-b"));
    drop(a);
    // Churn: Nodes come and go, each with a unique value; the interner never holds much more
    // than twice what the live Nodes hold.
    let mut live = vec![b];
    for i in 0..10 * build::MIN_SWEEP {
        live.push(interner.view(labelled(&format!("n{i}"), &format!("u{i}"))));
        if live.len() > 10 {
            live.remove(0);
        }
        assert!(interner.len() <= build::MIN_SWEEP.max(2 * (4 + 2 * live.len())) + 2);
    }
    interner.sweep();
    // The 3 keys, the zone, one unique value and one set per live Node.
    assert_eq!(interner.len(), 4 + 2 * live.len());
}

#[test]
fn a_value_equal_to_the_name_is_not_shared_with_a_node_of_another_name() {
    let mut interner = NodeViewInterner::default();
    // Node a's label equals its name; node b has the same text but another name: two sets.
    let a = interner.view(labelled("a", "x"));
    let mut other = labelled("b", "x");
    other
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("kubernetes.io/hostname".into(), "a".into());
    let b = interner.view(other.clone());
    assert!(!Arc::ptr_eq(
        a.0.labels.as_ref().unwrap(),
        b.0.labels.as_ref().unwrap()
    ));
    assert_eq!(a.label("kubernetes.io/hostname"), Some("a"));
    assert_eq!(b.label("kubernetes.io/hostname"), Some("a"));
    assert_eq!(b.to_node(), other);
    // A Node with a label map that is set but empty, and one without: distinct, read back.
    let mut empty = labelled("c", "x");
    empty.metadata.labels = Some(BTreeMap::new());
    let c = interner.view(empty.clone());
    assert!(c.has_labels() && c.labels().len() == 0);
    assert_eq!(c.to_node(), empty);
    empty.metadata.labels = None;
    assert!(!interner.view(empty).has_labels());
}

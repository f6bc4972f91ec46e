//! Unit tests of the cloud-node planner: the rules of the reference, one test per rule.

use super::*;
use ccm_core::ObjectMeta;
use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus, Taint};
use serde_json::json;

fn addr(type_: &str, address: &str) -> NodeAddress {
    NodeAddress {
        type_: type_.into(),
        address: address.into(),
    }
}

fn taint(key: &str, effect: &str) -> Taint {
    Taint {
        key: key.into(),
        effect: effect.into(),
        ..Default::default()
    }
}

struct N(Node);

impl N {
    fn new(name: &str) -> Self {
        N(Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(NodeSpec::default()),
            status: Some(NodeStatus::default()),
        })
    }
    fn tainted(name: &str) -> Self {
        Self::new(name)
            .taint(TAINT_UNINITIALIZED, "NoSchedule")
            .addresses(vec![addr("Hostname", name)])
    }
    fn taint(mut self, key: &str, effect: &str) -> Self {
        let spec = self.0.spec.get_or_insert_with(Default::default);
        spec.taints
            .get_or_insert_with(Vec::new)
            .push(taint(key, effect));
        self
    }
    fn label(mut self, k: &str, v: &str) -> Self {
        self.0
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(k.into(), v.into());
        self
    }
    fn annotation(mut self, k: &str, v: &str) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(k.into(), v.into());
        self
    }
    fn provider_id(mut self, id: &str) -> Self {
        self.0.spec.get_or_insert_with(Default::default).provider_id = Some(id.into());
        self
    }
    fn addresses(mut self, a: Vec<NodeAddress>) -> Self {
        self.0.status.get_or_insert_with(Default::default).addresses = Some(a);
        self
    }
}

fn meta(id: &str) -> InstanceMetadata {
    InstanceMetadata {
        provider_id: id.into(),
        instance_type: "small".into(),
        node_addresses: vec![addr("InternalIP", "10.0.0.1"), addr("Hostname", "n1")],
        zone: "zone-a".into(),
        region: "region-1".into(),
        additional_labels: BTreeMap::new(),
    }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

// ---- providerID ----

#[test]
fn provider_id_set_when_node_has_none() {
    let plan = plan_init(&N::tainted("n1").0, &meta("fake://n1"), true).unwrap();
    assert_eq!(plan.spec.provider_id.as_deref(), Some("fake://n1"));
}

#[test]
fn provider_id_never_changed_when_node_has_one() {
    let node = N::tainted("n1").provider_id("fake://old").0;
    let plan = plan_init(&node, &meta("fake://new"), true).unwrap();
    assert_eq!(plan.spec.provider_id, None);
}

#[test]
fn empty_provider_id_uses_the_nodes_own() {
    let node = N::tainted("n1").provider_id("fake://n1").0;
    let plan = plan_init(&node, &meta(""), true).unwrap();
    assert_eq!(plan.spec.provider_id, None);
    assert!(plan.spec.taints.is_some());
}

#[test]
fn empty_provider_id_everywhere_is_an_error_on_v2() {
    let err = plan_init(&N::tainted("n1").0, &meta(""), true).unwrap_err();
    assert_eq!(err, InitError::MissingProviderId);
    assert_eq!(err.step(), Step::ProviderId);
    assert_eq!(
        err.to_string(),
        "cloud provider does not set node provider ID"
    );
}

#[test]
fn empty_provider_id_is_tolerated_on_v1_not_implemented() {
    let plan = plan_init(&N::tainted("n1").0, &meta(""), false).unwrap();
    assert_eq!(plan.spec.provider_id, None);
    assert_eq!(plan.spec.taints, Some(vec![]));
}

// ---- labels ----

#[test]
fn well_known_labels_ga_and_beta() {
    let plan = plan_init(&N::tainted("n1").0, &meta("fake://n1"), true).unwrap();
    assert_eq!(
        plan.spec.labels,
        labels(&[
            (LABEL_INSTANCE_TYPE_BETA, "small"),
            (LABEL_INSTANCE_TYPE, "small"),
            (LABEL_FAILURE_DOMAIN_BETA_ZONE, "zone-a"),
            (LABEL_TOPOLOGY_ZONE, "zone-a"),
            (LABEL_FAILURE_DOMAIN_BETA_REGION, "region-1"),
            (LABEL_TOPOLOGY_REGION, "region-1"),
        ])
    );
}

#[test]
fn empty_type_zone_region_write_no_labels() {
    let mut m = meta("fake://n1");
    m.instance_type.clear();
    m.zone.clear();
    m.region.clear();
    let plan = plan_init(&N::tainted("n1").0, &m, true).unwrap();
    assert!(plan.spec.labels.is_empty());
}

#[test]
fn only_zone_known() {
    let mut m = meta("fake://n1");
    m.instance_type.clear();
    m.region.clear();
    let plan = plan_init(&N::tainted("n1").0, &m, true).unwrap();
    assert_eq!(
        plan.spec.labels,
        labels(&[
            (LABEL_FAILURE_DOMAIN_BETA_ZONE, "zone-a"),
            (LABEL_TOPOLOGY_ZONE, "zone-a")
        ])
    );
}

#[test]
fn well_known_labels_overwrite_like_go_and_skip_equal_values() {
    let node = N::tainted("n1")
        .label(LABEL_TOPOLOGY_ZONE, "stale")
        .label(LABEL_INSTANCE_TYPE, "small")
        .0;
    let plan = plan_init(&node, &meta("fake://n1"), true).unwrap();
    assert_eq!(
        plan.spec
            .labels
            .get(LABEL_TOPOLOGY_ZONE)
            .map(String::as_str),
        Some("zone-a")
    );
    assert!(!plan.spec.labels.contains_key(LABEL_INSTANCE_TYPE));
    assert!(plan.spec.labels.contains_key(LABEL_INSTANCE_TYPE_BETA));
}

#[test]
fn additional_labels_added_filtered_and_never_overwrite() {
    let node = N::tainted("n1").label("acme.io/pool", "blue").0;
    let mut m = meta("fake://n1");
    m.instance_type.clear();
    m.zone.clear();
    m.region.clear();
    m.additional_labels = labels(&[
        ("acme.io/rack", "r1"),
        ("acme.io/pool", "green"),
        ("kubernetes.io/hostname", "x"),
        ("node.kubernetes.io/foo", "x"),
        ("k8s.io/bar", "x"),
        ("sub.k8s.io/baz", "x"),
        ("notkubernetes.io/ok", "y"),
        ("plain", "z"),
    ]);
    let plan = plan_init(&node, &m, true).unwrap();
    assert_eq!(
        plan.spec.labels,
        labels(&[
            ("acme.io/rack", "r1"),
            ("notkubernetes.io/ok", "y"),
            ("plain", "z")
        ])
    );
    assert_eq!(
        plan.discarded_labels.len(),
        5,
        "{:?}",
        plan.discarded_labels
    );
}

#[test]
fn additional_label_equal_to_existing_is_silently_skipped() {
    let node = N::tainted("n1").label("acme.io/pool", "blue").0;
    let mut m = meta("fake://n1");
    m.additional_labels = labels(&[("acme.io/pool", "blue")]);
    let plan = plan_init(&node, &m, true).unwrap();
    assert!(!plan.spec.labels.contains_key("acme.io/pool"));
    assert!(plan.discarded_labels.is_empty());
}

#[test]
fn kubernetes_label_regex_equivalent() {
    for k in [
        "kubernetes.io/a",
        "k8s.io/a",
        "node.kubernetes.io/a",
        "a.b.k8s.io/x",
    ] {
        assert!(is_kubernetes_label(k), "{k}");
    }
    for k in [
        "kubernetes.io",
        "mykubernetes.io/a",
        "k8s.iox/a",
        "example.com/kubernetes.io",
        "x/kubernetes.io/",
        "a",
    ] {
        assert!(!is_kubernetes_label(k), "{k}");
    }
}

// ---- taints ----

#[test]
fn removes_every_uninitialized_taint_and_keeps_others_in_order() {
    let node = N::new("n1")
        .taint("a", "NoSchedule")
        .taint(TAINT_UNINITIALIZED, "NoSchedule")
        .taint("b", "NoExecute")
        .taint(TAINT_UNINITIALIZED, "NoExecute")
        .0;
    let plan = plan_init(&node, &meta("fake://n1"), true).unwrap();
    assert_eq!(
        plan.spec.taints,
        Some(vec![taint("a", "NoSchedule"), taint("b", "NoExecute")])
    );
    assert!(has_uninitialized_taint(&node));
    assert!(!has_uninitialized_taint(
        &N::new("x").taint("a", "NoSchedule").0
    ));
}

// ---- node IP ----

#[test]
fn unknown_provided_node_ip_is_an_error() {
    let node = N::tainted("n1")
        .annotation(ANNOTATION_PROVIDED_NODE_IP, "10.9.9.9")
        .0;
    let err = plan_init(&node, &meta("fake://n1"), true).unwrap_err();
    assert_eq!(err.step(), Step::NodeIp);
    assert_eq!(
        err.to_string(),
        "provided node ip for node \"n1\" is not valid: failed to get node address from cloud provider that matches ip: 10.9.9.9"
    );
}

#[test]
fn provided_node_ip_checked_against_cloud_list_not_hostname() {
    // The cloud returned no addresses at all: the requested IP cannot match.
    let node = N::tainted("n1")
        .annotation(ANNOTATION_PROVIDED_NODE_IP, "10.0.0.1")
        .0;
    let mut m = meta("fake://n1");
    m.node_addresses.clear();
    assert_eq!(plan_init(&node, &m, true).unwrap_err().step(), Step::NodeIp);
}

#[test]
fn parse_annotation_rules() {
    let v4: IpAddr = "10.0.0.1".parse().unwrap();
    let v6: IpAddr = "fd00::1".parse().unwrap();
    assert_eq!(parse_node_ip_annotation("10.0.0.1").unwrap(), vec![v4]);
    assert_eq!(
        parse_node_ip_annotation("10.0.0.1,fd00::1").unwrap(),
        vec![v4, v6]
    );
    assert_eq!(
        parse_node_ip_annotation("fd00::1,10.0.0.1").unwrap(),
        vec![v6, v4]
    );
    assert_eq!(
        parse_node_ip_annotation("010.000.000.001").unwrap(),
        vec![v4]
    );
    let bad = |s: &str| parse_node_ip_annotation(s).unwrap_err().to_string();
    assert_eq!(
        bad(""),
        "failed to parse node IP \"\": could not parse \"\""
    );
    assert_eq!(
        bad("10.0.0.1, fd00::1"),
        "failed to parse node IP \"10.0.0.1, fd00::1\": could not parse \" fd00::1\""
    );
    assert!(bad("10.0.0.1,10.0.0.2").contains("single IP or a dual-stack pair"));
    assert!(bad("fd00::1,fd00::2").contains("single IP or a dual-stack pair"));
    assert!(bad("10.0.0.1,fd00::1,10.0.0.2").contains("single IP or a dual-stack pair"));
    assert!(bad("0.0.0.0,fd00::1").contains("cannot include '0.0.0.0' or '::'"));
    assert!(bad("10.0.0.1,::").contains("cannot include"));
    assert!(bad("host.example").contains("could not parse"));
    // A single unspecified IP parses (and then matches nothing).
    assert!(parse_node_ip_annotation("0.0.0.0").is_ok());
}

#[test]
fn sloppy_ip_parsing() {
    assert_eq!(
        parse_ip_sloppy("192.168.001.010"),
        Some("192.168.1.10".parse().unwrap())
    );
    assert_eq!(parse_ip_sloppy("256.1.1.1"), None);
    assert_eq!(parse_ip_sloppy("1.2.3"), None);
    assert_eq!(parse_ip_sloppy("1.2.3.4.5"), None);
    assert_eq!(parse_ip_sloppy("1..3.4"), None);
    assert_eq!(parse_ip_sloppy("+1.2.3.4"), None);
    assert_eq!(parse_ip_sloppy("::1"), Some("::1".parse().unwrap()));
}

#[test]
fn provided_ip_single_stack_first_and_drops_same_type() {
    let cloud = vec![
        addr("InternalIP", "10.0.0.1"),
        addr("ExternalIP", "203.0.113.5"),
        addr("InternalIP", "10.0.0.2"),
        addr("Hostname", "n1"),
    ];
    let out = addresses_from_provided_node_ip("10.0.0.2", &cloud).unwrap();
    assert_eq!(
        out,
        vec![
            addr("InternalIP", "10.0.0.2"),
            addr("ExternalIP", "203.0.113.5"),
            addr("Hostname", "n1"),
        ]
    );
}

#[test]
fn provided_ip_matching_an_external_ip() {
    let cloud = vec![
        addr("InternalIP", "10.0.0.1"),
        addr("ExternalIP", "203.0.113.5"),
        addr("ExternalIP", "203.0.113.6"),
    ];
    let out = addresses_from_provided_node_ip("203.0.113.6", &cloud).unwrap();
    assert_eq!(
        out,
        vec![
            addr("ExternalIP", "203.0.113.6"),
            addr("InternalIP", "10.0.0.1")
        ]
    );
}

#[test]
fn provided_ip_dual_stack_in_request_order() {
    let cloud = vec![
        addr("InternalIP", "10.0.0.1"),
        addr("InternalIP", "fd00::1"),
        addr("InternalIP", "10.0.0.2"),
        addr("InternalIP", "fd00::2"),
        addr("ExternalIP", "203.0.113.5"),
    ];
    let out = addresses_from_provided_node_ip("fd00::2,10.0.0.2", &cloud).unwrap();
    assert_eq!(
        out,
        vec![
            addr("InternalIP", "fd00::2"),
            addr("InternalIP", "10.0.0.2"),
            addr("ExternalIP", "203.0.113.5"),
        ]
    );
    // One of the pair unknown: error naming it.
    let err = addresses_from_provided_node_ip("10.0.0.2,fd00::9", &cloud).unwrap_err();
    assert_eq!(err, NodeIpError::NotFound("fd00::9".parse().unwrap()));
}

#[test]
fn provided_ip_matches_sloppy_and_mapped_cloud_addresses() {
    let cloud = vec![
        addr("InternalIP", "010.000.000.001"),
        addr("ExternalIP", "x"),
    ];
    let out = addresses_from_provided_node_ip("10.0.0.1", &cloud).unwrap();
    assert_eq!(out[0], addr("InternalIP", "010.000.000.001"));
    let cloud = vec![addr("InternalIP", "::ffff:10.0.0.1")];
    assert!(addresses_from_provided_node_ip("10.0.0.1", &cloud).is_ok());
    // The same IP reported under two types: both kept, both types "matched".
    let cloud = vec![
        addr("InternalIP", "10.0.0.1"),
        addr("ExternalIP", "10.0.0.1"),
        addr("ExternalIP", "203.0.113.1"),
        addr("Hostname", "h"),
    ];
    let out = addresses_from_provided_node_ip("10.0.0.1", &cloud).unwrap();
    assert_eq!(
        out,
        vec![
            addr("InternalIP", "10.0.0.1"),
            addr("ExternalIP", "10.0.0.1"),
            addr("Hostname", "h")
        ]
    );
}

// ---- addresses ----

#[test]
fn addresses_keep_kubelet_hostname_when_cloud_has_none() {
    let node = N::tainted("n1").0;
    let cloud = vec![addr("InternalIP", "10.0.0.1")];
    let out = desired_addresses(&node, &cloud).unwrap().unwrap();
    assert_eq!(
        out,
        vec![addr("InternalIP", "10.0.0.1"), addr("Hostname", "n1")]
    );
}

#[test]
fn addresses_cloud_hostname_wins() {
    let node = N::tainted("n1").0;
    let cloud = vec![
        addr("Hostname", "cloud-name"),
        addr("InternalIP", "10.0.0.1"),
    ];
    let out = desired_addresses(&node, &cloud).unwrap().unwrap();
    assert_eq!(out, cloud);
}

#[test]
fn addresses_empty_cloud_list_skips() {
    let node = N::tainted("n1").0;
    assert_eq!(desired_addresses(&node, &[]).unwrap(), None);
}

#[test]
fn addresses_unchanged_skips() {
    let node = N::new("n1")
        .addresses(vec![addr("InternalIP", "10.0.0.1"), addr("Hostname", "n1")])
        .0;
    let cloud = vec![addr("InternalIP", "10.0.0.1")];
    assert_eq!(desired_addresses(&node, &cloud).unwrap(), None);
}

#[test]
fn addresses_with_provided_ip_after_hostname_merge() {
    let node = N::new("n1")
        .annotation(ANNOTATION_PROVIDED_NODE_IP, "10.0.0.2")
        .addresses(vec![addr("Hostname", "n1")])
        .0;
    let cloud = vec![
        addr("InternalIP", "10.0.0.1"),
        addr("InternalIP", "10.0.0.2"),
    ];
    let out = desired_addresses(&node, &cloud).unwrap().unwrap();
    assert_eq!(
        out,
        vec![addr("InternalIP", "10.0.0.2"), addr("Hostname", "n1")]
    );
    let bad = N::new("n1")
        .annotation(ANNOTATION_PROVIDED_NODE_IP, "10.0.0.3")
        .0;
    assert!(desired_addresses(&bad, &cloud).is_err());
}

#[test]
fn refresh_skips_tainted_nodes() {
    let cloud = vec![addr("InternalIP", "10.0.0.7")];
    assert_eq!(
        plan_address_refresh(&N::tainted("n1").0, &cloud).unwrap(),
        None
    );
    let node = N::new("n1")
        .addresses(vec![addr("InternalIP", "10.0.0.1")])
        .0;
    assert_eq!(
        plan_address_refresh(&node, &cloud).unwrap(),
        Some(vec![addr("InternalIP", "10.0.0.7")])
    );
}

#[test]
fn change_detection_is_keyed_by_type_but_exact_within_a_type() {
    let a = vec![addr("InternalIP", "1"), addr("Hostname", "h")];
    let reordered_types = vec![addr("Hostname", "h"), addr("InternalIP", "1")];
    assert!(!addresses_changed(&a, &reordered_types));
    assert!(addresses_changed(&a, &[addr("InternalIP", "1")]));
    assert!(addresses_changed(
        &a,
        &[addr("InternalIP", "2"), addr("Hostname", "h")]
    ));
    assert!(addresses_changed(
        &a,
        &[addr("ExternalIP", "1"), addr("Hostname", "h")]
    ));
    // Several addresses of one type: Go's map misses these changes or invents one.
    let two = vec![addr("InternalIP", "1"), addr("InternalIP", "2")];
    assert!(!addresses_changed(&two, &two.clone()));
    assert!(addresses_changed(
        &two,
        &[addr("InternalIP", "2"), addr("InternalIP", "2")]
    ));
    assert!(addresses_changed(
        &two,
        &[addr("InternalIP", "2"), addr("InternalIP", "1")]
    ));
    assert!(!addresses_changed(&[], &[]));
}

#[test]
fn init_plan_includes_addresses() {
    let plan = plan_init(&N::tainted("n1").0, &meta("fake://n1"), true).unwrap();
    assert_eq!(
        plan.addresses,
        Some(vec![addr("InternalIP", "10.0.0.1"), addr("Hostname", "n1")])
    );
}

// ---- label reconcile ----

#[test]
fn label_reconcile_beta_to_ga() {
    let node = N::new("n1")
        .label(LABEL_FAILURE_DOMAIN_BETA_ZONE, "z1")
        .label(LABEL_FAILURE_DOMAIN_BETA_REGION, "r1")
        .label(LABEL_TOPOLOGY_REGION, "old")
        .label(LABEL_INSTANCE_TYPE_BETA, "t")
        .label(LABEL_INSTANCE_TYPE, "t")
        .0;
    assert_eq!(
        plan_label_reconcile(&node),
        labels(&[(LABEL_TOPOLOGY_ZONE, "z1"), (LABEL_TOPOLOGY_REGION, "r1")])
    );
}

#[test]
fn label_reconcile_nothing_without_beta_labels() {
    let node = N::new("n1").label(LABEL_TOPOLOGY_ZONE, "z1").0;
    assert!(plan_label_reconcile(&node).is_empty());
    assert!(plan_label_reconcile(&N::new("n2").0).is_empty());
}

// ---- JSON patch ----

#[test]
fn json_patch_ops_for_labelled_node() {
    let node = N::tainted("n1").label("a", "b").taint("x", "NoExecute").0;
    let update = SpecUpdate {
        provider_id: Some("fake://n1".into()),
        labels: labels(&[("topology.kubernetes.io/zone", "z"), ("w~x", "1")]),
        taints: Some(vec![taint("x", "NoExecute")]),
        read_labels: Vec::new(),
    };
    assert_eq!(
        update.json_patch_ops(&node),
        vec![
            json!({"op":"add","path":"/metadata/labels/topology.kubernetes.io~1zone","value":"z"}),
            json!({"op":"add","path":"/metadata/labels/w~0x","value":"1"}),
            json!({"op":"add","path":"/spec/providerID","value":"fake://n1"}),
            json!({"op":"add","path":"/spec/taints","value":[{"key":"x","effect":"NoExecute"}]}),
        ]
    );
}

#[test]
fn preconditions_test_exactly_what_the_plan_read() {
    let mut node = N::tainted("n1").label("a", "b").0;
    node.metadata.uid = Some("u1".into());
    node.metadata.resource_version = Some("7".into());
    let update = SpecUpdate {
        provider_id: Some("fake://n1".into()),
        labels: labels(&[("a", "c"), ("new", "v")]),
        taints: Some(vec![]),
        read_labels: vec!["a".into()],
    };
    let uninitialized = json!([{"key": TAINT_UNINITIALIZED, "effect": "NoSchedule"}]);
    assert_eq!(
        update.preconditions(&node),
        vec![
            json!({"op":"test","path":"/metadata/uid","value":"u1"}),
            json!({"op":"test","path":"/metadata/labels/a","value":"b"}),
            json!({"op":"test","path":"/metadata/labels/new","value":null}),
            json!({"op":"test","path":"/spec/providerID","value":null}),
            json!({"op":"test","path":"/spec/taints","value":uninitialized}),
        ],
        "no resourceVersion: writes to other fields do not conflict"
    );
    // Labels added as a whole map: the map's absence is the precondition.
    node.metadata.labels = None;
    let only_labels = SpecUpdate {
        labels: labels(&[("k", "v")]),
        ..Default::default()
    };
    assert_eq!(
        only_labels.preconditions(&node),
        vec![
            json!({"op":"test","path":"/metadata/uid","value":"u1"}),
            json!({"op":"test","path":"/metadata/labels","value":null}),
        ]
    );
}

#[test]
fn json_patch_ops_for_bare_node() {
    let mut node = N::new("n1").taint(TAINT_UNINITIALIZED, "NoSchedule").0;
    let update = SpecUpdate {
        provider_id: None,
        labels: labels(&[("k", "v")]),
        taints: Some(vec![]),
        read_labels: Vec::new(),
    };
    assert_eq!(
        update.json_patch_ops(&node),
        vec![
            json!({"op":"add","path":"/metadata/labels","value":{"k":"v"}}),
            json!({"op":"remove","path":"/spec/taints"}),
        ]
    );
    node.spec = None;
    let update = SpecUpdate {
        provider_id: Some("p://1".into()),
        labels: BTreeMap::new(),
        taints: Some(vec![]),
        read_labels: Vec::new(),
    };
    assert_eq!(
        update.json_patch_ops(&node),
        vec![json!({"op":"add","path":"/spec","value":{"providerID":"p://1"}})]
    );
    assert!(SpecUpdate::default().is_empty());
    assert!(SpecUpdate::default().json_patch_ops(&node).is_empty());
}

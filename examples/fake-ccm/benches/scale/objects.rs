//! Objects as kubelets and users write them, and the states a scenario waits for.

use ccm_core::InstanceMetadata;
use ccm_core::well_known::{
    CONDITION_NETWORK_UNAVAILABLE, LABEL_FAILURE_DOMAIN_BETA_REGION,
    LABEL_FAILURE_DOMAIN_BETA_ZONE, LABEL_INSTANCE_TYPE, LABEL_INSTANCE_TYPE_BETA,
    LABEL_TOPOLOGY_REGION, LABEL_TOPOLOGY_ZONE, TAINT_UNINITIALIZED,
};
use ccm_testing::builders::kubelet_node;
use ccm_testing::fake_cloud::FakeCloud;
use k8s_openapi::api::core::v1::{ContainerImage, Node, NodeCondition, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::environment::{Env, RUN_LABEL};

/// 40 images as a node running a typical add-on set reports them.
pub(crate) const IMAGES: [(&str, &str, i64); 40] = [
    ("registry.k8s.io/kube-proxy", "v1.33.0", 31_212_118),
    ("registry.k8s.io/pause", "3.10", 320_368),
    ("registry.k8s.io/coredns/coredns", "v1.12.0", 20_938_480),
    ("registry.k8s.io/etcd", "3.5.21-0", 58_938_593),
    (
        "registry.k8s.io/metrics-server/metrics-server",
        "v0.7.2",
        19_494_617,
    ),
    (
        "registry.k8s.io/ingress-nginx/controller",
        "v1.12.1",
        105_347_180,
    ),
    (
        "registry.k8s.io/sig-storage/csi-node-driver-registrar",
        "v2.13.0",
        10_847_292,
    ),
    (
        "registry.k8s.io/sig-storage/livenessprobe",
        "v2.15.0",
        10_211_946,
    ),
    (
        "registry.k8s.io/sig-storage/csi-provisioner",
        "v5.2.0",
        30_417_321,
    ),
    (
        "registry.k8s.io/sig-storage/csi-attacher",
        "v4.8.1",
        28_114_623,
    ),
    (
        "registry.k8s.io/sig-storage/csi-resizer",
        "v1.13.2",
        28_703_114,
    ),
    (
        "registry.k8s.io/sig-storage/csi-snapshotter",
        "v8.2.1",
        29_001_870,
    ),
    (
        "registry.k8s.io/kube-state-metrics/kube-state-metrics",
        "v2.15.0",
        21_302_445,
    ),
    ("docker.io/calico/node", "v3.29.3", 146_508_271),
    ("docker.io/calico/cni", "v3.29.3", 96_512_664),
    ("docker.io/calico/kube-controllers", "v3.29.3", 34_814_021),
    ("docker.io/calico/typha", "v3.29.3", 31_405_930),
    ("quay.io/cilium/cilium", "v1.17.3", 223_604_412),
    ("quay.io/cilium/operator-generic", "v1.17.3", 32_201_117),
    ("quay.io/prometheus/node-exporter", "v1.9.1", 12_411_380),
    ("quay.io/prometheus/prometheus", "v3.3.0", 117_322_416),
    (
        "quay.io/prometheus-operator/prometheus-config-reloader",
        "v0.82.0",
        12_880_120,
    ),
    ("docker.io/grafana/grafana", "11.6.0", 181_320_051),
    ("docker.io/grafana/loki", "3.4.3", 38_120_004),
    ("docker.io/grafana/promtail", "3.4.3", 79_310_217),
    ("docker.io/fluent/fluent-bit", "4.0.1", 35_930_612),
    ("docker.io/library/nginx", "1.27.5", 72_195_292),
    ("docker.io/library/redis", "7.4.2", 45_321_877),
    ("docker.io/library/postgres", "17.4", 154_902_334),
    ("docker.io/library/busybox", "1.37.0", 2_156_541),
    ("docker.io/library/alpine", "3.21.3", 3_653_068),
    ("docker.io/bitnami/kubectl", "1.33.0", 87_001_215),
    (
        "quay.io/jetstack/cert-manager-controller",
        "v1.17.2",
        21_882_301,
    ),
    (
        "quay.io/jetstack/cert-manager-webhook",
        "v1.17.2",
        17_410_952,
    ),
    (
        "quay.io/jetstack/cert-manager-cainjector",
        "v1.17.2",
        16_551_320,
    ),
    (
        "ghcr.io/external-secrets/external-secrets",
        "v0.16.1",
        33_016_845,
    ),
    ("quay.io/argoproj/argocd", "v2.14.10", 176_112_049),
    ("docker.io/istio/proxyv2", "1.25.2", 91_833_271),
    ("docker.io/istio/pilot", "1.25.2", 75_402_118),
    ("docker.io/envoyproxy/envoy", "v1.34.0", 64_217_330),
];

/// A stable fake sha256 digest (64 hex digits) for an image.
pub(crate) fn digest(seed: &str) -> String {
    // FNV-1a, stretched to 256 bits: the digest only has to look like one and be stable.
    let mut out = String::with_capacity(64);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for round in 0u8..4 {
        for b in seed.bytes().chain([round]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        out.push_str(&format!("{h:016x}"));
    }
    out
}

/// How many of [`IMAGES`] (cycled) each Node reports (`--images`).
pub(crate) static IMAGE_COUNT: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(IMAGES.len());

pub(crate) fn images() -> Vec<ContainerImage> {
    let n = IMAGE_COUNT.load(std::sync::atomic::Ordering::Relaxed);
    IMAGES
        .iter()
        .cycle()
        .take(n)
        .map(|(repo, tag, size)| ContainerImage {
            names: Some(vec![
                format!("{repo}@sha256:{}", digest(&format!("{repo}:{tag}"))),
                format!("{repo}:{tag}"),
            ]),
            size_bytes: Some(*size),
        })
        .collect()
}

/// How a node starts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeKind {
    /// Registered by `kubelet --cloud-provider=external`: uninitialized taint.
    Tainted,
    /// Already initialised by an earlier CCM (provider ID, labels, cloud addresses).
    Initialised,
    /// Initialised, with a pod CIDR and `NetworkUnavailable=True` (no route yet).
    NeedsRoute(usize),
}

/// A Node as a kubelet writes it: capacity/allocatable, nodeInfo, the four kubelet conditions
/// plus `NetworkUnavailable`, 40 images.
pub(crate) fn node(env: &Env, i: usize, kind: NodeKind, meta: Option<&InstanceMetadata>) -> Node {
    let name = env.node_name(i);
    let mut b = kubelet_node(&name).label(RUN_LABEL, &env.run);
    if let NodeKind::NeedsRoute(j) = kind {
        let cidr = format!("10.{}.{}.0/24", (j / 256) % 256, j % 256);
        b = b.pod_cidrs(&[&cidr]);
    }
    if kind != NodeKind::Tainted {
        let m = meta.expect("metadata for an initialised node");
        b = b
            .without_uninitialized_taint()
            .provider_id(&m.provider_id)
            .label(LABEL_TOPOLOGY_ZONE, &m.zone)
            .label(LABEL_FAILURE_DOMAIN_BETA_ZONE, &m.zone)
            .label(LABEL_TOPOLOGY_REGION, &m.region)
            .label(LABEL_FAILURE_DOMAIN_BETA_REGION, &m.region)
            .label(LABEL_INSTANCE_TYPE, &m.instance_type)
            .label(LABEL_INSTANCE_TYPE_BETA, &m.instance_type)
            .addresses(m.node_addresses.clone());
        for (k, v) in &m.additional_labels {
            b = b.label(k, v);
        }
    }
    let mut n = b.build();
    let status = n.status.as_mut().unwrap();
    status.images = Some(images());
    let (st, reason, message) = match kind {
        NodeKind::NeedsRoute(_) => ("True", "NoRouteCreated", "Node created without a route"),
        _ => ("False", "RouteCreated", "RouteController created a route"),
    };
    let now = Time(jiff::Timestamp::now());
    status.conditions.as_mut().unwrap().push(NodeCondition {
        type_: CONDITION_NETWORK_UNAVAILABLE.to_string(),
        status: st.to_string(),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now),
    });
    n
}

/// What FakeCloud (default config, as fake-ccm runs it) reports for a node.
pub(crate) async fn metadata(env: &Env, i: usize) -> InstanceMetadata {
    let cloud = FakeCloud::default();
    let n = kubelet_node(&env.node_name(i)).build();
    let v2 = ccm_core::CloudProvider::instances_v2(&cloud).unwrap();
    v2.instance_metadata(&ccm_core::NodeView::from_node(&n))
        .await
        .unwrap()
}

pub(crate) fn is_initialised(n: &Node) -> bool {
    let spec = n.spec.as_ref();
    let tainted = spec
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TAINT_UNINITIALIZED));
    let zoned = n
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(LABEL_TOPOLOGY_ZONE));
    let provider = spec
        .and_then(|s| s.provider_id.as_deref())
        .is_some_and(|p| !p.is_empty());
    !tainted && zoned && provider
}

pub(crate) fn has_pod_cidr(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.pod_cidr.as_deref())
        .is_some_and(|c| !c.is_empty())
}

pub(crate) fn network_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == CONDITION_NETWORK_UNAVAILABLE && c.status == "False")
        })
}

pub(crate) fn has_ingress(s: &Service) -> bool {
    s.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .is_some_and(|i| !i.is_empty())
}

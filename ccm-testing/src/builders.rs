//! Builders for the objects tests start from: a Node as kubelet registers it with
//! `--cloud-provider=external`, and a `type: LoadBalancer` Service.

use std::collections::BTreeMap;

use ccm_core::well_known::{ANNOTATION_PROVIDED_NODE_IP, TAINT_UNINITIALIZED};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
    NodeSystemInfo, Service, ServicePort, ServiceSpec, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Starts a Node as kubelet `--cloud-provider=external` registers it: the
/// `node.cloudprovider.kubernetes.io/uninitialized=true:NoSchedule` taint, a `Ready=True`
/// condition (plus the pressure conditions `False`), a `Hostname` address equal to the name,
/// the `kubernetes.io/hostname`/`os`/`arch` labels, capacity, node info and kubelet endpoint.
pub fn kubelet_node(name: &str) -> NodeBuilder {
    NodeBuilder {
        name: name.to_string(),
        ready: true,
        uninitialized_taint: true,
        provided_node_ip: None,
        labels: BTreeMap::new(),
        taints: Vec::new(),
        pod_cidrs: Vec::new(),
        provider_id: None,
        addresses: None,
    }
}

/// Builder for a kubelet-registered [`Node`]; see [`kubelet_node`].
#[derive(Debug, Clone)]
pub struct NodeBuilder {
    name: String,
    ready: bool,
    uninitialized_taint: bool,
    provided_node_ip: Option<String>,
    labels: BTreeMap<String, String>,
    taints: Vec<Taint>,
    pod_cidrs: Vec<String>,
    provider_id: Option<String>,
    addresses: Option<Vec<NodeAddress>>,
}

impl NodeBuilder {
    /// Sets the `Ready` condition to `True` (true) or `False` (false).
    pub fn ready(mut self, ready: bool) -> Self {
        self.ready = ready;
        self
    }

    /// Shorthand for `.ready(false)`: `Ready=False` with reason `KubeletNotReady`.
    pub fn not_ready(self) -> Self {
        self.ready(false)
    }

    /// Leaves out the `node.cloudprovider.kubernetes.io/uninitialized` taint (a node that was
    /// already initialized, or a kubelet without `--cloud-provider=external`).
    pub fn without_uninitialized_taint(mut self) -> Self {
        self.uninitialized_taint = false;
        self
    }

    /// As kubelet `--node-ip=<ip>`: the `alpha.kubernetes.io/provided-node-ip` annotation and
    /// an `InternalIP` address (before the `Hostname` one).
    pub fn provided_node_ip(mut self, ip: &str) -> Self {
        self.provided_node_ip = Some(ip.to_string());
        self
    }

    /// Adds a label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_string(), value.to_string());
        self
    }

    /// Adds a taint (after the uninitialized taint, if any).
    pub fn taint(mut self, key: &str, value: &str, effect: &str) -> Self {
        self.taints.push(Taint {
            key: key.to_string(),
            value: (!value.is_empty()).then(|| value.to_string()),
            effect: effect.to_string(),
            time_added: None,
        });
        self
    }

    /// Sets `spec.podCIDRs` (and `spec.podCIDR` to the first).
    pub fn pod_cidrs(mut self, cidrs: &[&str]) -> Self {
        self.pod_cidrs = cidrs.iter().map(|c| c.to_string()).collect();
        self
    }

    /// Sets `spec.providerID`.
    pub fn provider_id(mut self, id: &str) -> Self {
        self.provider_id = Some(id.to_string());
        self
    }

    /// Replaces `status.addresses` entirely.
    pub fn addresses(mut self, addresses: Vec<NodeAddress>) -> Self {
        self.addresses = Some(addresses);
        self
    }

    /// Builds the Node.
    pub fn build(self) -> Node {
        let mut labels = BTreeMap::from([
            ("kubernetes.io/hostname".to_string(), self.name.clone()),
            ("kubernetes.io/os".to_string(), "linux".to_string()),
            ("kubernetes.io/arch".to_string(), "amd64".to_string()),
            ("beta.kubernetes.io/os".to_string(), "linux".to_string()),
            ("beta.kubernetes.io/arch".to_string(), "amd64".to_string()),
        ]);
        labels.extend(self.labels);
        let mut annotations = BTreeMap::from([(
            "volumes.kubernetes.io/controller-managed-attach-detach".to_string(),
            "true".to_string(),
        )]);
        if let Some(ip) = &self.provided_node_ip {
            annotations.insert(ANNOTATION_PROVIDED_NODE_IP.to_string(), ip.clone());
        }
        let mut taints = Vec::new();
        if self.uninitialized_taint {
            taints.push(Taint {
                key: TAINT_UNINITIALIZED.to_string(),
                value: Some("true".to_string()),
                effect: "NoSchedule".to_string(),
                time_added: None,
            });
        }
        taints.extend(self.taints);
        let addresses = self.addresses.unwrap_or_else(|| {
            let mut a = Vec::new();
            if let Some(ip) = &self.provided_node_ip {
                a.push(NodeAddress {
                    type_: "InternalIP".to_string(),
                    address: ip.clone(),
                });
            }
            a.push(NodeAddress {
                type_: "Hostname".to_string(),
                address: self.name.clone(),
            });
            a
        });
        let now = Time(jiff::Timestamp::now());
        let condition = |type_: &str, status: &str, reason: &str, message: &str| NodeCondition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: Some(reason.to_string()),
            message: Some(message.to_string()),
            last_heartbeat_time: Some(now.clone()),
            last_transition_time: Some(now.clone()),
        };
        let ready = if self.ready {
            condition(
                "Ready",
                "True",
                "KubeletReady",
                "kubelet is posting ready status",
            )
        } else {
            condition(
                "Ready",
                "False",
                "KubeletNotReady",
                "container runtime network not ready",
            )
        };
        let resources = BTreeMap::from([
            ("cpu".to_string(), Quantity("2".to_string())),
            ("memory".to_string(), Quantity("4028180Ki".to_string())),
            ("pods".to_string(), Quantity("110".to_string())),
            (
                "ephemeral-storage".to_string(),
                Quantity("20134592Ki".to_string()),
            ),
        ]);
        Node {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(labels),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                taints: (!taints.is_empty()).then_some(taints),
                pod_cidr: self.pod_cidrs.first().cloned(),
                pod_cidrs: (!self.pod_cidrs.is_empty()).then_some(self.pod_cidrs),
                provider_id: self.provider_id,
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(addresses),
                conditions: Some(vec![
                    condition(
                        "MemoryPressure",
                        "False",
                        "KubeletHasSufficientMemory",
                        "kubelet has sufficient memory available",
                    ),
                    condition(
                        "DiskPressure",
                        "False",
                        "KubeletHasNoDiskPressure",
                        "kubelet has no disk pressure",
                    ),
                    condition(
                        "PIDPressure",
                        "False",
                        "KubeletHasSufficientPID",
                        "kubelet has sufficient PID available",
                    ),
                    ready,
                ]),
                capacity: Some(resources.clone()),
                allocatable: Some(resources),
                daemon_endpoints: Some(NodeDaemonEndpoints {
                    kubelet_endpoint: Some(DaemonEndpoint { port: 10250 }),
                }),
                node_info: Some(NodeSystemInfo {
                    architecture: "amd64".to_string(),
                    boot_id: String::new(),
                    container_runtime_version: "containerd://2.0.0".to_string(),
                    kernel_version: "6.1.0".to_string(),
                    kube_proxy_version: String::new(),
                    kubelet_version: "v1.33.0".to_string(),
                    machine_id: String::new(),
                    operating_system: "linux".to_string(),
                    os_image: "Debian GNU/Linux 12 (bookworm)".to_string(),
                    system_uuid: String::new(),
                    ..NodeSystemInfo::default()
                }),
                ..NodeStatus::default()
            }),
        }
    }
}

/// Starts a `type: LoadBalancer` Service with TCP ports `http` 80 and `https` 443 and a
/// selector `app=<name>`.
pub fn load_balancer_service(namespace: &str, name: &str) -> ServiceBuilder {
    ServiceBuilder {
        namespace: namespace.to_string(),
        name: name.to_string(),
        type_: "LoadBalancer".to_string(),
        load_balancer_class: None,
        annotations: BTreeMap::new(),
        labels: BTreeMap::new(),
        ports: vec![("http".to_string(), 80), ("https".to_string(), 443)],
        default_ports: true,
        external_traffic_policy: None,
        finalizers: Vec::new(),
    }
}

/// Builder for a [`Service`]; see [`load_balancer_service`].
#[derive(Debug, Clone)]
pub struct ServiceBuilder {
    namespace: String,
    name: String,
    type_: String,
    load_balancer_class: Option<String>,
    annotations: BTreeMap<String, String>,
    labels: BTreeMap<String, String>,
    ports: Vec<(String, i32)>,
    default_ports: bool,
    external_traffic_policy: Option<String>,
    finalizers: Vec<String>,
}

impl ServiceBuilder {
    /// Sets `spec.type` (`LoadBalancer`, `ClusterIP`, `NodePort`).
    pub fn type_(mut self, type_: &str) -> Self {
        self.type_ = type_.to_string();
        self
    }

    /// Sets `spec.loadBalancerClass`.
    pub fn load_balancer_class(mut self, class: &str) -> Self {
        self.load_balancer_class = Some(class.to_string());
        self
    }

    /// Adds an annotation.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.to_string(), value.to_string());
        self
    }

    /// Adds a label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_string(), value.to_string());
        self
    }

    /// Adds a TCP port (target port = port). The first call replaces the default ports
    /// 80 and 443.
    pub fn port(mut self, name: &str, port: i32) -> Self {
        if self.default_ports {
            self.ports.clear();
            self.default_ports = false;
        }
        self.ports.push((name.to_string(), port));
        self
    }

    /// Sets `spec.externalTrafficPolicy` (`Cluster` or `Local`).
    pub fn external_traffic_policy(mut self, policy: &str) -> Self {
        self.external_traffic_policy = Some(policy.to_string());
        self
    }

    /// Adds a finalizer, e.g. `service.kubernetes.io/load-balancer-cleanup`.
    pub fn finalizer(mut self, finalizer: &str) -> Self {
        self.finalizers.push(finalizer.to_string());
        self
    }

    /// Builds the Service.
    pub fn build(self) -> Service {
        let ports = self
            .ports
            .iter()
            .map(|(name, port)| ServicePort {
                name: Some(name.clone()),
                port: *port,
                protocol: Some("TCP".to_string()),
                target_port: Some(IntOrString::Int(*port)),
                ..ServicePort::default()
            })
            .collect();
        Service {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace),
                labels: (!self.labels.is_empty()).then_some(self.labels),
                annotations: (!self.annotations.is_empty()).then_some(self.annotations),
                finalizers: (!self.finalizers.is_empty()).then_some(self.finalizers),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                type_: Some(self.type_),
                load_balancer_class: self.load_balancer_class,
                external_traffic_policy: self.external_traffic_policy,
                ports: Some(ports),
                selector: Some(BTreeMap::from([("app".to_string(), self.name)])),
                ..ServiceSpec::default()
            }),
            status: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_node_shape() {
        let n = kubelet_node("n1").provided_node_ip("10.0.0.5").build();
        let spec = n.spec.as_ref().unwrap();
        let taints = spec.taints.as_ref().unwrap();
        assert_eq!(taints[0].key, TAINT_UNINITIALIZED);
        assert_eq!(taints[0].effect, "NoSchedule");
        let status = n.status.as_ref().unwrap();
        let addrs = status.addresses.as_ref().unwrap();
        assert_eq!(addrs[0].type_, "InternalIP");
        assert_eq!(addrs[1].type_, "Hostname");
        assert_eq!(addrs[1].address, "n1");
        let ready = status
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.status, "True");
        assert_eq!(
            n.metadata.annotations.as_ref().unwrap()[ANNOTATION_PROVIDED_NODE_IP],
            "10.0.0.5"
        );
        let n = kubelet_node("n2")
            .not_ready()
            .without_uninitialized_taint()
            .build();
        assert!(n.spec.unwrap().taints.is_none());
    }

    #[test]
    fn service_ports() {
        let s = load_balancer_service("ns", "s").build();
        let ports = s.spec.unwrap().ports.unwrap();
        assert_eq!(
            ports.iter().map(|p| p.port).collect::<Vec<_>>(),
            vec![80, 443]
        );
        let s = load_balancer_service("ns", "s")
            .port("dns", 53)
            .port("x", 8080)
            .build();
        let ports = s.spec.unwrap().ports.unwrap();
        assert_eq!(
            ports.iter().map(|p| p.port).collect::<Vec<_>>(),
            vec![53, 8080]
        );
    }
}

//! Well-known names of the cloud-controller-manager protocol: taints, labels, annotations,
//! finalizers, conditions and ports, exactly as Kubernetes and Go's `k8s.io/cloud-provider`
//! spell them.

/// Taint kubelet `--cloud-provider=external` puts on a new Node; the cloud-node controller
/// removes it once the Node is initialised.
pub const TAINT_UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
/// Taint (`NoSchedule`) the node-lifecycle controller puts on a Node whose instance is shut down.
pub const TAINT_SHUTDOWN: &str = "node.cloudprovider.kubernetes.io/shutdown";
/// Taint the cluster-autoscaler puts on a Node it is about to remove; such Nodes are not load
/// balancer hosts.
pub const TAINT_TO_BE_DELETED_BY_CLUSTER_AUTOSCALER: &str = "ToBeDeletedByClusterAutoscaler";
/// Taint of Kubernetes' non-graceful node shutdown (GA since 1.28): with it, the Pods of a
/// Node are deleted and their volumes detached without waiting for the kubelet. The
/// node-lifecycle controller adds it (`nodeshutdown:NoExecute`) only when an operator turns
/// it on (`--node-out-of-service-after`).
pub const TAINT_OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";

/// Annotation kubelet writes with its `--node-ip` (one IP, or a dual-stack pair `v4,v6`).
pub const ANNOTATION_PROVIDED_NODE_IP: &str = "alpha.kubernetes.io/provided-node-ip";
/// Service annotation listing allowed load-balancer source ranges (comma-separated CIDRs).
pub const ANNOTATION_LOAD_BALANCER_SOURCE_RANGES: &str =
    "service.beta.kubernetes.io/load-balancer-source-ranges";

/// Finalizer the service controller puts on every Service it creates a load balancer for.
pub const FINALIZER_LOAD_BALANCER_CLEANUP: &str = "service.kubernetes.io/load-balancer-cleanup";

/// Node label excluding the Node from load-balancer host lists (unless its value parses as false).
pub const LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS: &str =
    "node.kubernetes.io/exclude-from-external-load-balancers";
/// GA zone label.
pub const LABEL_TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
/// GA region label.
pub const LABEL_TOPOLOGY_REGION: &str = "topology.kubernetes.io/region";
/// GA instance-type label.
pub const LABEL_INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
/// Legacy beta zone label.
pub const LABEL_FAILURE_DOMAIN_BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";
/// Legacy beta region label.
pub const LABEL_FAILURE_DOMAIN_BETA_REGION: &str = "failure-domain.beta.kubernetes.io/region";
/// Legacy beta instance-type label.
pub const LABEL_INSTANCE_TYPE_BETA: &str = "beta.kubernetes.io/instance-type";

/// Node condition the route controller maintains.
pub const CONDITION_NETWORK_UNAVAILABLE: &str = "NetworkUnavailable";
/// Node condition kubelet maintains; the node-lifecycle controller reads it.
pub const CONDITION_READY: &str = "Ready";
/// Node condition the node-lifecycle controller maintains, when an operator turns it on, while
/// the cloud reports the Node's instance gone (not in Go's `k8s.io/cloud-provider`).
pub const CONDITION_CLOUD_PROVIDER_INSTANCE_NOT_FOUND: &str = "CloudProviderInstanceNotFound";

/// The HTTPS port a cloud-controller-manager serves health and metrics on.
pub const CLOUD_CONTROLLER_MANAGER_PORT: u16 = 10258;
/// The HTTPS port a cloud-controller-manager serves admission webhooks on.
pub const CLOUD_CONTROLLER_MANAGER_WEBHOOK_PORT: u16 = 10260;

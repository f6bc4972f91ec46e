//! Entry points into the pure code that reads outside input, for the fuzz targets of `fuzz/`
//! (feature `fuzzing`, off by default; not a vendor API and not in the public-API snapshot).
//!
//! Each function runs a parser or planner on what a fuzzer made and checks what must hold for
//! any input; a broken property panics, which the fuzzer reports as a crash.

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, NodeAddress, Service};

use crate::controllers::cloud_node::plan as cloud_node_plan;
use crate::controllers::node_ipam::plan::{CidrSet, Pool};
use crate::controllers::route::plan as route_plan;
use crate::controllers::service::classes::ServedClasses;
use crate::controllers::service::plan as service_plan;

/// The service controller's reading of a Service (and of a change from `old` to `new`): what
/// it decides, whether it queues it, whether it cleans up, and what triggers an update.
pub fn service(old: &Service, new: &Service) {
    let go = ServedClasses::default();
    for s in [old, new] {
        let wants = service_plan::wants_load_balancer(s, &go);
        let cleanup = service_plan::needs_cleanup(s, &go);
        let _ = service_plan::should_enqueue_add(s, &go);
        let decided = service_plan::decide(s, false, &go);
        // Nothing is deleted in the cloud for a Service that never got our finalizer.
        if !service_plan::has_cleanup_finalizer(s) {
            assert_ne!(decided, service_plan::Decision::Delete, "{s:?}");
        }
        assert!(!(wants && cleanup && !service_plan::is_being_deleted(s)));
        let _ = service_plan::decide(s, true, &go);
    }
    let _ = service_plan::update_trigger(old, new, &go);
    // A Service compared with itself never triggers an update.
    assert!(
        service_plan::update_trigger(new, new, &go).is_none(),
        "{new:?}"
    );
}

/// The cloud-node controller's reading of a Node's `alpha.kubernetes.io/provided-node-ip`
/// annotation and addresses against the cloud's.
pub fn node_addresses(node: &Node, cloud: &[NodeAddress]) {
    if let Some(value) = cloud_node_plan::provided_node_ip(node) {
        let _ = cloud_node_plan::parse_node_ip_annotation(value);
    }
    let _ = cloud_node_plan::desired_addresses(node, cloud);
    let _ = cloud_node_plan::plan_address_refresh(node, cloud);
    let _ = cloud_node_plan::plan_label_reconcile(node);
}

/// Go's `ParseNodeIPAnnotation` on any text: at most two addresses, of different families.
pub fn node_ip_annotation(value: &str) {
    if let Ok(ips) = cloud_node_plan::parse_node_ip_annotation(value) {
        assert!(!ips.is_empty() && ips.len() <= 2, "{value:?} -> {ips:?}");
        if let [a, b] = ips.as_slice() {
            assert_ne!(a.is_ipv6(), b.is_ipv6(), "{value:?}");
        }
    }
    let _ = cloud_node_plan::parse_ip_sloppy(value);
}

/// The route controller's CIDR handling: `--cluster-cidr`, a route's destination, and whether
/// the controller owns a route.
pub fn route_cidrs(cluster_cidr: &str, destination: &str) {
    let normalized = route_plan::normalize_cidr(destination);
    // Normalising is idempotent.
    assert_eq!(route_plan::normalize_cidr(&normalized), normalized);
    if let Ok(cidrs) = crate::controllers::route::parse_cluster_cidrs(cluster_cidr) {
        assert!(!cidrs.is_empty() && cidrs.len() <= 2, "{cluster_cidr:?}");
        let route = ccm_core::Route {
            destination_cidr: destination.to_owned(),
            ..ccm_core::Route::default()
        };
        let _ = route_plan::is_responsible(&cidrs, &route);
    }
}

/// The range allocator's CIDR sets: a cluster CIDR split into `/node_mask` blocks, with
/// `steps` allocations, occupations and releases of `others`. Every CIDR given out lies in
/// the cluster CIDR, has the node mask, and is never given out twice while held.
pub fn cidr_set(cluster: IpNet, node_mask: u8, others: &[IpNet], steps: &[u8]) {
    let Ok(mut set) = CidrSet::new(cluster, node_mask) else {
        return;
    };
    let mut given: Vec<IpNet> = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        match step % 3 {
            0 => {
                if let Some((cidr, _)) = set.allocate_next() {
                    assert!(cluster.trunc().contains(&cidr), "{cidr} outside {cluster}");
                    assert_eq!(cidr.prefix_len(), node_mask);
                    assert!(!given.contains(&cidr), "{cidr} given out twice");
                    given.push(cidr);
                }
            }
            1 => {
                if let Some(cidr) = others.get(i % others.len().max(1)) {
                    let _ = set.occupy(cidr);
                }
            }
            _ => {
                if let Some(cidr) = given.pop() {
                    let _ = set.release(&cidr);
                }
            }
        }
        assert!(set.allocated() <= set.max());
    }
    let _ = Pool::new(&[cluster], &[node_mask], others);
}

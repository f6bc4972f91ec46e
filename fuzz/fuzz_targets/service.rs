//! The Service fields and annotations the controllers and ccm-core's helpers read, and the
//! Node annotations and addresses of the cloud-node controller. The input is JSON: a Service,
//! a pair `[old, new]` of Services, or `{"node": Node, "cloud": [NodeAddress]}`.
#![no_main]

use ccm_controllers::fuzzing;
use k8s_openapi::api::core::v1::{Node, NodeAddress, Service};
use libfuzzer_sys::fuzz_target;

#[derive(serde::Deserialize)]
struct NodeInput {
    node: Node,
    #[serde(default)]
    cloud: Vec<NodeAddress>,
}

fn helpers(s: &Service) {
    let _ = ccm_core::default_load_balancer_name(s);
    if let Ok(ranges) = ccm_core::load_balancer_source_ranges(s) {
        let _ = ccm_core::is_allow_all(&ranges);
    }
    let _ = ccm_core::requests_only_local_traffic(s);
    if ccm_core::needs_health_check(s) {
        let _ = ccm_core::health_check_path_port(s);
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = serde_json::from_slice::<Service>(data) {
        helpers(&s);
        fuzzing::service(&Service::default(), &s);
        fuzzing::service(&s, &s);
    } else if let Ok([old, new]) = serde_json::from_slice::<[Service; 2]>(data) {
        helpers(&old);
        helpers(&new);
        fuzzing::service(&old, &new);
    } else if let Ok(input) = serde_json::from_slice::<NodeInput>(data) {
        fuzzing::node_addresses(&input.node, &input.cloud);
    }
});

//! Helpers the FakeCloud tests share: Nodes, load-balancer hosts and Services as the
//! framework passes them.

use ccm_core::k8s_openapi::api::core::v1::{NodeSpec, ServicePort, ServiceSpec};
use ccm_core::{Node, NodeAddress, NodeView, ObjectMeta, Route, Service};

fn plain_node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A Node as the framework passes it to a provider (its cached view).
pub(crate) fn node(name: &str) -> NodeView {
    NodeView::from(plain_node(name))
}

pub(crate) fn node_with_provider_id(name: &str, provider_id: &str) -> NodeView {
    NodeView::from(Node {
        spec: Some(NodeSpec {
            provider_id: Some(provider_id.into()),
            ..Default::default()
        }),
        ..plain_node(name)
    })
}

/// A load-balancer host, as the framework passes it (shared from its Node cache).
pub(crate) fn host(name: &str) -> NodeView {
    node(name)
}

pub(crate) fn service(namespace: &str, name: &str, uid: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![
                ServicePort {
                    name: Some("http".into()),
                    port: 80,
                    ..Default::default()
                },
                ServicePort {
                    name: Some("https".into()),
                    port: 443,
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(crate) fn addr(cloud_addresses: &[NodeAddress], type_: &str) -> Option<String> {
    cloud_addresses
        .iter()
        .find(|a| a.type_ == type_)
        .map(|a| a.address.clone())
}

pub(crate) const UID: &str = "2f3c6a1e-9b7d-4c1a-8e5f-0123456789ab";

/// A route to `node_name` for `cidr`, with the node's InternalIP.
pub(crate) fn route(node_name: &str, cidr: &str) -> Route {
    Route {
        target_node: node_name.into(),
        destination_cidr: cidr.into(),
        target_node_addresses: vec![NodeAddress {
            type_: "InternalIP".into(),
            address: "10.1.2.3".into(),
        }],
        ..Default::default()
    }
}

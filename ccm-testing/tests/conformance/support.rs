//! The input every conformance test uses: FakeCloud's nodes, a Service, the suite input.

use std::collections::BTreeSet;
use std::time::Duration;

use ccm_core::k8s_openapi::api::core::v1::{NodeSpec, ServicePort, ServiceSpec};
use ccm_core::{Node, ObjectMeta, Service};
use ccm_testing::conformance::{Check, ConformanceInput};
use ccm_testing::fake_cloud::FakeCloud;

pub(crate) const CLUSTER: &str = "conformance";

pub(crate) const SERVICE_KEY: &str = "default/conformance-lb";

pub(crate) fn node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        },
        ..Default::default()
    }
}

pub(crate) fn service() -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some("conformance-lb".into()),
            namespace: Some("default".into()),
            uid: Some("6f1d3c2a-1111-4000-8000-000000000001".into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![ServicePort {
                port: 80,
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(crate) fn fake() -> ccm_testing::fake_cloud::FakeCloudBuilder {
    FakeCloud::builder()
        .missing_node("gone-.*")
        .shutdown_node("stopped-.*")
}

/// The input every test uses; `cloud` backs the load-balancer hosts probe.
pub(crate) fn input(cloud: &FakeCloud) -> ConformanceInput {
    let missing = Node {
        spec: Some(NodeSpec {
            provider_id: Some("fake://gone-1".into()),
            ..Default::default()
        }),
        ..node("gone-1")
    };
    let probe_cloud = cloud.clone();
    ConformanceInput::new(CLUSTER, vec![node("n-0"), node("n-1"), node("n-2")])
        .missing_node(missing)
        .shutdown_node(node("stopped-1"))
        .service(service())
        .route_cidr("10.244.250.0/24")
        .ipv6_route_cidr("fd00:10:244:fa::/64")
        .lb_hosts_probe(move |svc: Service| {
            let cloud = probe_cloud.clone();
            async move {
                let key = format!(
                    "{}/{}",
                    svc.metadata.namespace.unwrap_or_default(),
                    svc.metadata.name.unwrap_or_default()
                );
                cloud.load_balancers().get(&key).map(|lb| lb.hosts.clone())
            }
        })
        .call_timeout(Duration::from_secs(20))
}

pub(crate) fn failed(report: &ccm_testing::conformance::Report) -> BTreeSet<Check> {
    report.failed().map(|r| r.check).collect()
}

//! The framework's controllers with the provider against a real moto server: the in-process
//! API server (or the cluster of `CCM_TEST_KUBECONFIG`, with unique names and an informer scope
//! that sees only this test's Nodes and Services). The service controller serves both classes
//! the provider declares: Services without a class and those of its internal class.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use aws_ccm::INTERNAL_NLB_CLASS;
use ccm_controllers::InformerScope;
use ccm_core::well_known::{FINALIZER_LOAD_BALANCER_CLEANUP, TAINT_SHUTDOWN, TAINT_UNINITIALIZED};
use ccm_core::{CloudProvider, default_load_balancer_name};
use ccm_testing::TestCluster;
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use ccm_testing::harness::{ControllerHarness, HarnessBuilder};
use ccm_testing::wait::{eventually, wait_for, wait_for_deletion};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, DeleteParams};
use support::world::{World, instance_ids, provider_id};

const LABEL: &str = "aws-ccm-test.ccm-rs.io/run";
const WAIT: Duration = Duration::from_secs(60);
/// A class nobody in these tests serves (another controller's).
const FOREIGN_CLASS: &str = "other.example/lb";

/// A cluster, an AWS account in moto, and a run label for this test's Nodes.
struct Scenario {
    cluster: TestCluster,
    world: World,
    run: String,
    namespace: String,
}

impl Scenario {
    async fn start(prefix: &str) -> Scenario {
        let cluster = TestCluster::start().await;
        let run = cluster.unique_name(prefix);
        let world = World::new(&run).await;
        let namespace = cluster.namespace().await;
        Scenario {
            cluster,
            world,
            run,
            namespace,
        }
    }

    fn harness(&self) -> HarnessBuilder {
        let cloud: Arc<dyn CloudProvider> = self.world.cloud.clone();
        ControllerHarness::builder(&self.cluster, cloud)
            .flag(&format!("--cluster-name={}", self.run))
            .scope(InformerScope {
                node_labels: Some(format!("{LABEL}={}", self.run)),
                service_namespace: Some(self.namespace.clone()),
                ..InformerScope::default()
            })
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.cluster.client())
    }

    /// A Node for `instance` as kubelet registers it (named by its private DNS name).
    async fn kubelet_node(&self, instance: &aws_sdk_ec2::types::Instance) -> String {
        let name = instance.private_dns_name().unwrap().to_owned();
        self.cluster
            .create(&kubelet_node(&name).label(LABEL, &self.run).build())
            .await;
        name
    }

    /// An initialised, Ready Node for `instance` (provider ID set, no uninitialized taint).
    async fn initialised_node(
        &self,
        instance: &aws_sdk_ec2::types::Instance,
        ready: bool,
    ) -> String {
        let name = instance.private_dns_name().unwrap().to_owned();
        let node = kubelet_node(&name)
            .label(LABEL, &self.run)
            .without_uninitialized_taint()
            .provider_id(&provider_id(instance))
            .ready(ready)
            .build();
        self.cluster.create(&node).await;
        name
    }
}

/// The Service's ingress hostname (its NLB's DNS name), once it has one.
fn hostname(svc: &Service) -> Option<String> {
    let ingress = svc
        .status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?;
    ingress.iter().find_map(|i| i.hostname.clone())
}

fn has_hostname(svc: &Service) -> bool {
    hostname(svc).is_some()
}

/// Deletes the Service and waits until it is gone (the controller released its finalizer).
async fn delete_service(services: &Api<Service>, name: &str) {
    services
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    wait_for_deletion(services, name, WAIT).await.unwrap();
}

fn taints(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_are_initialised_from_real_instances() {
    let s = Scenario::start("aws-init").await;
    let instances = s.world.launch(2).await;
    let harness = s.harness().cloud_node().start().await;
    let mut names = Vec::new();
    for instance in &instances {
        names.push(s.kubelet_node(instance).await);
    }
    for (instance, name) in instances.iter().zip(&names) {
        let node = wait_for(&s.nodes(), name, WAIT, |n: &Node| {
            !taints(n).iter().any(|t| t == TAINT_UNINITIALIZED)
        })
        .await
        .unwrap();
        let spec = node.spec.clone().unwrap();
        assert_eq!(
            spec.provider_id.as_deref(),
            Some(provider_id(instance).as_str())
        );
        let labels = node.metadata.labels.clone().unwrap();
        assert_eq!(labels["topology.kubernetes.io/zone"], "us-east-1a");
        assert_eq!(labels["topology.kubernetes.io/region"], "us-east-1");
        assert_eq!(labels["node.kubernetes.io/instance-type"], "t3.medium");
        let addresses: BTreeSet<(String, String)> = node
            .status
            .unwrap()
            .addresses
            .unwrap()
            .into_iter()
            .map(|a| (a.type_, a.address))
            .collect();
        let ip = instance.private_ip_address().unwrap().to_owned();
        let expected: BTreeSet<(String, String)> = [
            ("InternalIP".to_owned(), ip),
            ("InternalDNS".to_owned(), name.clone()),
            ("Hostname".to_owned(), name.clone()),
        ]
        .into();
        assert_eq!(addresses, expected, "addresses of {name}");
    }
    harness.stop().await.unwrap();
    s.cluster.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_instance_loses_its_node_and_a_stopped_one_is_tainted() {
    let s = Scenario::start("aws-life").await;
    let instances = s.world.launch(3).await;
    let terminated = s.initialised_node(&instances[0], false).await;
    let stopped = s.initialised_node(&instances[1], false).await;
    let running = s.initialised_node(&instances[2], false).await;
    s.world.terminate(instances[0].instance_id().unwrap()).await;
    s.world.stop(instances[1].instance_id().unwrap()).await;
    let harness = s.harness().node_lifecycle().start().await;

    wait_for_deletion(&s.nodes(), &terminated, WAIT)
        .await
        .unwrap();
    wait_for(&s.nodes(), &stopped, WAIT, |n: &Node| {
        taints(n).iter().any(|t| t == TAINT_SHUTDOWN)
    })
    .await
    .unwrap();
    harness.settled().await;
    // The running (but NotReady) instance's Node is neither deleted nor tainted.
    let node = s.nodes().get(&running).await.unwrap();
    assert!(
        !taints(&node).iter().any(|t| t == TAINT_SHUTDOWN),
        "{:?}",
        taints(&node)
    );
    let node = s.nodes().get(&stopped).await.unwrap();
    assert!(node.metadata.deletion_timestamp.is_none());
    harness.stop().await.unwrap();
    s.cluster.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_balancer_service_gets_an_nlb_that_follows_its_nodes_and_goes_with_it() {
    let s = Scenario::start("aws-lb").await;
    let instances = s.world.launch(3).await;
    let ids: Vec<String> = instance_ids(&instances).collect();
    let first = s.initialised_node(&instances[0], true).await;
    s.initialised_node(&instances[1], true).await;
    let harness = s.harness().service().start().await;

    let service = load_balancer_service(&s.namespace, &s.cluster.unique_name("web")).build();
    let service = s.cluster.create(&service).await;
    let name = service.metadata.name.clone().unwrap();
    let services: Api<Service> = Api::namespaced(s.cluster.client(), &s.namespace);
    let service = wait_for(&services, &name, WAIT, has_hostname)
        .await
        .unwrap();
    let lb_name = default_load_balancer_name(&service);
    let lb = s
        .world
        .elb
        .describe_load_balancers()
        .names(&lb_name)
        .send()
        .await
        .unwrap();
    let lb = lb.load_balancers()[0].clone();
    assert_eq!(
        hostname(&service).as_deref(),
        lb.dns_name(),
        "the ingress hostname is the NLB's DNS name"
    );
    assert_eq!(lb.r#type().map(|t| t.as_str()), Some("network"));

    let targets = |want: Vec<&String>| {
        let want: BTreeSet<String> = want.into_iter().cloned().collect();
        let world = &s.world;
        let lb_name = lb_name.clone();
        async move {
            let ok = eventually(WAIT, || async {
                world.targets_of(&lb_name).await
                    == Some(vec![(80, want.clone()), (443, want.clone())])
            })
            .await;
            assert!(
                ok,
                "targets of {lb_name}: want {want:?} on 80 and 443, have {:?}",
                world.targets_of(&lb_name).await
            );
        }
    };
    targets(vec![&ids[0], &ids[1]]).await;
    // One load balancer, a target group and a listener per port, all tagged with the cluster.
    assert_eq!(s.world.tagged_elb_resources().await.len(), 5);

    // A Node joins, another leaves.
    s.initialised_node(&instances[2], true).await;
    targets(vec![&ids[0], &ids[1], &ids[2]]).await;
    s.nodes()
        .delete(&first, &DeleteParams::default())
        .await
        .unwrap();
    targets(vec![&ids[1], &ids[2]]).await;

    // Deleting the Service deletes everything that was created for it.
    delete_service(&services, &name).await;
    assert_eq!(
        s.world.tagged_elb_resources().await,
        BTreeSet::new(),
        "nothing tagged with the cluster is left"
    );
    harness.stop().await.unwrap();
    s.cluster.cleanup().await;
}

/// ipMode (KEP-1860): an NLB with instance targets keeps the client's IP, so aws-ccm declares
/// `VIP` only; its ingress entries are the NLB's DNS name (a hostname, no IP), which carry no
/// `ipMode` (the API server rejects one there). A Service asking for `Proxy` is refused with a
/// Warning Event `IPModeNotAllowed` and still gets its load balancer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nlbs_hostname_ingress_has_no_ip_mode_and_proxy_is_refused() {
    let s = Scenario::start("aws-ipmode").await;
    let instances = s.world.launch(1).await;
    s.initialised_node(&instances[0], true).await;
    let harness = s.harness().service().start().await;
    assert!(
        !s.world
            .cloud
            .load_balancer_ip_modes(None)
            .allows(ccm_core::IpMode::Proxy)
    );

    let name = s.cluster.unique_name("proxied");
    let service = load_balancer_service(&s.namespace, &name)
        .annotation(ccm_core::ANNOTATION_IP_MODE, "Proxy")
        .build();
    s.cluster.create(&service).await;
    let services: Api<Service> = Api::namespaced(s.cluster.client(), &s.namespace);
    let service = wait_for(&services, &name, WAIT, has_hostname)
        .await
        .unwrap();
    let ingress = service
        .status
        .as_ref()
        .and_then(|st| st.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.clone())
        .unwrap_or_default();
    assert!(!ingress.is_empty());
    for entry in &ingress {
        assert!(entry.hostname.is_some() && entry.ip.is_none(), "{entry:?}");
        assert_eq!(
            entry.ip_mode, None,
            "a hostname entry carries no ipMode: {entry:?}"
        );
    }
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(s.cluster.client(), &s.namespace);
    let refused = eventually(WAIT, || async {
        events
            .list(&Default::default())
            .await
            .map(|l| {
                l.items.iter().any(|e| {
                    e.reason.as_deref() == Some("IPModeNotAllowed")
                        && e.type_.as_deref() == Some("Warning")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                            == Some(name.as_str())
                })
            })
            .unwrap_or(false)
    })
    .await;
    assert!(refused, "no Warning IPModeNotAllowed on {name}");
    delete_service(&services, &name).await;
    harness.stop().await.unwrap();
    s.cluster.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_internal_class_gets_an_internal_nlb_and_a_foreign_class_is_left_alone() {
    let s = Scenario::start("aws-class").await;
    let instances = s.world.launch(2).await;
    let ids: BTreeSet<String> = instance_ids(&instances).collect();
    for instance in &instances {
        s.initialised_node(instance, true).await;
    }
    let harness = s.harness().service().start().await;
    let services: Api<Service> = Api::namespaced(s.cluster.client(), &s.namespace);
    let cluster = &s.cluster;
    let create = |name: &str, class: Option<&str>| {
        let mut service = load_balancer_service(&s.namespace, &cluster.unique_name(name));
        if let Some(class) = class {
            service = service.load_balancer_class(class);
        }
        let service = service.build();
        async move { cluster.create(&service).await.metadata.name.unwrap() }
    };

    // A Service without a class: an internet-facing NLB in `subnets`, as before classes.
    let plain = create("plain", None).await;
    let plain = wait_for(&services, &plain, WAIT, has_hostname)
        .await
        .unwrap();
    let plain_lb = default_load_balancer_name(&plain);
    let plain_resources = s.world.tagged_elb_resources().await;
    assert_eq!(plain_resources.len(), 5, "{plain_resources:?}");

    // One of the provider's internal class, one of a class nobody here serves.
    let internal = create("internal", Some(INTERNAL_NLB_CLASS)).await;
    let foreign = create("foreign", Some(FOREIGN_CLASS)).await;
    let internal = wait_for(&services, &internal, WAIT, has_hostname)
        .await
        .unwrap();
    let internal_lb = default_load_balancer_name(&internal);
    let lb = s.world.load_balancer(&internal_lb).await.unwrap();
    assert_eq!(hostname(&internal).as_deref(), lb.dns_name());
    assert_eq!(
        s.world.placement_of(&internal_lb).await,
        Some((
            "internal".to_owned(),
            s.world.config.internal_load_balancer_subnets().to_vec()
        ))
    );
    assert_eq!(
        s.world.placement_of(&plain_lb).await,
        Some(("internet-facing".to_owned(), s.world.config.subnets.clone()))
    );
    let world = &s.world;
    let both_ports = Some(vec![(80, ids.clone()), (443, ids.clone())]);
    assert!(
        eventually(WAIT, || async {
            world.targets_of(&internal_lb).await == both_ports
        })
        .await,
        "targets of {internal_lb}: {:?}",
        world.targets_of(&internal_lb).await
    );
    assert!(
        internal
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER_LOAD_BALANCER_CLEANUP)
    );

    let foreign_untouched = || async {
        let service = services.get(&foreign).await.unwrap();
        assert!(!has_hostname(&service), "{service:?}");
        assert_eq!(service.metadata.finalizers, None, "{service:?}");
        let name = default_load_balancer_name(&service);
        assert!(world.load_balancer(&name).await.is_none(), "{name}");
    };
    foreign_untouched().await;
    assert_eq!(world.tagged_elb_resources().await.len(), 10);

    // Deleting the classed Service releases its load balancer, and only it.
    delete_service(&services, internal.metadata.name.as_deref().unwrap()).await;
    assert_eq!(world.tagged_elb_resources().await, plain_resources);
    foreign_untouched().await;

    delete_service(&services, plain.metadata.name.as_deref().unwrap()).await;
    assert_eq!(world.tagged_elb_resources().await, BTreeSet::new());
    harness.stop().await.unwrap();
    s.cluster.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_are_created_and_deleted_in_the_route_table() {
    let s = Scenario::start("aws-route").await;
    let instances = s.world.launch(2).await;
    let harness = s
        .harness()
        .route()
        .flag("--route-reconciliation-period=1s")
        .start()
        .await;
    let mut names = Vec::new();
    for (i, instance) in instances.iter().enumerate() {
        let name = instance.private_dns_name().unwrap().to_owned();
        let node = kubelet_node(&name)
            .label(LABEL, &s.run)
            .without_uninitialized_taint()
            .provider_id(&provider_id(instance))
            .pod_cidrs(&[&format!("10.244.{}.0/24", i + 1)])
            .build();
        s.cluster.create(&node).await;
        names.push(name);
    }
    let route = |i: usize| {
        (
            format!("10.244.{}.0/24", i + 1),
            instances[i].instance_id().unwrap().to_owned(),
        )
    };
    let expected: BTreeSet<_> = [route(0), route(1)].into();
    let world = &s.world;
    assert!(
        eventually(WAIT, || async { world.instance_routes().await == expected }).await,
        "routes: want {expected:?}, have {:?}",
        world.instance_routes().await
    );

    s.nodes()
        .delete(&names[0], &DeleteParams::default())
        .await
        .unwrap();
    let expected: BTreeSet<_> = [route(1)].into();
    assert!(
        eventually(WAIT, || async { world.instance_routes().await == expected }).await,
        "routes after the Node left: want {expected:?}, have {:?}",
        world.instance_routes().await
    );
    harness.stop().await.unwrap();
    s.cluster.cleanup().await;
}

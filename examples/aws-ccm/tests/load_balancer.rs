//! The load-balancer capability against moto, called directly: a delete that stopped half-way
//! (the load balancer gone, its target groups left) is still reported by `get_load_balancer`,
//! so that the service controller, which deletes only what `get_load_balancer` reports (as
//! Go's does), finishes it; the internal class's load balancers (scheme `internal`, in
//! `internalSubnets`) beside those of Services without a class; and an existing load balancer
//! of the other scheme left alone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;

use aws_ccm::INTERNAL_NLB_CLASS;
use ccm_core::{
    CloudError, CloudProvider, LoadBalancer, LoadBalancerStatus, NodeView, Service,
    default_load_balancer_name,
};
use ccm_testing::builders::load_balancer_service;
use support::world::{World, instance_ids, node_with_id};

/// A LoadBalancer Service with ports 80 and 443 on NodePorts `31000 + 10 * n` and up, the UID
/// `<n>d2c3b4a-...` and `class`.
fn service(name: &str, n: u8, class: Option<&str>) -> Service {
    let mut service = load_balancer_service("default", name).build();
    // The load balancer's name is the UID's first 31 characters: they differ.
    service.metadata.uid = Some(format!("{n}d2c3b4a-0000-4000-8000-00000000b001"));
    let spec = service.spec.as_mut().unwrap();
    spec.load_balancer_class = class.map(str::to_owned);
    for (i, port) in spec.ports.as_mut().unwrap().iter_mut().enumerate() {
        port.node_port = Some(31000 + 10 * i32::from(n) + i as i32);
    }
    service
}

/// `ensure_load_balancer` until it stops answering `Retry` (the NLB provisioning).
async fn ensure(
    lb: &dyn LoadBalancer,
    cluster: &str,
    service: &Service,
    hosts: &[NodeView],
) -> Result<LoadBalancerStatus, CloudError> {
    loop {
        match lb.ensure_load_balancer(cluster, service, hosts).await {
            Err(e) if e.retry_after().is_some() => {}
            answer => return answer,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lingering_target_groups_keep_the_load_balancer_reported_until_deleted() {
    let world = World::new("half-deleted").await;
    let instances = world.launch(1).await;
    let hosts = vec![NodeView::from(node_with_id(&instances[0]))];
    let service = service("web", 1, None);
    let lb = world.cloud.load_balancer().unwrap();
    let cluster = world.cluster.clone();
    ensure(lb, &cluster, &service, &hosts).await.unwrap();
    assert_eq!(
        world.tagged_elb_resources().await.len(),
        5,
        "a load balancer, 2 target groups, 2 listeners"
    );

    // Half a delete: the load balancer (and its listeners) gone, the target groups left.
    let name = default_load_balancer_name(&service);
    let lbs = world
        .elb
        .describe_load_balancers()
        .names(&name)
        .send()
        .await
        .unwrap();
    let arn = lbs.load_balancers()[0]
        .load_balancer_arn()
        .unwrap()
        .to_owned();
    world
        .elb
        .delete_load_balancer()
        .load_balancer_arn(arn)
        .send()
        .await
        .unwrap();
    assert_eq!(world.tagged_elb_resources().await.len(), 2);

    assert!(
        lb.get_load_balancer(&cluster, &service)
            .await
            .unwrap()
            .is_some(),
        "lingering target groups: the load balancer still exists for the service controller"
    );
    lb.ensure_load_balancer_deleted(&cluster, &service)
        .await
        .unwrap();
    assert!(world.tagged_elb_resources().await.is_empty());
    assert!(
        lb.get_load_balancer(&cluster, &service)
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_internal_class_gets_internal_nlbs_in_its_own_subnets() {
    let world = World::new("internal-nlb").await;
    let instances = world.launch(2).await;
    let ids: BTreeSet<String> = instance_ids(&instances).collect();
    let hosts: Vec<NodeView> = instances
        .iter()
        .map(|i| NodeView::from(node_with_id(i)))
        .collect();
    let cluster = world.cluster.clone();
    let classes = world.cloud.load_balancer_classes();
    assert_eq!(
        classes.entries().collect::<Vec<_>>(),
        [None, Some(INTERNAL_NLB_CLASS)]
    );
    let public_lbs = world.cloud.load_balancer_for_class(None).unwrap();
    let internal_lbs = world
        .cloud
        .load_balancer_for_class(Some(INTERNAL_NLB_CLASS))
        .unwrap();
    let public = service("public", 1, None);
    let internal = service("internal", 2, Some(INTERNAL_NLB_CLASS));
    let (public_name, internal_name) = (
        default_load_balancer_name(&public),
        default_load_balancer_name(&internal),
    );

    ensure(public_lbs, &cluster, &public, &hosts).await.unwrap();
    let status = ensure(internal_lbs, &cluster, &internal, &hosts)
        .await
        .unwrap();
    let lb = world.load_balancer(&internal_name).await.unwrap();
    assert_eq!(
        status.ingress.unwrap()[0].hostname.as_deref(),
        lb.dns_name(),
        "the internal NLB's DNS name is the ingress hostname"
    );
    let internal_subnets = world.config.internal_load_balancer_subnets().to_vec();
    assert_ne!(internal_subnets, world.config.subnets);
    assert_eq!(
        world.placement_of(&internal_name).await,
        Some(("internal".to_owned(), internal_subnets))
    );
    assert_eq!(
        world.placement_of(&public_name).await,
        Some(("internet-facing".to_owned(), world.config.subnets.clone()))
    );
    assert_eq!(
        world.targets_of(&internal_name).await,
        Some(vec![(80, ids.clone()), (443, ids.clone())])
    );
    let both = world.tagged_elb_resources().await;
    assert_eq!(
        both.len(),
        10,
        "2 load balancers, 4 target groups, 4 listeners"
    );

    // The hosts batch of the class updates its load balancers.
    let batch = world
        .cloud
        .load_balancer_hosts_batch_for_class(Some(INTERNAL_NLB_CLASS))
        .unwrap();
    let answers = batch
        .update_load_balancer_hosts(&cluster, &[internal.clone().into()], &hosts[..1])
        .await
        .unwrap();
    assert!(answers["default/internal"].is_ok(), "{answers:?}");
    let first: BTreeSet<String> = [instances[0].instance_id().unwrap().to_owned()].into();
    assert_eq!(
        world.targets_of(&internal_name).await,
        Some(vec![(80, first.clone()), (443, first)])
    );
    assert_eq!(
        world.targets_of(&public_name).await,
        Some(vec![(80, ids.clone()), (443, ids)]),
        "the other class's load balancer is not touched"
    );

    // Deleting the internal Service's load balancer leaves the other one whole.
    internal_lbs
        .ensure_load_balancer_deleted(&cluster, &internal)
        .await
        .unwrap();
    assert!(world.load_balancer(&internal_name).await.is_none());
    let left = world.tagged_elb_resources().await;
    assert_eq!(left.len(), 5, "{left:?}");
    assert!(left.is_subset(&both));
    assert!(world.load_balancer(&public_name).await.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_balancer_of_the_other_scheme_is_never_used() {
    let world = World::new("scheme-kept").await;
    let instances = world.launch(1).await;
    let hosts = vec![NodeView::from(node_with_id(&instances[0]))];
    let cluster = world.cluster.clone();
    let public_lbs = world.cloud.load_balancer_for_class(None).unwrap();
    let internal_lbs = world
        .cloud
        .load_balancer_for_class(Some(INTERNAL_NLB_CLASS))
        .unwrap();
    // An internet-facing NLB made for the Service (say before an operator mapped its class to
    // the internal implementation with --load-balancer-classes).
    let service = service("moved", 3, Some(INTERNAL_NLB_CLASS));
    let name = default_load_balancer_name(&service);
    ensure(public_lbs, &cluster, &service, &hosts)
        .await
        .unwrap();
    let before = world.tagged_elb_resources().await;

    let err = ensure(internal_lbs, &cluster, &service, &hosts)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!(
            "load balancer {name} of default/moved is internet-facing"
        )) && err.contains("cannot change the scheme"),
        "{err}"
    );
    assert_eq!(
        world.tagged_elb_resources().await,
        before,
        "nothing changed"
    );
    assert_eq!(
        world.placement_of(&name).await.map(|(scheme, _)| scheme),
        Some("internet-facing".to_owned())
    );
    // It is still the Service's: reported, and deleted by either implementation.
    assert!(
        internal_lbs
            .get_load_balancer(&cluster, &service)
            .await
            .unwrap()
            .is_some()
    );
    internal_lbs
        .ensure_load_balancer_deleted(&cluster, &service)
        .await
        .unwrap();
    assert!(world.tagged_elb_resources().await.is_empty());
}

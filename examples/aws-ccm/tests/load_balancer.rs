//! The load-balancer capability against moto, called directly: a delete that stopped half-way
//! (the load balancer gone, its target groups left) is still reported by `get_load_balancer`,
//! so that the service controller, which deletes only what `get_load_balancer` reports (as
//! Go's does), finishes it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use ccm_core::{LoadBalancer, NodeView, default_load_balancer_name};
use ccm_testing::builders::load_balancer_service;
use support::world::{World, node_with_id};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lingering_target_groups_keep_the_load_balancer_reported_until_deleted() {
    let world = World::new("half-deleted").await;
    let instances = world.launch(1).await;
    let hosts = vec![NodeView::from(node_with_id(&instances[0]))];
    let mut service = load_balancer_service("default", "web").build();
    service.metadata.uid = Some("1d2c3b4a-0000-4000-8000-00000000b001".into());
    for (i, port) in service
        .spec
        .as_mut()
        .unwrap()
        .ports
        .as_mut()
        .unwrap()
        .iter_mut()
        .enumerate()
    {
        port.node_port = Some(31000 + i as i32);
    }
    let cloud = &world.cloud;
    let cluster = world.cluster.clone();
    let mut ensured = cloud.ensure_load_balancer(&cluster, &service, &hosts).await;
    while let Err(e) = &ensured {
        assert!(e.retry_after().is_some(), "{e}");
        ensured = cloud.ensure_load_balancer(&cluster, &service, &hosts).await;
    }
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
        cloud
            .get_load_balancer(&cluster, &service)
            .await
            .unwrap()
            .is_some(),
        "lingering target groups: the load balancer still exists for the service controller"
    );
    cloud
        .ensure_load_balancer_deleted(&cluster, &service)
        .await
        .unwrap();
    assert!(world.tagged_elb_resources().await.is_empty());
    assert!(
        cloud
            .get_load_balancer(&cluster, &service)
            .await
            .unwrap()
            .is_none()
    );
}

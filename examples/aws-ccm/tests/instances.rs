//! The instance capabilities against moto, called directly: lookups by provider ID and by
//! name, instance states, and the batch with many IDs per call, following `NextToken`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use aws_ccm::AwsCloud;
use ccm_core::{CloudError, InstanceAnswer, InstancesBatch, InstancesV2, Node, NodeView};
use support::world::{World, credentials, node_named, node_with_id, provider_id};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_lookups_by_provider_id_and_by_name() {
    let world = World::new("instances").await;
    let instances = world.launch(3).await;
    let (running, stopped, terminated) = (&instances[0], &instances[1], &instances[2]);
    world.stop(stopped.instance_id().unwrap()).await;
    world.terminate(terminated.instance_id().unwrap()).await;
    let cloud = &world.cloud;

    for node in [node_with_id(running), node_named(running)].map(NodeView::from) {
        let metadata = cloud.instance_metadata(&node).await.unwrap();
        assert_eq!(metadata.provider_id, provider_id(running));
        assert_eq!(
            (metadata.zone.as_str(), metadata.region.as_str()),
            ("us-east-1a", "us-east-1")
        );
        assert_eq!(metadata.instance_type, "t3.medium");
        assert!(cloud.instance_exists(&node).await.unwrap());
        assert!(!cloud.instance_shutdown(&node).await.unwrap());
    }
    for node in [node_with_id(stopped), node_named(stopped)].map(NodeView::from) {
        assert!(
            cloud.instance_exists(&node).await.unwrap(),
            "a stopped instance exists"
        );
        assert!(cloud.instance_shutdown(&node).await.unwrap());
    }
    for node in [node_with_id(terminated), node_named(terminated)].map(NodeView::from) {
        assert!(
            !cloud.instance_exists(&node).await.unwrap(),
            "a terminated instance is gone"
        );
        assert!(!cloud.instance_shutdown(&node).await.unwrap());
        assert!(matches!(
            cloud.instance_metadata(&node).await,
            Err(CloudError::InstanceNotFound)
        ));
    }
    let mut unknown = node_with_id(running);
    unknown.spec.as_mut().unwrap().provider_id =
        Some("aws:///us-east-1a/i-0000000000000dead".into());
    assert!(
        !cloud
            .instance_exists(&NodeView::from(unknown))
            .await
            .unwrap(),
        "InvalidInstanceID.NotFound is gone"
    );
    let mut nameless = Node::default();
    nameless.metadata.name = Some("ip-192-0-2-1.ec2.internal".into());
    assert!(
        !cloud
            .instance_exists(&NodeView::from(nameless))
            .await
            .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_batch_answers_many_nodes_across_pages() {
    let world = World::new("batch").await;
    // One RunInstances per instance: moto pages by reservation (AWS by instance).
    let mut instances = Vec::new();
    for _ in 0..12 {
        instances.extend(world.launch(1).await);
    }
    world.stop(instances[10].instance_id().unwrap()).await;
    world.terminate(instances[11].instance_id().unwrap()).await;
    // Pages of 5: the 12 instances by ID take three pages, one provider call.
    let cloud = AwsCloud::new(world.config.clone(), Some(credentials())).with_page_size(5);

    let mut nodes: Vec<NodeView> = instances[..9]
        .iter()
        .map(|i| NodeView::from(node_with_id(i)))
        .collect();
    nodes.push(NodeView::from(node_named(&instances[9]))); // by name
    nodes.push(NodeView::from(node_with_id(&instances[10])));
    nodes.push(NodeView::from(node_with_id(&instances[11])));
    let mut unknown = node_with_id(&instances[0]);
    unknown.metadata.name = Some("unknown".into());
    unknown.spec.as_mut().unwrap().provider_id =
        Some("aws:///us-east-1a/i-0000000000000dead".into());
    nodes.push(NodeView::from(unknown));

    let before = cloud.requests();
    let answers = cloud.describe_instances(&nodes).await.unwrap();
    let requests = cloud.requests() - before;
    // 11 IDs in pages of 5 (3 requests) + 1 name (1 request).
    assert_eq!(requests, 4, "one filtered DescribeInstances per page");
    for instance in &instances[..10] {
        let name = instance.private_dns_name().unwrap();
        match &answers[name] {
            InstanceAnswer::Found(metadata) => {
                assert_eq!(metadata.provider_id, provider_id(instance))
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    assert!(matches!(
        answers[instances[10].private_dns_name().unwrap()],
        InstanceAnswer::Shutdown(_)
    ));
    assert!(matches!(
        answers[instances[11].private_dns_name().unwrap()],
        InstanceAnswer::NotFound
    ));
    // An ID AWS does not return is unknown (left out), never NotFound.
    assert!(
        !answers.contains_key("unknown"),
        "{:?}",
        answers.get("unknown")
    );
    assert_eq!(answers.len(), 12);
}

//! The ccm-testing conformance suite against the provider on a real moto server, with both
//! load-balancer classes it declares.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use aws_ccm::target_groups::target_instances;
use ccm_core::default_load_balancer_name;
use ccm_testing::builders::load_balancer_service;
use ccm_testing::conformance::{Check, ConformanceInput, Suite};
use support::world::{World, node_with_id};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_keeps_the_provider_contract() {
    let world = World::new("conformance").await;
    let instances = world.launch(3).await;
    let stopped = &instances[2];
    world.stop(stopped.instance_id().unwrap()).await;
    let gone = world.launch(1).await;
    world.terminate(gone[0].instance_id().unwrap()).await;

    // Load balancer hosts are found by provider ID (lookups by name: tests/instances.rs).
    let existing = vec![node_with_id(&instances[0]), node_with_id(&instances[1])];
    let mut missing = node_with_id(&instances[0]);
    missing.metadata.name = Some("gone-1".into());
    missing.spec.as_mut().unwrap().provider_id =
        Some("aws:///us-east-1a/i-0000000000000dead".into());

    let mut service = load_balancer_service("default", "conformance-lb").build();
    service.metadata.uid = Some("6f1d3c2a-0000-4000-8000-00000000a001".into());
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
        port.node_port = Some(30080 + i as i32);
    }

    let by_id: Vec<(String, String)> = instances
        .iter()
        .map(|i| {
            (
                i.instance_id().unwrap().to_owned(),
                i.private_dns_name().unwrap().to_owned(),
            )
        })
        .collect();
    let elb = world.elb.clone();
    let input = ConformanceInput::new(world.cluster.clone(), existing)
        .missing_node(missing)
        .shutdown_node(node_with_id(stopped))
        .service(service)
        .route_cidr("10.244.250.0/24")
        .ipv6_route_cidr("fd00:10:244:fa::/64")
        .lb_hosts_probe(move |svc| {
            let elb = elb.clone();
            let by_id = by_id.clone();
            async move {
                let name = default_load_balancer_name(&svc);
                let lbs = elb
                    .describe_load_balancers()
                    .names(name)
                    .send()
                    .await
                    .ok()?;
                let arn = lbs
                    .load_balancers()
                    .first()?
                    .load_balancer_arn()?
                    .to_owned();
                let listeners = elb
                    .describe_listeners()
                    .load_balancer_arn(arn)
                    .send()
                    .await
                    .ok()?;
                let group = listeners
                    .listeners()
                    .first()?
                    .default_actions()
                    .first()?
                    .target_group_arn()?
                    .to_owned();
                let ids = target_instances(&elb, &group).await.ok()?;
                Some(
                    ids.iter()
                        .map(|id| {
                            by_id
                                .iter()
                                .find(|(i, _)| i == id)
                                .map(|(_, n)| n.clone())
                                .unwrap_or(id.clone())
                        })
                        .collect(),
                )
            }
        });
    let report = Suite::new(world.cloud.clone(), input).run().await;
    println!("{report}");
    report.assert_success();
    // The declaration check ran and passed: valid class names, an implementation for each
    // entry, and ensure, get and delete through the internal class's implementation.
    let classes = report.get(Check::LoadBalancerClassesDeclared).unwrap();
    assert!(classes.outcome.is_passed(), "{classes:?}");

    // The suite deleted what it created: nothing tagged with the cluster is left.
    assert_eq!(world.tagged_elb_resources().await, Default::default());
}

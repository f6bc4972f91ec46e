//! A silent partition on the cloud side (issue 42): the connection the AWS SDK uses to reach
//! the cloud is accepted but carries no byte and is never closed
//! (`ccm_testing::partition::PartitionProxy` in front of moto). The runtime's cloud-call budget
//! cuts the provider call at `--cloud-api-timeout`; once the path works again the next call is
//! answered.
//!
//! moto answers every request with `Connection: close`, so the SDK opens a connection per call
//! and there is no pooled connection to freeze: the proxy freezes the connections made while
//! the partition lasts (`set_freeze_new_connections`), which is what a call sees on a pooled
//! connection whose flow a NAT dropped: a request sent, no answer, no FIN, no RST.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_ccm::AwsCloud;
use ccm_controllers::{BudgetedProvider, MetricsRegistry, NoArgs, parse_flags};
use ccm_core::{CloudProvider, NodeView};
use ccm_testing::partition::PartitionProxy;
use support::world::{World, credentials, node_with_id, provider_id};

/// `--cloud-api-timeout` under test: short, so the test is quick, and well below the SDK's own
/// 30 s attempt timeout (`src/clients.rs`), so the cut seen is the budget's.
const CLOUD_API_TIMEOUT: &str = "2s";

/// The test fails if a call takes longer than this: generous against the 2 s bound on a loaded
/// machine, and below the SDK's 30 s attempt timeout, so that a call left to the SDK fails the
/// test instead of ending with the SDK's error.
const HANG: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cloud_call_on_a_frozen_connection_is_cut_at_the_cloud_api_timeout() {
    let world = World::new("partition").await;
    let instance = world.launch(1).await.remove(0);
    let node = NodeView::from(node_with_id(&instance));

    // The provider talks to moto through the proxy, wrapped in the budget as the runtime wraps
    // it, from the same flags.
    let proxy = PartitionProxy::start(&world.moto.url()).await.unwrap();
    let mut config = world.config.clone();
    config.endpoint_url = Some(proxy.url());
    let aws = Arc::new(AwsCloud::new(config, Some(credentials())));
    let flag = format!("--cloud-api-timeout={CLOUD_API_TIMEOUT}");
    let (options, _) = parse_flags::<NoArgs>(&["aws-ccm", "--cloud-provider=aws", &flag]).unwrap();
    let budget = options.budget_config();
    assert_eq!(budget.timeout, Some(Duration::from_secs(2)));
    let cloud = BudgetedProvider::new(aws.clone(), &budget, &MetricsRegistry::new());
    let instances = cloud.instances_v2().unwrap();

    // One answered call through the proxy: the path works.
    let metadata = tokio::time::timeout(HANG, instances.instance_metadata(&node))
        .await
        .expect("the call before the freeze hung")
        .unwrap();
    assert_eq!(metadata.provider_id, provider_id(&instance));
    let requests = aws.requests();

    // The partition: every connection made from now on is accepted and then silent.
    proxy.set_freeze_new_connections(true);

    // The next call is sent on a frozen connection: no answer ever comes, the budget drops the
    // call at --cloud-api-timeout with an error naming the operation and the flag.
    let start = Instant::now();
    let cut = tokio::time::timeout(HANG, instances.instance_metadata(&node))
        .await
        .expect("the call on the frozen connection hung past the bound");
    let elapsed = start.elapsed();
    let err = cut.expect_err("a frozen connection cannot answer");
    assert_eq!(
        err.to_string(),
        "cloud call instance_metadata timed out after 2s (--cloud-api-timeout)"
    );
    assert_eq!(
        aws.requests(),
        requests + 1,
        "the request was sent (into the frozen connection) once, not retried by the SDK"
    );
    eprintln!(
        "the call on a frozen connection was cut after {:.3} s (--cloud-api-timeout={CLOUD_API_TIMEOUT}); {} connection(s) frozen",
        elapsed.as_secs_f64(),
        proxy.frozen_connections()
    );

    assert!(
        proxy.frozen_connections() >= 1,
        "the cut call's connection reached the proxy and was frozen"
    );

    // The path works again: the next call opens a new connection and is answered; the frozen
    // one is not reused.
    proxy.set_freeze_new_connections(false);
    let start = Instant::now();
    let exists = tokio::time::timeout(HANG, instances.instance_exists(&node))
        .await
        .expect("the call after the cut hung")
        .unwrap();
    assert!(exists);
    eprintln!(
        "the next call was answered after {:.3} s over a new connection ({} open)",
        start.elapsed().as_secs_f64(),
        proxy.open_connections()
    );
}

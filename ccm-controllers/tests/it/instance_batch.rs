//! Controller tests of batched instance lookups (`InstancesBatch`): the cloud-node and
//! node-lifecycle controllers against the in-process API server (real HTTP, real watches) with
//! FakeCloud's `describe_instances` switched on, or against the real cluster named by
//! `CCM_TEST_KUBECONFIG` (the Nodes carry this test's run label; the informers are restricted
//! to it there). The cloud calls are counted from FakeCloud's call records.
//!
//! With the batch capability off the controllers make the single calls their own test modules
//! (`cloud_node`, `node_lifecycle`) check.

use std::sync::Arc;
use std::time::Duration;

use ccm_controllers::controllers::cloud_node::CloudNodeConfig;
use ccm_controllers::controllers::node_lifecycle::NodeLifecycleConfig;
use ccm_core::well_known::{TAINT_SHUTDOWN, TAINT_UNINITIALIZED};
use ccm_core::{
    CloudProvider, CloudResult, InstanceAnswers, InstancesBatch, InstancesV2, Node, NodeView,
    async_trait,
};
use ccm_testing::builders::kubelet_node;
use ccm_testing::fake_cloud::{FakeCloud, Fault};
use ccm_testing::wait::{eventually, wait_for, wait_for_deletion};

use crate::support::node::{TIMEOUT, Test, addresses, has_taint, quiet_cloud_node_config};

/// The lifecycle controller, checking every 200 ms and deleting on the first "gone" answer
/// (Go's rule): the strictest setting for a Node that must not be deleted.
fn strict_lifecycle_config() -> NodeLifecycleConfig {
    {
        let mut config = NodeLifecycleConfig::default();
        config.monitor_period = Duration::from_millis(200);
        config.deletion_grace_period = Duration::ZERO;
        config
    }
}

/// The node counts of FakeCloud's `describe_instances` calls, in order.
fn batch_sizes(fake: &FakeCloud) -> Vec<usize> {
    fake.calls_of("describe_instances")
        .iter()
        .map(|c| c.node_names().len())
        .collect()
}

/// A provider wrapping FakeCloud whose batch answers leave out the Nodes named in `drop`
/// (as a cloud that pages its answers or skips unknown IDs silently).
struct Dropping {
    fake: FakeCloud,
    drop: Vec<String>,
}

#[async_trait]
impl CloudProvider for Dropping {
    fn provider_name(&self) -> &str {
        "fake"
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        self.fake.instances_v2()
    }
    fn instances_batch(&self) -> Option<&dyn InstancesBatch> {
        Some(self)
    }
}

#[async_trait]
impl InstancesBatch for Dropping {
    fn max_batch_size(&self) -> usize {
        self.fake.instances_batch().unwrap().max_batch_size()
    }
    async fn describe_instances(&self, nodes: &[NodeView]) -> CloudResult<InstanceAnswers> {
        let mut answers = self
            .fake
            .instances_batch()
            .unwrap()
            .describe_instances(nodes)
            .await?;
        answers.retain(|name, _| !self.drop.contains(name));
        Ok(answers)
    }
}

#[tokio::test]
async fn an_initialisation_burst_costs_one_describe_call_per_max_batch_size_nodes() {
    let t = Test::start().await;
    let fake = FakeCloud::builder()
        .instances_batch(true)
        .max_batch_size(10)
        .build();
    let names: Vec<String> = (0..25).map(|i| t.name(&format!("burst{i}"))).collect();
    for name in &names {
        t.create(&t.registered_node(name).build()).await;
    }
    let running = t
        .run_cloud_node(fake.provider(), quiet_cloud_node_config())
        .await;
    for name in &names {
        t.wait_initialized(name).await;
    }
    let sizes = batch_sizes(&fake);
    assert_eq!(fake.call_count("instance_metadata"), 0, "no single lookups");
    assert_eq!(
        sizes.iter().sum::<usize>(),
        25,
        "each Node asked once: {sizes:?}"
    );
    assert!(
        sizes.iter().all(|s| *s <= 10),
        "max_batch_size honoured: {sizes:?}"
    );
    // ceil(25 / 10) = 3 calls; one more only if a worker picked its Node up after the 100 ms
    // window of the batch before had closed (a loaded machine).
    assert!(
        (3..=4).contains(&sizes.len()),
        "describe_instances calls: {sizes:?}"
    );
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn a_retry_of_the_batch_call_delays_every_node_of_it() {
    let t = Test::start().await;
    let fake = FakeCloud::builder().instances_batch(true).build();
    fake.inject(
        "describe_instances",
        Fault::Retry {
            after: Duration::from_secs(3),
            count: 1,
        },
    );
    let names: Vec<String> = (0..5).map(|i| t.name(&format!("retry{i}"))).collect();
    for name in &names {
        t.create(&t.registered_node(name).build()).await;
    }
    let running = t
        .run_cloud_node(fake.provider(), quiet_cloud_node_config())
        .await;
    assert!(
        eventually(TIMEOUT, || async {
            fake.call_count("describe_instances") >= 1
        })
        .await
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Nobody was asked alone meanwhile, and every Node still waits.
    assert_eq!(fake.call_count("describe_instances"), 1);
    assert_eq!(fake.call_count("instance_metadata"), 0);
    for name in &names {
        let node = t.nodes.get(name).await.unwrap();
        assert!(
            has_taint(&node, TAINT_UNINITIALIZED),
            "{name} initialised too early"
        );
    }
    for name in &names {
        t.wait_initialized(name).await;
    }
    assert_eq!(fake.call_count("instance_metadata"), 0);
    for name in &names {
        assert!(
            !t.events(name).await.iter().any(|e| e.1 == "SyncFailed"),
            "no Warning for a Retry"
        );
    }
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn a_node_missing_from_the_batch_answer_is_asked_alone_at_initialisation() {
    let t = Test::start().await;
    let fake = FakeCloud::builder().instances_batch(true).build();
    let (kept, dropped) = (t.name("answered"), t.name("dropped"));
    t.create(&t.registered_node(&kept).build()).await;
    t.create(&t.registered_node(&dropped).build()).await;
    let cloud = Arc::new(Dropping {
        fake: fake.clone(),
        drop: vec![dropped.clone()],
    });
    let running = t.run_cloud_node(cloud, quiet_cloud_node_config()).await;
    t.wait_initialized(&kept).await;
    t.wait_initialized(&dropped).await;
    let singles: Vec<String> = fake
        .calls_of("instance_metadata")
        .iter()
        .flat_map(|c| {
            c.node_names()
                .into_iter()
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        singles,
        vec![dropped.clone()],
        "only the unknown Node is asked alone"
    );
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn describe_not_implemented_falls_back_to_single_calls_for_good() {
    let t = Test::start().await;
    let fake = FakeCloud::builder().instances_batch(true).build();
    fake.inject("describe_instances", Fault::NotImplemented);
    let names: Vec<String> = (0..4).map(|i| t.name(&format!("single{i}"))).collect();
    for name in &names[..2] {
        t.create(&t.registered_node(name).build()).await;
    }
    let running = t
        .run_cloud_node(fake.provider(), quiet_cloud_node_config())
        .await;
    for name in &names[..2] {
        t.wait_initialized(name).await;
    }
    for name in &names[2..] {
        t.create(&t.registered_node(name).build()).await;
    }
    for name in &names[2..] {
        t.wait_initialized(name).await;
    }
    assert_eq!(fake.call_count("instance_metadata"), 4);
    assert_eq!(
        fake.call_count("describe_instances"),
        1,
        "not asked again once NotImplemented"
    );
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn the_periodic_address_refresh_asks_in_batches() {
    let t = Test::start().await;
    let fake = FakeCloud::builder()
        .instances_batch(true)
        .max_batch_size(4)
        .build();
    let names: Vec<String> = (0..6).map(|i| t.name(&format!("refresh{i}"))).collect();
    let mut expected = Vec::new();
    for name in &names {
        let probe = kubelet_node(name).build();
        let meta = fake
            .instances_v2()
            .unwrap()
            .instance_metadata(&ccm_core::NodeView::from_node(&probe))
            .await
            .unwrap();
        expected.push(
            meta.node_addresses
                .into_iter()
                .map(|a| (a.type_, a.address))
                .collect::<Vec<_>>(),
        );
        t.create(&t.initialized_node(name).build()).await;
    }
    fake.reset_calls();
    let running = t
        .run_cloud_node(fake.provider(), {
            let mut config = CloudNodeConfig::default();
            config.status_update_frequency = Duration::from_millis(500);
            config
        })
        .await;
    for (name, want) in names.iter().zip(&expected) {
        wait_for(&t.nodes, name, TIMEOUT, |n: &Node| addresses(n) == *want)
            .await
            .unwrap();
    }
    // Two periods: each asks all 6 Nodes in ceil(6 / 4) = 2 calls, none alone.
    assert!(
        eventually(TIMEOUT, || async {
            fake.call_count("describe_instances") >= 4
        })
        .await
    );
    assert_eq!(fake.call_count("instance_metadata"), 0);
    let sizes = batch_sizes(&fake);
    assert!(sizes.iter().all(|s| *s <= 4), "{sizes:?}");
    if !t.cluster.is_real() {
        // Only this test's Nodes exist: each period is one call of 4 and one of 2.
        let mut first_period = sizes[..2].to_vec();
        first_period.sort_unstable();
        assert_eq!(first_period, vec![2, 4]);
    }
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

#[tokio::test]
async fn lifecycle_checks_in_batches_and_never_deletes_a_node_missing_from_the_answer() {
    let t = Test::start().await;
    let (gone, stopped, running_name, dropped) = (
        t.name("gone"),
        t.name("stopped"),
        t.name("running"),
        t.name("dropped"),
    );
    // `dropped`'s instance is gone too, but the batch answer leaves it out: unknown, kept.
    let fake = FakeCloud::builder()
        .instances_batch(true)
        .missing_node(&gone)
        .missing_node(&dropped)
        .shutdown_node(&stopped)
        .build();
    for name in [&gone, &stopped, &running_name, &dropped] {
        t.create(&t.initialized_node(name).not_ready().build())
            .await;
    }
    let cloud = Arc::new(Dropping {
        fake: fake.clone(),
        drop: vec![dropped.clone()],
    });
    let running = t.run_lifecycle(cloud, strict_lifecycle_config()).await;

    wait_for_deletion(&t.nodes, &gone, TIMEOUT).await.unwrap();
    wait_for(&t.nodes, &stopped, TIMEOUT, |n: &Node| {
        has_taint(n, TAINT_SHUTDOWN)
    })
    .await
    .unwrap();
    let calls = fake.call_count("describe_instances");
    assert!(
        eventually(TIMEOUT, || async {
            fake.call_count("describe_instances") >= calls + 3
        })
        .await
    );
    assert!(
        t.nodes.get(&dropped).await.is_ok(),
        "a Node missing from the answer was deleted"
    );
    let running_node = t.nodes.get(&running_name).await.unwrap();
    assert!(!has_taint(&running_node, TAINT_SHUTDOWN));
    for op in ["instance_exists", "instance_shutdown", "instance_metadata"] {
        assert_eq!(
            fake.call_count(op),
            0,
            "{op} called: the checks are batched"
        );
    }
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

/// Issue 25: a refresh pass that cannot fit the period says so while it runs. 20 Nodes, one
/// address refresh at a time, 1 s per `instance_metadata`: a pass takes at least 20 s against
/// a 2 s period. The gauge shows the stretched period (the pass's time so far) from the first
/// check after the period (5 s into the pass), while some of the Nodes have not been asked
/// yet, not only when the pass ends (at 100,000 Nodes under a quota that would be after 83
/// minutes).
#[tokio::test]
async fn a_refresh_pass_past_the_period_shows_the_stretched_period_while_it_runs() {
    let t = Test::start().await;
    let names: Vec<String> = (0..20).map(|i| t.name(&format!("slow{i}"))).collect();
    for name in &names {
        t.create(&t.initialized_node(name).build()).await;
    }
    let fake = FakeCloud::builder()
        .operation_latency("instance_metadata", Duration::from_secs(1))
        .build();
    let running = t
        .run_cloud_node(fake.provider(), {
            let mut config = CloudNodeConfig::default();
            config.status_update_frequency = Duration::from_secs(2);
            config.status_update_workers = 1;
            config
        })
        .await;
    let period = |text: &str| -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with("node_controller_address_refresh_period_seconds "))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    };
    // Registered when the controller starts.
    assert!(
        eventually(TIMEOUT, || async { period(&running.metrics()).is_some() }).await,
        "no refresh period gauge"
    );
    let asked = || {
        fake.call_log()
            .into_iter()
            .filter(|c| c.operation == "instance_metadata" && names.contains(&c.subject))
            .count()
    };
    assert!(
        eventually(TIMEOUT, || async {
            period(&running.metrics()).is_some_and(|p| p > 2.0)
        })
        .await,
        "the gauge never showed a stretched period"
    );
    let stretched = period(&running.metrics()).unwrap_or_default();
    let asked_then = asked();
    assert!(
        asked_then < names.len(),
        "the period showed {stretched} s only after all {asked_then} Nodes were asked: the pass had ended"
    );
    // The pass's time at the first check: 5 s.
    assert!(stretched >= 5.0, "{stretched}");
    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

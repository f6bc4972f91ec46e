//! Service controller: node sync through the provider's `LoadBalancerHostsBatch` (issue 19
//! item 4): the hosts of many load balancers per `update_load_balancer_hosts` call, a `Retry`
//! of a whole batch delaying the pass, and the fall-back to one `update_load_balancer` per load
//! balancer when the batch is not implemented or fails.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ccm_testing::TestCluster;
use ccm_testing::fake_cloud::{FakeCloud, Fault};
use ccm_testing::harness::ControllerHarness;

use crate::support::service::*;

/// At most this many Services per `update_load_balancer_hosts` call.
const MAX_BATCH: usize = 3;

/// A FakeCloud offering the batch, the service controller on it, and 5 LoadBalancer Services
/// with their ingress. Returns the keys of the Services.
async fn batched(
    cluster: &TestCluster,
    ns: &str,
    fake: &FakeCloud,
) -> (ControllerHarness, Vec<String>) {
    let running = start(cluster, ns, fake.provider(), test_config()).await;
    let keys = lb_services(cluster, ns, 5).await;
    (running, keys)
}

fn batch_cloud() -> FakeCloud {
    FakeCloud::builder()
        .load_balancer_hosts_batch(true)
        .max_batch_size(MAX_BATCH)
        .build()
}

/// Waits until every load balancer of `keys` has every Node of `nodes`.
async fn every_lb_has(fake: &FakeCloud, keys: &[String], nodes: &[&String]) {
    wait_until("every load balancer has the joined nodes", || async {
        let lbs = fake.load_balancers();
        keys.iter().all(|k| {
            lbs.get(k)
                .is_some_and(|lb| nodes.iter().all(|n| lb.hosts.contains(n)))
        })
    })
    .await;
}

/// The Services of our load balancers named in the `op` calls since the last reset.
fn ours_in(fake: &FakeCloud, op: &str, keys: &[String]) -> Vec<Vec<String>> {
    fake.call_log()
        .into_iter()
        .filter(|c| c.operation == op)
        .map(|c| {
            c.services()
                .into_iter()
                .filter(|s| keys.iter().any(|k| k == s))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|s| !s.is_empty())
        .collect()
}

#[tokio::test]
async fn a_join_updates_the_load_balancers_in_batches_of_max_batch_size() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = batch_cloud();
    let (running, keys) = batched(&cluster, &ns, &fake).await;
    fake.reset_calls();
    let node = cluster.unique_name("n");
    create_node(&cluster, &node).await;
    every_lb_has(&fake, &keys, &[&node]).await;
    assert!(
        ours_in(&fake, "update_load_balancer", &keys).is_empty(),
        "no single update while the batch works"
    );
    let batches = fake
        .call_log()
        .into_iter()
        .filter(|c| c.operation == "update_load_balancer_hosts")
        .collect::<Vec<_>>();
    for call in &batches {
        let services = call.services();
        assert!((1..=MAX_BATCH).contains(&services.len()), "{services:?}");
        let distinct: BTreeSet<&str> = services.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            services.len(),
            "a Service twice in {services:?}"
        );
        assert!(
            call.hosts().is_some_and(|h| h.contains(&node)),
            "every batch carries the joined node"
        );
    }
    // 5 load balancers, at most 3 per call: 2 calls for the join. (A real cluster's own Node
    // changes may add passes; each still covers every load balancer in 2 calls.)
    let ours = ours_in(&fake, "update_load_balancer_hosts", &keys);
    let named: usize = ours.iter().map(Vec::len).sum();
    assert!(ours.len() >= 2 && named >= keys.len(), "{ours:?}");
    for k in &keys {
        let name = k.rsplit('/').next().unwrap_or_default();
        wait_event(&cluster, &ns, name, "UpdatedLoadBalancer").await;
    }
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

/// Issue 25: when the batch carries every load balancer in a few calls (5 load balancers, 3 per
/// call: 2 calls a pass), joins do not widen the addition window: a Node joining every second
/// against the 300 ms base window (1,200 ms maximum) gets a pass of its own, 8 passes for 8
/// joins, where the widening window would group them into 5 (300, 600, then 1,200 ms windows).
/// A real cluster's own Node changes may add passes, never remove one.
#[tokio::test]
async fn cheap_batched_passes_keep_the_base_window_for_every_join() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = batch_cloud();
    let (running, keys) = batched(&cluster, &ns, &fake).await;
    fake.reset_calls();
    let joins: Vec<String> = (0..8).map(|_| cluster.unique_name("join")).collect();
    for (i, node) in joins.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        create_node(&cluster, node).await;
    }
    let all: Vec<&String> = joins.iter().collect();
    every_lb_has(&fake, &keys, &all).await;
    let ours = ours_in(&fake, "update_load_balancer_hosts", &keys);
    for k in &keys {
        let passes = ours.iter().filter(|s| s.contains(k)).count();
        assert!(
            passes >= 7,
            "{k}: {passes} batched updates for 8 joins 1 s apart (widening gives 5)"
        );
    }
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

#[tokio::test]
async fn a_batch_answered_retry_resumes_the_node_sync_after_its_delay() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = batch_cloud();
    let (running, keys) = batched(&cluster, &ns, &fake).await;
    fake.reset_calls();
    fake.inject(
        "update_load_balancer_hosts",
        Fault::Retry {
            after: Duration::from_secs(3),
            count: 1,
        },
    );
    let joined = Instant::now();
    let node = cluster.unique_name("n");
    create_node(&cluster, &node).await;
    every_lb_has(&fake, &keys, &[&node]).await;
    assert!(
        joined.elapsed() >= Duration::from_secs(3),
        "the pass resumed before the provider's delay"
    );
    // The whole batch waited: no load balancer was sent alone, none was fully re-ensured.
    assert!(ours_in(&fake, "update_load_balancer", &keys).is_empty());
    assert!(ours_in(&fake, "ensure_load_balancer", &keys).is_empty());
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

#[tokio::test]
async fn not_implemented_batch_falls_back_to_single_updates_for_good() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = batch_cloud();
    fake.inject("update_load_balancer_hosts", Fault::NotImplemented);
    // No reset of the call counts: on a real cluster another Node change may start the pass
    // that meets NotImplemented before ours does; either way it is asked exactly once.
    let (running, keys) = batched(&cluster, &ns, &fake).await;
    let first = cluster.unique_name("n");
    create_node(&cluster, &first).await;
    every_lb_has(&fake, &keys, &[&first]).await;
    let second = cluster.unique_name("n");
    create_node(&cluster, &second).await;
    every_lb_has(&fake, &keys, &[&first, &second]).await;
    assert_eq!(
        fake.call_count("update_load_balancer_hosts"),
        1,
        "asked once, then never again"
    );
    for k in &keys {
        let singles = ours_in(&fake, "update_load_balancer", &keys)
            .into_iter()
            .filter(|s| s.contains(k))
            .count();
        // At least one per join (more when other Nodes of a real cluster change meanwhile).
        assert!(singles >= 1, "{k}: no single update");
    }
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

#[tokio::test]
async fn a_failed_batch_updates_its_load_balancers_one_by_one() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = batch_cloud();
    let (running, keys) = batched(&cluster, &ns, &fake).await;
    fake.reset_calls();
    fake.inject("update_load_balancer_hosts", Fault::FailNext(1));
    let node = cluster.unique_name("n");
    create_node(&cluster, &node).await;
    every_lb_has(&fake, &keys, &[&node]).await;
    let singles: usize = ours_in(&fake, "update_load_balancer", &keys)
        .iter()
        .map(Vec::len)
        .sum();
    // The failed batch's load balancers (up to 3) went out alone; the others in a batch.
    assert!(
        (1..=MAX_BATCH).contains(&singles),
        "{singles} single updates"
    );
    assert!(fake.call_count("update_load_balancer_hosts") >= 2);
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

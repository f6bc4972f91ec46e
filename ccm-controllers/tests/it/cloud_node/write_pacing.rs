//! Initialisation writes that give way while the API server queues (issue 43): fewer in flight
//! while its answers are slow, every Node still initialised, and the width back when it is
//! quick again (`machinery/write_pacing`).

use std::time::Duration;

use ccm_testing::fake_cloud::FakeCloud;

use crate::support::node::{Test, quiet_cloud_node_config};
use crate::support::service::metric_value;

const LIMIT: &str = "node_controller_initialization_writes_limit";

#[tokio::test]
async fn initialisation_writes_narrow_while_the_api_server_is_slow_and_widen_after() {
    let t = Test::start().await;
    let Some(server) = t.cluster.api_server() else {
        return; // slows the in-process API server down
    };
    let fake = FakeCloud::default();
    let running = t
        .run_cloud_node(fake.provider(), {
            let mut config = quiet_cloud_node_config();
            config.workers = 8;
            config
        })
        .await;
    let limit = || metric_value(&running.metrics(), LIMIT);

    // A Node joins a quiet cluster: its writes are the baseline; one at a time does not widen
    // the limit from its start of 4.
    let quiet = t.name("pace-quiet");
    t.create(&t.registered_node(&quiet).build()).await;
    t.wait_initialized(&quiet).await;
    assert_eq!(limit(), 4.0);

    // The API server queues: every answer takes 300 ms. The writes narrow to one at a time
    // with a gap after each, and every Node is still initialised.
    server.set_latency(Duration::from_millis(300));
    let slow: Vec<String> = (0..4).map(|i| t.name(&format!("pace-slow{i}"))).collect();
    for name in &slow {
        t.create(&t.registered_node(name).build()).await;
    }
    for name in &slow {
        t.wait_initialized(name).await;
    }
    assert!(
        limit() < 1.0,
        "one initialisation writing at a time, part of the time, while the server is slow: {}",
        limit()
    );

    // Quick again: a burst of Nodes widens the limit as its writes wait for the one slot.
    server.set_latency(Duration::ZERO);
    let burst: Vec<String> = (0..12).map(|i| t.name(&format!("pace-burst{i}"))).collect();
    let nodes: Vec<_> = burst.iter().map(|n| t.registered_node(n).build()).collect();
    futures::future::join_all(nodes.iter().map(|n| t.create(n))).await;
    for name in &burst {
        t.wait_initialized(name).await;
    }
    assert!(limit() > 1.0, "the limit widens again: {}", limit());

    running.stop().await.unwrap();
    t.cluster.cleanup().await;
}

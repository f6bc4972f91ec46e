//! Runs the quickstart's play with small numbers and checks the final state, so the README's
//! first command cannot silently break.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use quickstart::{PlayOptions, Silent, play};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_play_ends_in_the_expected_state() {
    let options = PlayOptions {
        nodes: 6,
        services: 3,
        leaving: 2,
        latency: Duration::from_millis(1),
        kubeconfig: None,
        phase_timeout: Duration::from_secs(60),
    };
    let report = play(&options, &Silent).await.unwrap();
    assert!(report.is_success(), "{}", report.render());
    assert_eq!(report.nodes_initialised, 4);
    assert_eq!(report.nodes_deleted, 2);
    assert_eq!(report.routes.len(), 4);
    assert_eq!(report.network_available, 4);
    assert_eq!(report.load_balancers.len(), 2);
    assert!(
        report
            .load_balancers
            .values()
            .all(|(ingress, hosts)| ingress.starts_with("198.18.") && *hosts == 4)
    );
    assert_eq!(
        report
            .sample_labels
            .get("topology.kubernetes.io/zone")
            .map(String::as_str),
        Some("zone-a")
    );
    assert!(report.sample_provider_id.starts_with("fake://"));
    assert_eq!(
        report.cloud_calls.get("ensure_load_balancer_deleted"),
        Some(&1)
    );
    assert_eq!(report.ccm_exit_code, 0);
}

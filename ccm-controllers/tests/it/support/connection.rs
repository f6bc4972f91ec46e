//! How a whole runtime under test reaches the test's cluster.

use ccm_testing::TestCluster;

/// The runtime's connection flag for `cluster`: `--master=<url>` of the in-process API server,
/// or `--kubeconfig=<$CCM_TEST_KUBECONFIG>` for a real cluster.
pub(crate) fn connection_flag(cluster: &TestCluster) -> String {
    match cluster.api_server() {
        Some(server) => format!("--master={}", server.url()),
        None => format!(
            "--kubeconfig={}",
            std::env::var(ccm_testing::KUBECONFIG_ENV).unwrap()
        ),
    }
}

//! The template of a cloud-controller-manager binary: copy this file into your own crate.
//!
//! 1. Make your provider's registration part of the binary. Here the provider `fake`
//!    (`FakeCloud`, configured from the `--cloud-config` file) is registered right here; when
//!    your provider registers itself in its own crate, replace the macro call with
//!    `use your_provider_crate as _;` so the linker keeps that crate and its registration.
//! 2. Call `ccm_controllers::run()`: it parses the same flags a Go CCM takes, builds the
//!    provider named by `--cloud-provider`, and runs the controllers until SIGTERM.
//!
//! Run it against any cluster:
//! `cargo run -p fake-ccm -- --kubeconfig ~/.kube/config --cloud-provider=fake
//! --cloud-config=examples/fake-ccm/fake-cloud.yaml --leader-elect=false`

use std::sync::Arc;

use ccm_core::{BoxError, CloudProvider};
use ccm_testing::fake_cloud::FakeCloud;

ccm_core::register_cloud_provider!("fake", FakeCloud::from_cloud_config);

/// A second fake cloud, `fake-b` (provider IDs `fake-b://<node>`), to play another cloud in the
/// same cluster: two fake-ccm processes, one per cloud, each manage only their own Nodes
/// (docs/running.md, "Two cloud-controller-managers in one cluster"). Your binary registers
/// only your provider.
fn fake_b(cloud_config: Option<&[u8]>) -> Result<Arc<dyn CloudProvider>, BoxError> {
    FakeCloud::from_cloud_config_as("fake-b", cloud_config)
}

ccm_core::register_cloud_provider!("fake-b", fake_b);

fn main() -> std::process::ExitCode {
    ccm_controllers::run()
}

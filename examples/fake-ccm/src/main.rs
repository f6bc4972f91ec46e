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

use ccm_testing::fake_cloud::FakeCloud;

ccm_core::register_cloud_provider!("fake", FakeCloud::from_cloud_config);

fn main() -> std::process::ExitCode {
    ccm_controllers::run()
}

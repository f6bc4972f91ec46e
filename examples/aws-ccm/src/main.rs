//! The aws-ccm binary: the framework's main.rs template. `--cloud-provider=aws` finds the
//! provider that the aws_ccm library registers.

use aws_ccm as _; // keeps aws_ccm, and its `register_cloud_provider!`, linked

fn main() -> std::process::ExitCode {
    ccm_controllers::run()
}

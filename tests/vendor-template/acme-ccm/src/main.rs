// src/main.rs
use acme_cloud as _; // keeps acme-cloud, and its `register_cloud_provider!`, linked

fn main() -> std::process::ExitCode {
    ccm_controllers::run()
}

//! `--cloud-config`: the runtime's reading of the file (`ccm_core::parse_cloud_config`, YAML or
//! JSON, into a vendor's struct) and FakeCloud's configuration with its validation.
#![no_main]

use ccm_testing::fake_cloud::{FakeCloud, FakeCloudConfig};
use libfuzzer_sys::fuzz_target;

/// A vendor's configuration, as the guide shows one.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct VendorConfig {
    region: String,
    #[serde(default)]
    token_file: Option<String>,
    #[serde(default)]
    zones: Vec<String>,
    #[serde(default)]
    timeout_seconds: Option<u64>,
}

fuzz_target!(|data: &[u8]| {
    let _ = ccm_core::parse_cloud_config::<serde_json::Value>(data);
    let _ = ccm_core::parse_cloud_config::<VendorConfig>(data);
    if let Ok(mut config) = ccm_core::parse_cloud_config::<FakeCloudConfig>(data) {
        // Never read or write a file the input names.
        config.state_file = None;
        let _ = config.validate();
        let _ = FakeCloud::try_new(config.clone());
        let _ = FakeCloud::new(config);
    }
});

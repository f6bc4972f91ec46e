//! A vendor's flags flattened next to the runtime's.

use ccm_controllers::parse_flags;

#[derive(clap::Args, Debug)]
struct AcmeArgs {
    /// The Acme region.
    #[arg(long, default_value = "eu-1")]
    acme_region: String,
    /// Go-style boolean of the vendor.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    acme_fast: bool,
}

#[test]
fn vendor_args_are_flattened_next_to_the_runtime_flags() {
    let (o, acme) = parse_flags::<AcmeArgs>(&[
        "ccm",
        "--cloud-provider=acme",
        "--acme-region=us-2",
        "--acme-fast",
        "--concurrent-service-syncs=4",
    ])
    .unwrap();
    assert_eq!(acme.acme_region, "us-2");
    assert!(acme.acme_fast);
    assert_eq!(o.service_workers(), 4);
    let (_, acme) = parse_flags::<AcmeArgs>(&["ccm"]).unwrap();
    assert_eq!(acme.acme_region, "eu-1");
    assert!(!acme.acme_fast);
}

//! Table tests of the runtime's flags: every flag with Go's syntax, every default, every invalid
//! value and its message.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use ccm_controllers::options::LogFormat;
use ccm_controllers::options::Options;
use ccm_controllers::{NoArgs, parse_flags};

mod syntax;
mod validation;
mod vendor;

fn parse(args: &[&str]) -> Result<Options, String> {
    let mut all = vec!["cloud-controller-manager"];
    all.extend_from_slice(args);
    parse_flags::<NoArgs>(&all)
        .map(|(o, _)| o)
        .map_err(|e| e.to_string())
}

fn ok(args: &[&str]) -> Options {
    parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn defaults_match_go_or_are_documented() {
    let o = ok(&[]);
    assert_eq!(o.cloud.cloud_provider, None);
    assert_eq!(o.cloud.cloud_config, None);
    assert!(!o.cloud.allow_untagged_cloud);
    assert_eq!(o.kube.kubeconfig, None);
    assert_eq!(o.kube.master, None);
    assert_eq!(o.kube.kube_api_qps, 5000.0);
    assert_eq!(o.kube.kube_api_burst, 10000);
    assert_eq!(o.generic.controllers, vec!["*"]);
    assert_eq!(o.generic.cluster_name, "kubernetes");
    assert_eq!(o.generic.cluster_cidr, "");
    assert!(!o.generic.allocate_node_cidrs);
    assert_eq!(o.node_ipam.cidr_allocator_type, "RangeAllocator");
    assert_eq!(
        o.node_ipam.node_cidr_mask_size, 0,
        "unset: /24 or /64 by family"
    );
    assert_eq!(o.node_ipam.service_cluster_ip_range, "");
    assert_eq!(o.generic.controller_start_interval, Duration::ZERO);
    // Deliberately above Go's 1 (see the options module docs).
    assert_eq!(o.node.concurrent_node_syncs, 100);
    assert_eq!(o.node.concurrent_node_status_updates, 0);
    assert_eq!(
        o.node_status_update_workers(),
        100,
        "0 means --concurrent-node-syncs"
    );
    assert_eq!(o.node.node_monitor_period, secs(5));
    assert_eq!(o.node.node_status_update_frequency, secs(300));
    assert_eq!(o.node.node_deletion_grace_period, secs(30));
    assert_eq!(o.service.concurrent_service_syncs, 10);
    assert_eq!(o.service.node_sync_window, secs(1));
    assert!(o.route.configure_cloud_routes);
    assert_eq!(o.route.route_reconciliation_period, secs(10));
    let le = &o.leader_election;
    assert!(le.leader_elect);
    assert_eq!(le.leader_elect_lease_duration, secs(15));
    assert_eq!(le.leader_elect_renew_deadline, secs(10));
    assert_eq!(le.leader_elect_retry_period, secs(2));
    assert_eq!(le.leader_elect_resource_lock, "leases");
    assert_eq!(le.leader_elect_resource_name, "cloud-controller-manager");
    assert_eq!(le.leader_elect_resource_namespace, "kube-system");
    // Go's serving defaults (HTTPS with delegated authn/authz).
    assert_eq!(
        o.serving.secure.bind_address,
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    );
    assert_eq!(o.serving.secure.secure_port, 10258);
    assert_eq!(
        o.serving.secure.authorization_always_allow_paths,
        ["/healthz", "/readyz", "/livez"]
    );
    assert_eq!(o.serving.shutdown_grace_period, secs(30));
    assert_eq!(o.budget.cloud_api_qps, None);
    assert_eq!(o.budget.cloud_api_burst, None);
    assert_eq!(o.cloud_api_burst(), None, "unlimited by default");
    assert_eq!(o.budget.cloud_api_timeout, secs(120));
    assert_eq!(o.logging.verbosity, 0);
    assert_eq!(o.logging.log_format, LogFormat::Text);
    // Without --cloud-provider the options do not validate.
    let errs = o.validate().unwrap_err();
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(
        errs[0].to_string(),
        "invalid value for --cloud-provider: must be set to the name of a registered cloud provider"
    );
}

//! Table tests of the runtime's flags: every flag with Go's syntax, every default, every invalid
//! value and its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use ccm_controllers::options::LogFormat;
use ccm_controllers::options::Options;
use ccm_controllers::{NoArgs, parse_flags};

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
    assert_eq!(o.kube.kube_api_qps, 1000.0);
    assert_eq!(o.kube.kube_api_burst, 2000);
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

type Check = fn(&Options) -> bool;

#[test]
fn every_flag_in_go_syntax() {
    let cases: &[(&[&str], Check)] = &[
        (&["--cloud-provider=acme"], |o| {
            o.cloud.cloud_provider.as_deref() == Some("acme")
        }),
        (&["--cloud-provider", "acme"], |o| {
            o.cloud.cloud_provider.as_deref() == Some("acme")
        }),
        (&["--cloud-config=/etc/acme.conf"], |o| {
            o.cloud.cloud_config.as_deref() == Some("/etc/acme.conf".as_ref())
        }),
        (&["--allow-untagged-cloud"], |o| {
            o.cloud.allow_untagged_cloud
        }),
        (&["--allow-untagged-cloud=true"], |o| {
            o.cloud.allow_untagged_cloud
        }),
        (&["--kubeconfig=/k.yaml"], |o| {
            o.kube.kubeconfig.as_deref() == Some("/k.yaml".as_ref())
        }),
        (&["--master=https://10.0.0.1:6443"], |o| {
            o.kube.master.as_deref() == Some("https://10.0.0.1:6443")
        }),
        (&["--kube-api-qps=50.5"], |o| o.kube.kube_api_qps == 50.5),
        (&["--kube-api-burst=100"], |o| o.kube.kube_api_burst == 100),
        (&["--controllers=*,-route"], |o| {
            o.generic.controllers == ["*", "-route"]
        }),
        (&["--controllers", "service,cloud-node"], |o| {
            o.generic.controllers == ["service", "cloud-node"]
        }),
        (&["--cluster-name=prod"], |o| o.cluster_name() == "prod"),
        (&["--cluster-cidr=10.244.0.0/16"], |o| {
            o.cluster_cidrs().unwrap().len() == 1
        }),
        (&["--cluster-cidr=10.244.0.0/16,fd00::/48"], |o| {
            o.cluster_cidrs().unwrap().len() == 2
        }),
        (&["--allocate-node-cidrs"], |o| {
            o.generic.allocate_node_cidrs
        }),
        (&["--controller-start-interval=500ms"], |o| {
            o.generic.controller_start_interval == Duration::from_millis(500)
        }),
        (&["--configure-cloud-routes=false"], |o| {
            !o.configure_cloud_routes()
        }),
        (&["--configure-cloud-routes"], |o| {
            o.configure_cloud_routes()
        }),
        (&["--concurrent-node-syncs=7"], |o| {
            o.node_sync_workers() == 7
        }),
        (&["--concurrent-node-status-updates=3"], |o| {
            o.node_status_update_workers() == 3
        }),
        (&["--node-monitor-period=1m30s"], |o| {
            o.node_monitor_period() == secs(90)
        }),
        (&["--node-status-update-frequency=1h30m"], |o| {
            o.node_status_update_frequency() == secs(5400)
        }),
        (&["--node-deletion-grace-period=2m0s"], |o| {
            o.node_deletion_grace_period() == secs(120)
        }),
        (&["--node-deletion-grace-period=0s"], |o| {
            o.node_deletion_grace_period().is_zero()
        }),
        (&["--concurrent-service-syncs=3"], |o| {
            o.service_workers() == 3
        }),
        (&["--node-sync-window=250ms"], |o| {
            o.node_sync_window() == Duration::from_millis(250)
        }),
        (&["--route-reconciliation-period=1.5m"], |o| {
            o.route_reconciliation_period() == secs(90)
        }),
        (&["--leader-elect=false"], |o| {
            !o.leader_election.leader_elect
        }),
        (&["--leader-elect"], |o| o.leader_election.leader_elect),
        (&["--leader-elect-lease-duration=30s"], |o| {
            o.leader_election.leader_elect_lease_duration == secs(30)
        }),
        (&["--leader-elect-renew-deadline=20s"], |o| {
            o.leader_election.leader_elect_renew_deadline == secs(20)
        }),
        (&["--leader-elect-retry-period=5s"], |o| {
            o.leader_election.leader_elect_retry_period == secs(5)
        }),
        (&["--leader-elect-resource-lock=leases"], |o| {
            o.leader_election.leader_elect_resource_lock == "leases"
        }),
        (&["--leader-elect-resource-name=acme-ccm"], |o| {
            o.leader_election.leader_elect_resource_name == "acme-ccm"
        }),
        (&["--leader-elect-resource-namespace=acme"], |o| {
            o.leader_election.leader_elect_resource_namespace == "acme"
        }),
        (&["--bind-address=0.0.0.0"], |o| {
            o.serving.secure.bind_address.is_unspecified()
        }),
        (&["--bind-address=::1"], |o| {
            o.serving.secure.bind_address.is_ipv6()
        }),
        (&["--secure-port=0"], |o| o.serving.secure.secure_port == 0),
        (&["--secure-port=8443"], |o| {
            o.serving.secure.secure_port == 8443
        }),
        (&["--shutdown-grace-period=45s"], |o| {
            o.serving.shutdown_grace_period == secs(45)
        }),
        (&["--cloud-api-qps=5"], |o| {
            o.budget.cloud_api_qps == Some(5.0) && o.cloud_api_burst() == Some(5)
        }),
        (&["--cloud-api-qps=0.5"], |o| o.cloud_api_burst() == Some(1)),
        (&["--cloud-api-qps=5", "--cloud-api-burst=20"], |o| {
            o.cloud_api_burst() == Some(20)
        }),
        (&["--cloud-api-timeout=30s"], |o| {
            o.cloud_api_timeout() == Some(secs(30))
        }),
        (&["--cloud-api-timeout=0s"], |o| {
            o.cloud_api_timeout().is_none()
        }),
        (&["-v=4"], |o| o.logging.verbosity == 4),
        (&["-v", "2"], |o| o.logging.verbosity == 2),
        (&["--v=5"], |o| o.logging.verbosity == 5),
        (&["--log-format=json"], |o| {
            o.logging.log_format == LogFormat::Json
        }),
        (&["--log-format=text"], |o| {
            o.logging.log_format == LogFormat::Text
        }),
        // Go's component-base logging flags.
        (&["--logging-format=json"], |o| {
            o.logging.log_format == LogFormat::Json
        }),
        (
            &["--vmodule=ccm_controllers::controllers::node_ipam=4,kube_runtime*=5"],
            |o| {
                o.logging.vmodule_directives()
                    == (
                        vec![
                            "ccm_controllers::controllers::node_ipam=debug".to_owned(),
                            "kube_runtime=trace".to_owned(),
                        ],
                        vec![],
                    )
                    && o.warnings().is_empty()
            },
        ),
        (&["--vmodule=*/leaderelection.go=4"], |o| {
            o.warnings()
                .iter()
                .any(|w| w.starts_with("--vmodule=*/leaderelection.go=4 has no effect"))
        }),
        (&["--log-flush-frequency=5s"], |o| {
            o.warnings()
                .iter()
                .any(|w| w.starts_with("--log-flush-frequency has no effect"))
        }),
        (
            &[
                "--logging-format=json",
                "--log-json-split-stream",
                "--log-json-info-buffer-size=1Ki",
                "--feature-gates=LoggingAlphaOptions=true",
            ],
            |o| {
                o.logging.split_stream()
                    && o.warnings()
                        .iter()
                        .any(|w| w.starts_with("--log-json-info-buffer-size has no effect"))
            },
        ),
        (
            &[
                "--log-text-split-stream=true",
                "--feature-gates=LoggingAlphaOptions=true",
            ],
            |o| o.logging.split_stream(),
        ),
        (&["--log-text-split-stream=true"], |o| {
            o.logging.log_format == LogFormat::Text && o.logging.log_text_split_stream
        }),
        // Go serving, webhook and metrics flags without an implementation: warned about.
        (&["--tls-sni-cert-key=/c.pem,/k.pem:example.com"], |o| {
            o.warnings()
                .iter()
                .any(|w| w.starts_with("--tls-sni-cert-key has no effect"))
        }),
        (
            &[
                "--requestheader-client-ca-file=/front-proxy-ca.crt",
                "--requestheader-allowed-names=front-proxy-client",
            ],
            |o| {
                o.warnings()
                    .iter()
                    .any(|w| w.starts_with("--requestheader-* has no effect"))
            },
        ),
        (
            &["--webhook-bind-address=0.0.0.0", "--webhook-cert-dir=/tmp"],
            |o| {
                o.warnings()
                    .iter()
                    .any(|w| w.starts_with("--webhook-* serving flags have no effect"))
            },
        ),
        (
            &[
                "--permit-port-sharing",
                "--http2-max-streams-per-connection=1000",
            ],
            |o| o.warnings().len() == 2,
        ),
        (
            &[
                "--show-hidden-metrics-for-version=1.32",
                "--disabled-metrics=a,b",
                "--allow-metric-labels=m,l='v'",
            ],
            |o| o.warnings().len() == 3,
        ),
        // Go flags accepted with a warning.
        (
            &["--kube-api-content-type=application/vnd.kubernetes.protobuf"],
            |o| {
                o.warnings()
                    .iter()
                    .any(|w| w.starts_with("--kube-api-content-type has no effect"))
            },
        ),
        (&["--profiling"], |o| {
            o.warnings()
                .iter()
                .any(|w| w.starts_with("--profiling has no effect"))
        }),
        (&["--profiling=false"], |o| {
            o.warnings()
                .iter()
                .any(|w| w.starts_with("--profiling has no effect"))
        }),
        (&["--contention-profiling=true"], |o| {
            o.warnings()
                .iter()
                .any(|w| w.starts_with("--contention-profiling has no effect"))
        }),
        (&["--min-resync-period=12h"], |o| {
            o.warnings()
                .iter()
                .any(|w| w.starts_with("--min-resync-period has no effect"))
        }),
        (&["--node-sync-period=0s"], |o| {
            o.warnings()
                .iter()
                .any(|w| w.starts_with("--node-sync-period has no effect"))
        }),
        // Node IPAM (Go's NodeIPAMControllerOptions).
        (&["--cidr-allocator-type=CloudAllocator"], |o| {
            o.node_ipam.cidr_allocator_type == "CloudAllocator" && o.warnings().is_empty()
        }),
        (&["--node-cidr-mask-size=26"], |o| {
            o.node_ipam.node_cidr_mask_size == 26
        }),
        (
            &[
                "--node-cidr-mask-size-ipv4=25",
                "--node-cidr-mask-size-ipv6=80",
            ],
            |o| {
                o.node_ipam.node_cidr_mask_size_ipv4 == 25
                    && o.node_ipam.node_cidr_mask_size_ipv6 == 80
            },
        ),
        (
            &["--service-cluster-ip-range=10.96.0.0/12,fd00:96::/108"],
            |o| o.service_cidrs().unwrap().len() == 2,
        ),
        (&["--external-cloud-volume-plugin=acme"], |o| {
            o.warnings()
                .iter()
                .any(|w| w.starts_with("--external-cloud-volume-plugin has no effect"))
        }),
        (
            &["--feature-gates=CloudControllerManagerWebhook=true"],
            |o| {
                o.warnings()
                    .iter()
                    .any(|w| w.starts_with("--feature-gates has no effect"))
            },
        ),
        (&["--use-service-account-credentials=false"], |o| {
            !o.use_service_account_credentials()
                && !o
                    .warnings()
                    .iter()
                    .any(|w| w.contains("--use-service-account-credentials"))
        }),
        (&["--use-service-account-credentials"], |o| {
            o.use_service_account_credentials()
        }),
        (&["--use-service-account-credentials=true"], |o| {
            o.use_service_account_credentials()
        }),
        (&["--enable-leader-migration=false"], |o| {
            o.warnings()
                .iter()
                .any(|w| w.starts_with("--enable-leader-migration has no effect"))
        }),
        // Allocating node CIDRs is a controller now, not a warning.
        (&["--allocate-node-cidrs=true"], |o| {
            o.generic.allocate_node_cidrs && o.warnings().is_empty()
        }),
        (&["--leader-elect=false"], |o| {
            o.warnings()
                .iter()
                .any(|w| w.starts_with("--leader-elect=false: run a single replica"))
        }),
        // Serving flags (HTTPS with delegated authn/authz; tested in secure_serving.rs).
        (
            &["--tls-cert-file=/c.pem", "--tls-private-key-file=/k.pem"],
            |o| {
                o.serving.secure.tls_cert_file.as_deref() == Some("/c.pem".as_ref())
                    && o.serving.secure.tls_private_key_file.as_deref() == Some("/k.pem".as_ref())
            },
        ),
        (&["--cert-dir=/certs"], |o| {
            o.serving.secure.cert_dir.as_deref() == Some("/certs".as_ref())
        }),
        (&["--authentication-kubeconfig=/a"], |o| {
            o.serving.secure.authentication_kubeconfig.is_some()
        }),
        (&["--authorization-kubeconfig=/a"], |o| {
            o.serving.secure.authorization_kubeconfig.is_some()
        }),
        (&["--authentication-skip-lookup"], |o| {
            o.serving.secure.authentication_skip_lookup
        }),
        (
            &["--authorization-always-allow-paths=/healthz,/metrics"],
            |o| o.serving.secure.authorization_always_allow_paths == ["/healthz", "/metrics"],
        ),
        (&["--client-ca-file=/ca.pem"], |o| {
            o.serving.secure.client_ca_file.is_some()
        }),
    ];
    for (args, check) in cases {
        let o = ok(args);
        assert!(check(&o), "{args:?} parsed as {o:#?}");
    }
    // A full Go-style command line validates.
    let o = ok(&[
        "--cloud-provider=acme",
        "--use-service-account-credentials=true",
        "--cluster-name=prod",
        "--cluster-cidr=10.244.0.0/16",
        "--leader-elect=true",
        "--leader-elect-lease-duration=30s",
        "--leader-elect-renew-deadline=20s",
        "--leader-elect-retry-period=4s",
        "--concurrent-service-syncs=5",
        "-v=2",
    ]);
    assert_eq!(o.validate(), Ok(()));
}

#[test]
fn syntax_errors_name_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        // pflag rejects a separate value for a boolean.
        (&["--leader-elect", "false"], "unexpected argument 'false'"),
        (
            &["--configure-cloud-routes", "false"],
            "unexpected argument 'false'",
        ),
        (&["--leader-elect=maybe"], "--leader-elect"),
        (&["--allow-untagged-cloud=yes"], "--allow-untagged-cloud"),
        (&["--node-monitor-period=5"], "missing unit"),
        (&["--node-monitor-period=-5s"], "--node-monitor-period"),
        (&["--node-monitor-period=-5s"], "durations must be >= 0"),
        (&["--route-reconciliation-period=10x"], "unknown unit \"x\""),
        (
            &["--leader-elect-lease-duration=fifteen"],
            "--leader-elect-lease-duration",
        ),
        (
            &["--node-status-update-frequency=-1m"],
            "--node-status-update-frequency",
        ),
        (
            &["--node-deletion-grace-period=-30s"],
            "--node-deletion-grace-period",
        ),
        (&["--node-sync-window=1s1"], "missing unit"),
        (&["--cloud-api-timeout=-1s"], "--cloud-api-timeout"),
        (&["--shutdown-grace-period=abc"], "--shutdown-grace-period"),
        (
            &["--controller-start-interval=-1s"],
            "--controller-start-interval",
        ),
        (&["--concurrent-node-syncs=-1"], "--concurrent-node-syncs"),
        (
            &["--concurrent-service-syncs=many"],
            "--concurrent-service-syncs",
        ),
        (
            &["--concurrent-node-status-updates=-2"],
            "--concurrent-node-status-updates",
        ),
        (&["--kube-api-burst=-1"], "--kube-api-burst"),
        (&["--kube-api-qps=fast"], "--kube-api-qps"),
        (&["--cloud-api-qps=fast"], "--cloud-api-qps"),
        (&["--cloud-api-burst=-3"], "--cloud-api-burst"),
        (&["--secure-port=70000"], "--secure-port"),
        (&["--bind-address=localhost:1"], "--bind-address"),
        (&["--log-format=yaml"], "--logging-format"),
        (&["--logging-format=yaml"], "--logging-format"),
        (&["--log-flush-frequency=5"], "missing unit"),
        (&["--log-json-info-buffer-size=lots"], "is not a quantity"),
        (&["--node-cidr-mask-size=129"], "--node-cidr-mask-size"),
        (
            &["--node-cidr-mask-size-ipv4=33"],
            "--node-cidr-mask-size-ipv4",
        ),
        (&["--v=high"], "--v"),
        (&["--no-such-flag"], "unexpected argument '--no-such-flag'"),
        (&["positional"], "unexpected argument 'positional'"),
    ];
    for (args, want) in cases {
        let err = parse(args).expect_err(&format!("{args:?} should fail"));
        assert!(
            err.contains(want),
            "{args:?}: {err:?} does not contain {want:?}"
        );
    }
}

#[test]
fn invalid_values_fail_validation_with_the_flag_named() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--cloud-provider="],
            "invalid value for --cloud-provider: must not be empty",
        ),
        (
            &["--cluster-name="],
            "invalid value for --cluster-name: must not be empty",
        ),
        (
            &["--concurrent-node-syncs=0"],
            "invalid value for --concurrent-node-syncs: must be >= 1",
        ),
        (
            &["--concurrent-service-syncs=0"],
            "invalid value for --concurrent-service-syncs: must be >= 1",
        ),
        (
            &["--node-monitor-period=0s"],
            "invalid value for --node-monitor-period: must be > 0",
        ),
        (
            &["--node-status-update-frequency=0s"],
            "invalid value for --node-status-update-frequency: must be > 0",
        ),
        (
            &["--route-reconciliation-period=0"],
            "invalid value for --route-reconciliation-period: must be > 0",
        ),
        (
            &["--kube-api-qps=0"],
            "invalid value for --kube-api-qps: must be > 0",
        ),
        (
            &["--kube-api-qps=-1"],
            "invalid value for --kube-api-qps: must be > 0",
        ),
        (
            &["--kube-api-burst=0"],
            "invalid value for --kube-api-burst: must be >= 1",
        ),
        (
            &["--leader-elect-renew-deadline=15s"],
            "invalid value for --leader-elect-renew-deadline: must be less than --leader-elect-lease-duration (15s >= 15s)",
        ),
        (
            &["--leader-elect-lease-duration=10s"],
            "invalid value for --leader-elect-renew-deadline: must be less than --leader-elect-lease-duration (10s >= 10s)",
        ),
        (
            &["--leader-elect-retry-period=9s"],
            "invalid value for --leader-elect-renew-deadline: must be greater than 1.2 x --leader-elect-retry-period",
        ),
        (
            &["--leader-elect-retry-period=0s"],
            "invalid value for --leader-elect-retry-period: must be > 0",
        ),
        (
            &["--leader-elect-renew-deadline=0s"],
            "invalid value for --leader-elect-renew-deadline: must be > 0",
        ),
        (
            &[
                "--leader-elect-lease-duration=1s",
                "--leader-elect-renew-deadline=500ms",
                "--leader-elect-retry-period=100ms",
            ],
            "invalid value for --leader-elect-lease-duration: must be at least 2s",
        ),
        (
            &["--leader-elect-resource-lock=configmapsleases"],
            "invalid value for --leader-elect-resource-lock: \"configmapsleases\" is not supported; only \"leases\"",
        ),
        (
            &["--leader-elect-resource-lock=endpoints"],
            "only \"leases\"",
        ),
        (
            &["--leader-elect-resource-name="],
            "invalid value for --leader-elect-resource-name: must not be empty",
        ),
        (
            &["--leader-elect-resource-namespace="],
            "invalid value for --leader-elect-resource-namespace: must not be empty",
        ),
        (
            &["--cloud-api-qps=0"],
            "invalid value for --cloud-api-qps: must be > 0",
        ),
        (
            &["--cloud-api-qps=-2"],
            "invalid value for --cloud-api-qps: must be > 0",
        ),
        (
            &["--cloud-api-burst=5"],
            "invalid value for --cloud-api-burst: needs --cloud-api-qps",
        ),
        (
            &["--cloud-api-qps=5", "--cloud-api-burst=0"],
            "invalid value for --cloud-api-burst: must be >= 1",
        ),
        (
            &["--enable-leader-migration=true"],
            "invalid value for --enable-leader-migration: leader migration is not implemented",
        ),
        (
            &["--leader-migration-config=/m.yaml"],
            "invalid value for --leader-migration-config",
        ),
        (
            &["--webhooks=*"],
            "invalid value for --webhooks: admission webhooks are not implemented",
        ),
        // Go's logging validation.
        (
            &["--logging-format=json", "--vmodule=ccm_controllers=4"],
            "invalid value for --vmodule: only supported for the text log format",
        ),
        (
            &["--log-json-split-stream"],
            "invalid value for --log-json-split-stream: Feature LoggingAlphaOptions is disabled",
        ),
        (
            &["--log-text-info-buffer-size=4Ki"],
            "invalid value for --log-text-info-buffer-size: Feature LoggingAlphaOptions is disabled",
        ),
        // Flags a current Go CCM no longer has.
        (
            &["--logtostderr"],
            "invalid value for --logtostderr: this klog flag was removed",
        ),
        (
            &["--logtostderr=false"],
            "invalid value for --logtostderr: this klog flag was removed",
        ),
        (
            &["--alsologtostderr=true"],
            "--alsologtostderr: this klog flag was removed",
        ),
        (
            &["--log-dir=/var/log"],
            "--log-dir: this klog flag was removed",
        ),
        (
            &["--log-file=/var/log/ccm.log"],
            "--log-file: this klog flag was removed",
        ),
        (
            &["--stderrthreshold=INFO"],
            "--stderrthreshold: this klog flag was removed",
        ),
        (
            &["--skip-headers"],
            "--skip-headers: this klog flag was removed",
        ),
        (
            &["--address=0.0.0.0"],
            "invalid value for --address: insecure serving was removed",
        ),
        (
            &["--port=0"],
            "invalid value for --port: insecure serving was removed",
        ),
        (
            &["--leader-elect-resource-lock=configmaps"],
            "invalid value for --leader-elect-resource-lock: \"configmaps\" is not supported",
        ),
    ];
    for (args, want) in cases {
        let mut all = vec!["--cloud-provider=acme"];
        all.extend_from_slice(args);
        let o = ok(&all);
        let errors = o
            .validate()
            .expect_err(&format!("{args:?} should not validate"));
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert!(
            text.iter().any(|e| e.contains(want)),
            "{args:?}: {text:?} does not contain {want:?}"
        );
    }
    // Leader-election timing is not checked when election is off.
    let o = ok(&[
        "--cloud-provider=acme",
        "--leader-elect=false",
        "--leader-elect-renew-deadline=20s",
    ]);
    assert_eq!(o.validate(), Ok(()));
}

#[test]
fn cluster_cidr_values() {
    let good = [
        ("", 0),
        ("10.244.0.0/16", 1),
        ("fd00:10:244::/56", 1),
        ("10.244.0.0/16,fd00:10:244::/56", 2),
        ("fd00::/48, 10.0.0.0/8", 2),
    ];
    for (value, n) in good {
        let flag = format!("--cluster-cidr={value}");
        assert_eq!(ok(&[&flag]).cluster_cidrs().unwrap().len(), n, "{value}");
    }
    let bad = [
        ("10.244.0.0", "--cluster-cidr: \"10.244.0.0\" is not a CIDR"),
        ("10.0.0.0/8,10.1.0.0/16", "two CIDRs of the same IP family"),
        (
            "10.0.0.0/8,fd00::/48,10.1.0.0/16",
            "has 3 CIDRs; at most two",
        ),
        ("banana", "is not a CIDR"),
    ];
    for (value, want) in bad {
        let flag = format!("--cluster-cidr={value}");
        let err = ok(&[&flag]).cluster_cidrs().unwrap_err().to_string();
        assert!(err.contains(want), "{value}: {err}");
    }
}

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

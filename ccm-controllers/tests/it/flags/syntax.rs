//! Every flag in Go's syntax, and syntax errors naming the flag.

use ccm_controllers::options::LogFormat;
use ccm_controllers::options::Options;
use std::time::Duration;

use super::{ok, parse, secs};

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
        // --profiling works (Go's default true): no warning either way.
        (&["--profiling"], |o| {
            o.compat.profiling_enabled() && !o.warnings().iter().any(|w| w.contains("profiling"))
        }),
        (&[], |o| o.compat.profiling_enabled()),
        (&["--profiling=false"], |o| {
            !o.compat.profiling_enabled() && !o.warnings().iter().any(|w| w.contains("profiling"))
        }),
        (&["--contention-profiling=false"], |o| {
            !o.warnings().iter().any(|w| w.contains("profiling"))
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

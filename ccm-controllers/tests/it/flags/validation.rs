//! Invalid values fail validation with the flag named; `--cluster-cidr` values.

use super::ok;

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

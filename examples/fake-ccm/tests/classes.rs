//! Two `fake-ccm` processes in one cluster, each serving a load-balancer class of its own with
//! its own cloud (its own FakeCloud state file): every Service gets exactly one load balancer,
//! from the cloud serving its class; deleting a Service releases that one; a Service of a
//! third class and one without a class are never touched. One process serves its class by
//! renaming the provider's default implementation (`--load-balancer-classes=<class>=-`), the
//! other because its cloud-config declares it (`load_balancer_classes`).
//!
//! Runs against the in-process API server, or a real cluster with `CCM_TEST_KUBECONFIG`: the
//! classes are unique to the test run, so neither process touches anyone else's Services.
//! Also: a bad `--load-balancer-classes` exits non-zero naming the problem.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use ccm_core::well_known::FINALIZER_LOAD_BALANCER_CLEANUP;
use ccm_testing::TestCluster;
use ccm_testing::builders::load_balancer_service;
use ccm_testing::fake_cloud::FakeCloudState;
use ccm_testing::wait::{wait_for, wait_for_deletion};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams};

const TIMEOUT: Duration = Duration::from_secs(60);

/// How the process reaches the cluster: the in-process server's URL or the real cluster's
/// kubeconfig.
fn cluster_args(cluster: &TestCluster) -> Vec<String> {
    match cluster.api_server() {
        Some(server) => vec![format!("--master={}", server.url())],
        None => vec![format!(
            "--kubeconfig={}",
            std::env::var("CCM_TEST_KUBECONFIG").unwrap()
        )],
    }
}

fn start_ccm(cluster: &TestCluster, config: &Path, extra: &[String]) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_fake-ccm"))
        .args(cluster_args(cluster))
        .arg("--cloud-provider=fake")
        .arg(format!("--cloud-config={}", config.display()))
        .arg("--leader-elect=false")
        .arg("--secure-port=0")
        .arg("--configure-cloud-routes=false")
        .arg("--controllers=service")
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("fake-ccm-classes-{}-{name}", std::process::id()))
}

fn state(path: &Path) -> FakeCloudState {
    if path.exists() {
        FakeCloudState::load(path).unwrap()
    } else {
        FakeCloudState::default()
    }
}

fn has_ingress(s: &Service) -> bool {
    s.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .is_some_and(|i| !i.is_empty())
}

fn untouched(s: &Service) -> bool {
    !has_ingress(s)
        && !s
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER_LOAD_BALANCER_CLEANUP)
}

#[tokio::test]
async fn two_processes_each_serve_their_own_class_from_their_own_cloud() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let class_a = format!("{}.example/lb", cluster.unique_name("a"));
    let class_b = format!("{}.example/lb", cluster.unique_name("b"));
    let class_foreign = format!("{}.example/lb", cluster.unique_name("f"));

    let (state_a, state_b) = (temp_path("a.json"), temp_path("b.json"));
    let (config_a, config_b) = (temp_path("a.yaml"), temp_path("b.yaml"));
    std::fs::write(
        &config_a,
        format!(
            "state_file: {}\nlb_ip_range: 203.0.113.0/24\n",
            state_a.display()
        ),
    )
    .unwrap();
    std::fs::write(
        &config_b,
        format!(
            "state_file: {}\nlb_ip_range: 198.51.100.0/24\nload_balancer_classes: [\"{class_b}\"]\n",
            state_b.display()
        ),
    )
    .unwrap();
    // A: the provider declares only Services without a class; the operator serves its
    // implementation under class A instead. B: the provider declares class B.
    let mut ccm_a = start_ccm(
        &cluster,
        &config_a,
        &[format!("--load-balancer-classes={class_a}=-")],
    );
    let mut ccm_b = start_ccm(&cluster, &config_b, &[]);

    let api: Api<Service> = Api::namespaced(cluster.client(), &ns);
    let names: Vec<String> = ["a", "b", "foreign", "none"]
        .iter()
        .map(|n| cluster.unique_name(n))
        .collect();
    let [svc_a, svc_b, svc_foreign, svc_none] = names.as_slice() else {
        unreachable!()
    };
    for (name, class) in [
        (svc_a, Some(&class_a)),
        (svc_b, Some(&class_b)),
        (svc_foreign, Some(&class_foreign)),
        (svc_none, None),
    ] {
        let mut builder = load_balancer_service(&ns, name);
        if let Some(class) = class {
            builder = builder.load_balancer_class(class);
        }
        cluster.create(&builder.build()).await;
    }

    // Each served Service gets exactly one load balancer, from the cloud serving its class.
    let a = wait_for(&api, svc_a, TIMEOUT, has_ingress).await.unwrap();
    let b = wait_for(&api, svc_b, TIMEOUT, has_ingress).await.unwrap();
    let ip = |s: &Service| {
        s.status
            .as_ref()
            .unwrap()
            .load_balancer
            .as_ref()
            .unwrap()
            .ingress
            .as_ref()
            .unwrap()[0]
            .ip
            .clone()
            .unwrap()
    };
    assert!(ip(&a).starts_with("203.0.113."), "{a:?}");
    assert!(ip(&b).starts_with("198.51.100."), "{b:?}");
    let key = |name: &str| format!("{ns}/{name}");
    let in_a = state(&state_a).load_balancers;
    let in_b = state(&state_b).load_balancers;
    assert_eq!(in_a.keys().collect::<Vec<_>>(), [&key(svc_a)], "{in_a:?}");
    assert_eq!(in_b.keys().collect::<Vec<_>>(), [&key(svc_b)], "{in_b:?}");
    assert_eq!(in_a[&key(svc_a)].class.as_deref(), Some(class_a.as_str()));
    assert_eq!(in_b[&key(svc_b)].class.as_deref(), Some(class_b.as_str()));

    // Deleting A's Service releases A's load balancer only.
    api.delete(svc_a, &DeleteParams::default()).await.unwrap();
    wait_for_deletion(&api, svc_a, TIMEOUT).await.unwrap();
    assert!(state(&state_a).load_balancers.is_empty());
    assert_eq!(state(&state_b).load_balancers.len(), 1);
    api.delete(svc_b, &DeleteParams::default()).await.unwrap();
    wait_for_deletion(&api, svc_b, TIMEOUT).await.unwrap();
    assert!(state(&state_b).load_balancers.is_empty());

    // The foreign class and the Service without a class: neither process touched them (by
    // now each process has seen them several times over).
    for name in [svc_foreign, svc_none] {
        let s = api.get(name).await.unwrap();
        assert!(untouched(&s), "{name}: {s:?}");
    }
    assert!(state(&state_a).load_balancers.is_empty());
    assert!(state(&state_b).load_balancers.is_empty());

    for ccm in [&mut ccm_a, &mut ccm_b] {
        assert!(ccm.try_wait().unwrap().is_none(), "a fake-ccm exited early");
        ccm.kill().await.unwrap();
    }
    for path in [&state_a, &state_b, &config_a, &config_b] {
        let _ = std::fs::remove_file(path);
    }
    cluster.cleanup().await;
}

/// A bad `--load-balancer-classes` stops the process before it touches the cluster (no API
/// server needed), non-zero, naming the problem.
#[tokio::test]
async fn a_bad_load_balancer_classes_flag_exits_non_zero_naming_it() {
    for (value, says) in [
        (
            "acme.example/nlb",
            "the cloud provider serves no class \"acme.example/nlb\"; it declares -",
        ),
        ("Bad Class", "invalid load-balancer class \"Bad Class\""),
        ("-,-", "listed twice"),
    ] {
        let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_fake-ccm"))
            .arg("--master=https://127.0.0.1:1")
            .arg("--cloud-provider=fake")
            .arg("--leader-elect=false")
            .arg("--configure-cloud-routes=false")
            .arg(format!("--load-balancer-classes={value}"))
            .output()
            .await
            .unwrap();
        assert!(!output.status.success(), "{value}: {output:?}");
        // The error line is klog's: its message quoted as Go's %q, so `"` comes out as `\"`.
        let stderr = String::from_utf8_lossy(&output.stderr);
        let quoted = says.replace('"', "\\\"");
        assert!(stderr.contains(&quoted), "{value}: {stderr}");
    }
}

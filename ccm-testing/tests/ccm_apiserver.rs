//! The `ccm-apiserver` binary: serves on a port, writes a kubeconfig, and `kubectl` and a kube-rs
//! client work against it. Needs kubectl on `PATH` (`.ci/run` installs Debian's
//! `kubernetes-client`); without it the kubectl part is skipped with a message.
//!
//! Run it with `cargo test -p ccm-testing --features ccm-apiserver --test ccm_apiserver`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

/// The kubectl to use: `$KUBECTL`, else `kubectl` from `PATH`.
fn kubectl_program() -> String {
    std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".to_owned())
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> Output {
    let output = Command::new(kubectl_program())
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "kubectl {args:?} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Kills the server if the test fails before stopping it.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for_file(path: &Path, server: &mut Server) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !path.exists() {
        if let Some(status) = server.0.try_wait().unwrap() {
            panic!(
                "ccm-apiserver exited with {status} before writing {}",
                path.display()
            );
        }
        assert!(
            Instant::now() < deadline,
            "no kubeconfig at {} after 60 s",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test]
async fn kubectl_and_kube_clients_work_against_ccm_apiserver() {
    let kubeconfig: PathBuf = std::env::temp_dir().join(format!(
        "ccm-apiserver-test-{}.kubeconfig",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&kubeconfig);
    let mut server = Server(
        Command::new(env!("CARGO_BIN_EXE_ccm-apiserver"))
            .args(["--port=0", "--node=worker-1", "--node=worker-2"])
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_file(&kubeconfig, &mut server);

    // A kube-rs client (what a CCM binary's --kubeconfig builds) sees the seeded Nodes.
    let options = kube::config::KubeConfigOptions::default();
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).unwrap(),
        &options,
    )
    .await
    .unwrap();
    let nodes: Api<Node> = Api::all(kube::Client::try_from(config).unwrap());
    let names: Vec<String> = nodes
        .list(&ListParams::default())
        .await
        .unwrap()
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    assert_eq!(names, ["worker-1", "worker-2"]);

    match Command::new(kubectl_program())
        .args(["version", "--client"])
        .output()
    {
        Ok(version) => eprintln!("using {}", String::from_utf8_lossy(&version.stdout).trim()),
        Err(e) => {
            eprintln!(
                "SKIPPED the kubectl part: cannot run {:?} ({e}); install kubectl (Debian: \
                 apt-get install kubernetes-client) or set KUBECTL",
                kubectl_program()
            );
            return;
        }
    }

    // kubectl's discovery (/api, /apis, /version) and its table output.
    let table = String::from_utf8(kubectl(&kubeconfig, &["get", "nodes"]).stdout).unwrap();
    eprintln!("kubectl get nodes:\n{table}");
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("NAME"), "{table}");
    assert!(lines.iter().any(|l| l.starts_with("worker-1 ")), "{table}");
    assert!(lines.iter().any(|l| l.starts_with("worker-2 ")), "{table}");

    // Short names resolve through discovery, as against kube-apiserver.
    let by_short_name = kubectl(&kubeconfig, &["get", "no", "-o", "name"]);
    assert_eq!(
        String::from_utf8_lossy(&by_short_name.stdout),
        "node/worker-1\nnode/worker-2\n"
    );
    kubectl(&kubeconfig, &["get", "svc,ns,cm,ev", "--all-namespaces"]);

    // A field of the object, and a write as a vendor's smoke test would make it.
    let taints = kubectl(
        &kubeconfig,
        &[
            "get",
            "node",
            "worker-1",
            "-o",
            "jsonpath={.spec.taints[*].key}",
        ],
    );
    // As kube-apiserver does, the server's admission also adds `node.kubernetes.io/not-ready`.
    let keys = String::from_utf8_lossy(&taints.stdout).into_owned();
    let keys: Vec<&str> = keys.split_whitespace().collect();
    assert!(
        keys.contains(&"node.cloudprovider.kubernetes.io/uninitialized"),
        "{keys:?}"
    );
    assert!(keys.contains(&"node.kubernetes.io/not-ready"), "{keys:?}");
    kubectl(&kubeconfig, &["label", "node", "worker-2", "smoke=test"]);
    let labelled = kubectl(
        &kubeconfig,
        &["get", "nodes", "-l", "smoke=test", "-o", "name"],
    );
    assert_eq!(
        String::from_utf8_lossy(&labelled.stdout).trim(),
        "node/worker-2"
    );

    // SIGTERM: a clean exit.
    Command::new("kill")
        .arg("-TERM")
        .arg(server.0.id().to_string())
        .status()
        .unwrap();
    let status = server.0.wait().unwrap();
    assert!(status.success(), "ccm-apiserver exited with {status}");
    let _ = std::fs::remove_file(&kubeconfig);
}

/// `--fault` rules: a bad one stops the binary with a clear error; good ones inject faults
/// into the requests they name and leave the others alone. `--watch-list=false` refuses
/// `sendInitialEvents`.
#[tokio::test]
async fn fault_flags_inject_faults() {
    let bad = Command::new(env!("CARGO_BIN_EXE_ccm-apiserver"))
        .args(["--port=0", "--fault=503:0.5"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("KIND:RATE"), "{stderr}");

    let kubeconfig: PathBuf = std::env::temp_dir().join(format!(
        "ccm-apiserver-faults-{}.kubeconfig",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&kubeconfig);
    let mut server = Server(
        Command::new(env!("CARGO_BIN_EXE_ccm-apiserver"))
            .args([
                "--port=0",
                "--node=worker-1",
                "--fault=500:1:get:nodes",
                "--fault=429:1:list:services",
                "--fault-retry-after=7",
                "--fault-seed=3",
                "--watch-list=false",
            ])
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_file(&kubeconfig, &mut server);
    let yaml = std::fs::read_to_string(&kubeconfig).unwrap();
    let url = yaml
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .unwrap()
        .trim_matches(|c| c == '\'' || c == '"')
        .to_owned();
    let mut config = kube::Config::new(url.parse().unwrap());
    config.default_retry = false;
    let client = kube::Client::try_from(config).unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    match nodes.get("worker-1").await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 500),
        other => panic!("expected the injected 500, got {other:?}"),
    }
    assert_eq!(
        nodes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let req = http::Request::get("/api/v1/services")
        .body(kube::client::Body::empty())
        .unwrap();
    let resp = client.send(req).await.unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    assert_eq!(resp.headers()["retry-after"], "7");
    // --watch-list=false: a streaming initial list is refused, as without the WatchList gate.
    let req = http::Request::get(
        "/api/v1/nodes?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan",
    )
    .body(kube::client::Body::empty())
    .unwrap();
    assert_eq!(client.send(req).await.unwrap().status().as_u16(), 422);
    let _ = std::fs::remove_file(&kubeconfig);
}

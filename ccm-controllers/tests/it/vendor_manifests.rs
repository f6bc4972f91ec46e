//! Replays the CCM arguments of public vendor manifests (`tests/data/vendor-manifests/`, each
//! file naming its source) through the runtime's parser and startup, against the in-process API
//! server with the fake provider. Only what an operator swaps is swapped: `--cloud-provider`,
//! `--cloud-config` and the connection (`--kubeconfig`/`--master`); serving uses a free port.
//! Each `start` manifest must start and serve `/healthz` (and, with `--allocate-node-cidrs`,
//! give a new Node its pod CIDR); `reject` manifests (old versions a current Go CCM rejects too)
//! must stop with the reason.
//!
//! Skipped against a real cluster: the built-in controllers would act on its Nodes with the fake
//! cloud's answers.
#![allow(clippy::panic)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use ccm_controllers::{Builder, NoArgs, parse_flags};
use ccm_testing::TestCluster;
use ccm_testing::builders::kubelet_node;
use ccm_testing::fake_cloud::FakeCloud;
use ccm_testing::wait::eventually;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use tokio::sync::oneshot;

use crate::support::https::http_get;

ccm_core::register_cloud_provider!("fake", FakeCloud::from_cloud_config);

const WAIT: Duration = Duration::from_secs(30);

/// The fake cloud of the replay: no routes (like most vendors' providers; with routes and no
/// `--cluster-cidr` Go and this runtime both refuse to start), no latency.
const FAKE_CLOUD_CONFIG: &str =
    "latency_ms: 0\ncapabilities:\n  instances_v2: true\n  load_balancer: true\n  routes: false\n";

#[derive(Debug, PartialEq)]
enum Expect {
    Start,
    Reject(String),
}

struct Manifest {
    file: String,
    source: String,
    expect: Expect,
    args: Vec<String>,
}

fn manifests() -> Vec<Manifest> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/vendor-manifests");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let file = path.file_name().unwrap().to_string_lossy().into_owned();
            let mut source = None;
            let mut expect = None;
            let mut args = Vec::new();
            for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
                if let Some(s) = line.strip_prefix("# source: ") {
                    source = Some(s.to_owned());
                } else if let Some(e) = line.strip_prefix("# expect: ") {
                    let (kind, rest) = e.split_once(' ').unwrap_or((e, ""));
                    expect = Some(match kind {
                        "start" => Expect::Start,
                        "reject" => Expect::Reject(rest.to_owned()),
                        other => panic!("{file}: unknown expectation {other:?}"),
                    });
                } else if !line.starts_with('#') {
                    args.push(line.to_owned());
                }
            }
            Manifest {
                source: source.unwrap_or_else(|| panic!("{file}: no `# source:` line")),
                expect: expect.unwrap_or_else(|| panic!("{file}: no `# expect:` line")),
                file,
                args,
            }
        })
        .collect()
}

/// The manifest's arguments with the provider, its config and the connection swapped.
fn swapped(args: &[String], cloud_config: &Path, master: &str) -> Vec<String> {
    const SWAPPED: [&str; 4] = [
        "--cloud-provider",
        "--cloud-config",
        "--kubeconfig",
        "--master",
    ];
    let mut out = vec!["cloud-controller-manager".to_owned()];
    let mut skip_value = false;
    for arg in args {
        if std::mem::take(&mut skip_value) {
            continue;
        }
        let name = arg.split_once('=').map_or(arg.as_str(), |(n, _)| n);
        if SWAPPED.contains(&name) {
            // `--kubeconfig <path>`: the value is the next argument.
            skip_value = !arg.contains('=');
            continue;
        }
        out.push(arg.clone());
    }
    out.push("--cloud-provider=fake".to_owned());
    out.push(format!("--cloud-config={}", cloud_config.display()));
    out.push(format!("--master={master}"));
    out
}

fn validation_errors(args: &[String]) -> Vec<String> {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    match parse_flags::<NoArgs>(&refs) {
        Err(e) => vec![e.to_string()],
        Ok((o, _)) => o
            .validate()
            .err()
            .unwrap_or_default()
            .iter()
            .map(ToString::to_string)
            .collect(),
    }
}

/// Starts the runtime with `args`; checks `/healthz` (and node IPAM when enabled); stops it.
async fn start_and_serve(
    m: &Manifest,
    args: Vec<String>,
    cluster: &TestCluster,
) -> Result<(), String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stop_rx) = oneshot::channel::<()>();
    let runtime = tokio::spawn(
        Builder::new()
            .args(args.clone())
            .listener(listener)
            .shutdown_signal(async {
                let _ = stop_rx.await;
            })
            .run_async(),
    );
    let served = eventually(WAIT, || async {
        runtime.is_finished() || http_get(addr, "/healthz").await.0 == 200
    })
    .await;
    if runtime.is_finished() {
        let code = runtime.await.unwrap();
        return Err(format!(
            "{}: exited with {code} at startup; args {args:?}",
            m.file
        ));
    }
    if !served {
        return Err(format!("{}: /healthz never answered 200", m.file));
    }
    // A manifest that allocates pod CIDRs: a new Node gets one, inside --cluster-cidr.
    let cluster_cidr = m
        .args
        .iter()
        .find_map(|a| a.strip_prefix("--cluster-cidr="))
        .map(|c| c.parse::<IpNet>().unwrap());
    if m.args.iter().any(|a| a == "--allocate-node-cidrs=true") {
        let name = cluster.unique_name("replay");
        cluster.create(&kubelet_node(&name).build()).await;
        let nodes: Api<Node> = Api::all(cluster.client());
        let seen = std::sync::Mutex::new(None);
        let allocated = eventually(WAIT, || async {
            let cidr = nodes
                .get(&name)
                .await
                .ok()
                .and_then(|n| n.spec?.pod_cidrs?.first().cloned());
            let found = cidr.is_some();
            *seen.lock().unwrap() = cidr;
            found
        })
        .await;
        let got = seen.into_inner().unwrap();
        let inside = got
            .as_deref()
            .and_then(|c| c.parse::<IpNet>().ok())
            .zip(cluster_cidr)
            .is_some_and(|(c, range)| range.contains(&c));
        if !allocated || !inside {
            return Err(format!(
                "{}: node {name} got pod CIDR {got:?}, want one in {cluster_cidr:?}",
                m.file
            ));
        }
    }
    let _ = stop.send(());
    let code = tokio::time::timeout(WAIT, runtime).await.unwrap().unwrap();
    if code != 0 {
        return Err(format!("{}: stopped with exit code {code}", m.file));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_vendor_manifests_start_unchanged() {
    let all = manifests();
    assert!(
        all.len() >= 10,
        "at least 10 manifests, found {}",
        all.len()
    );
    let dir = tempfile::tempdir().unwrap();
    let cloud_config = dir.path().join("fake-cloud.yaml");
    std::fs::write(&cloud_config, FAKE_CLOUD_CONFIG).unwrap();
    let mut failures = Vec::new();
    let mut started = 0;
    for m in &all {
        let cluster = TestCluster::start().await;
        let Some(server) = cluster.api_server() else {
            return; // a real cluster: see the module documentation
        };
        let args = swapped(&m.args, &cloud_config, &server.url());
        let errors = validation_errors(&args);
        match &m.expect {
            Expect::Start => match start_and_serve(m, args, &cluster).await {
                Ok(()) => started += 1,
                Err(e) => failures.push(format!("{e} (source: {})", m.source)),
            },
            Expect::Reject(text) => {
                if !errors.iter().any(|e| e.contains(text.as_str())) {
                    failures.push(format!(
                        "{}: want an error containing {text:?}, got {errors:?}",
                        m.file
                    ));
                }
                let code = Builder::new()
                    .args(args)
                    .listener(std::net::TcpListener::bind("127.0.0.1:0").unwrap())
                    .shutdown_signal(async {})
                    .run_async()
                    .await;
                if code == 0 {
                    failures.push(format!("{}: started although Go rejects it", m.file));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(started >= 11, "only {started} manifests started");
}

#[test]
fn the_swap_replaces_only_provider_config_and_connection() {
    let args: Vec<String> = [
        "--v=3",
        "--cloud-provider=azure",
        "--kubeconfig",
        "/etc/kubeconfig",
        "--cloud-config=/etc/azure.json",
        "--master=https://x:6443",
        "--leader-elect=true",
    ]
    .map(str::to_owned)
    .to_vec();
    let out = swapped(&args, Path::new("/tmp/fake.yaml"), "http://127.0.0.1:1");
    assert_eq!(
        out,
        [
            "cloud-controller-manager",
            "--v=3",
            "--leader-elect=true",
            "--cloud-provider=fake",
            "--cloud-config=/tmp/fake.yaml",
            "--master=http://127.0.0.1:1"
        ]
    );
}

//! The ClusterRole in `examples/deploy/` is sufficient and minimal.
//!
//! `deploy_role_is_sufficient_and_minimal` runs the real runtime (all four controllers, leader
//! election with the Lease flags of `examples/deploy/deployment.yaml`, HTTPS serving with
//! delegated authentication and authorisation) against the in-process API server with
//! FakeCloud, and drives every path that talks to the API server: node initialisation (with a
//! conflicting patch, so the fresh read happens), routes and the `NetworkUnavailable` condition,
//! the shutdown taint added and removed, a Node deleted because its instance is gone, load
//! balancers created (with a conflicting finalizer patch), updated and deleted, repeated Events
//! (series patches), the Lease acquired, renewed and released, the client-CA lookup, and a
//! `/metrics` scrape with a bearer token (TokenReview and SubjectAccessReview).
//!
//! Every request the CCM made (user agent `cloud-controller-manager/<version>`) is then checked
//! against the roles that `examples/deploy/` binds to the CCM's ServiceAccount (its ClusterRole,
//! plus the built-in roles of the standard bindings, modelled in [`BUILTIN_ROLES`]):
//!
//! 1. every request is allowed (sufficient), and
//! 2. every (rule, apiGroup, resource, verb, resourceName) of the ClusterRole is needed by at
//!    least one request that nothing else allows, and no wildcard is used (minimal).
//!
//! The RBAC evaluation is the pure module `eval` (`rbac/eval.rs`); its tests (run with this one)
//! show that the checks fail when a grant is removed or an unneeded one is added.
//!
//! In-process only: the proof needs the API server's request log.

mod eval;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ccm_testing::apiserver::{ApiServer, RequestRecord};
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use ccm_testing::fake_cloud::FakeCloud;
use ccm_testing::wait::{eventually, wait_for, wait_for_deletion};
use eval::{Access, Grant, Manifests};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use tokio_util::sync::CancellationToken;

use crate::support::node::has_taint;

const WAIT: Duration = Duration::from_secs(30);
const HARNESS_AGENT: &str = "rbac-test-harness";
const CCM_AGENT_PREFIX: &str = "cloud-controller-manager/";
const SHUTDOWN_TAINT: &str = "node.cloudprovider.kubernetes.io/shutdown";

/// The built-in roles the bindings in `examples/deploy/rbac.yaml` refer to, as kube-apiserver's
/// bootstrap policy defines them (`plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go`):
/// `system:auth-delegator` lets a component delegate authentication and authorisation;
/// `extension-apiserver-authentication-reader` lets it read the client CA the API server
/// publishes in `kube-system`.
pub(crate) const BUILTIN_ROLES: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:auth-delegator
rules:
  - apiGroups: ["authentication.k8s.io"]
    resources: ["tokenreviews"]
    verbs: ["create"]
  - apiGroups: ["authorization.k8s.io"]
    resources: ["subjectaccessreviews"]
    verbs: ["create"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: extension-apiserver-authentication-reader
  namespace: kube-system
rules:
  - apiGroups: [""]
    resources: ["configmaps"]
    resourceNames: ["extension-apiserver-authentication"]
    verbs: ["get", "list", "watch"]
"#;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/deploy")
}

fn read(file: &str) -> String {
    let path = deploy_dir().join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The files `kustomization.yaml` applies.
fn deployed_files() -> Vec<String> {
    let k: serde_norway::Value = serde_norway::from_str(&read("kustomization.yaml")).unwrap();
    k["resources"]
        .as_sequence()
        .expect("kustomization.yaml lists resources")
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect()
}

/// The Deployment of `examples/deploy/` as YAML: its namespace, ServiceAccount and flags are
/// read from it. (Not deserialised into `k8s_openapi`'s Deployment: `defaultMode: 0440` is a
/// YAML 1.1 octal number for kubectl, a string for serde_norway's YAML 1.2.)
fn deployment() -> serde_norway::Value {
    for file in deployed_files() {
        for doc in serde_norway::Deserializer::from_str(&read(&file)) {
            let v: serde_norway::Value = serde::Deserialize::deserialize(doc).unwrap();
            if v["kind"].as_str() == Some("Deployment") {
                return v;
            }
        }
    }
    panic!("no Deployment in examples/deploy");
}

/// The Deployment's ServiceAccount: (namespace, name).
fn service_account() -> (String, String) {
    let d = deployment();
    let namespace = d["metadata"]["namespace"].as_str().expect("namespace");
    let name = d["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("the Deployment names its ServiceAccount");
    (namespace.to_owned(), name.to_owned())
}

/// The flags of the Deployment's container.
fn deployment_args() -> Vec<String> {
    deployment()["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_sequence()
        .expect("the container has args")
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

/// The role name in grants of the ClusterRole under test.
const ROLE_UNDER_TEST: &str = "ClusterRole/system:cloud-controller-manager";

/// How kube-apiserver's RequestInfo sees a logged request. A list or watch with the field
/// selector `metadata.name=<n>` names the object `<n>`, as in kube-apiserver.
fn access_of(r: &RequestRecord) -> Access {
    let mut name = r.name.clone();
    if name.is_none() && (r.verb == "list" || r.verb == "watch") {
        name = r
            .query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == "fieldSelector")
            .and_then(|(_, v)| {
                percent_decode(v)
                    .split(',')
                    .find_map(|s| s.strip_prefix("metadata.name=").map(str::to_owned))
            });
    }
    Access {
        verb: r.verb.clone(),
        group: r.group.clone(),
        resource: r.resource.clone(),
        subresource: r.subresource.clone(),
        namespace: r.namespace.clone(),
        name,
    }
}

/// Decodes `%XX` escapes and `+` of a query value (hand-written: a dozen lines do not justify a
/// URL crate in the dev-dependencies).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 3 <= bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn harness_client(server: &ApiServer) -> kube::Client {
    let mut config = kube::Config::new(server.url().parse().unwrap());
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(HARNESS_AGENT),
    ));
    kube::Client::try_from(config).unwrap()
}

fn initialised(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_ref())
        .is_some()
        && !has_taint(node, "node.cloudprovider.kubernetes.io/uninitialized")
        && node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .is_some_and(|a| a.iter().any(|a| a.type_ == "InternalIP"))
}

fn network_available(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "NetworkUnavailable" && c.status == "False")
        })
}

fn has_ingress(svc: &Service) -> bool {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .is_some_and(|i| !i.is_empty())
}

async fn set_ready(nodes: &Api<Node>, name: &str, status: &str) {
    let patch = serde_json::json!({"status": {"conditions": [{
        "type": "Ready", "status": status, "reason": "Test",
        "message": format!("set to {status} by the RBAC scenario"),
    }]}});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .unwrap();
}

/// GET `https://<addr>/metrics` with a bearer token; the status code.
async fn scrape(addr: std::net::SocketAddr, token: &str) -> u16 {
    let client = reqwest::Client::builder()
        .use_rustls_tls()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    client
        .get(format!("https://{addr}/metrics"))
        .bearer_auth(token)
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

/// Runs the scenario and returns the requests the CCM made.
async fn scenario() -> Vec<RequestRecord> {
    let server = ApiServer::start().await;
    // As a v1.33 kube-apiserver with the WatchList feature gate off: the informers list in
    // pages, so the role's `list` grants are exercised too (a streaming server needs only
    // `watch`, and the role must serve both).
    server.set_watch_list(false);
    let client = harness_client(&server);
    let cloud = FakeCloud::builder().build();
    let nodes: Api<Node> = Api::all(client.clone());
    let services: Api<Service> = Api::namespaced(client.clone(), "default");

    // Who may scrape /metrics.
    let scraper = "system:serviceaccount:monitoring:prometheus";
    server.add_token("scraper-token", scraper, &["system:serviceaccounts"]);
    server.allow_non_resource(scraper, "get", "/metrics");

    // The deployment's leader-election flags (so the Lease name matches the role's
    // resourceNames), fast timings for the scenario.
    let container_args = deployment_args();
    let mut args = vec![
        "ccm".to_owned(),
        format!("--master={}", server.url()),
        "--cloud-provider=fake".to_owned(),
        "--cluster-cidr=10.0.0.0/8".to_owned(),
        "--node-monitor-period=1s".to_owned(),
        "--node-deletion-grace-period=1s".to_owned(),
        "--node-status-update-frequency=1s".to_owned(),
        "--route-reconciliation-period=2s".to_owned(),
        "--leader-elect-lease-duration=4s".to_owned(),
        "--leader-elect-renew-deadline=3s".to_owned(),
        "--leader-elect-retry-period=1s".to_owned(),
        "--shutdown-grace-period=5s".to_owned(),
    ];
    args.extend(
        container_args
            .into_iter()
            .filter(|a| a.starts_with("--leader-elect")),
    );
    assert!(args.iter().any(|a| a == "--leader-elect=true"), "{args:?}");

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    // The first guarded spec patch of a Node conflicts: the cloud-node controller re-reads it.
    server.fail_next("patch", "nodes", 1, 409, None);
    let ccm = tokio::spawn(
        ccm_controllers::Builder::new()
            .args(args)
            .provider(cloud.provider())
            .listener(listener)
            .shutdown_signal(shutdown.clone().cancelled_owned())
            .run_async(),
    );

    // Leader election: the Lease is acquired and renewed.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let renewed = eventually(WAIT, || async {
        leases
            .get_opt("cloud-controller-manager")
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec)
            .is_some_and(|s| s.holder_identity.is_some() && s.renew_time.is_some())
    })
    .await;
    assert!(renewed, "the CCM did not acquire the Lease");

    // Nodes register and are initialised; routes and NetworkUnavailable follow.
    for (i, name) in ["rbac-a", "rbac-b", "rbac-c", "rbac-gone"]
        .iter()
        .enumerate()
    {
        let cidr = format!("10.1.{i}.0/24");
        nodes
            .create(
                &PostParams::default(),
                &kubelet_node(name).pod_cidrs(&[&cidr]).build(),
            )
            .await
            .unwrap();
    }
    for name in ["rbac-a", "rbac-b", "rbac-c", "rbac-gone"] {
        wait_for(&nodes, name, WAIT, |n: &Node| {
            initialised(n) && network_available(n)
        })
        .await
        .unwrap();
    }

    // Load balancers: the finalizer patch of the first Service conflicts (fresh read).
    server.fail_next("patch", "services/status", 1, 409, None);
    for name in ["rbac-lb-1", "rbac-lb-2"] {
        services
            .create(
                &PostParams::default(),
                &load_balancer_service("default", name).build(),
            )
            .await
            .unwrap();
    }
    for name in ["rbac-lb-1", "rbac-lb-2"] {
        wait_for(&services, name, WAIT, has_ingress).await.unwrap();
    }
    // An update of a Service (a new port): the load balancer is ensured again, and the
    // repeated Events become series (patches).
    let patch =
        serde_json::json!({"spec": {"ports": [{"name": "alt", "port": 8080, "protocol": "TCP"}]}});
    services
        .patch(
            "rbac-lb-1",
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
        .unwrap();
    assert!(
        eventually(WAIT, || async {
            cloud
                .load_balancers()
                .get("default/rbac-lb-1")
                .is_some_and(|lb| lb.ports.contains(&8080))
        })
        .await,
        "the load balancer was not updated"
    );

    // A shut-down instance: the shutdown taint comes while the Node is NotReady and goes when
    // it is Ready again.
    cloud.set_shutdown_nodes(&["^rbac-b$"]);
    set_ready(&nodes, "rbac-b", "False").await;
    wait_for(&nodes, "rbac-b", WAIT, |n: &Node| {
        has_taint(n, SHUTDOWN_TAINT)
    })
    .await
    .unwrap();
    cloud.set_shutdown_nodes(&[]);
    set_ready(&nodes, "rbac-b", "True").await;
    wait_for(&nodes, "rbac-b", WAIT, |n: &Node| {
        !has_taint(n, SHUTDOWN_TAINT)
    })
    .await
    .unwrap();

    // An instance that is gone: its Node is deleted, and the load balancers lose the host.
    cloud.set_missing_nodes(&["^rbac-gone$"]);
    set_ready(&nodes, "rbac-gone", "Unknown").await;
    wait_for_deletion(&nodes, "rbac-gone", WAIT).await.unwrap();
    assert!(
        eventually(WAIT, || async {
            cloud
                .load_balancers()
                .values()
                .all(|lb| !lb.hosts.iter().any(|h| h == "rbac-gone"))
        })
        .await,
        "the load balancers kept the deleted node"
    );

    // A Service deleted: the load balancer goes, then the finalizer.
    services
        .delete("rbac-lb-2", &DeleteParams::default())
        .await
        .unwrap();
    wait_for_deletion(&services, "rbac-lb-2", WAIT)
        .await
        .unwrap();

    // /metrics with a ServiceAccount token: TokenReview and SubjectAccessReview.
    assert_eq!(scrape(addr, "scraper-token").await, 200);
    assert_eq!(scrape(addr, "unknown-token").await, 401);

    // Graceful shutdown releases the Lease.
    shutdown.cancel();
    assert_eq!(ccm.await.unwrap(), 0, "the CCM's exit code");
    server.requests()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_role_is_sufficient_and_minimal() {
    // The runtime keeps an installed subscriber: warnings and errors only, captured by the test
    // harness.
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_test_writer()
        .try_init();
    // The roles bound to the Deployment's ServiceAccount.
    let mut manifests = Manifests::default();
    manifests.add_yaml("built-in roles", BUILTIN_ROLES).unwrap();
    for file in deployed_files() {
        manifests.add_yaml(&file, &read(&file)).unwrap();
    }
    let (sa_namespace, sa_name) = service_account();
    let grants = manifests
        .grants_of_service_account(&sa_namespace, &sa_name)
        .unwrap();
    assert!(
        grants.iter().any(|g| g.role == ROLE_UNDER_TEST),
        "{ROLE_UNDER_TEST} is not bound to {sa_namespace}/{sa_name}"
    );

    let requests = scenario().await;
    let strangers: BTreeSet<String> = requests
        .iter()
        .filter_map(|r| r.user_agent.clone())
        .filter(|a| a != HARNESS_AGENT && !a.starts_with(CCM_AGENT_PREFIX))
        .collect();
    assert!(
        strangers.is_empty(),
        "requests from unknown clients (the CCM must use its own user agent everywhere): {strangers:?}"
    );
    let ccm_requests: Vec<&RequestRecord> = requests
        .iter()
        .filter(|r| {
            r.user_agent
                .as_deref()
                .is_some_and(|a| a.starts_with(CCM_AGENT_PREFIX))
        })
        .collect();
    let non_resource: Vec<&str> = ccm_requests
        .iter()
        .filter(|r| r.resource.is_empty())
        .map(|r| r.path.as_str())
        .collect();
    assert!(
        non_resource.is_empty(),
        "non-resource requests (not modelled): {non_resource:?}"
    );
    let accesses: BTreeSet<Access> = ccm_requests.iter().map(|r| access_of(r)).collect();

    let uncovered = eval::uncovered(&grants, &accesses);
    let unneeded = eval::unneeded(&grants, ROLE_UNDER_TEST, &accesses);
    let list = |items: Vec<String>| items.join("\n  ");
    let all = list(accesses.iter().map(ToString::to_string).collect());
    assert!(
        uncovered.is_empty(),
        "requests of the CCM that examples/deploy does not allow:\n  {}\n\nall requests:\n  {all}",
        list(uncovered.iter().map(ToString::to_string).collect())
    );
    assert!(
        unneeded.is_empty(),
        "grants of {ROLE_UNDER_TEST} that no request needs:\n  {}\n\nall requests:\n  {all}",
        list(unneeded.iter().map(ToString::to_string).collect())
    );

    // The proof can fail on this very role and scenario: without any one of the role's grants
    // some request is refused, and each grant added to it is reported as unneeded.
    for (i, g) in grants.iter().enumerate() {
        if g.role != ROLE_UNDER_TEST {
            continue;
        }
        let mut fewer = grants.clone();
        fewer.remove(i);
        assert!(
            !eval::uncovered(&fewer, &accesses).is_empty(),
            "removing {g} went unnoticed"
        );
    }
    let template = grants
        .iter()
        .find(|g| g.role == ROLE_UNDER_TEST)
        .unwrap()
        .clone();
    for extra in [
        Grant {
            group: String::new(),
            resource: "nodes".into(),
            verb: "update".into(),
            resource_name: None,
            ..template.clone()
        },
        Grant {
            group: String::new(),
            resource: "secrets".into(),
            verb: "get".into(),
            resource_name: None,
            ..template.clone()
        },
        Grant {
            group: "coordination.k8s.io".into(),
            resource: "leases".into(),
            verb: "get".into(),
            resource_name: Some("another-lease".into()),
            ..template
        },
    ] {
        let mut more = grants.clone();
        more.push(extra.clone());
        assert!(
            eval::unneeded(&more, ROLE_UNDER_TEST, &accesses).contains(&extra),
            "adding {extra} went unnoticed"
        );
    }
}

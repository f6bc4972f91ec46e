//! Leader election of whole runtimes: only the leader runs controllers; a graceful stop releases
//! the lease so the standby takes over at once; a killed leader (no release) is replaced after
//! the lease expires; a stolen lease makes the leader exit non-zero; readiness, health and
//! `leader_election_master_status` per state.
//!
//! Runs against a small lease-capable API server defined here (GET/POST/PATCH of Leases with
//! merge semantics, empty Node/Service lists).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::get;
use ccm_controllers::{Builder, ControllerContext};
use ccm_core::{CloudProvider, CloudResult, InstanceMetadata, InstancesV2, Node};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

// ---------------------------------------------------------------------------------------------
// A lease-capable API server.

#[derive(Clone, Default)]
struct Leases(Arc<Mutex<HashMap<(String, String), Value>>>);

fn status(code: u16, reason: &str, message: &str) -> Response {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(
            json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                   "reason":reason,"code":code,"message":message})
            .to_string(),
        ))
        .unwrap()
}

fn object(code: u16, v: &Value) -> Response {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(v.to_string()))
        .unwrap()
}

/// RFC 7386 JSON merge (null deletes); what both the apply and the strategic patches of the
/// lease manager amount to for a Lease.
fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

fn bump(lease: &mut Value) {
    let rv: u64 = lease["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    lease["metadata"]["resourceVersion"] = json!((rv + 1).to_string());
}

async fn lease_get(
    State(leases): State<Leases>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    match leases.0.lock().unwrap().get(&(ns, name.clone())) {
        Some(l) => object(200, l),
        None => status(404, "NotFound", &format!("leases \"{name}\" not found")),
    }
}

async fn lease_create(
    State(leases): State<Leases>,
    Path(ns): Path<String>,
    body: Bytes,
) -> Response {
    let mut lease: Value = serde_json::from_slice(&body).unwrap();
    let name = lease["metadata"]["name"].as_str().unwrap().to_owned();
    lease["metadata"]["namespace"] = json!(ns);
    lease["apiVersion"] = json!("coordination.k8s.io/v1");
    lease["kind"] = json!("Lease");
    bump(&mut lease);
    let mut map = leases.0.lock().unwrap();
    if map.contains_key(&(ns.clone(), name.clone())) {
        return status(
            409,
            "AlreadyExists",
            &format!("leases \"{name}\" already exists"),
        );
    }
    map.insert((ns, name), lease.clone());
    object(201, &lease)
}

async fn lease_patch(
    State(leases): State<Leases>,
    Path((ns, name)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let patch: Value = serde_json::from_slice(&body).unwrap();
    let mut map = leases.0.lock().unwrap();
    match map.get_mut(&(ns, name.clone())) {
        Some(lease) => {
            merge(lease, &patch);
            bump(lease);
            object(200, lease)
        }
        None => status(404, "NotFound", &format!("leases \"{name}\" not found")),
    }
}

async fn list_or_watch(
    Query(q): Query<BTreeMap<String, String>>,
    Path(kind): Path<String>,
) -> Response {
    if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
        let stream = futures::stream::pending::<Result<Vec<u8>, std::io::Error>>();
        return Response::builder()
            .header("content-type", "application/json")
            .body(Body::from_stream(stream))
            .unwrap();
    }
    let list = if kind == "nodes" {
        "NodeList"
    } else {
        "ServiceList"
    };
    object(
        200,
        &json!({"kind":list,"apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}),
    )
}

async fn api_server() -> (String, kube::Client) {
    let leases = Leases::default();
    let app = axum::Router::new()
        .route("/api/v1/{kind}", get(list_or_watch))
        .route(
            "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
            axum::routing::post(lease_create),
        )
        .route(
            "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}",
            get(lease_get).patch(lease_patch),
        )
        .fallback(|| async { StatusCode::NOT_FOUND })
        .with_state(leases);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    (url, client)
}

// ---------------------------------------------------------------------------------------------
// Helpers.

struct Cloud;

#[async_trait::async_trait]
impl CloudProvider for Cloud {
    fn provider_name(&self) -> &str {
        "leader-test"
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }
}

#[async_trait::async_trait]
impl InstancesV2 for Cloud {
    async fn instance_exists(&self, _: &Node) -> CloudResult<bool> {
        Ok(true)
    }
    async fn instance_shutdown(&self, _: &Node) -> CloudResult<bool> {
        Ok(false)
    }
    async fn instance_metadata(&self, _: &Node) -> CloudResult<InstanceMetadata> {
        Ok(InstanceMetadata::default())
    }
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return (0, String::new());
    };
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let response = String::from_utf8(response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (
        head.split(' ').nth(1).unwrap().parse().unwrap(),
        body.to_owned(),
    )
}

async fn eventually<F, Fut>(mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// One runtime under test.
struct Replica {
    addr: std::net::SocketAddr,
    running: Arc<AtomicBool>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<i32>,
}

impl Replica {
    fn start(master: &str, lease: &str, timing: &[&str]) -> Replica {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let running = Arc::new(AtomicBool::new(false));
        let flag = running.clone();
        let (stop, stop_rx) = oneshot::channel::<()>();
        let mut args = vec![
            "ccm".to_owned(),
            format!("--master={master}"),
            format!("--leader-elect-resource-name={lease}"),
            "--leader-elect-resource-namespace=kube-system".to_owned(),
            "--shutdown-grace-period=5s".to_owned(),
        ];
        args.extend(timing.iter().map(|s| (*s).to_owned()));
        let builder = Builder::new()
            .provider(Arc::new(Cloud))
            .listener(listener)
            .controller("probe", move |ctx: ControllerContext| {
                let flag = flag.clone();
                async move {
                    // Reset when the controller returns or is aborted.
                    struct Running(Arc<AtomicBool>);
                    impl Drop for Running {
                        fn drop(&mut self) {
                            self.0.store(false, Ordering::SeqCst);
                        }
                    }
                    flag.store(true, Ordering::SeqCst);
                    let _running = Running(flag);
                    ctx.shutdown.cancelled().await;
                    Ok(())
                }
            })
            .args(args)
            .shutdown_signal(async {
                let _ = stop_rx.await;
            });
        Replica {
            addr,
            running,
            stop: Some(stop),
            task: tokio::spawn(builder.run_async()),
        }
    }

    fn runs_controllers(&self) -> bool {
        self.running.load(Ordering::SeqCst)
    }

    async fn master_status(&self, lease: &str) -> Option<f64> {
        let (_, body) = http_get(self.addr, "/metrics").await;
        let series = format!("leader_election_master_status{{name=\"{lease}\"}} ");
        body.lines()
            .find_map(|l| l.strip_prefix(&series))
            .and_then(|v| v.parse().ok())
    }

    async fn stop(mut self) -> i32 {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .expect("stops")
            .unwrap()
    }
}

async fn holder(client: &kube::Client, lease: &str) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), "kube-system")
        .get(lease)
        .await
        .ok()?
        .spec?
        .holder_identity
}

// Lease 30 s: a standby that takes over within the 20 s wait can only have done so because
// the lease was released.
const LONG_LEASE: [&str; 3] = [
    "--leader-elect-lease-duration=30s",
    "--leader-elect-renew-deadline=20s",
    "--leader-elect-retry-period=1s",
];

#[tokio::test]
async fn only_the_leader_runs_controllers_and_a_graceful_stop_hands_over() {
    let (master, client) = api_server().await;
    let lease = "ccm-handover";
    let a = Replica::start(&master, lease, &LONG_LEASE);
    assert!(
        eventually(|| async { a.runs_controllers() }).await,
        "A leads"
    );
    assert_eq!(a.master_status(lease).await, Some(1.0));
    assert_eq!(
        http_get(a.addr, "/readyz").await.0,
        200,
        "leading and synced"
    );
    assert_eq!(http_get(a.addr, "/healthz").await.0, 200);
    let a_identity = holder(&client, lease).await.expect("A holds the lease");
    let host = hostname::get().unwrap().into_string().unwrap();
    assert!(a_identity.starts_with(&format!("{host}_")), "{a_identity}");

    let b = Replica::start(&master, lease, &LONG_LEASE);
    assert!(
        eventually(|| async { b.master_status(lease).await == Some(0.0) }).await,
        "B stands by"
    );
    assert_eq!(
        http_get(b.addr, "/readyz").await.0,
        200,
        "standing by healthily"
    );
    assert_eq!(http_get(b.addr, "/healthz").await.0, 200);
    // Several retry periods later B still stands by and runs nothing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!b.runs_controllers(), "only the leader runs controllers");
    assert!(a.runs_controllers());
    assert_eq!(
        holder(&client, lease).await.as_deref(),
        Some(a_identity.as_str())
    );

    // Graceful stop of A: controllers stop, the lease is released, B takes over long before
    // the 30 s lease would have expired.
    let a_running = a.running.clone();
    assert_eq!(a.stop().await, 0);
    assert!(!a_running.load(Ordering::SeqCst));
    assert_ne!(
        holder(&client, lease).await.as_deref(),
        Some(a_identity.as_str()),
        "A released the lease"
    );
    assert!(
        eventually(|| async { b.runs_controllers() }).await,
        "B leads after A released"
    );
    assert_eq!(b.master_status(lease).await, Some(1.0));
    assert_eq!(http_get(b.addr, "/readyz").await.0, 200);
    assert_eq!(b.stop().await, 0);
}

#[tokio::test]
async fn a_killed_leader_is_replaced_after_the_lease_expires() {
    let (master, client) = api_server().await;
    let lease = "ccm-kill";
    let timing = [
        "--leader-elect-lease-duration=3s",
        "--leader-elect-renew-deadline=2s",
        "--leader-elect-retry-period=1s",
    ];
    let a = Replica::start(&master, lease, &timing);
    assert!(eventually(|| async { a.runs_controllers() }).await);
    let a_identity = holder(&client, lease).await.unwrap();
    let b = Replica::start(&master, lease, &timing);
    assert!(eventually(|| async { b.master_status(lease).await == Some(0.0) }).await);
    assert!(!b.runs_controllers());

    // Kill A: drop the runtime without releasing.
    a.task.abort();
    let _ = a.task.await;
    assert_eq!(
        holder(&client, lease).await.as_deref(),
        Some(a_identity.as_str()),
        "a killed leader does not release"
    );
    assert!(
        eventually(|| async { b.runs_controllers() }).await,
        "B leads once A's lease expired"
    );
    assert_ne!(
        holder(&client, lease).await.as_deref(),
        Some(a_identity.as_str())
    );
    assert_eq!(b.stop().await, 0);
}

#[tokio::test]
async fn a_stolen_lease_makes_the_leader_exit_non_zero() {
    let (master, client) = api_server().await;
    let lease = "ccm-stolen";
    let a = Replica::start(&master, lease, &LONG_LEASE);
    assert!(eventually(|| async { a.runs_controllers() }).await);
    // Another process takes the lease (e.g. after a long partition).
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(jiff::Timestamp::now());
    Api::<Lease>::namespaced(client.clone(), "kube-system")
        .patch(
            lease,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": "thief", "renewTime": now, "leaseDurationSeconds": 30}})),
        )
        .await
        .unwrap();
    let code = tokio::time::timeout(Duration::from_secs(20), a.task)
        .await
        .expect("the leader exits")
        .unwrap();
    assert_eq!(code, 1, "losing the lease exits non-zero");
    assert!(
        !a.running.load(Ordering::SeqCst),
        "controllers were stopped"
    );
    assert_eq!(holder(&client, lease).await.as_deref(), Some("thief"));
}

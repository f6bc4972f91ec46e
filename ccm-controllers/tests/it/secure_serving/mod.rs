//! HTTPS serving with delegated authentication and authorisation, against a mock API server
//! that answers TokenReviews and SubjectAccessReviews and counts them.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use ccm_controllers::secure_serving::{SecureServer, SecureServingArgs, UserInfo, serve_on};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

mod authn;
mod client_certs;
mod layer;
mod tls;

// ---------------------------------------------------------------------------------------------
// Mock API server
// ---------------------------------------------------------------------------------------------

/// Tokens the mock knows: `alice-token` (may get /metrics), `mallory-token` (may not),
/// `root-token` (in system:masters), `broken-token` (review answers with an error). Any other
/// token is not authenticated.
#[derive(Default)]
struct MockState {
    token_reviews: AtomicUsize,
    access_reviews: AtomicUsize,
    fail_access_reviews: AtomicBool,
    last_access_review: Mutex<Option<Value>>,
    configmap_gets: AtomicUsize,
    /// What GET configmap kube-system/extension-apiserver-authentication answers.
    auth_configmap: Mutex<AuthConfigMap>,
}

#[derive(Default, Clone)]
enum AuthConfigMap {
    #[default]
    Missing,
    Forbidden,
    ClientCa(String),
}

struct MockApi {
    url: String,
    state: Arc<MockState>,
}

impl MockApi {
    async fn start() -> Self {
        let state = Arc::new(MockState::default());
        let app = axum::Router::new()
            .route(
                "/apis/authentication.k8s.io/v1/tokenreviews",
                post(token_review),
            )
            .route(
                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                post(access_review),
            )
            .route(
                "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication",
                get(auth_configmap),
            )
            .with_state(state.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { url, state }
    }

    fn client(&self) -> kube::Client {
        client_for(&self.url)
    }

    fn token_reviews(&self) -> usize {
        self.state.token_reviews.load(Ordering::SeqCst)
    }

    fn access_reviews(&self) -> usize {
        self.state.access_reviews.load(Ordering::SeqCst)
    }

    fn configmap_gets(&self) -> usize {
        self.state.configmap_gets.load(Ordering::SeqCst)
    }

    fn set_auth_configmap(&self, cm: AuthConfigMap) {
        *self.state.auth_configmap.lock().unwrap() = cm;
    }
}

async fn auth_configmap(State(s): State<Arc<MockState>>) -> (StatusCode, Json<Value>) {
    s.configmap_gets.fetch_add(1, Ordering::SeqCst);
    let status = |code: u16, reason: &str, message: &str| {
        Json(
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}),
        )
    };
    let cm = s.auth_configmap.lock().unwrap().clone();
    match cm {
        AuthConfigMap::Missing => (
            StatusCode::NOT_FOUND,
            status(
                404,
                "NotFound",
                "configmaps \"extension-apiserver-authentication\" not found",
            ),
        ),
        AuthConfigMap::Forbidden => (
            StatusCode::FORBIDDEN,
            status(
                403,
                "Forbidden",
                "configmaps \"extension-apiserver-authentication\" is forbidden",
            ),
        ),
        AuthConfigMap::ClientCa(pem) => (
            StatusCode::OK,
            Json(json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
                "data": {"client-ca-file": pem},
            })),
        ),
    }
}

fn client_for(url: &str) -> kube::Client {
    kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap()
}

async fn token_review(State(s): State<Arc<MockState>>, Json(review): Json<Value>) -> Json<Value> {
    s.token_reviews.fetch_add(1, Ordering::SeqCst);
    let token = review["spec"]["token"].as_str().unwrap_or_default();
    let user = |name: &str, groups: &[&str]| json!({"authenticated": true, "user": {"username": name, "uid": format!("uid-{name}"), "groups": groups}});
    let status = match token {
        "alice-token" => user("alice", &["team-a"]),
        "mallory-token" => user("mallory", &["team-m"]),
        "root-token" => user("root", &["system:masters"]),
        "broken-token" => json!({"authenticated": false, "error": "token signer unavailable"}),
        _ => json!({"authenticated": false}),
    };
    Json(json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "metadata": {},
        "spec": review["spec"],
        "status": status,
    }))
}

async fn access_review(
    State(s): State<Arc<MockState>>,
    Json(review): Json<Value>,
) -> (StatusCode, Json<Value>) {
    s.access_reviews.fetch_add(1, Ordering::SeqCst);
    *s.last_access_review.lock().unwrap() = Some(review.clone());
    if s.fail_access_reviews.load(Ordering::SeqCst) {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": "etcd is on fire", "reason": "InternalError", "code": 500}),
            ),
        );
    }
    let spec = &review["spec"];
    let allowed = spec["user"] == "alice"
        && spec["nonResourceAttributes"]["path"] == "/metrics"
        && spec["nonResourceAttributes"]["verb"] == "get";
    let reason = if allowed {
        "RBAC: allowed by ClusterRoleBinding \"metrics\""
    } else {
        ""
    };
    (
        StatusCode::CREATED,
        Json(json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "metadata": {},
            "spec": spec,
            "status": {"allowed": allowed, "reason": reason},
        })),
    )
}

/// An address nothing listens on: the API server "cannot be reached".
/// A URL on which nothing listens, for as long as the test process runs: its port stays bound
/// by a socket that never listens, so connecting is refused at once, and no other test's server
/// can bind the port meanwhile (a port freed right after binding was taken by a concurrent
/// test's mock API server, which then answered the "unreachable" URL).
async fn unreachable_url() -> String {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = socket.local_addr().unwrap();
    // Never listened on, never closed.
    std::mem::forget(socket);
    format!("http://{addr}")
}

fn write_kubeconfig(dir: &Path, server: &str) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n\
             users:\n- name: u\n  user:\n    token: reviewer\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n\
             current-context: x\n"
        ),
    )
    .unwrap();
    path
}

// ---------------------------------------------------------------------------------------------
// The server under test
// ---------------------------------------------------------------------------------------------

struct Running {
    addr: SocketAddr,
    shutdown: CancellationToken,
    server: Option<SecureServer>,
}

impl Running {
    fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.addr.port())
    }

    async fn stop(mut self) {
        self.shutdown.cancel();
        self.server.take().unwrap().wait().await.unwrap();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn app() -> axum::Router {
    axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/livez", get(|| async { "ok" }))
        .route(
            "/metrics",
            get(|| async { "# EOF\n" }).post(|| async { "posted" }),
        )
        .route(
            "/whoami",
            get(
                |user: Option<axum::Extension<UserInfo>>, headers: HeaderMap| async move {
                    Json(json!({
                        "user": user.map(|u| u.0.username.clone()),
                        "authorization_header": headers.contains_key("authorization"),
                    }))
                },
            ),
        )
}

async fn start(args: SecureServingArgs, client: kube::Client) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let shutdown = CancellationToken::new();
    let server = serve_on(listener, app(), &args, client, shutdown.clone())
        .await
        .unwrap();
    Running {
        addr: server.local_addr(),
        shutdown,
        server: Some(server),
    }
}

fn https() -> reqwest::Client {
    https_builder().build().unwrap()
}

fn https_builder() -> reqwest::ClientBuilder {
    // A fresh client (no pooled connection) per call site, so every check does a handshake.
    reqwest::Client::builder()
        .use_rustls_tls()
        .danger_accept_invalid_certs(true)
        .tls_info(true)
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(30))
}

async fn get_with(url: &str, token: Option<&str>) -> (StatusCode, String) {
    let mut req = https().get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    (status, resp.text().await.unwrap())
}

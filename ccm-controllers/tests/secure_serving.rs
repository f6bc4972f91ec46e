//! HTTPS serving with delegated authentication and authorisation, against a mock API server
//! that answers TokenReviews and SubjectAccessReviews and counts them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use ccm_controllers::secure_serving::{
    SecureServer, SecureServingArgs, TlsVersion, UserInfo, serve, serve_on,
};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

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
async fn unreachable_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
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

// ---------------------------------------------------------------------------------------------
// Authentication and authorisation
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn request_without_token_gets_401() {
    let api = MockApi::start().await;
    let srv = start(SecureServingArgs::default(), api.client()).await;
    let (status, body) = get_with(&srv.url("/metrics"), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["reason"], "Unauthorized");
    // A non-bearer scheme counts as no credentials.
    let resp = https()
        .get(srv.url("/metrics"))
        .basic_auth("alice", Some("pw"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(api.token_reviews(), 0);
    assert_eq!(api.access_reviews(), 0);
    srv.stop().await;
}

#[tokio::test]
async fn invalid_token_gets_401() {
    let api = MockApi::start().await;
    let srv = start(SecureServingArgs::default(), api.client()).await;
    let (status, _) = get_with(&srv.url("/metrics"), Some("forged-token")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // A review that answers with an error is refused too.
    let (status, _) = get_with(&srv.url("/metrics"), Some("broken-token")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(api.token_reviews(), 2);
    assert_eq!(
        api.access_reviews(),
        0,
        "no authorisation without authentication"
    );
    srv.stop().await;
}

#[tokio::test]
async fn valid_token_of_allowed_subject_gets_200() {
    let api = MockApi::start().await;
    let srv = start(SecureServingArgs::default(), api.client()).await;
    let (status, body) = get_with(&srv.url("/metrics"), Some("alice-token")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, "# EOF\n");
    let review = api
        .state
        .last_access_review
        .lock()
        .unwrap()
        .clone()
        .unwrap();
    assert_eq!(review["apiVersion"], "authorization.k8s.io/v1");
    let spec = &review["spec"];
    assert_eq!(spec["user"], "alice");
    assert_eq!(spec["uid"], "uid-alice");
    assert_eq!(
        spec["groups"],
        json!(["team-a", "system:authenticated"]),
        "Go adds system:authenticated"
    );
    assert_eq!(
        spec["nonResourceAttributes"],
        json!({"path": "/metrics", "verb": "get"})
    );
    assert!(spec.get("resourceAttributes").is_none());
    srv.stop().await;
}

#[tokio::test]
async fn handler_sees_the_user_and_not_the_token() {
    let api = MockApi::start().await;
    let args = SecureServingArgs {
        authorization_always_allow_paths: vec!["/healthz".into()],
        ..SecureServingArgs::default()
    };
    let srv = start(args, api.client()).await;
    // Only alice may "get /metrics" in the mock; root is in system:masters and skips the review.
    let (status, body) = get_with(&srv.url("/whoami"), Some("root-token")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["user"], "root");
    assert_eq!(body["authorization_header"], false);
    assert_eq!(
        api.access_reviews(),
        0,
        "system:masters skips the SubjectAccessReview"
    );
    srv.stop().await;
}

#[tokio::test]
async fn denied_subject_gets_403() {
    let api = MockApi::start().await;
    let srv = start(SecureServingArgs::default(), api.client()).await;
    let (status, body) = get_with(&srv.url("/metrics"), Some("mallory-token")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["reason"], "Forbidden");
    assert_eq!(
        body["message"],
        "forbidden: User \"mallory\" cannot get path \"/metrics\""
    );
    // The verb is the lower-cased HTTP method, as Go's RequestInfo has it for non-resource paths.
    let resp = https()
        .post(srv.url("/metrics"))
        .bearer_auth("alice-token")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let review = api
        .state
        .last_access_review
        .lock()
        .unwrap()
        .clone()
        .unwrap();
    assert_eq!(review["spec"]["nonResourceAttributes"]["verb"], "post");
    srv.stop().await;
}

#[tokio::test]
async fn always_allowed_paths_skip_authentication_and_authorization() {
    let api = MockApi::start().await;
    let args = SecureServingArgs {
        authorization_always_allow_paths: vec!["/healthz".into(), "/who*".into()],
        ..SecureServingArgs::default()
    };
    let srv = start(args, api.client()).await;
    assert_eq!(get_with(&srv.url("/healthz"), None).await.0, StatusCode::OK);
    assert_eq!(get_with(&srv.url("/whoami"), None).await.0, StatusCode::OK);
    // Not in the list any more: /livez needs credentials now.
    assert_eq!(
        get_with(&srv.url("/livez"), None).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(api.token_reviews(), 0);
    assert_eq!(api.access_reviews(), 0);
    srv.stop().await;
}

#[tokio::test]
async fn default_always_allowed_paths_are_the_probes() {
    let api = MockApi::start().await;
    let srv = start(SecureServingArgs::default(), api.client()).await;
    assert_eq!(get_with(&srv.url("/healthz"), None).await.0, StatusCode::OK);
    assert_eq!(get_with(&srv.url("/livez"), None).await.0, StatusCode::OK);
    // /readyz is allowed too: the router has no such route, so it is 404, not 401.
    assert_eq!(
        get_with(&srv.url("/readyz"), None).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get_with(&srv.url("/nothing"), None).await.0,
        StatusCode::UNAUTHORIZED
    );
    srv.stop().await;
}

#[tokio::test]
async fn token_review_unreachable_refuses_with_401() {
    let api = MockApi::start().await;
    let down = unreachable_url().await;
    let args = SecureServingArgs {
        // The client-CA lookup would fail (and refuse to start) with this client.
        authentication_skip_lookup: true,
        ..SecureServingArgs::default()
    };
    let srv = start(args, client_for(&down)).await;
    let (status, _) = get_with(&srv.url("/metrics"), Some("alice-token")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // The failure is not cached as a verdict, and probes keep working.
    assert_eq!(get_with(&srv.url("/healthz"), None).await.0, StatusCode::OK);
    assert_eq!(api.token_reviews(), 0);
    srv.stop().await;
}

#[tokio::test]
async fn access_review_unreachable_refuses_with_500() {
    let api = MockApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let down = unreachable_url().await;
    let args = SecureServingArgs {
        authorization_kubeconfig: Some(write_kubeconfig(dir.path(), &down)),
        ..SecureServingArgs::default()
    };
    let srv = start(args, api.client()).await;
    let (status, body) = get_with(&srv.url("/metrics"), Some("alice-token")).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert!(body.contains("authorization review failed"), "{body}");
    assert_eq!(
        api.token_reviews(),
        1,
        "authentication used the main client"
    );
    assert_eq!(api.access_reviews(), 0);
    srv.stop().await;
}

#[tokio::test]
async fn access_review_error_is_not_cached_and_never_lets_through() {
    let api = MockApi::start().await;
    api.state.fail_access_reviews.store(true, Ordering::SeqCst);
    let srv = start(SecureServingArgs::default(), api.client()).await;
    let (status, _) = get_with(&srv.url("/metrics"), Some("alice-token")).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let failed = api.access_reviews();
    assert!(
        failed >= 2,
        "a 500 is retried (Go's webhook backoff): {failed}"
    );
    api.state.fail_access_reviews.store(false, Ordering::SeqCst);
    let (status, _) = get_with(&srv.url("/metrics"), Some("alice-token")).await;
    assert_eq!(status, StatusCode::OK, "the error was not cached");
    assert_eq!(api.access_reviews(), failed + 1);
    srv.stop().await;
}

#[tokio::test]
async fn authentication_kubeconfig_is_used_for_token_reviews() {
    let api = MockApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let down = unreachable_url().await;
    let args = SecureServingArgs {
        authentication_kubeconfig: Some(write_kubeconfig(dir.path(), &api.url)),
        authorization_kubeconfig: Some(write_kubeconfig(dir.path(), &api.url)),
        ..SecureServingArgs::default()
    };
    // The main client is unreachable: only the kubeconfigs can make this work.
    let srv = start(args, client_for(&down)).await;
    let (status, body) = get_with(&srv.url("/metrics"), Some("alice-token")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(api.token_reviews(), 1);
    assert_eq!(api.access_reviews(), 1);
    srv.stop().await;
}

#[tokio::test]
async fn reviews_are_cached_for_both_outcomes() {
    let api = MockApi::start().await;
    let srv = start(SecureServingArgs::default(), api.client()).await;
    for _ in 0..3 {
        assert_eq!(
            get_with(&srv.url("/metrics"), Some("alice-token")).await.0,
            StatusCode::OK
        );
    }
    assert_eq!(
        api.token_reviews(),
        1,
        "second and third requests hit the token cache"
    );
    assert_eq!(api.access_reviews(), 1, "and the authorized cache");
    for _ in 0..2 {
        assert_eq!(
            get_with(&srv.url("/metrics"), Some("mallory-token"))
                .await
                .0,
            StatusCode::FORBIDDEN
        );
    }
    assert_eq!(api.token_reviews(), 2);
    assert_eq!(
        api.access_reviews(),
        2,
        "the unauthorized decision is cached too"
    );
    for _ in 0..2 {
        assert_eq!(
            get_with(&srv.url("/metrics"), Some("forged-token")).await.0,
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(api.token_reviews(), 3, "a rejected token is cached too");
    // Another path is another authorisation question, same token.
    assert_eq!(
        get_with(&srv.url("/whoami"), Some("alice-token")).await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(api.token_reviews(), 3);
    assert_eq!(api.access_reviews(), 3);
    srv.stop().await;
}

#[tokio::test]
async fn cache_entries_expire_after_their_ttl() {
    let api = MockApi::start().await;
    let args = SecureServingArgs {
        authentication_token_webhook_cache_ttl: Duration::from_millis(200),
        authorization_webhook_cache_authorized_ttl: Duration::from_millis(200),
        authorization_webhook_cache_unauthorized_ttl: Duration::from_secs(600),
        ..SecureServingArgs::default()
    };
    let srv = start(args, api.client()).await;
    let ok = || async { get_with(&srv.url("/metrics"), Some("alice-token")).await.0 };
    assert_eq!(ok().await, StatusCode::OK);
    assert_eq!(
        get_with(&srv.url("/metrics"), Some("mallory-token"))
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    assert_eq!((api.token_reviews(), api.access_reviews()), (2, 2));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(ok().await, StatusCode::OK);
    assert_eq!(
        (api.token_reviews(), api.access_reviews()),
        (3, 3),
        "alice's token and decision expired"
    );
    // mallory's token expired (one TTL for tokens), but the denial is still cached (600 s).
    assert_eq!(
        get_with(&srv.url("/metrics"), Some("mallory-token"))
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    assert_eq!((api.token_reviews(), api.access_reviews()), (4, 3));
    srv.stop().await;
}

#[tokio::test]
async fn zero_ttl_disables_the_caches() {
    let api = MockApi::start().await;
    let args = SecureServingArgs {
        authentication_token_webhook_cache_ttl: Duration::ZERO,
        authorization_webhook_cache_authorized_ttl: Duration::ZERO,
        authorization_webhook_cache_unauthorized_ttl: Duration::ZERO,
        ..SecureServingArgs::default()
    };
    let srv = start(args, api.client()).await;
    for _ in 0..2 {
        assert_eq!(
            get_with(&srv.url("/metrics"), Some("alice-token")).await.0,
            StatusCode::OK
        );
    }
    assert_eq!((api.token_reviews(), api.access_reviews()), (2, 2));
    srv.stop().await;
}

// ---------------------------------------------------------------------------------------------
// TLS
// ---------------------------------------------------------------------------------------------

async fn peer_certificate(url: &str, builder: reqwest::ClientBuilder) -> Vec<u8> {
    let resp = builder.build().unwrap().get(url).send().await.unwrap();
    resp.extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|i| i.peer_certificate())
        .expect("TLS info with a peer certificate")
        .to_vec()
}

#[tokio::test]
async fn self_signed_certificate_for_localhost_is_served() {
    let api = MockApi::start().await;
    let srv = start(SecureServingArgs::default(), api.client()).await;
    let der = peer_certificate(&srv.url("/healthz"), https_builder()).await;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    assert_eq!(cert.subject(), cert.issuer(), "self-signed");
    let san = cert.subject_alternative_name().unwrap().unwrap();
    let names: Vec<String> = san
        .value
        .general_names
        .iter()
        .map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => d.to_string(),
            x509_parser::extensions::GeneralName::IPAddress(ip) => format!("{ip:?}"),
            other => format!("{other:?}"),
        })
        .collect();
    assert!(names.contains(&"localhost".to_owned()), "{names:?}");
    assert!(names.contains(&"[127, 0, 0, 1]".to_owned()), "{names:?}");
    assert!(
        cert.validity().is_valid(),
        "valid now: {:?}",
        cert.validity()
    );
    // Plain HTTP on the secure port does not get a response.
    let plain = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{}/healthz", srv.addr.port()))
        .send()
        .await;
    assert!(
        plain.map(|r| !r.status().is_success()).unwrap_or(true),
        "plain HTTP must not be served"
    );
    srv.stop().await;
}

#[tokio::test]
async fn tls_min_version_is_enforced() {
    let api = MockApi::start().await;
    let tls12_only = || https_builder().max_tls_version(reqwest::tls::Version::TLS_1_2);

    // Default minimum is TLS 1.2: a TLS 1.2 client gets through.
    let srv = start(SecureServingArgs::default(), api.client()).await;
    let resp = tls12_only()
        .build()
        .unwrap()
        .get(srv.url("/healthz"))
        .send()
        .await;
    assert_eq!(resp.unwrap().status(), StatusCode::OK);
    srv.stop().await;

    // --tls-min-version=VersionTLS13 refuses it; a TLS 1.3 client still works.
    let args = SecureServingArgs {
        tls_min_version: Some(TlsVersion::Tls13),
        ..SecureServingArgs::default()
    };
    let srv = start(args, api.client()).await;
    let err = tls12_only()
        .build()
        .unwrap()
        .get(srv.url("/healthz"))
        .send()
        .await
        .expect_err("TLS 1.2 handshake must fail");
    assert!(err.is_connect() || err.is_request(), "{err:?}");
    let resp = https_builder()
        .min_tls_version(reqwest::tls::Version::TLS_1_3)
        .build()
        .unwrap()
        .get(srv.url("/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    srv.stop().await;
}

#[tokio::test]
async fn cipher_suite_restriction_applies_to_tls12() {
    let api = MockApi::start().await;
    // Our certificate is ECDSA, so an RSA-only TLS 1.2 suite list leaves no usable suite.
    let rsa_only = SecureServingArgs {
        tls_cipher_suites: vec![
            ccm_controllers::secure_serving::parse_cipher_suite(
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            )
            .unwrap(),
        ],
        ..SecureServingArgs::default()
    };
    let srv = start(rsa_only.clone(), api.client()).await;
    let tls12_only = || https_builder().max_tls_version(reqwest::tls::Version::TLS_1_2);
    assert!(
        tls12_only()
            .build()
            .unwrap()
            .get(srv.url("/healthz"))
            .send()
            .await
            .is_err(),
        "no ECDSA TLS 1.2 suite is allowed"
    );
    // TLS 1.3 suites are unaffected, as in Go.
    let resp = https().get(srv.url("/healthz")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    srv.stop().await;

    let ecdsa = SecureServingArgs {
        tls_cipher_suites: vec![
            ccm_controllers::secure_serving::parse_cipher_suite(
                "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
            )
            .unwrap(),
        ],
        ..SecureServingArgs::default()
    };
    let srv = start(ecdsa, api.client()).await;
    let resp = tls12_only()
        .build()
        .unwrap()
        .get(srv.url("/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    srv.stop().await;
}

fn write_pair(dir: &Path, cn: &str) -> Vec<u8> {
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    // Write to temporary names and rename, as a Secret volume update does (atomically).
    std::fs::write(dir.join("tls.crt.tmp"), cert.pem()).unwrap();
    std::fs::write(dir.join("tls.key.tmp"), key.serialize_pem()).unwrap();
    std::fs::rename(dir.join("tls.key.tmp"), dir.join("tls.key")).unwrap();
    std::fs::rename(dir.join("tls.crt.tmp"), dir.join("tls.crt")).unwrap();
    cert.der().to_vec()
}

async fn wait_for_certificate(url: &str, want: &[u8]) -> bool {
    for _ in 0..200 {
        if peer_certificate(url, https_builder()).await == want {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test]
async fn certificate_files_are_served_and_reloaded() {
    let api = MockApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let first = write_pair(dir.path(), "first");
    let args = SecureServingArgs {
        tls_cert_file: Some(dir.path().join("tls.crt")),
        tls_private_key_file: Some(dir.path().join("tls.key")),
        ..SecureServingArgs::default()
    };
    let srv = start(args, api.client()).await;
    let url = srv.url("/healthz");
    assert_eq!(peer_certificate(&url, https_builder()).await, first);

    let second = write_pair(dir.path(), "second");
    assert_ne!(first, second);
    assert!(
        wait_for_certificate(&url, &second).await,
        "the replaced certificate is served within 20 s"
    );

    // A broken replacement is refused and the last good pair stays in use.
    std::fs::write(dir.path().join("tls.crt"), "not a certificate").unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(peer_certificate(&url, https_builder()).await, second);
    // Once the files are good again they are picked up.
    let third = write_pair(dir.path(), "third");
    assert!(wait_for_certificate(&url, &third).await);
    srv.stop().await;
}

#[tokio::test]
async fn bad_certificate_files_fail_at_start_with_a_clear_error() {
    let api = MockApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), "a");
    let other = tempfile::tempdir().unwrap();
    write_pair(other.path(), "b");
    let args = SecureServingArgs {
        tls_cert_file: Some(dir.path().join("tls.crt")),
        tls_private_key_file: Some(other.path().join("tls.key")),
        ..SecureServingArgs::default()
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = serve_on(
        listener,
        app(),
        &args,
        api.client(),
        CancellationToken::new(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("tls.crt"), "{err}");
    assert!(err.contains("do not form a usable pair"), "{err}");

    let args = SecureServingArgs {
        tls_cert_file: Some(dir.path().join("missing.crt")),
        tls_private_key_file: Some(dir.path().join("tls.key")),
        ..SecureServingArgs::default()
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = serve_on(
        listener,
        app(),
        &args,
        api.client(),
        CancellationToken::new(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("missing.crt"), "{err}");
}

#[tokio::test]
async fn secure_port_zero_disables_serving() {
    let api = MockApi::start().await;
    let args = SecureServingArgs {
        secure_port: 0,
        ..SecureServingArgs::default()
    };
    let server = serve(app(), &args, api.client(), CancellationToken::new())
        .await
        .unwrap();
    assert!(server.is_none());
}

#[tokio::test]
async fn serve_binds_the_configured_address_and_stops_on_shutdown() {
    let api = MockApi::start().await;
    // Find a free port, then ask serve() to bind exactly that.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let args = SecureServingArgs {
        bind_address: "127.0.0.1".parse().unwrap(),
        secure_port: port,
        ..SecureServingArgs::default()
    };
    let shutdown = CancellationToken::new();
    let server = serve(app(), &args, api.client(), shutdown.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(server.local_addr().port(), port);
    let (status, _) = get_with(&format!("https://127.0.0.1:{port}/healthz"), None).await;
    assert_eq!(status, StatusCode::OK);
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(20), server.wait())
        .await
        .expect("server stops after shutdown")
        .unwrap();
    assert!(
        https()
            .get(format!("https://127.0.0.1:{port}/healthz"))
            .send()
            .await
            .is_err(),
        "nothing listens after shutdown"
    );
}

// ---------------------------------------------------------------------------------------------
// Client certificates
// ---------------------------------------------------------------------------------------------

struct Ca {
    params: rcgen::CertificateParams,
    key: rcgen::KeyPair,
    pem: String,
}

fn new_ca(name: &str) -> Ca {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let key = rcgen::KeyPair::generate().unwrap();
    let pem = params.self_signed(&key).unwrap().pem();
    Ca { params, key, pem }
}

fn client_identity(ca: &Ca, cn: &str, org: &str) -> reqwest::Identity {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, org);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let key = rcgen::KeyPair::generate().unwrap();
    let issuer = rcgen::Issuer::from_params(&ca.params, &ca.key);
    let cert = params.signed_by(&key, &issuer).unwrap();
    let pem = format!("{}{}", cert.pem(), key.serialize_pem());
    reqwest::Identity::from_pem(pem.as_bytes()).unwrap()
}

async fn get_as(url: &str, identity: reqwest::Identity) -> Result<StatusCode, reqwest::Error> {
    let client = https_builder().identity(identity).build().unwrap();
    Ok(client.get(url).send().await?.status())
}

#[tokio::test]
async fn client_certificate_signed_by_the_cluster_client_ca_authenticates() {
    let api = MockApi::start().await;
    let ca = new_ca("cluster-client-ca");
    api.set_auth_configmap(AuthConfigMap::ClientCa(ca.pem.clone()));
    let srv = start(SecureServingArgs::default(), api.client()).await;
    assert_eq!(
        api.configmap_gets(),
        1,
        "the client CA is looked up at start"
    );

    let status = get_as(
        &srv.url("/metrics"),
        client_identity(&ca, "alice", "team-a"),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(api.token_reviews(), 0, "no TokenReview for a certificate");
    let review = api
        .state
        .last_access_review
        .lock()
        .unwrap()
        .clone()
        .unwrap();
    assert_eq!(review["spec"]["user"], "alice");
    assert_eq!(
        review["spec"]["groups"],
        json!(["team-a", "system:authenticated"])
    );

    // The certificate's subject is still authorised: mallory may not read /metrics.
    let status = get_as(&srv.url("/metrics"), client_identity(&ca, "mallory", "x"))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::FORBIDDEN);
    // Without a certificate, bearer tokens keep working.
    assert_eq!(
        get_with(&srv.url("/metrics"), Some("alice-token")).await.0,
        StatusCode::OK
    );
    srv.stop().await;
}

#[tokio::test]
async fn client_certificate_from_another_ca_is_refused() {
    let api = MockApi::start().await;
    let ca = new_ca("cluster-client-ca");
    api.set_auth_configmap(AuthConfigMap::ClientCa(ca.pem.clone()));
    let srv = start(SecureServingArgs::default(), api.client()).await;
    let rogue = new_ca("rogue");
    let result = get_as(
        &srv.url("/metrics"),
        client_identity(&rogue, "alice", "team-a"),
    )
    .await;
    assert!(result.is_err(), "handshake must fail: {result:?}");
    assert_eq!(api.access_reviews(), 0);
    srv.stop().await;
}

#[tokio::test]
async fn client_ca_file_flag_is_used_without_lookup() {
    let api = MockApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = new_ca("file-ca");
    std::fs::write(dir.path().join("ca.crt"), &ca.pem).unwrap();
    let args = SecureServingArgs {
        client_ca_file: Some(dir.path().join("ca.crt")),
        ..SecureServingArgs::default()
    };
    let srv = start(args, api.client()).await;
    assert_eq!(api.configmap_gets(), 0);
    let status = get_as(
        &srv.url("/metrics"),
        client_identity(&ca, "alice", "team-a"),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::OK);
    srv.stop().await;
}

#[tokio::test]
async fn skip_lookup_means_no_client_certificates() {
    let api = MockApi::start().await;
    let ca = new_ca("cluster-client-ca");
    api.set_auth_configmap(AuthConfigMap::ClientCa(ca.pem.clone()));
    let args = SecureServingArgs {
        authentication_skip_lookup: true,
        ..SecureServingArgs::default()
    };
    let srv = start(args, api.client()).await;
    assert_eq!(api.configmap_gets(), 0);
    // The server does not ask for a certificate, so the request has no credentials.
    let status = get_as(
        &srv.url("/metrics"),
        client_identity(&ca, "alice", "team-a"),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    srv.stop().await;
}

#[tokio::test]
async fn missing_auth_configmap_is_fine() {
    let api = MockApi::start().await;
    api.set_auth_configmap(AuthConfigMap::Missing);
    let srv = start(SecureServingArgs::default(), api.client()).await;
    assert_eq!(api.configmap_gets(), 1);
    assert_eq!(
        get_with(&srv.url("/metrics"), Some("alice-token")).await.0,
        StatusCode::OK
    );
    srv.stop().await;
}

#[tokio::test]
async fn forbidden_lookup_fails_start_unless_tolerated() {
    let api = MockApi::start().await;
    api.set_auth_configmap(AuthConfigMap::Forbidden);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = serve_on(
        listener,
        app(),
        &SecureServingArgs::default(),
        api.client(),
        CancellationToken::new(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("extension-apiserver-authentication"), "{err}");
    assert!(
        err.contains("--role=extension-apiserver-authentication-reader"),
        "the error says how to fix it: {err}"
    );

    let args = SecureServingArgs {
        authentication_tolerate_lookup_failure: true,
        ..SecureServingArgs::default()
    };
    let srv = start(args, api.client()).await;
    assert_eq!(
        get_with(&srv.url("/metrics"), Some("alice-token")).await.0,
        StatusCode::OK
    );
    srv.stop().await;
}

// ---------------------------------------------------------------------------------------------
// The layer on its own
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn layer_wraps_any_router() {
    use ccm_controllers::secure_serving::DelegatedAuth;
    use tower::ServiceExt;
    let api = MockApi::start().await;
    let auth =
        DelegatedAuth::new(&SecureServingArgs::default(), api.client(), api.client()).unwrap();
    let router = app().layer(auth.layer());
    let request = |token: Option<&str>| {
        let mut b = axum::http::Request::get("/metrics");
        if let Some(t) = token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        b.body(axum::body::Body::empty()).unwrap()
    };
    let status = |r: axum::response::Response| r.status();
    assert_eq!(
        status(router.clone().oneshot(request(None)).await.unwrap()),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        status(
            router
                .clone()
                .oneshot(request(Some("mallory-token")))
                .await
                .unwrap()
        ),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        status(
            router
                .clone()
                .oneshot(request(Some("alice-token")))
                .await
                .unwrap()
        ),
        StatusCode::OK
    );
}

#[tokio::test]
async fn concurrent_requests_with_one_token_make_one_review() {
    let api = MockApi::start().await;
    let srv = start(SecureServingArgs::default(), api.client()).await;
    let url = srv.url("/metrics");
    let client = https();
    let requests = (0..16).map(|_| {
        let req = client.get(&url).bearer_auth("alice-token");
        async move { req.send().await.unwrap().status() }
    });
    let statuses = futures::future::join_all(requests).await;
    assert!(
        statuses.iter().all(|s| *s == StatusCode::OK),
        "{statuses:?}"
    );
    assert_eq!(
        api.token_reviews(),
        1,
        "concurrent lookups of one token are coalesced"
    );
    assert_eq!(api.access_reviews(), 1);
    srv.stop().await;
}

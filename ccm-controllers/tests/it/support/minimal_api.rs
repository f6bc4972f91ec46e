//! The runtime on its own: a minimal API server for its shared informers (empty Node and
//! Service lists, watches that stay open, no streaming lists, served by axum), a test provider whose calls take a
//! set time, and a runtime run that stops at once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Body;
use axum::extract::{Query, Request};
use axum::routing::get;
use ccm_controllers::Builder;
use ccm_core::{
    CloudError, CloudProvider, CloudResult, InstanceMetadata, InstancesV2, NodeView, Route, Routes,
};

/// User agents the fake API server saw.
pub(crate) fn user_agents() -> &'static Mutex<Vec<String>> {
    static AGENTS: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    AGENTS.get_or_init(|| Mutex::new(Vec::new()))
}

/// Serves the minimal API server on a free local port; returns its `http://` URL.
pub(crate) async fn fake_api_server() -> String {
    async fn list_or_watch(
        Query(q): Query<BTreeMap<String, String>>,
        req: Request,
    ) -> axum::response::Response {
        if let Some(agent) = req.headers().get("user-agent") {
            user_agents()
                .lock()
                .unwrap()
                .push(agent.to_str().unwrap().to_owned());
        }
        if q.get("sendInitialEvents").is_some_and(|w| w == "true") {
            // As a v1.33 kube-apiserver with the WatchList feature gate off.
            let status = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Invalid","code":422,"message":"sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"}"#;
            return axum::response::Response::builder()
                .status(422)
                .header("content-type", "application/json")
                .body(Body::from(status))
                .unwrap();
        }
        if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
            let stream = futures::stream::pending::<Result<Vec<u8>, std::io::Error>>();
            return axum::response::Response::builder()
                .header("content-type", "application/json")
                .body(Body::from_stream(stream))
                .unwrap();
        }
        let kind = if req.uri().path().ends_with("nodes") {
            "NodeList"
        } else {
            "ServiceList"
        };
        let body = format!(
            r#"{{"kind":"{kind}","apiVersion":"v1","metadata":{{"resourceVersion":"1"}},"items":[]}}"#
        );
        axum::response::Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap()
    }
    let app = axum::Router::new()
        .route("/api/v1/nodes", get(list_or_watch))
        .route("/api/v1/services", get(list_or_watch));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// A listener on a free local port, and its address.
pub(crate) fn free_listener() -> (std::net::TcpListener, std::net::SocketAddr) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

/// A test provider: every call takes `latency`, and is counted when it starts and ends.
#[derive(Default)]
pub(crate) struct TestCloud {
    /// How long each cloud call takes.
    pub(crate) latency: Duration,
    /// Cloud calls started.
    pub(crate) started: AtomicUsize,
    /// Cloud calls completed.
    pub(crate) completed: AtomicUsize,
    /// Whether the provider reports no cluster ID.
    pub(crate) untagged: bool,
    /// Whether the provider offers `Routes`.
    pub(crate) with_routes: bool,
}

#[async_trait]
impl CloudProvider for TestCloud {
    fn provider_name(&self) -> &str {
        "runtime-test"
    }
    fn has_cluster_id(&self) -> bool {
        !self.untagged
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }
    fn routes(&self) -> Option<&dyn Routes> {
        self.with_routes.then_some(self as &dyn Routes)
    }
}

impl TestCloud {
    async fn work(&self) {
        self.started.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.latency).await;
        self.completed.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl InstancesV2 for TestCloud {
    async fn instance_exists(&self, _: &NodeView) -> CloudResult<bool> {
        self.work().await;
        Ok(true)
    }
    async fn instance_shutdown(&self, _: &NodeView) -> CloudResult<bool> {
        self.work().await;
        Err(CloudError::NotImplemented)
    }
    async fn instance_metadata(&self, _: &NodeView) -> CloudResult<InstanceMetadata> {
        self.work().await;
        Ok(InstanceMetadata::default())
    }
}

#[async_trait]
impl Routes for TestCloud {
    async fn list_routes(&self, _: &str) -> CloudResult<Vec<Route>> {
        Ok(vec![])
    }
    async fn create_route(&self, _: &str, _: &str, _: &Route) -> CloudResult<()> {
        Ok(())
    }
    async fn delete_route(&self, _: &str, _: &Route) -> CloudResult<()> {
        Ok(())
    }
}

/// Runs the runtime with these flags (after the program name) and a shutdown that fires at
/// once; returns the exit code.
pub(crate) async fn run_and_stop(args: &[&str], builder: Builder) -> i32 {
    let mut all = vec!["cloud-controller-manager".to_owned()];
    all.extend(args.iter().map(|s| (*s).to_owned()));
    tokio::time::timeout(
        Duration::from_secs(30),
        builder.args(all).shutdown_signal(async {}).run_async(),
    )
    .await
    .expect("the runtime stops")
}

/// Serving off (`--secure-port=0`).
pub(crate) const NO_SERVING: &str = "--secure-port=0";
/// Leader election off.
pub(crate) const NO_ELECTION: &str = "--leader-elect=false";

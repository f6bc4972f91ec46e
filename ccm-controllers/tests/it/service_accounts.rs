//! `--use-service-account-credentials` end to end, as Go's dynamic client builder does it: a
//! whole runtime with the built-in controllers against the in-process API server, whose request
//! log says which identity made each request.
//!
//! - With the flag, the ServiceAccounts `node-controller`, `service-controller` and
//!   `route-controller` are created in `kube-system`; every write of the cloud-node and
//!   lifecycle controllers is made as `system:serviceaccount:kube-system:node-controller`,
//!   the service controller's as `...:service-controller`, the route controller's as
//!   `...:route-controller`, their Events too; the shared informers list and watch with the
//!   root identity; with RBAC on and only kube-apiserver's bootstrap roles
//!   (`system:controller:*`) for those accounts, nothing the controllers do is refused.
//! - A token is replaced before 80 % of its lifetime (the server caps tokens at 5 s, as
//!   kube-apiserver's `--service-account-max-token-expiration` would), and no request ever
//!   carries an expired one; a vendor controller names its own client.
//! - Without the flag, each controller's requests carry a user agent ending in its client name.
//!
//! In-process only: it needs the server's request log and token cap, and the built-in
//! controllers would act on every Node of a real cluster.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccm_controllers::user_agent;
use ccm_controllers::{Builder, ControllerContext, ControllerEntry};
use ccm_testing::apiserver::{ApiServer, RequestFilter, RequestRecord};
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use ccm_testing::fake_cloud::FakeCloud;
use ccm_testing::wait::eventually;
use k8s_openapi::api::core::v1::{Node, Service, ServiceAccount};
use kube::api::{Api, PostParams};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(30);
const VERSION: &str = "0.0.1-test";
const ROOT: &str = "system:admin";

fn sa(name: &str) -> String {
    format!("system:serviceaccount:kube-system:{name}")
}

struct Runtime {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<i32>,
}

impl Runtime {
    fn start(builder: Builder, server: &ApiServer, extra: &[&str]) -> Runtime {
        let mut args = vec![
            "cloud-controller-manager".to_owned(),
            format!("--master={}", server.url()),
            "--secure-port=0".to_owned(),
            "--leader-elect=false".to_owned(),
            "--cluster-cidr=10.244.0.0/16".to_owned(),
            "--route-reconciliation-period=1s".to_owned(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let (stop, stop_rx) = oneshot::channel::<()>();
        let builder = builder.version(VERSION).args(args).shutdown_signal(async {
            let _ = stop_rx.await;
        });
        Runtime {
            stop: Some(stop),
            task: tokio::spawn(builder.run_async()),
        }
    }

    async fn stop(mut self) -> i32 {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(WAIT, &mut self.task)
            .await
            .expect("the runtime stops")
            .unwrap()
    }
}

/// Creates a kubelet-registered (tainted) Node and a LoadBalancer Service, and waits until the
/// cloud-node controller initialised the Node and the service controller gave the Service an
/// ingress.
async fn node_and_service(server: &ApiServer) {
    let client = server.client();
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &kubelet_node("n1").pod_cidrs(&["10.244.1.0/24"]).build(),
        )
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(client, "default");
    services
        .create(
            &PostParams::default(),
            &load_balancer_service("default", "lb")
                .port("http", 80)
                .build(),
        )
        .await
        .unwrap();
    let initialised = eventually(WAIT, || async {
        let node = nodes.get("n1").await.unwrap();
        let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
        !taints
            .iter()
            .any(|t| t.key == "node.cloudprovider.kubernetes.io/uninitialized")
    })
    .await;
    assert!(initialised, "the cloud-node controller initialises n1");
    let ingress = eventually(WAIT, || async {
        let svc = services.get("lb").await.unwrap();
        svc.status
            .and_then(|s| s.load_balancer)
            .and_then(|lb| lb.ingress)
            .is_some_and(|i| !i.is_empty())
    })
    .await;
    assert!(
        ingress,
        "the service controller provisions the load balancer"
    );
}

/// The CCM's requests (the harness's own have another user agent).
fn ccm_requests(server: &ApiServer) -> Vec<RequestRecord> {
    server
        .requests()
        .into_iter()
        .filter(|r| {
            r.user_agent
                .as_deref()
                .is_some_and(|a| a.starts_with("cloud-controller-manager/"))
        })
        .collect()
}

fn describe(records: &[RequestRecord]) -> Vec<String> {
    records
        .iter()
        .map(|r| {
            format!(
                "{} {} {} as {:?} ({:?}) -> {}",
                r.verb,
                r.resource_path(),
                r.name.as_deref().unwrap_or(""),
                r.user,
                r.user_agent,
                r.status
            )
        })
        .collect()
}

#[tokio::test]
async fn each_controller_acts_as_its_service_account_with_the_bootstrap_rbac() {
    let server = ApiServer::start().await;
    server.enable_rbac();
    server.add_bootstrap_controller_roles();
    let cloud = FakeCloud::default();
    let runtime = Runtime::start(
        Builder::new().provider(cloud.provider()),
        &server,
        &["--use-service-account-credentials=true"],
    );
    node_and_service(&server).await;
    let routed = eventually(WAIT, || async { !cloud.routes().is_empty() }).await;
    assert!(routed, "the route controller creates n1's route");
    // The Events of the initialisation and of the load balancer.
    let events = eventually(WAIT, || async {
        let created =
            server.requests_matching(&RequestFilter::new().verb("create").resource("events"));
        created
            .iter()
            .any(|r| r.user.as_deref() == Some(&*sa("node-controller")))
            && created
                .iter()
                .any(|r| r.user.as_deref() == Some(&*sa("service-controller")))
    })
    .await;
    assert!(events, "{:#?}", describe(&ccm_requests(&server)));

    // The ServiceAccounts exist, created by the root identity.
    let accounts: Api<ServiceAccount> = Api::namespaced(server.client(), "kube-system");
    for name in ["node-controller", "service-controller", "route-controller"] {
        assert!(accounts.get_opt(name).await.unwrap().is_some(), "{name}");
        let created = server.requests_matching(
            &RequestFilter::new()
                .verb("create")
                .resource("serviceaccounts")
                .namespace("kube-system"),
        );
        assert!(
            created.iter().any(|r| r.user.as_deref() == Some(ROOT)),
            "{name}"
        );
        let tokens = server.requests_matching(
            &RequestFilter::new()
                .verb("create")
                .resource("serviceaccounts/token")
                .name(name),
        );
        assert!(
            !tokens.is_empty() && tokens.iter().all(|r| r.user.as_deref() == Some(ROOT)),
            "{name}: {:?}",
            describe(&tokens)
        );
    }

    let requests = ccm_requests(&server);
    let all = describe(&requests);
    // Nothing was refused: the bootstrap roles cover what the controllers do.
    let refused: Vec<&RequestRecord> = requests
        .iter()
        .filter(|r| r.status == 401 || r.status == 403)
        .collect();
    assert!(
        refused.is_empty(),
        "refused: {:#?}",
        describe(&refused.into_iter().cloned().collect::<Vec<_>>())
    );
    // Every write of a Node's taints and labels (the cloud-node controller) is the
    // node-controller's; its status: node-controller or route-controller (NetworkUnavailable).
    let node_writes: Vec<&RequestRecord> = requests
        .iter()
        .filter(|r| r.is_write() && r.resource == "nodes")
        .collect();
    assert!(!node_writes.is_empty());
    for r in &node_writes {
        let user = r.user.as_deref().unwrap_or_default();
        let allowed = if r.subresource.is_none() {
            user == sa("node-controller")
        } else {
            user == sa("node-controller") || user == sa("route-controller")
        };
        assert!(
            allowed,
            "{} {} by {user}: {all:#?}",
            r.verb,
            r.resource_path()
        );
        assert_eq!(
            r.user_agent.as_deref(),
            Some(&*user_agent(VERSION, user)),
            "the user agent ends in the account's user name, as in Go"
        );
    }
    assert!(
        node_writes
            .iter()
            .any(|r| r.subresource.is_none() && r.user.as_deref() == Some(&*sa("node-controller"))),
        "the taint is removed by node-controller: {all:#?}"
    );
    assert!(
        node_writes
            .iter()
            .any(|r| r.user.as_deref() == Some(&*sa("route-controller"))),
        "the route controller sets NetworkUnavailable as route-controller: {all:#?}"
    );
    // Every Service write is the service-controller's.
    let service_writes: Vec<&RequestRecord> = requests
        .iter()
        .filter(|r| r.is_write() && r.resource == "services")
        .collect();
    assert!(!service_writes.is_empty());
    for r in &service_writes {
        assert_eq!(
            r.user.as_deref(),
            Some(&*sa("service-controller")),
            "{all:#?}"
        );
    }
    // Events carry the identity of the controller that recorded them.
    for r in requests
        .iter()
        .filter(|r| r.resource == "events" && r.is_write())
    {
        let user = r.user.as_deref().unwrap_or_default();
        assert!(
            [
                sa("node-controller"),
                sa("service-controller"),
                sa("route-controller")
            ]
            .iter()
            .any(|u| u == user),
            "an Event written as {user}: {all:#?}"
        );
    }
    // The shared informers list and watch with the root credentials.
    let informer_reads: Vec<&RequestRecord> = requests
        .iter()
        .filter(|r| {
            (r.verb == "list" || r.verb == "watch")
                && (r.resource == "nodes" || r.resource == "services")
        })
        .collect();
    // At least one streaming-list watch per informer (Nodes, Services).
    assert!(informer_reads.len() >= 2, "{all:#?}");
    for r in &informer_reads {
        assert_eq!(r.user.as_deref(), Some(ROOT), "{all:#?}");
        assert_eq!(
            r.user_agent.as_deref(),
            Some(&*user_agent(VERSION, "shared-informers"))
        );
    }

    assert_eq!(runtime.stop().await, 0);
}

#[tokio::test]
async fn tokens_are_replaced_before_80_percent_of_their_lifetime_and_never_sent_expired() {
    let server = ApiServer::start().await;
    // Every token lives 5 s (the CCM asks for 3600 s).
    server.set_max_token_expiration(Some(Duration::from_secs(5)));
    // A vendor controller with a client of its own name, asking the API server every 100 ms.
    let results: Arc<Mutex<Vec<Result<(), String>>>> = Arc::default();
    let seen = results.clone();
    let pinger = ControllerEntry::new("acme-pinger", move |ctx: ControllerContext, _| {
        let seen = seen.clone();
        async move {
            let nodes: Api<Node> = Api::all(ctx.client.clone());
            loop {
                tokio::select! {
                    () = ctx.shutdown.cancelled() => return Ok(()),
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
                let result = nodes
                    .get_opt("absent")
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string());
                seen.lock().unwrap().push(result);
            }
        }
    })
    .client("acme-pinger");
    let runtime = Runtime::start(
        Builder::new()
            .without_builtin_controllers()
            .controller_entry(pinger)
            .provider(FakeCloud::default().provider()),
        &server,
        &["--use-service-account-credentials"],
    );
    // Note when each TokenRequest of the account appears (polled every 50 ms).
    let filter = RequestFilter::new()
        .verb("create")
        .resource("serviceaccounts/token")
        .name("acme-pinger");
    let start = Instant::now();
    let mut issued: Vec<Instant> = Vec::new();
    while start.elapsed() < Duration::from_secs(14) {
        let n = server.requests_matching(&filter).len();
        while issued.len() < n {
            issued.push(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(runtime.stop().await, 0);

    let tokens = server.requests_matching(&filter);
    assert!(
        tokens
            .iter()
            .all(|r| r.status == 201 && r.user.as_deref() == Some(ROOT))
    );
    // 14 s of 5 s tokens: the first and at least three replacements.
    assert!(issued.len() >= 4, "{} tokens in 14 s", issued.len());
    for pair in issued.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap < Duration::from_secs(4),
            "a token was replaced {gap:?} after the previous one: later than 80 % of its 5 s"
        );
    }
    // Every request of the controller authenticated as its account: none carried an expired
    // token (that would be a 401), none failed.
    let results = results.lock().unwrap().clone();
    assert!(results.len() > 50, "{} requests", results.len());
    let failed: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(failed.is_empty(), "{failed:?}");
    let mine = server.requests_matching(&RequestFilter::new().resource("nodes").name("absent"));
    assert_eq!(mine.len(), results.len());
    for r in &mine {
        assert_eq!(r.status, 404, "{:?}", describe(std::slice::from_ref(r)));
        assert_eq!(r.user.as_deref(), Some(&*sa("acme-pinger")));
    }
}

#[tokio::test]
async fn without_the_flag_each_controller_has_its_own_user_agent_and_the_root_identity() {
    let server = ApiServer::start().await;
    let cloud = FakeCloud::default();
    let runtime = Runtime::start(Builder::new().provider(cloud.provider()), &server, &[]);
    node_and_service(&server).await;
    let routed = eventually(WAIT, || async { !cloud.routes().is_empty() }).await;
    assert!(routed);
    assert_eq!(runtime.stop().await, 0);

    let requests = ccm_requests(&server);
    let all = describe(&requests);
    assert!(
        requests.iter().all(|r| r.user.as_deref() == Some(ROOT)),
        "{all:#?}"
    );
    assert!(
        server
            .requests_matching(&RequestFilter::new().resource("serviceaccounts"))
            .is_empty(),
        "no ServiceAccount is touched"
    );
    let agent_of = |r: &RequestRecord| r.user_agent.clone().unwrap_or_default();
    for r in requests
        .iter()
        .filter(|r| r.is_write() && r.resource == "nodes" && r.subresource.is_none())
    {
        assert_eq!(
            agent_of(r),
            user_agent(VERSION, "node-controller"),
            "{all:#?}"
        );
    }
    for r in requests
        .iter()
        .filter(|r| r.is_write() && r.resource == "services")
    {
        assert_eq!(
            agent_of(r),
            user_agent(VERSION, "service-controller"),
            "{all:#?}"
        );
    }
    for r in requests
        .iter()
        .filter(|r| r.verb == "list" || r.verb == "watch")
    {
        assert_eq!(
            agent_of(r),
            user_agent(VERSION, "shared-informers"),
            "{all:#?}"
        );
    }
    for client in ["node-controller", "service-controller", "route-controller"] {
        assert!(
            requests
                .iter()
                .any(|r| agent_of(r) == user_agent(VERSION, client)),
            "no request of {client}: {all:#?}"
        );
    }
}

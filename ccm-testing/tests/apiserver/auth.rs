//! Who makes each request, as the in-process API server sees it: ServiceAccounts, the
//! TokenRequest API, bearer-token authentication, RBAC (with the bootstrap roles of the CCM's
//! controllers) and the request log's bodies and identities.
//!
//! In-process only: the proofs read the server's request log and change its settings.

use std::time::Duration;

use ccm_testing::apiserver::{ApiServer, PatchType, RequestFilter};
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Event, Node, ObjectReference, Service, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::ObjectMeta;
use serde_json::json;

use crate::support::api_err;

const NODE_CONTROLLER: &str = "system:serviceaccount:kube-system:node-controller";

/// A client of `server` with `token` (when given) and `user_agent`.
async fn client(server: &ApiServer, token: Option<&str>, user_agent: &str) -> kube::Client {
    let user = match token {
        Some(t) => format!("  user:\n    token: {t}\n"),
        None => "  user: {}\n".to_string(),
    };
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\nusers:\n- name: u\n{user}contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
        server.url()
    );
    let kubeconfig = Kubeconfig::from_yaml(&yaml).unwrap();
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .unwrap();
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_str(user_agent).unwrap(),
    ));
    kube::Client::try_from(config).unwrap()
}

async fn service_account(server: &ApiServer, ns: &str, name: &str) -> ServiceAccount {
    let sas: Api<ServiceAccount> = Api::namespaced(server.client(), ns);
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    sas.create(&PostParams::default(), &sa).await.unwrap();
    sas.get(name).await.unwrap()
}

async fn request_token(
    server: &ApiServer,
    ns: &str,
    name: &str,
    seconds: Option<i64>,
) -> Result<serde_json::Value, kube::Error> {
    let sas: Api<ServiceAccount> = Api::namespaced(server.client(), ns);
    // As JSON both ways: which TokenRequest fields are optional differs between the
    // Kubernetes versions k8s-openapi compiles for.
    let request: TokenRequest = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": seconds, "audiences": []},
    }))
    .unwrap();
    let answer = sas
        .create_token_request(name, &PostParams::default(), &request)
        .await?;
    Ok(serde_json::to_value(answer).unwrap())
}

fn token_of(tr: &serde_json::Value) -> String {
    tr["status"]["token"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn token_requests_issue_service_account_tokens_that_authenticate() {
    let s = ApiServer::start().await;
    let sa = service_account(&s, "kube-system", "node-controller").await;
    assert!(sa.metadata.uid.is_some());

    let before = jiff::Timestamp::now();
    let issued = request_token(&s, "kube-system", "node-controller", None)
        .await
        .unwrap();
    assert_eq!(issued["spec"]["expirationSeconds"], 3600, "the default");
    let expires: jiff::Timestamp = issued["status"]["expirationTimestamp"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let lifetime = expires.as_second() - before.as_second();
    assert!((3599..=3601).contains(&lifetime), "{lifetime}");

    // The token authenticates as the ServiceAccount, and the request log says so.
    let agent = "ccm/v0 (linux/amd64) kubernetes/test/cloud-node-controller";
    let as_sa = client(&s, Some(&token_of(&issued)), agent).await;
    let nodes: Api<Node> = Api::all(as_sa);
    nodes.list(&Default::default()).await.unwrap();
    let listed = s.requests_matching(&RequestFilter::new().verb("list").user(NODE_CONTROLLER));
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].groups,
        vec![
            "system:serviceaccounts",
            "system:serviceaccounts:kube-system",
            "system:authenticated"
        ]
    );
    assert_eq!(listed[0].user_agent.as_deref(), Some(agent));
    // Requests without credentials are the cluster administrator.
    let token_requests =
        s.requests_matching(&RequestFilter::new().resource("serviceaccounts/token"));
    assert_eq!(token_requests[0].user.as_deref(), Some("system:admin"));
    assert_eq!(token_requests[0].verb, "create");

    // A requested lifetime is honoured; below ten minutes is invalid; a missing account is 404.
    let long = request_token(&s, "kube-system", "node-controller", Some(7200))
        .await
        .unwrap();
    assert_eq!(long["spec"]["expirationSeconds"], 7200);
    let e = api_err(
        request_token(&s, "kube-system", "node-controller", Some(300))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert!(
        e.message
            .contains("may not specify a duration less than 10 minutes"),
        "{}",
        e.message
    );
    let e = api_err(
        request_token(&s, "kube-system", "nobody", None)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (e.code, e.message.as_str()),
        (404, "serviceaccounts \"nobody\" not found")
    );
}

#[tokio::test]
async fn expired_unknown_and_orphaned_tokens_are_unauthorized() {
    let s = ApiServer::start().await;
    service_account(&s, "kube-system", "route-controller").await;
    s.set_max_token_expiration(Some(Duration::from_secs(1)));
    let short = request_token(&s, "kube-system", "route-controller", None)
        .await
        .unwrap();
    assert_eq!(
        short["spec"]["expirationSeconds"], 1,
        "capped by the maximum"
    );
    let nodes: Api<Node> = Api::all(client(&s, Some(&token_of(&short)), "t").await);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let e = api_err(nodes.list(&Default::default()).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (401, "Unauthorized"));
    let last = s.requests().pop().unwrap();
    assert_eq!((last.status, last.user), (401, None));

    let nodes: Api<Node> = Api::all(client(&s, Some("made-up"), "t").await);
    assert_eq!(
        api_err(nodes.list(&Default::default()).await.unwrap_err()).code,
        401
    );

    // A token outlives neither its ServiceAccount nor a re-created one of the same name.
    s.set_max_token_expiration(None);
    let valid = request_token(&s, "kube-system", "route-controller", None)
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(client(&s, Some(&token_of(&valid)), "t").await);
    nodes.list(&Default::default()).await.unwrap();
    let sas: Api<ServiceAccount> = Api::namespaced(s.client(), "kube-system");
    sas.delete("route-controller", &Default::default())
        .await
        .unwrap();
    service_account(&s, "kube-system", "route-controller").await;
    assert_eq!(
        api_err(nodes.list(&Default::default()).await.unwrap_err()).code,
        401
    );

    // Registered tokens (add_token) authenticate requests too.
    s.add_token("static", "alice", &["team-a"]);
    let nodes: Api<Node> = Api::all(client(&s, Some("static"), "t").await);
    nodes.list(&Default::default()).await.unwrap();
    assert_eq!(s.requests().pop().unwrap().user.as_deref(), Some("alice"));
}

fn event(ns: &str, name: &str) -> Event {
    Event {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            kind: Some("Node".into()),
            name: Some("n1".into()),
            ..Default::default()
        },
        reason: Some("Synced".into()),
        message: Some("Node synced successfully".into()),
        type_: Some("Normal".into()),
        ..Default::default()
    }
}

#[tokio::test]
async fn rbac_with_the_bootstrap_controller_roles_allows_each_controller_its_own_writes() {
    let s = ApiServer::start().await;
    s.enable_rbac();
    let admin_nodes: Api<Node> = Api::all(s.client());
    admin_nodes
        .create(&PostParams::default(), &kubelet_node("n1").build())
        .await
        .unwrap();
    let admin_svcs: Api<Service> = Api::namespaced(s.client(), "default");
    admin_svcs
        .create(
            &PostParams::default(),
            &load_balancer_service("default", "web").build(),
        )
        .await
        .unwrap();
    let mut tokens = std::collections::BTreeMap::new();
    for account in ["node-controller", "service-controller", "route-controller"] {
        service_account(&s, "kube-system", account).await;
        let t = request_token(&s, "kube-system", account, None)
            .await
            .unwrap();
        tokens.insert(account, token_of(&t));
    }
    let as_account = |account: &'static str| {
        let token = tokens[account].clone();
        let s = &s;
        async move { client(s, Some(&token), &format!("ccm/{account}")).await }
    };

    // Without any binding, a ServiceAccount may do nothing but discovery.
    let nodes: Api<Node> = Api::all(as_account("node-controller").await);
    let e = api_err(nodes.get("n1").await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        e.message,
        format!(
            "nodes \"n1\" is forbidden: User \"{NODE_CONTROLLER}\" cannot get resource \"nodes\" in API group \"\" at the cluster scope"
        )
    );
    as_account("node-controller")
        .await
        .apiserver_version()
        .await
        .unwrap();

    s.add_bootstrap_controller_roles();
    let merge = |v: serde_json::Value| Patch::Merge(v);
    // node-controller: nodes and their status, events.
    let client_nc = as_account("node-controller").await;
    let nodes: Api<Node> = Api::all(client_nc.clone());
    nodes.get("n1").await.unwrap();
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &merge(json!({"spec": {"providerID": "fake://n1"}})),
        )
        .await
        .unwrap();
    nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &merge(
                json!({"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}}),
            ),
        )
        .await
        .unwrap();
    Api::<Event>::namespaced(client_nc.clone(), "default")
        .create(&PostParams::default(), &event("default", "e1"))
        .await
        .unwrap();
    let e = api_err(
        Api::<Service>::namespaced(client_nc, "default")
            .get("web")
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 403);

    // service-controller: reads Services, writes only their status (finalizers included,
    // as Go's service controller patches them through /status).
    let svcs: Api<Service> = Api::namespaced(as_account("service-controller").await, "default");
    svcs.get("web").await.unwrap();
    let patched = svcs
        .patch_status(
            "web",
            &PatchParams::default(),
            &merge(json!({"metadata": {"finalizers": ["service.kubernetes.io/load-balancer-cleanup"]}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.metadata.finalizers.unwrap().len(), 1);
    let e = api_err(
        svcs.patch(
            "web",
            &PatchParams::default(),
            &merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 403);
    assert!(
        e.message.contains("cannot patch resource \"services\""),
        "{}",
        e.message
    );

    // route-controller: lists Nodes and patches their status, nothing more.
    let nodes: Api<Node> = Api::all(as_account("route-controller").await);
    nodes.list(&Default::default()).await.unwrap();
    nodes
        .patch_status("n1", &PatchParams::default(), &merge(json!({"status": {"conditions": [{"type": "NetworkUnavailable", "status": "False"}]}})))
        .await
        .unwrap();
    assert_eq!(api_err(nodes.get("n1").await.unwrap_err()).code, 403);

    // Creating tokens is itself authorised: `create serviceaccounts/token`.
    let sas: Api<ServiceAccount> =
        Api::namespaced(as_account("route-controller").await, "kube-system");
    let e = api_err(
        sas.create_token_request(
            "node-controller",
            &PostParams::default(),
            &TokenRequest::default(),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 403);
    assert!(
        e.message
            .contains("cannot create resource \"serviceaccounts/token\""),
        "{}",
        e.message
    );

    // The log tells each identity's writes apart.
    let writes = s.requests_matching(&RequestFilter::new().writes().user(NODE_CONTROLLER));
    let kinds: Vec<String> = writes
        .iter()
        .filter(|r| r.status < 300)
        .map(|r| r.resource_path())
        .collect();
    assert_eq!(kinds, vec!["nodes", "nodes/status", "events"]);
}

#[tokio::test]
async fn reviews_know_issued_tokens_and_rbac() {
    let s = ApiServer::start().await;
    s.add_bootstrap_controller_roles();
    service_account(&s, "kube-system", "service-controller").await;
    let token = token_of(
        &request_token(&s, "kube-system", "service-controller", None)
            .await
            .unwrap(),
    );
    let client = s.client();
    let review: serde_json::Value = client
        .request(
            http::Request::post("/apis/authentication.k8s.io/v1/tokenreviews")
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}})).unwrap())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(review["status"]["authenticated"], true);
    assert_eq!(
        review["status"]["user"]["username"],
        "system:serviceaccount:kube-system:service-controller"
    );
    let sar = |verb: &str, sub: Option<&str>| {
        let mut attrs =
            json!({"verb": verb, "resource": "services", "namespace": "default", "name": "web"});
        if let Some(sub) = sub {
            attrs["subresource"] = json!(sub);
        }
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {
            "user": "system:serviceaccount:kube-system:service-controller",
            "groups": ["system:serviceaccounts"],
            "resourceAttributes": attrs,
        }})
    };
    for (verb, sub, allowed) in [
        ("patch", Some("status"), true),
        ("patch", None, false),
        ("get", None, true),
    ] {
        let answer: serde_json::Value = client
            .request(
                http::Request::post("/apis/authorization.k8s.io/v1/subjectaccessreviews")
                    .header("content-type", "application/json")
                    .body(serde_json::to_vec(&sar(verb, sub)).unwrap())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(
            answer["status"]["allowed"], allowed,
            "{verb} {sub:?}: {answer}"
        );
    }
}

#[tokio::test]
async fn the_request_log_keeps_bodies_patch_types_and_user_agents() {
    let s = ApiServer::start().await;
    let node_agent = "ccm/v0 (linux/amd64) kubernetes/test/cloud-node-controller";
    let nodes: Api<Node> = Api::all(client(&s, None, node_agent).await);
    nodes
        .create(&PostParams::default(), &kubelet_node("n1").build())
        .await
        .unwrap();
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"labels": {"zone": "a"}}})),
        )
        .await
        .unwrap();
    nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}}),
            ),
        )
        .await
        .unwrap();
    let other: Api<Node> = Api::all(client(&s, None, "ccm/v0/route-controller").await);
    other
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{"type": "NetworkUnavailable", "status": "False"}]}})),
        )
        .await
        .unwrap();

    // "The patches made to node n1 by the cloud-node controller", as a Go table test lists them.
    let patches: Vec<(String, Option<PatchType>, serde_json::Value)> = s
        .requests_matching(
            &RequestFilter::new()
                .verb("patch")
                .name("n1")
                .user_agent_suffix("/cloud-node-controller"),
        )
        .into_iter()
        .map(|r| (r.resource_path(), r.patch_type, r.body.unwrap()))
        .collect();
    assert_eq!(
        patches,
        vec![
            (
                "nodes".to_string(),
                Some(PatchType::Strategic),
                json!({"metadata": {"labels": {"zone": "a"}}})
            ),
            (
                "nodes/status".to_string(),
                Some(PatchType::Merge),
                json!({"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}})
            ),
        ]
    );
    let created = s.requests_matching(&RequestFilter::new().verb("create").resource("nodes"));
    assert_eq!(created[0].body.as_ref().unwrap()["metadata"]["name"], "n1");
    assert_eq!(created[0].patch_type, None);
    assert_eq!(
        s.requests_matching(
            &RequestFilter::new()
                .resource("nodes/status")
                .user_agent_suffix("/route-controller")
        )
        .len(),
        1
    );

    // Bodies can be left out of the log.
    s.set_record_bodies(false);
    nodes.get("n1").await.unwrap();
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"b": "c"}}})),
        )
        .await
        .unwrap();
    assert_eq!(s.requests().pop().unwrap().body, None);
}

//! The `aws-ccm` binary as a process, against the in-process API server (behind TLS, so the
//! binary's Kubernetes client speaks HTTPS with the AWS SDK linked in) and a moto server. It
//! serves its internal load-balancer class under a name of the operator's
//! (`--load-balancer-classes`, as the README shows).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use ccm_core::default_load_balancer_name;
use ccm_testing::apiserver::ApiServer;
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use ccm_testing::wait::wait_for;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, PostParams};
use support::world::{World, provider_id};

/// The operator's name for the provider's internal class in this cluster.
const PRIVATE_CLASS: &str = "team-a.example/private";
use tokio::net::{TcpListener, TcpStream};

/// A TLS-terminating proxy to `upstream` with a fresh self-signed certificate; returns its
/// port and the certificate (PEM).
async fn tls_proxy(upstream: SocketAddr) -> (u16, String) {
    let certified =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .unwrap();
    let pem = certified.cert.pem();
    let key = rustls::pki_types::PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der());
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![certified.cert.der().clone()], key.into())
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    return;
                };
                let Ok(mut plain) = TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    (port, pem)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_initialises_nodes_and_serves_load_balancers_over_https() {
    let world = World::new("aws-process").await;
    let instance = world.launch(1).await.remove(0);
    let node_name = instance.private_dns_name().unwrap().to_owned();

    let server = ApiServer::start().await;
    let upstream: SocketAddr = server.url().trim_start_matches("http://").parse().unwrap();
    let (port, ca) = tls_proxy(upstream).await;
    let dir = std::env::temp_dir().join(format!("aws-ccm-process-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("ca.pem"), ca).unwrap();
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority: {}\n\
         contexts:\n- name: test\n  context:\n    cluster: test\n    user: test\ncurrent-context: test\nusers:\n- name: test\n  user: {{}}\n",
        dir.join("ca.pem").display()
    );
    std::fs::write(dir.join("kubeconfig"), kubeconfig).unwrap();
    std::fs::write(dir.join("cloud.yaml"), world.config_yaml()).unwrap();

    let nodes: Api<Node> = Api::all(server.client());
    let services: Api<Service> = Api::namespaced(server.client(), "default");
    nodes
        .create(&PostParams::default(), &kubelet_node(&node_name).build())
        .await
        .unwrap();
    services
        .create(
            &PostParams::default(),
            &load_balancer_service("default", "web").build(),
        )
        .await
        .unwrap();
    let private = services
        .create(
            &PostParams::default(),
            &load_balancer_service("default", "private")
                .load_balancer_class(PRIVATE_CLASS)
                .build(),
        )
        .await
        .unwrap();

    let mut ccm = tokio::process::Command::new(env!("CARGO_BIN_EXE_aws-ccm"))
        .arg(format!("--kubeconfig={}", dir.join("kubeconfig").display()))
        .arg("--cloud-provider=aws")
        .arg(format!(
            "--cloud-config={}",
            dir.join("cloud.yaml").display()
        ))
        .arg("--cluster-name=aws-process")
        .arg("--leader-elect=false")
        .arg("--secure-port=0")
        .arg("--configure-cloud-routes=false")
        .arg(format!(
            "--load-balancer-classes=-,{PRIVATE_CLASS}={}",
            aws_ccm::INTERNAL_NLB_CLASS
        ))
        // The SDK's default credential chain finds these; no metadata service to ask.
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    let timeout = Duration::from_secs(90);
    let node = wait_for(&nodes, &node_name, timeout, |n: &Node| {
        n.spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .is_some()
    })
    .await
    .unwrap();
    assert_eq!(node.spec.unwrap().provider_id, Some(provider_id(&instance)));
    let has_ingress = |s: &Service| {
        let lb = s.status.as_ref().and_then(|s| s.load_balancer.as_ref());
        lb.and_then(|l| l.ingress.as_ref())
            .is_some_and(|i| !i.is_empty())
    };
    let service = wait_for(&services, "web", timeout, has_ingress)
        .await
        .unwrap();
    let web_lb = default_load_balancer_name(&service);
    let hostname = service
        .status
        .unwrap()
        .load_balancer
        .unwrap()
        .ingress
        .unwrap()[0]
        .hostname
        .clone()
        .unwrap();
    assert!(hostname.ends_with(".elb.amazonaws.com"), "{hostname}");
    // The Service of the operator's class got the provider's internal NLB; the other one its
    // internet-facing NLB.
    wait_for(&services, "private", timeout, has_ingress)
        .await
        .unwrap();
    let private_lb = default_load_balancer_name(&private);
    let scheme = |placement: Option<(String, Vec<String>)>| placement.map(|(scheme, _)| scheme);
    assert_eq!(
        scheme(world.placement_of(&private_lb).await).as_deref(),
        Some("internal")
    );
    assert_eq!(
        scheme(world.placement_of(&web_lb).await).as_deref(),
        Some("internet-facing")
    );

    // SIGTERM: a graceful shutdown exits 0.
    let pid = ccm.id().unwrap();
    std::process::Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status()
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(60), ccm.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "aws-ccm exited with {status}");
    let _ = std::fs::remove_dir_all(dir);
}

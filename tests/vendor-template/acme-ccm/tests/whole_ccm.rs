use std::time::Duration;

use acme_api::{Client, Machine, MachineState};
use acme_cloud::balancer_name;
use ccm_controllers::Builder;
use ccm_testing::apiserver::ApiServer;
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use ccm_testing::wait::wait_for;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, PostParams};

#[cfg_attr(test, tokio::test)]
async fn the_ccm_initialises_nodes_and_serves_load_balancers() {
    // The account: the machine behind the Node kubelet registers.
    let account = Client::connect("memory://whole-ccm", "test-token").unwrap();
    account.add_machine(Machine {
        id: "m-7".into(),
        name: "worker-7".into(),
        zone: "fra-1a".into(),
        plan: "a1.small".into(),
        private_ip: "10.0.0.7".into(),
        public_ip: None,
        state: MachineState::Running,
    });
    let config = std::env::temp_dir().join(format!("acme-whole-ccm-{}.yaml", std::process::id()));
    std::fs::write(&config, "endpoint: memory://whole-ccm\ntoken: test-token\n").unwrap();

    let server = ApiServer::start().await;
    let nodes: Api<Node> = Api::all(server.client());
    let services: Api<Service> = Api::namespaced(server.client(), "default");
    let create = PostParams::default();
    nodes.create(&create, &kubelet_node("worker-7").build()).await.unwrap();
    services.create(&create, &load_balancer_service("default", "web").build()).await.unwrap();

    // The binary's flags; `--cloud-provider=acme` finds the provider acme-cloud registered.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let ccm = Builder::new()
        .args([
            "acme-ccm".to_owned(),
            format!("--master={}", server.url()),
            "--cloud-provider=acme".to_owned(),
            format!("--cloud-config={}", config.display()),
            "--cluster-name=whole-ccm".to_owned(),
            "--leader-elect=false".to_owned(),
            "--secure-port=0".to_owned(),
        ])
        .shutdown_signal(async move {
            let _ = stopped.await;
        })
        .run_async();
    let ccm = tokio::spawn(ccm);

    let timeout = Duration::from_secs(30);
    let node = wait_for(&nodes, "worker-7", timeout, |node: &Node| {
        let spec = node.spec.as_ref();
        spec.and_then(|s| s.provider_id.as_deref()) == Some("acme://fra-1a/m-7")
    })
    .await
    .unwrap();
    let labels = node.metadata.labels.unwrap_or_default();
    assert_eq!(labels["topology.kubernetes.io/zone"], "fra-1a");

    let service = wait_for(&services, "web", timeout, |service: &Service| {
        let status = service.status.as_ref().and_then(|s| s.load_balancer.as_ref());
        status.and_then(|lb| lb.ingress.as_ref()).is_some_and(|i| !i.is_empty())
    })
    .await
    .unwrap();
    let balancer = account.get_balancer(&balancer_name("whole-ccm", &service)).await.unwrap();
    assert_eq!(balancer.targets, ["worker-7"]);

    let _ = stop.send(());
    assert_eq!(ccm.await.unwrap(), 0, "a graceful shutdown exits 0");
    let _ = std::fs::remove_file(config);
}

//! FakeCloud's state file outlives the `fake-ccm` process: a CCM killed with SIGKILL while an
//! `ensure_load_balancer` is in flight and started again against the same file sees the load
//! balancers it made, and a load balancer whose Service vanished while it was down stays
//! visible (a leak) to anyone reading the file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use ccm_testing::apiserver::ApiServer;
use ccm_testing::builders::load_balancer_service;
use ccm_testing::fake_cloud::FakeCloudState;
use ccm_testing::wait::wait_for;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};

mod support;

use support::signal;

const NS: &str = "default";

fn start_ccm(server: &ApiServer, config: &Path) -> tokio::process::Child {
    support::fake_ccm(server, config, 0)
        .arg("--controllers=service")
        .arg("--concurrent-service-syncs=1")
        .spawn()
        .unwrap()
}

/// Waits until the state file satisfies `done`, polling every 10 ms.
async fn wait_for_state(path: &Path, done: impl Fn(&FakeCloudState) -> bool) -> FakeCloudState {
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let state = FakeCloudState::load(path).unwrap();
            if done(&state) {
                return state;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("state file never reached the expected state")
}

fn ingress_ip(service: &Service) -> Option<String> {
    service
        .status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .first()?
        .ip
        .clone()
}

#[tokio::test]
async fn load_balancers_survive_a_sigkill_in_the_state_file() {
    let server = ApiServer::start().await;
    let services: Api<Service> = Api::namespaced(server.client(), NS);
    let dir = std::env::temp_dir().join(format!("fake-ccm-state-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state_file = dir.join("cloud.json");
    let config = dir.join("fake-cloud.yaml");
    // Each ensure takes 1.5 s: with one service worker, the second Service's ensure is in
    // flight when the first one's load balancer appears in the file.
    std::fs::write(
        &config,
        format!(
            "state_file: {}\noperation_latency_ms: {{ensure_load_balancer: 1500}}\n",
            state_file.display()
        ),
    )
    .unwrap();
    for name in ["svc-a", "svc-b"] {
        services
            .create(
                &PostParams::default(),
                &load_balancer_service(NS, name).port("http", 80).build(),
            )
            .await
            .unwrap();
    }

    let ccm = start_ccm(&server, &config);
    let before = wait_for_state(&state_file, |s| !s.load_balancers.is_empty()).await;
    signal(&ccm, "KILL");
    drop(ccm);
    // Only the finished ensure is in the file; the one in flight left nothing behind.
    assert_eq!(before.load_balancers.len(), 1, "{before:?}");
    let (first_key, first) = before.load_balancers.iter().next().unwrap();
    let first_ip = first.ingress_ip.clone().unwrap();
    let first_name = first_key.strip_prefix("default/").unwrap().to_owned();
    let second_name = if first_name == "svc-a" {
        "svc-b"
    } else {
        "svc-a"
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(FakeCloudState::load(&state_file).unwrap(), before);

    // While the CCM is down, the first Service is force-deleted (finalizer removed by hand):
    // no CCM will ever delete its load balancer.
    services
        .patch(
            &first_name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    services
        .delete(&first_name, &DeleteParams::default())
        .await
        .unwrap();

    // The restarted CCM creates the second load balancer next to the first (read from the
    // file, not forgotten), with another address.
    let ccm = start_ccm(&server, &config);
    let second = wait_for(&services, second_name, Duration::from_secs(60), |s| {
        ingress_ip(s).is_some()
    })
    .await
    .unwrap();
    let after = wait_for_state(&state_file, |s| s.load_balancers.len() == 2).await;
    assert_eq!(
        after.load_balancers[first_key], *first,
        "the leak is visible"
    );
    let second_ip = ingress_ip(&second).unwrap();
    assert_ne!(second_ip, first_ip);
    assert_eq!(
        after.load_balancers[&format!("default/{second_name}")]
            .ingress_ip
            .as_deref(),
        Some(second_ip.as_str())
    );

    let mut ccm = ccm;
    let status = support::stop(&mut ccm).await;
    assert!(status.success(), "fake-ccm exited with {status}");
    let _ = std::fs::remove_dir_all(dir);
}

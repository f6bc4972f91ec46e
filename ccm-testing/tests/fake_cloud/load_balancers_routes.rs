//! Load balancers (hosts, ports, ingress) and the route table.

use std::sync::Arc;
use std::time::Duration;

use ccm_core::{CloudProvider, Route};
use ccm_testing::fake_cloud::FakeCloud;

use crate::support::{UID, host, route, service};

#[tokio::test]
async fn load_balancer_lifecycle_remembers_hosts_and_ports() {
    let cloud = FakeCloud::default();
    let lb = cloud.load_balancer().unwrap();
    let svc = service("ns", "web", UID);
    assert_eq!(lb.get_load_balancer("c1", &svc).await.unwrap(), None);

    let hosts = [host("n2"), host("n1"), host("n2")];
    let status = lb.ensure_load_balancer("c1", &svc, &hosts).await.unwrap();
    let ingress = status.ingress.clone().unwrap();
    assert_eq!(ingress.len(), 1);
    // The first load balancer gets the lowest address of the default range.
    assert_eq!(ingress[0].ip.as_deref(), Some("198.18.0.1"));
    assert_eq!(ingress[0].hostname, None);

    let state = cloud.load_balancers();
    let web = &state["ns/web"];
    assert_eq!(web.name, "a2f3c6a1e9b7d4c1a8e5f0123456789a");
    assert_eq!(web.hosts, ["n1", "n2"]);
    assert_eq!(web.ports, [80, 443]);
    assert_eq!(web.cluster_name, "c1");

    assert_eq!(
        lb.get_load_balancer("c1", &svc).await.unwrap(),
        Some(status.clone())
    );
    // Another cluster never sees it, nor deletes it.
    assert_eq!(lb.get_load_balancer("c2", &svc).await.unwrap(), None);
    lb.ensure_load_balancer_deleted("c2", &svc).await.unwrap();
    assert!(lb.get_load_balancer("c1", &svc).await.unwrap().is_some());

    lb.update_load_balancer("c1", &svc, &[host("n3")])
        .await
        .unwrap();
    assert_eq!(cloud.load_balancers()["ns/web"].hosts, ["n3"]);

    // Idempotent ensure.
    assert_eq!(
        lb.ensure_load_balancer("c1", &svc, &hosts).await.unwrap(),
        status
    );
    assert_eq!(cloud.load_balancers().len(), 1);

    lb.ensure_load_balancer_deleted("c1", &svc).await.unwrap();
    assert_eq!(lb.get_load_balancer("c1", &svc).await.unwrap(), None);
    assert!(cloud.load_balancers().is_empty());
    // Deleting what does not exist succeeds; updating it fails.
    lb.ensure_load_balancer_deleted("c1", &svc).await.unwrap();
    let err = lb
        .update_load_balancer("c1", &svc, &[host("n1")])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("ns/web"), "{err}");
}

#[tokio::test]
async fn lb_ip_and_lb_hostname_set_the_ingress() {
    let svc = service("ns", "web", UID);
    let cloud = FakeCloud::builder().lb_ip("198.51.100.7").build();
    let status = cloud
        .load_balancer()
        .unwrap()
        .ensure_load_balancer("c", &svc, &[])
        .await
        .unwrap();
    assert_eq!(
        status.ingress.unwrap()[0].ip.as_deref(),
        Some("198.51.100.7")
    );

    let cloud = FakeCloud::builder().lb_hostname("lb.example.com").build();
    let lb = cloud.load_balancer().unwrap();
    let status = lb.ensure_load_balancer("c", &svc, &[]).await.unwrap();
    let ingress = status.ingress.unwrap();
    assert_eq!(ingress[0].hostname.as_deref(), Some("lb.example.com"));
    assert_eq!(ingress[0].ip, None);
    let got = lb.get_load_balancer("c", &svc).await.unwrap().unwrap();
    assert_eq!(
        got.ingress.unwrap()[0].hostname.as_deref(),
        Some("lb.example.com")
    );
}

#[tokio::test]
async fn route_table_create_list_delete_and_idempotence() {
    let cloud = FakeCloud::default();
    let routes = CloudProvider::routes(&cloud).unwrap();
    let r = route("n1", "10.244.1.0/24");
    routes.create_route("c1", "uid-1", &r).await.unwrap();
    // Creating it again succeeds and does not duplicate it.
    routes.create_route("c1", "uid-1", &r).await.unwrap();
    let listed = routes.list_routes("c1").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "c1-uid-1");
    assert_eq!(listed[0].target_node, "n1");
    assert_eq!(listed[0].destination_cidr, "10.244.1.0/24");
    assert_eq!(listed[0].target_node_addresses, r.target_node_addresses);
    assert!(!listed[0].enable_node_addresses, "not tracked by default");
    // Another cluster does not see it.
    assert!(routes.list_routes("c2").await.unwrap().is_empty());

    routes.delete_route("c1", &listed[0]).await.unwrap();
    assert!(routes.list_routes("c1").await.unwrap().is_empty());
    // Deleting a missing route succeeds.
    routes.delete_route("c1", &listed[0]).await.unwrap();
    assert!(FakeCloud::routes(&cloud).is_empty());
}

#[tokio::test]
async fn seeded_routes_are_listed_for_every_cluster_and_deletable() {
    let cloud = FakeCloud::default();
    cloud.insert_route(Route {
        destination_cidr: "10.244.9.0/24".into(),
        target_node: "old".into(),
        blackhole: true,
        ..Default::default()
    });
    let routes = CloudProvider::routes(&cloud).unwrap();
    let listed = routes.list_routes("any").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "seed-10.244.9.0/24");
    assert!(listed[0].blackhole);
    routes.delete_route("any", &listed[0]).await.unwrap();
    assert!(cloud.routes().is_empty());
}

#[tokio::test]
async fn track_node_addresses_sets_enable_node_addresses_on_list() {
    let cloud = FakeCloud::builder().track_node_addresses(true).build();
    let routes = CloudProvider::routes(&cloud).unwrap();
    routes
        .create_route("c", "uid", &route("n1", "10.244.0.0/24"))
        .await
        .unwrap();
    let listed = routes.list_routes("c").await.unwrap();
    assert!(listed[0].enable_node_addresses);
}

#[tokio::test]
async fn hosts_batch_updates_each_load_balancer_as_update_would_in_one_quota_token() {
    let cloud = FakeCloud::builder()
        .load_balancer_hosts_batch(true)
        .max_batch_size(3)
        .operation_quota("update_load_balancer_hosts", 1.0, 1)
        .build();
    let lb = cloud.load_balancer().unwrap();
    let batch = cloud.load_balancer_hosts_batch().unwrap();
    assert_eq!(batch.max_batch_size(), 3);
    let (web, api, none) = (
        Arc::new(service("ns", "web", UID)),
        Arc::new(service("ns", "api", UID)),
        Arc::new(service("ns", "none", UID)),
    );
    for svc in [&web, &api] {
        lb.ensure_load_balancer("c1", svc, &[host("n1")])
            .await
            .unwrap();
    }
    let answers = batch
        .update_load_balancer_hosts(
            "c1",
            &[web.clone(), api.clone(), none.clone()],
            &[host("n3"), host("n2")],
        )
        .await
        .unwrap();
    assert_eq!(answers.len(), 3);
    assert!(answers["ns/web"].is_ok() && answers["ns/api"].is_ok());
    // A Service without a load balancer gets the error update_load_balancer gives it.
    let single = lb
        .update_load_balancer("c1", &none, &[host("n2")])
        .await
        .unwrap_err();
    let batched = answers["ns/none"].as_ref().unwrap_err();
    assert_eq!(batched.to_string(), single.to_string());
    let state = cloud.load_balancers();
    assert_eq!(state["ns/web"].hosts, ["n2", "n3"]);
    assert_eq!(state["ns/api"].hosts, ["n2", "n3"]);
    // The call is logged with every Service and the hosts, and cost one token: the next one
    // is over the quota of 1 call per second.
    let call = cloud
        .call_log()
        .into_iter()
        .find(|c| c.operation == "update_load_balancer_hosts")
        .unwrap();
    assert_eq!(call.services(), ["ns/web", "ns/api", "ns/none"]);
    assert_eq!(call.hosts().unwrap(), ["n2", "n3"]);
    let err = batch
        .update_load_balancer_hosts("c1", std::slice::from_ref(&web), &[])
        .await
        .unwrap_err();
    assert!(err.retry_after().is_some(), "{err}");
    assert_eq!(cloud.load_balancers()["ns/web"].hosts, ["n2", "n3"]);
    // Another cluster's call updates nothing of c1.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let other = batch
        .update_load_balancer_hosts("c2", std::slice::from_ref(&web), &[])
        .await
        .unwrap();
    assert!(other["ns/web"].is_err());
    assert_eq!(cloud.load_balancers()["ns/web"].hosts, ["n2", "n3"]);
}

#[tokio::test]
async fn hosts_batch_over_max_batch_size_fails_whole() {
    let cloud = FakeCloud::builder()
        .load_balancer_hosts_batch(true)
        .max_batch_size(1)
        .build();
    let batch = cloud.load_balancer_hosts_batch().unwrap();
    let two = [
        Arc::new(service("ns", "a", UID)),
        Arc::new(service("ns", "b", UID)),
    ];
    let err = batch
        .update_load_balancer_hosts("c1", &two, &[])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("max_batch_size 1"), "{err}");
}

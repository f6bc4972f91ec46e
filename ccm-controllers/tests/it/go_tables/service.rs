//! The service controller's table.

use ccm_core::CloudProvider;
use ccm_core::well_known::{
    FINALIZER_LOAD_BALANCER_CLEANUP, LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS,
};
use ccm_testing::TestCluster;
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use ccm_testing::fake_cloud::{CallArgs, FakeCloud};
use ccm_testing::harness::ControllerHarness;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::DeleteParams;
use serde_json::json;

use super::{Calls, Write, call, cloud_calls, dump, skip_on_real_cluster, write, writes};

struct ServiceCase {
    name: &'static str,
    /// The Service `default/web` given.
    service: Service,
    /// Whether the Service is deleted before the controller starts.
    deleted: bool,
    /// The cloud calls expected, in order.
    calls: Calls,
    /// The API writes expected, in order.
    writes: Vec<Write>,
}

#[tokio::test]
async fn service_table() {
    if skip_on_real_cluster("service_table") {
        return;
    }
    let lb_args = |hosts: &[&str]| CallArgs::LoadBalancer {
        cluster_name: "kubernetes".into(),
        service: "default/web".into(),
        hosts: Some(hosts.iter().map(|h| h.to_string()).collect()),
    };
    // The arguments of the load-balancer calls without hosts.
    let lb_call = || CallArgs::LoadBalancer {
        cluster_name: "kubernetes".into(),
        service: "default/web".into(),
        hosts: None,
    };
    let cases = vec![
        ServiceCase {
            name: "load balancer ensured with every Node but the excluded one",
            service: load_balancer_service("default", "web").build(),
            deleted: false,
            calls: Calls::Exactly(vec![call("ensure_load_balancer", lb_args(&["n1", "n2"]))]),
            // As Go's PatchService: the cleanup finalizer first, then the status, both through
            // the status subresource; the first IP of FakeCloud's range.
            writes: vec![
                write(
                    "patch services/status web",
                    // Guarded by what the decision read, never the resourceVersion.
                    json!([
                        {"op": "test", "path": "/metadata/uid", "value": "<uid>"},
                        {"op": "test", "path": "/metadata/deletionTimestamp", "value": null},
                        {"op": "test", "path": "/spec/type", "value": "LoadBalancer"},
                        {"op": "test", "path": "/spec/loadBalancerClass", "value": null},
                        {"op": "test", "path": "/metadata/finalizers", "value": null},
                        {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER_LOAD_BALANCER_CLEANUP]},
                    ]),
                ),
                // Differs from Go: an explicit ipMode (the provider's class default, VIP),
                // what the API server would default anyway (docs/controllers.md).
                write(
                    "patch services/status web",
                    json!({"status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.1", "ipMode": "VIP"}]}}}),
                ),
            ],
        },
        ServiceCase {
            name: "deleted Service whose load balancer exists: load balancer deleted, finalizer removed",
            service: load_balancer_service("default", "web")
                .finalizer(FINALIZER_LOAD_BALANCER_CLEANUP)
                .build(),
            deleted: true,
            // Go: GetLoadBalancer, and EnsureLoadBalancerDeleted only when it exists.
            calls: Calls::Exactly(vec![
                call("get_load_balancer", lb_call()),
                call("ensure_load_balancer_deleted", lb_call()),
            ]),
            writes: vec![write(
                "patch services/status web",
                json!([
                    {"op": "test", "path": "/metadata/uid", "value": "<uid>"},
                    {"op": "test", "path": "/metadata/finalizers/0", "value": FINALIZER_LOAD_BALANCER_CLEANUP},
                    {"op": "remove", "path": "/metadata/finalizers/0"},
                ]),
            )],
        },
        ServiceCase {
            name: "ClusterIP Service: no load balancer",
            service: load_balancer_service("default", "web")
                .type_("ClusterIP")
                .build(),
            deleted: false,
            calls: Calls::Exactly(vec![]),
            writes: vec![],
        },
        ServiceCase {
            name: "another load-balancer class: left to its controller",
            service: load_balancer_service("default", "web")
                .load_balancer_class("example.com/other")
                .build(),
            deleted: false,
            calls: Calls::Exactly(vec![]),
            writes: vec![],
        },
    ];
    for case in cases {
        let cluster = TestCluster::start().await;
        let server = cluster.api_server().unwrap();
        let cloud = FakeCloud::default();
        let initialised = |name: &str| {
            kubelet_node(name)
                .without_uninitialized_taint()
                .provider_id(&format!("fake://{name}"))
        };
        cluster.create(&initialised("n1").build()).await;
        cluster.create(&initialised("n2").build()).await;
        cluster
            .create(
                &initialised("n3")
                    .label(LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS, "")
                    .build(),
            )
            .await;
        let created = cluster.create(&case.service).await;
        let uid = created.metadata.uid.clone().unwrap();
        if case.deleted {
            // The load balancer made before the Service was deleted.
            let lb = cloud.load_balancer().unwrap();
            lb.ensure_load_balancer("kubernetes", &created, &[])
                .await
                .unwrap();
            cloud.reset_calls();
            let services: Api<Service> = Api::namespaced(cluster.client(), "default");
            services
                .delete("web", &DeleteParams::default())
                .await
                .unwrap();
        }
        server.clear_requests();
        let harness = ControllerHarness::builder(&cluster, cloud.provider())
            .service()
            .start()
            .await;
        harness.settled().await;
        harness.stop().await.unwrap();
        let (calls, writes) = (cloud_calls(&cloud), writes(server, &[(&uid, "<uid>")]));
        dump(case.name, &calls, &writes);
        case.calls.check(case.name, &calls);
        assert_eq!(writes, case.writes, "case {}: API writes", case.name);
        cluster.cleanup().await;
    }
}

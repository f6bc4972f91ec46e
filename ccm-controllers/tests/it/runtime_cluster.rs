//! Whole runtimes on `TestCluster` (the in-process API server, or the real cluster of
//! `$CCM_TEST_KUBECONFIG`) with `FakeCloud`: leader election between two runtimes (only the
//! leader runs controllers; a graceful stop hands over at once; a killed leader is replaced
//! after the lease expires), readiness and health per state, and `/metrics` in OpenMetrics text
//! with the cloud-call counters moving.
//!
//! Each test uses its own namespace and Lease name, so it also runs against a shared cluster.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ccm_controllers::{Builder, ControllerContext};
use ccm_testing::TestCluster;
use ccm_testing::builders::kubelet_node;
use ccm_testing::fake_cloud::FakeCloud;
use ccm_testing::wait::eventually;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ContainerImage, Node, NodeCondition};
use kube::Api;
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;

use crate::support::connection::connection_flag;
use crate::support::https::http_get;
use crate::support::openmetrics::{assert_openmetrics, samples};

const WAIT: Duration = Duration::from_secs(20);

/// One runtime under test, with a controller `poller` that reports whether it runs and makes
/// one `instance_metadata` call through the budget each time it is poked.
struct Replica {
    addr: std::net::SocketAddr,
    running: Arc<AtomicBool>,
    poke: Arc<Notify>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<i32>,
}

impl Replica {
    fn start(
        cluster: &TestCluster,
        cloud: &FakeCloud,
        namespace: &str,
        lease: &str,
        timing: &[&str],
    ) -> Replica {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let running = Arc::new(AtomicBool::new(false));
        let poke = Arc::new(Notify::new());
        let (stop, stop_rx) = oneshot::channel::<()>();
        let mut args = vec![
            "ccm".to_owned(),
            connection_flag(cluster),
            format!("--leader-elect-resource-name={lease}"),
            format!("--leader-elect-resource-namespace={namespace}"),
            "--shutdown-grace-period=5s".to_owned(),
            // /metrics without credentials in these tests (the probes are always allowed).
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics".to_owned(),
        ];
        args.extend(timing.iter().map(|s| (*s).to_owned()));
        let (flag, poked) = (running.clone(), poke.clone());
        let builder = Builder::new()
            // Only the test's controller: the built-in ones would act on a real cluster's Nodes
            // with FakeCloud answers.
            .without_builtin_controllers()
            .provider(cloud.provider())
            .listener(listener)
            .controller("poller", move |ctx: ControllerContext| {
                let (flag, poked) = (flag.clone(), poked.clone());
                async move {
                    struct Running(Arc<AtomicBool>);
                    impl Drop for Running {
                        fn drop(&mut self) {
                            self.0.store(false, Ordering::SeqCst);
                        }
                    }
                    flag.store(true, Ordering::SeqCst);
                    let _running = Running(flag);
                    let node = kubelet_node("poller-node").build();
                    loop {
                        tokio::select! {
                            () = ctx.shutdown.cancelled() => return Ok(()),
                            () = poked.notified() => {
                                let iv2 = ctx.cloud.instances_v2().expect("FakeCloud has InstancesV2");
                                let _ = iv2.instance_metadata(&ccm_core::NodeView::from_node(&node)).await;
                            }
                        }
                    }
                }
            })
            .args(args)
            .shutdown_signal(async {
                let _ = stop_rx.await;
            });
        Replica {
            addr,
            running,
            poke,
            stop: Some(stop),
            task: tokio::spawn(builder.run_async()),
        }
    }

    fn runs_controllers(&self) -> bool {
        self.running.load(Ordering::SeqCst)
    }

    async fn metric(&self, series: &str) -> Option<f64> {
        let (_, body) = http_get(self.addr, "/metrics").await;
        samples(&body).get(series).copied()
    }

    async fn stop(mut self) -> i32 {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("the runtime stops")
            .unwrap()
    }
}

async fn holder(cluster: &TestCluster, namespace: &str, lease: &str) -> Option<String> {
    Api::<Lease>::namespaced(cluster.client(), namespace)
        .get(lease)
        .await
        .ok()?
        .spec?
        .holder_identity
}

fn master_status(lease: &str) -> String {
    format!("leader_election_master_status{{name=\"{lease}\"}}")
}

#[tokio::test]
async fn two_runtimes_on_test_cluster_one_leads_and_hands_over_on_graceful_stop() {
    let cluster = TestCluster::start().await;
    let namespace = cluster.namespace().await;
    let lease = cluster.unique_name("ccm-lease");
    let cloud = FakeCloud::default();
    // A 30 s lease: a standby that leads within the 20 s wait below can only do so because the
    // leader released the lease.
    let timing = [
        "--leader-elect-lease-duration=30s",
        "--leader-elect-renew-deadline=20s",
        "--leader-elect-retry-period=1s",
    ];
    let a = Replica::start(&cluster, &cloud, &namespace, &lease, &timing);
    assert!(
        eventually(WAIT, || async { a.runs_controllers() }).await,
        "A leads"
    );
    assert!(
        eventually(WAIT, || async {
            http_get(a.addr, "/readyz").await.0 == 200
        })
        .await,
        "leader ready once synced"
    );
    assert_eq!(http_get(a.addr, "/healthz").await.0, 200);
    assert_eq!(http_get(a.addr, "/livez").await.0, 200);
    assert_eq!(a.metric(&master_status(&lease)).await, Some(1.0));
    let a_identity = holder(&cluster, &namespace, &lease)
        .await
        .expect("A holds the Lease");

    let b = Replica::start(&cluster, &cloud, &namespace, &lease, &timing);
    assert!(
        eventually(WAIT, || async {
            b.metric(&master_status(&lease)).await == Some(0.0)
        })
        .await,
        "B stands by"
    );
    assert_eq!(
        http_get(b.addr, "/readyz").await.0,
        200,
        "standing by healthily is ready"
    );
    assert_eq!(http_get(b.addr, "/healthz").await.0, 200);
    // Several retry periods later, still only A runs controllers.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(a.runs_controllers());
    assert!(!b.runs_controllers(), "the standby runs no controller");
    assert_eq!(
        holder(&cluster, &namespace, &lease).await.as_deref(),
        Some(a_identity.as_str())
    );

    // /metrics: OpenMetrics text, and the cloud-call counters move with the calls.
    let series =
        "cloud_provider_requests_total{operation=\"instance_metadata\",result=\"success\"}";
    let before = a.metric(series).await.unwrap_or(0.0);
    let calls_before = cloud.call_count("instance_metadata");
    for round in 1..=3 {
        a.poke.notify_one();
        let want = before + f64::from(round);
        assert!(
            eventually(WAIT, || async { a.metric(series).await == Some(want) }).await,
            "counter reaches {want}"
        );
    }
    assert_eq!(cloud.call_count("instance_metadata"), calls_before + 3);
    let (status, body) = http_get(a.addr, "/metrics").await;
    assert_eq!(status, 200);
    assert_openmetrics(&body);
    let all = samples(&body);
    assert_eq!(
        all.get(
            "running_managed_controllers{manager=\"cloud-controller-manager\",name=\"poller\"}"
        ),
        Some(&1.0)
    );
    assert_eq!(
        all.get("cloud_provider_request_duration_seconds_count{operation=\"instance_metadata\"}"),
        Some(&(before + 3.0))
    );
    assert!(
        all.keys()
            .any(|k| k.starts_with("rest_client_requests_total{code=\"200\",method=\"GET\"")),
        "client request metrics"
    );
    let (_, b_body) = http_get(b.addr, "/metrics").await;
    assert_openmetrics(&b_body);
    assert!(
        !b_body.contains(
            "running_managed_controllers{manager=\"cloud-controller-manager\",name=\"poller\"} 1"
        ),
        "the standby reports no running controller"
    );

    // Graceful stop of the leader: its controllers stop, it releases the Lease, B takes over
    // long before the 30 s lease would expire.
    let a_running = a.running.clone();
    assert_eq!(a.stop().await, 0);
    assert!(!a_running.load(Ordering::SeqCst));
    assert_ne!(
        holder(&cluster, &namespace, &lease).await.as_deref(),
        Some(a_identity.as_str()),
        "the Lease was released"
    );
    assert!(
        eventually(WAIT, || async { b.runs_controllers() }).await,
        "B leads after the release"
    );
    assert_eq!(b.metric(&master_status(&lease)).await, Some(1.0));
    assert!(
        eventually(WAIT, || async {
            http_get(b.addr, "/readyz").await.0 == 200
        })
        .await
    );
    assert_eq!(b.stop().await, 0);
    cluster.cleanup().await;
}

#[tokio::test]
async fn a_killed_leader_on_test_cluster_is_replaced_after_the_lease_expires() {
    let cluster = TestCluster::start().await;
    let namespace = cluster.namespace().await;
    let lease = cluster.unique_name("ccm-lease");
    let cloud = FakeCloud::default();
    let timing = [
        "--leader-elect-lease-duration=4s",
        "--leader-elect-renew-deadline=3s",
        "--leader-elect-retry-period=1s",
    ];
    let a = Replica::start(&cluster, &cloud, &namespace, &lease, &timing);
    assert!(eventually(WAIT, || async { a.runs_controllers() }).await);
    let a_identity = holder(&cluster, &namespace, &lease).await.unwrap();
    let b = Replica::start(&cluster, &cloud, &namespace, &lease, &timing);
    assert!(
        eventually(WAIT, || async {
            b.metric(&master_status(&lease)).await == Some(0.0)
        })
        .await
    );
    assert!(!b.runs_controllers());

    // Kill A: its runtime is dropped without releasing the Lease.
    a.task.abort();
    let _ = a.task.await;
    assert_eq!(
        holder(&cluster, &namespace, &lease).await.as_deref(),
        Some(a_identity.as_str()),
        "a killed leader leaves the Lease held"
    );
    assert!(
        eventually(WAIT, || async { b.runs_controllers() }).await,
        "B leads once the Lease expired"
    );
    assert_ne!(
        holder(&cluster, &namespace, &lease).await.as_deref(),
        Some(a_identity.as_str())
    );
    assert_eq!(b.metric(&master_status(&lease)).await, Some(1.0));
    assert_eq!(b.stop().await, 0);
    cluster.cleanup().await;
}

#[tokio::test]
async fn a_leader_whose_lease_is_taken_exits_non_zero() {
    use kube::api::{Patch, PatchParams};
    let cluster = TestCluster::start().await;
    let namespace = cluster.namespace().await;
    let lease = cluster.unique_name("ccm-lease");
    let cloud = FakeCloud::default();
    let timing = [
        "--leader-elect-lease-duration=30s",
        "--leader-elect-renew-deadline=20s",
        "--leader-elect-retry-period=1s",
    ];
    let a = Replica::start(&cluster, &cloud, &namespace, &lease, &timing);
    assert!(eventually(WAIT, || async { a.runs_controllers() }).await);
    // Another process takes the Lease (as after a long partition of this one).
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(jiff::Timestamp::now());
    Api::<Lease>::namespaced(cluster.client(), &namespace)
        .patch(
            &lease,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {
                "holderIdentity": "thief", "renewTime": now, "leaseDurationSeconds": 30
            }})),
        )
        .await
        .unwrap();
    let code = tokio::time::timeout(WAIT, a.task)
        .await
        .expect("the leader exits")
        .unwrap();
    assert_eq!(code, 1, "losing the lease exits non-zero");
    assert!(!a.running.load(Ordering::SeqCst), "its controllers stopped");
    assert_eq!(
        holder(&cluster, &namespace, &lease).await.as_deref(),
        Some("thief"),
        "the loser does not release someone else's Lease"
    );
    cluster.cleanup().await;
}

#[tokio::test]
async fn renewal_failures_keep_the_lease_until_the_renew_deadline_then_exit_1() {
    let cluster = TestCluster::start().await;
    let Some(server) = cluster.api_server() else {
        return; // Needs fault injection (in-process API server only).
    };
    let namespace = cluster.namespace().await;
    let lease = cluster.unique_name("ccm-lease");
    let cloud = FakeCloud::default();
    let timing = [
        "--leader-elect-lease-duration=4s",
        "--leader-elect-renew-deadline=3s",
        "--leader-elect-retry-period=1s",
    ];
    let a = Replica::start(&cluster, &cloud, &namespace, &lease, &timing);
    assert!(eventually(WAIT, || async { a.runs_controllers() }).await);
    assert!(
        server.requests().iter().any(|r| r.user_agent.as_deref()
            == Some(&*ccm_controllers::user_agent(
                env!("CARGO_PKG_VERSION"),
                "cloud-controller-manager"
            ))),
        "user agent cloud-controller-manager/<version> (<os>/<arch>) kubernetes/unknown/cloud-controller-manager"
    );

    // One failed renewal is retried and does not cost the lease.
    server.clear_requests();
    server.fail_next("patch", "leases", 1, 500, None);
    let failed = || {
        server
            .requests()
            .iter()
            .any(|r| r.resource == "leases" && r.verb == "patch" && r.status == 500)
    };
    assert!(eventually(WAIT, || async { failed() }).await);
    let renewed_after_failure = || {
        let requests = server.requests();
        let first_failure = requests
            .iter()
            .position(|r| r.resource == "leases" && r.status == 500);
        first_failure.is_some_and(|i| {
            requests[i..]
                .iter()
                .any(|r| r.resource == "leases" && r.verb == "patch" && r.status == 200)
        })
    };
    assert!(
        eventually(WAIT, || async { renewed_after_failure() }).await,
        "the renewal is retried"
    );
    assert!(
        a.runs_controllers(),
        "still leading after a transient failure"
    );
    assert!(!a.task.is_finished());
    assert_eq!(a.metric(&master_status(&lease)).await, Some(1.0));

    // Renewals failing for longer than --leader-elect-renew-deadline: the lease counts as lost.
    server.fail_next("patch", "leases", usize::MAX, 500, None);
    let code = tokio::time::timeout(WAIT, a.task)
        .await
        .expect("the leader gives up")
        .unwrap();
    assert_eq!(code, 1);
    assert!(!a.running.load(Ordering::SeqCst));
    cluster.cleanup().await;
}

#[tokio::test]
async fn the_built_in_controllers_run_through_the_runtime() {
    use k8s_openapi::api::core::v1::Node;
    let cluster = TestCluster::start().await;
    if cluster.is_real() {
        // The built-in controllers would act on the real cluster's Nodes with FakeCloud's
        // answers; this wiring test runs on the in-process API server only.
        return;
    }
    let cloud = FakeCloud::default();
    let name = cluster.unique_name("worker");
    cluster
        .create(&kubelet_node(&name).pod_cidrs(&["10.244.1.0/24"]).build())
        .await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stop_rx) = oneshot::channel::<()>();
    let runtime = tokio::spawn(
        Builder::new()
            .provider(cloud.provider())
            .listener(listener)
            .args([
                "ccm".to_owned(),
                connection_flag(&cluster),
                "--leader-elect=false".to_owned(),
                "--cluster-cidr=10.244.0.0/16".to_owned(),
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics".to_owned(),
            ])
            .shutdown_signal(async {
                let _ = stop_rx.await;
            })
            .run_async(),
    );
    let nodes: Api<Node> = Api::all(cluster.client());
    let node = ccm_testing::wait::wait_for(&nodes, &name, WAIT, |n: &Node| {
        let spec = n.spec.as_ref();
        let tainted = spec.and_then(|s| s.taints.as_ref()).is_some_and(|t| {
            t.iter()
                .any(|t| t.key == ccm_core::well_known::TAINT_UNINITIALIZED)
        });
        !tainted && spec.and_then(|s| s.provider_id.as_deref()).is_some()
    })
    .await
    .expect("the cloud-node controller initialises the Node");
    assert_eq!(
        node.spec.unwrap().provider_id.as_deref(),
        Some(format!("fake://{name}").as_str())
    );
    assert!(
        eventually(WAIT, || async {
            cloud.routes().iter().any(|r| r.target_node == name)
        })
        .await,
        "the route controller creates the Node's route"
    );
    let (_, body) = http_get(addr, "/metrics").await;
    let all = samples(&body);
    for alias in ["cloud-node", "cloud-node-lifecycle", "service", "route"] {
        let series = format!(
            "running_managed_controllers{{manager=\"cloud-controller-manager\",name=\"{alias}\"}}"
        );
        assert_eq!(all.get(&series), Some(&1.0), "{series}");
    }
    assert!(
        all.get(
            "cloud_provider_requests_total{operation=\"instance_metadata\",result=\"success\"}"
        )
        .is_some_and(|n| *n >= 1.0)
    );
    stop.send(()).unwrap();
    assert_eq!(
        tokio::time::timeout(WAIT, runtime).await.unwrap().unwrap(),
        0
    );
    cluster.cleanup().await;
}

/// Runs a runtime whose only controller hands out the cached copy of Node `name` once the shared
/// informer has it.
async fn cached_node(cluster: &TestCluster, name: &str, strip: Option<fn(&mut Node)>) -> Arc<Node> {
    let (found_tx, found_rx) = oneshot::channel::<Arc<Node>>();
    let found_tx = Arc::new(std::sync::Mutex::new(Some(found_tx)));
    let (stop, stop_rx) = oneshot::channel::<()>();
    let wanted = name.to_owned();
    let mut builder = Builder::new()
        .without_builtin_controllers()
        .provider(FakeCloud::default().provider())
        .listener(std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .controller("reader", move |ctx: ControllerContext| {
            let (found_tx, wanted) = (found_tx.clone(), wanted.clone());
            async move {
                let node = loop {
                    if let Some(node) = ctx.nodes.get(&wanted) {
                        break node;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                };
                if let Some(tx) = found_tx.lock().unwrap().take() {
                    let _ = tx.send(node);
                }
                ctx.shutdown.cancelled().await;
                Ok(())
            }
        })
        .args([
            "ccm".to_owned(),
            connection_flag(cluster),
            "--leader-elect=false".to_owned(),
        ])
        .shutdown_signal(async {
            let _ = stop_rx.await;
        });
    if let Some(strip) = strip {
        builder = builder.strip_cached_node(strip);
    }
    let task = tokio::spawn(builder.run_async());
    let node = tokio::time::timeout(WAIT, found_rx)
        .await
        .expect("the controller finds the node")
        .unwrap();
    let _ = stop.send(());
    assert_eq!(tokio::time::timeout(WAIT, task).await.unwrap().unwrap(), 0);
    node
}

fn condition_types(node: &Node) -> Vec<String> {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions
        .map(|cs| cs.iter().map(|c| c.type_.clone()).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn cached_nodes_keep_what_clouds_read_unless_the_vendor_keeps_more() {
    let cluster = TestCluster::start().await;
    let name = cluster.unique_name("cached");
    let mut node = kubelet_node(&name)
        .label("acme.example.com/pool", "blue")
        .build();
    let status = node.status.as_mut().unwrap();
    status.images = Some(vec![ContainerImage {
        names: Some(vec!["registry.k8s.io/pause:3.10".to_owned()]),
        size_bytes: Some(300_000),
    }]);
    status.conditions.as_mut().unwrap().push(NodeCondition {
        type_: "NetworkUnavailable".to_owned(),
        status: "False".to_owned(),
        reason: Some("RouteCreated".to_owned()),
        ..Default::default()
    });
    cluster.create(&node).await;
    let written = cluster.client();
    let written = Api::<Node>::all(written).get(&name).await.unwrap();
    let written_status = written.status.as_ref().unwrap();
    assert!(written_status.capacity.is_some() && written_status.images.is_some());
    assert!(
        condition_types(&written).len() > 2,
        "kubelet's pressure conditions too"
    );

    // Default: what neither a controller nor a cloud reads is gone, the rest is kept.
    let cached = cached_node(&cluster, &name, None).await;
    let status = cached.status.as_ref().unwrap();
    assert_eq!(status.images, None);
    assert_eq!(status.capacity, None);
    assert_eq!(status.allocatable, None);
    assert_eq!(status.daemon_endpoints, None);
    assert_eq!(condition_types(&cached), ["Ready", "NetworkUnavailable"]);
    assert_eq!(status.addresses, written_status.addresses);
    // Of nodeInfo, what clouds match instances by (and the platform) is kept; versions and
    // the boot ID are emptied.
    let (info, written_info) = (
        status.node_info.as_ref().unwrap(),
        written_status.node_info.as_ref().unwrap(),
    );
    assert_eq!(info.system_uuid, written_info.system_uuid);
    assert_eq!(info.machine_id, written_info.machine_id);
    assert_eq!(info.architecture, written_info.architecture);
    assert_eq!(info.operating_system, written_info.operating_system);
    assert_eq!(info.kubelet_version, "");
    assert_eq!(info.kernel_version, "");
    assert_eq!(cached.metadata.labels, written.metadata.labels);
    assert_eq!(cached.metadata.annotations, written.metadata.annotations);
    assert_eq!(cached.spec, written.spec);
    assert!(cached.metadata.managed_fields.is_none());

    // A vendor that needs more keeps it.
    fn images_only(node: &mut Node) {
        if let Some(status) = node.status.as_mut() {
            status.images = None;
        }
    }
    let cached = cached_node(&cluster, &name, Some(images_only)).await;
    let status = cached.status.as_ref().unwrap();
    assert_eq!(status.images, None);
    assert_eq!(status.capacity, written_status.capacity);
    assert_eq!(condition_types(&cached), condition_types(&written));
    cluster.cleanup().await;
}

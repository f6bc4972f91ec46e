//! Service controller: backends chosen per Service by the annotation
//! `service.ccm-rs.io/backend-node-selector` (issue 45, beyond Go). The hosts of an annotated
//! Service are the eligible Nodes its selector matches, on ensure, on node sync and through the
//! hosts batch; a Node relabelled in or out of a selector changes that load balancer only; an
//! invalid selector leaves the load balancer as it is, with a Warning Event and the condition.
//!
//! Each test's Nodes carry a label of their own (`LABEL=<run>`), and every selector names it,
//! so other tests' Nodes never match. The test that counts calls for an unannotated Service
//! (which gets every eligible Node, other tests' too) takes the cluster alone
//! (`TestCluster::start_exclusive`).

use std::collections::BTreeSet;

use ccm_testing::TestCluster;
use ccm_testing::builders::{kubelet_node, load_balancer_service};
use ccm_testing::fake_cloud::FakeCloud;
use ccm_testing::wait::wait_for;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::support::service::*;

/// The annotation, as documented (docs/controllers.md).
const ANNOTATION: &str = "service.ccm-rs.io/backend-node-selector";
/// Every Node of a test carries this label with the test's own value.
const LABEL: &str = "backends-test.ccm-rs.io/run";

/// A test's Nodes: created with `LABEL=<run>` and their own labels.
struct Nodes<'c> {
    cluster: &'c TestCluster,
    run: String,
    names: Vec<String>,
}

impl<'c> Nodes<'c> {
    fn new(cluster: &'c TestCluster) -> Self {
        Nodes {
            cluster,
            run: cluster.unique_name("run"),
            names: Vec::new(),
        }
    }

    async fn create(&mut self, prefix: &str, labels: &[(&str, &str)]) -> String {
        let name = self.cluster.unique_name(prefix);
        let mut node = kubelet_node(&name)
            .provider_id(&format!("fake://{name}"))
            .label(LABEL, &self.run);
        for (k, v) in labels {
            node = node.label(k, v);
        }
        self.cluster.create(&node.build()).await;
        self.names.push(name.clone());
        name
    }

    /// The requirement every Node of this test meets.
    fn ours(&self) -> String {
        format!("{LABEL}={}", self.run)
    }

    /// A selector of this test's Nodes that also requires `rest`.
    fn selector(&self, rest: &str) -> String {
        format!("{},{rest}", self.ours())
    }

    /// The hosts of `key`'s load balancer among this test's Nodes.
    fn hosts(&self, fake: &FakeCloud, key: &str) -> BTreeSet<String> {
        fake.load_balancers()
            .get(key)
            .map(|lb| {
                lb.hosts
                    .iter()
                    .filter(|h| self.names.contains(h))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn set(names: &[&String]) -> BTreeSet<String> {
    names.iter().map(|n| (*n).clone()).collect()
}

async fn relabel(cluster: &TestCluster, node: &str, key: &str, value: Option<&str>) {
    nodes(cluster)
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {key: value}}})),
        )
        .await
        .unwrap();
}

async fn annotate(cluster: &TestCluster, ns: &str, name: &str, selector: Option<&str>) {
    services(cluster, ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {ANNOTATION: selector}}})),
        )
        .await
        .unwrap();
}

async fn annotated_service(cluster: &TestCluster, ns: &str, selector: &str) -> Service {
    let name = cluster.unique_name("sel");
    let mut svc = load_balancer_service(ns, &name).build();
    svc.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(ANNOTATION.to_owned(), selector.to_owned());
    let svc = cluster.create(&svc).await;
    wait_for(&services(cluster, ns), &name, TIMEOUT, has_ingress)
        .await
        .unwrap();
    svc
}

async fn plain_service(cluster: &TestCluster, ns: &str) -> Service {
    let name = cluster.unique_name("all");
    let svc = cluster
        .create(&load_balancer_service(ns, &name).build())
        .await;
    wait_for(&services(cluster, ns), &name, TIMEOUT, has_ingress)
        .await
        .unwrap();
    svc
}

/// Ensure passes the selected hosts; relabelling a Node in or out of the selector updates that
/// load balancer through node sync (no ensure) and costs the unannotated one no call; removing
/// the annotation gives back every host.
#[tokio::test]
async fn hosts_follow_the_selector_and_its_nodes_labels() {
    let cluster = TestCluster::start_exclusive().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let mut ours = Nodes::new(&cluster);
    let web = ours.create("web", &[("pool", "web")]).await;
    let db = ours.create("db", &[("pool", "db")]).await;
    let bare = ours.create("bare", &[]).await;
    let (running, probe) = start_probed(&cluster, &ns, &fake, test_config()).await;
    let selected = annotated_service(&cluster, &ns, &ours.selector("pool=web")).await;
    let all = plain_service(&cluster, &ns).await;
    let (sk, ak) = (key(&selected), key(&all));
    assert_eq!(ours.hosts(&fake, &sk), set(&[&web]));
    assert_eq!(ours.hosts(&fake, &ak), set(&[&web, &db, &bare]));
    let ensures = probe.count("ensure_load_balancer", &sk);
    let all_updates = probe.count("update_load_balancer", &ak);

    // Into the selector.
    relabel(&cluster, &db, "pool", Some("web")).await;
    wait_until("the relabelled node joins", || async {
        ours.hosts(&fake, &sk) == set(&[&web, &db])
    })
    .await;
    assert_eq!(probe.count("update_load_balancer", &sk), 1);
    // Out of it.
    relabel(&cluster, &web, "pool", None).await;
    wait_until("the relabelled node leaves", || async {
        ours.hosts(&fake, &sk) == set(&[&db])
    })
    .await;
    assert_eq!(probe.count("update_load_balancer", &sk), 2);
    assert_eq!(probe.count("ensure_load_balancer", &sk), ensures);
    // The unannotated load balancer's hosts did not change: no call for it.
    assert_eq!(probe.count("update_load_balancer", &ak), all_updates);
    assert_eq!(ours.hosts(&fake, &ak), set(&[&web, &db, &bare]));

    // A selector matching no Node: an empty host list, as Go with no eligible Node.
    let name = selected.metadata.name.as_deref().unwrap();
    annotate(&cluster, &ns, name, Some(&ours.selector("pool=none"))).await;
    wait_until("no host", || async {
        fake.load_balancers()
            .get(&sk)
            .is_some_and(|lb| lb.hosts.is_empty())
    })
    .await;
    wait_event(&cluster, &ns, name, "UnAvailableLoadBalancer").await;

    // Without the annotation: every eligible Node again.
    annotate(&cluster, &ns, name, None).await;
    wait_until("every host back", || async {
        ours.hosts(&fake, &sk) == set(&[&web, &db, &bare])
    })
    .await;
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

/// The hosts batch carries load balancers of one selector per call: each gets its own hosts.
#[tokio::test]
async fn the_hosts_batch_gives_each_selector_its_own_hosts() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::builder()
        .load_balancer_hosts_batch(true)
        .max_batch_size(10)
        .build();
    let mut ours = Nodes::new(&cluster);
    let web = ours.create("web", &[("pool", "web")]).await;
    let running = start(&cluster, &ns, fake.provider(), test_config()).await;
    let selected = annotated_service(&cluster, &ns, &ours.selector("pool=web")).await;
    let other = annotated_service(&cluster, &ns, &ours.selector("pool")).await;
    let all = plain_service(&cluster, &ns).await;
    let (sk, ok, ak) = (key(&selected), key(&other), key(&all));
    assert_eq!(ours.hosts(&fake, &sk), set(&[&web]));
    fake.reset_calls();

    // A joining Node outside both selectors: only the unannotated load balancer gets it.
    let bare = ours.create("bare", &[]).await;
    wait_until(
        "the unannotated load balancer gets the new node",
        || async { ours.hosts(&fake, &ak) == set(&[&web, &bare]) },
    )
    .await;
    // A Node labelled into `pool` but not `pool=web`.
    relabel(&cluster, &bare, "pool", Some("db")).await;
    wait_until("the `pool` load balancer gets it", || async {
        ours.hosts(&fake, &ok) == set(&[&web, &bare])
    })
    .await;
    assert_eq!(ours.hosts(&fake, &sk), set(&[&web]));
    assert!(
        fake.call_log()
            .iter()
            .any(|c| c.operation == "update_load_balancer_hosts"),
        "the node sync went through the batch"
    );
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

fn provisioned(service: &Service) -> Option<(String, String)> {
    service
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "LoadBalancerProvisioned")
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// An invalid selector: a Warning Event, the condition False with its own reason, and no call:
/// the load balancer keeps its hosts, through node syncs too. Fixing the annotation recovers.
#[tokio::test]
async fn an_invalid_selector_leaves_the_load_balancer_as_it_is() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let mut ours = Nodes::new(&cluster);
    let web = ours.create("web", &[("pool", "web")]).await;
    let mut config = test_config();
    config.status_conditions = true;
    let (running, probe) = start_probed(&cluster, &ns, &fake, config).await;
    let selected = annotated_service(&cluster, &ns, &ours.selector("pool=web")).await;
    let witness = plain_service(&cluster, &ns).await;
    let (sk, wk) = (key(&selected), key(&witness));
    let name = selected.metadata.name.clone().unwrap();
    assert_eq!(ours.hosts(&fake, &sk), set(&[&web]));

    annotate(&cluster, &ns, &name, Some("pool in ()")).await;
    let note = wait_event(&cluster, &ns, &name, "InvalidBackendNodeSelector").await;
    assert!(note.contains(ANNOTATION), "{note}");
    let failed = wait_for(&services(&cluster, &ns), &name, TIMEOUT, |s| {
        provisioned(s).is_some_and(|(status, _)| status == "False")
    })
    .await
    .unwrap();
    assert_eq!(
        provisioned(&failed).unwrap().1,
        "InvalidBackendNodeSelector"
    );
    assert!(has_ingress(&failed), "the ingress stays");
    let calls = probe.calls_for("ensure_load_balancer", &sk).len()
        + probe.count("update_load_balancer", &sk)
        + probe.count("ensure_load_balancer_deleted", &sk);

    // A Node joins: the witness gets it, the invalid one is left alone.
    let joined = ours.create("joined", &[("pool", "web")]).await;
    wait_until("the witness gets the new node", || async {
        ours.hosts(&fake, &wk) == set(&[&web, &joined])
    })
    .await;
    assert_eq!(ours.hosts(&fake, &sk), set(&[&web]), "never emptied");
    assert_eq!(
        probe.calls_for("ensure_load_balancer", &sk).len()
            + probe.count("update_load_balancer", &sk)
            + probe.count("ensure_load_balancer_deleted", &sk),
        calls,
        "no call for the invalid selector's load balancer"
    );

    // Fixed: ensured with the selected hosts, condition True again.
    annotate(&cluster, &ns, &name, Some(&ours.selector("pool=web"))).await;
    wait_until("the fixed selector's hosts", || async {
        ours.hosts(&fake, &sk) == set(&[&web, &joined])
    })
    .await;
    wait_for(&services(&cluster, &ns), &name, TIMEOUT, |s| {
        provisioned(s).is_some_and(|(status, _)| status == "True")
    })
    .await
    .unwrap();
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

/// A Service of a class not served: its annotation is ignored with it (no Event, no call).
#[tokio::test]
async fn a_foreign_class_annotation_is_ignored() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let (running, probe) = start_probed(&cluster, &ns, &fake, test_config()).await;
    let foreign = cluster.unique_name("foreign");
    cluster
        .create(
            &load_balancer_service(&ns, &foreign)
                .load_balancer_class("other.example/lb")
                .annotation(ANNOTATION, "pool in ()")
                .build(),
        )
        .await;
    // A served Service created after it, ensured: the foreign one had its chance.
    plain_service(&cluster, &ns).await;
    running.settled().await;
    assert!(!has_event(&cluster, &ns, &foreign, "InvalidBackendNodeSelector").await);
    assert!(
        probe
            .calls()
            .iter()
            .all(|c| c.key != format!("{ns}/{foreign}")),
        "no call for a foreign class"
    );
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

/// With `--managed-node-selector`, the selector picks among the Nodes that are ours: a foreign
/// Node matching it is no host until it becomes ours.
#[tokio::test]
async fn the_selector_picks_among_our_nodes_only() {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace().await;
    let fake = FakeCloud::default();
    let mut nodes = Nodes::new(&cluster);
    let web = nodes
        .create("web", &[("fleet", "ours"), ("pool", "web")])
        .await;
    let db = nodes
        .create("db", &[("fleet", "ours"), ("pool", "db")])
        .await;
    let foreign = nodes.create("foreign", &[("pool", "web")]).await;
    let config = test_config();
    let running = ccm_testing::harness::ControllerHarness::builder(&cluster, fake.provider())
        .controller(
            ccm_controllers::controllers::service::NAME,
            move |ctx, _| ccm_controllers::controllers::service::run(ctx, config.clone()),
        )
        .scope(ccm_controllers::InformerScope {
            service_namespace: Some(ns.clone()),
            ..Default::default()
        })
        .flag(&format!(
            "--managed-node-selector={}",
            nodes.selector("fleet=ours")
        ))
        .start()
        .await;
    let selected = annotated_service(&cluster, &ns, &nodes.selector("pool=web")).await;
    let all = plain_service(&cluster, &ns).await;
    assert_eq!(nodes.hosts(&fake, &key(&selected)), set(&[&web]));
    assert_eq!(nodes.hosts(&fake, &key(&all)), set(&[&web, &db]));
    relabel(&cluster, &foreign, "fleet", Some("ours")).await;
    wait_until("the node that became ours joins", || async {
        nodes.hosts(&fake, &key(&selected)) == set(&[&web, &foreign])
    })
    .await;
    running.stop().await.unwrap();
    cluster.cleanup().await;
}

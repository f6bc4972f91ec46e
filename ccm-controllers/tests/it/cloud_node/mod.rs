//! Controller tests of the cloud-node controller: the real controller against the in-process
//! API server (real HTTP, real watches) with FakeCloud, or against the real cluster named by
//! `CCM_TEST_KUBECONFIG`.
//!
//! On a real cluster the controller must not touch anybody else's Nodes, so there the shared
//! informer is restricted to this test's Nodes with a label selector (every Node a test creates
//! carries `ccm-test.example.com/run=<unique>`); on the in-process server the test owns the
//! whole server and uses `ControllerContext::standalone` as is. Steps that need the in-process
//! server's request log or fault injection are skipped on a real cluster.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use ccm_core::{
    CloudProvider, CloudResult, InstanceMetadata, Instances, InstancesV2, NodeView, Zones,
    async_trait,
};
use ccm_testing::builders::kubelet_node;
use ccm_testing::fake_cloud::FakeCloud;

mod addresses;
mod concurrency;
mod failures;
mod initialization;
mod write_pacing;

fn addr(type_: &str, address: &str) -> (String, String) {
    (type_.to_owned(), address.to_owned())
}

/// The addresses FakeCloud reports for a node name.
async fn fake_addresses(fake: &FakeCloud, name: &str) -> Vec<(String, String)> {
    let node = kubelet_node(name).build();
    let meta = fake
        .instances_v2()
        .unwrap()
        .instance_metadata(&ccm_core::NodeView::from_node(&node))
        .await
        .unwrap();
    fake.reset_calls();
    meta.node_addresses
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect()
}

fn fake_internal_ip(addrs: &[(String, String)]) -> String {
    addrs
        .iter()
        .find(|(t, _)| t == "InternalIP")
        .map(|(_, a)| a.clone())
        .unwrap()
}

/// What a [`Probe`] does to FakeCloud's `instance_metadata` answer for a Node.
type Tweak = Box<dyn Fn(&NodeView, &mut InstanceMetadata) + Send + Sync>;

/// A provider wrapping FakeCloud whose `InstancesV2` answers can be edited, which counts how
/// many `instance_metadata` calls run at once, and which can hold a Node's first call.
struct Probe {
    fake: FakeCloud,
    tweak: Tweak,
    hold: Option<Hold>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

/// Holds the first `instance_metadata` call for one Node (by UID) until released.
struct Hold {
    uid: String,
    taken: std::sync::atomic::AtomicBool,
    entered: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

impl Probe {
    fn new(fake: FakeCloud, tweak: fn(&mut InstanceMetadata)) -> Arc<Probe> {
        Probe::build(fake, Box::new(move |_, m| tweak(m)), None)
    }

    /// Holds the first call for the Node with `uid`; `tweak` sees the Node asked about.
    fn holding(
        fake: FakeCloud,
        uid: &str,
        tweak: impl Fn(&NodeView, &mut InstanceMetadata) + Send + Sync + 'static,
    ) -> Arc<Probe> {
        let hold = Hold {
            uid: uid.to_string(),
            taken: std::sync::atomic::AtomicBool::new(false),
            entered: tokio::sync::Notify::new(),
            release: tokio::sync::Notify::new(),
        };
        Probe::build(fake, Box::new(tweak), Some(hold))
    }

    fn build(fake: FakeCloud, tweak: Tweak, hold: Option<Hold>) -> Arc<Probe> {
        Arc::new(Probe {
            fake,
            tweak,
            hold,
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
        })
    }

    fn hold(&self) -> &Hold {
        self.hold
            .as_ref()
            .expect("a probe made with Probe::holding")
    }
}

#[async_trait]
impl CloudProvider for Probe {
    fn provider_name(&self) -> &str {
        "fake"
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }
    fn instances(&self) -> Option<&dyn Instances> {
        None
    }
    fn zones(&self) -> Option<&dyn Zones> {
        None
    }
}

#[async_trait]
impl InstancesV2 for Probe {
    async fn instance_exists(&self, node: &NodeView) -> CloudResult<bool> {
        self.fake
            .instances_v2()
            .unwrap()
            .instance_exists(node)
            .await
    }
    async fn instance_shutdown(&self, node: &NodeView) -> CloudResult<bool> {
        self.fake
            .instances_v2()
            .unwrap()
            .instance_shutdown(node)
            .await
    }
    async fn instance_metadata(&self, node: &NodeView) -> CloudResult<InstanceMetadata> {
        if let Some(hold) = &self.hold
            && node.uid() == Some(hold.uid.as_str())
            && !hold.taken.swap(true, Ordering::SeqCst)
        {
            hold.entered.notify_one();
            hold.release.notified().await;
        }
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let result = self
            .fake
            .instances_v2()
            .unwrap()
            .instance_metadata(node)
            .await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        let mut meta = result?;
        (self.tweak)(node, &mut meta);
        Ok(meta)
    }
}

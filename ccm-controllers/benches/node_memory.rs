//! What one cached Node costs the CCM, and where it goes (issue 25, item 3): the bytes the
//! shared Node informer holds per Node (kubelet-registered and initialised, stripped as the
//! runtime strips it), broken down by part, and the bytes per key of a work queue.
//!
//! Run with `cargo bench -p ccm-controllers --bench node_memory` (add `-- <nodes>`, default
//! 20,000). It prints a table; it asserts nothing (memory is a figure, not a test).
//!
//! Bytes are counted by dhat's allocator (bytes asked of the allocator, live at the moment of
//! the reading). The resident memory a process pays on top of that (the allocator's headers,
//! rounding and free space) is read from `/proc/self/statm` around the informer's fill; it is
//! the figure of this single-threaded run, not of the multi-threaded binary (see the scale
//! bench for that).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::Duration;

use ccm_controllers::{Backoff, Informer, WorkQueue, strip_node};
use ccm_core::Node;
use ccm_testing::builders::kubelet_node;
use k8s_openapi::api::core::v1::{NodeAddress, NodeCondition, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::ObjectMeta;
use kube::runtime::watcher::Event;
use tokio_util::sync::CancellationToken;

#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

/// Bytes live in the heap now.
fn heap() -> usize {
    dhat::HeapStats::get().curr_bytes
}

/// Resident bytes of this process now.
fn resident() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Heap bytes a value keeps alive: a clone of it, measured while it lives.
fn held<T: Clone>(value: &T) -> usize {
    let before = heap();
    let copy = value.clone();
    let after = heap();
    drop(copy);
    after.saturating_sub(before)
}

/// A Node as a kubelet registers it and the CCM initialises it, with the fields the API server
/// sets (uid, resourceVersion, creationTimestamp), as the scale bench's cluster holds it
/// (without the image list, which the informer drops before storing).
fn initialised_node(i: usize) -> Node {
    let name = format!("bench-node-{i:06}");
    let zone = ["zone-a", "zone-b", "zone-c"][i % 3];
    let mut node = kubelet_node(&name)
        .label("ccm-bench/run", "r1234")
        .without_uninitialized_taint()
        .provider_id(&format!("fake:///{zone}/{name}"))
        .label("topology.kubernetes.io/zone", zone)
        .label("failure-domain.beta.kubernetes.io/zone", zone)
        .label("topology.kubernetes.io/region", "region-1")
        .label("failure-domain.beta.kubernetes.io/region", "region-1")
        .label("node.kubernetes.io/instance-type", "fake.large")
        .label("beta.kubernetes.io/instance-type", "fake.large")
        .addresses(vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: format!("10.{}.{}.{}", i / 65536, i / 256 % 256, i % 256),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: name.clone(),
            },
        ])
        .build();
    node.metadata.uid = Some(format!("6f1c2a8e-0000-4000-8000-{i:012}"));
    node.metadata.resource_version = Some(format!("{}", 1_000_000 + i));
    node.metadata.creation_timestamp = Some(Time(jiff::Timestamp::now()));
    let now = Time(jiff::Timestamp::now());
    if let Some(conditions) = node.status.as_mut().and_then(|s| s.conditions.as_mut()) {
        conditions.push(NodeCondition {
            type_: "NetworkUnavailable".into(),
            status: "False".into(),
            reason: Some("RouteCreated".into()),
            message: Some("RouteController created a route".into()),
            last_heartbeat_time: Some(now.clone()),
            last_transition_time: Some(now),
        });
    }
    node
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let nodes: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(20_000);
    // The watcher decodes each Node from its JSON text; decoding here too gives the same
    // capacities (a Vec decoded by serde is not the one a builder makes).
    let texts: Vec<String> = (0..nodes)
        .map(|i| serde_json::to_string(&initialised_node(i)).expect("a Node encodes"))
        .collect();
    let json_per_node = texts.iter().map(String::len).sum::<usize>() / nodes;

    let (heap_before, resident_before) = (heap(), resident());
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let shutdown = CancellationToken::new();
    let (informer, driver) = Informer::from_stream(rx, strip_node, shutdown.clone());
    let task = tokio::spawn(driver);
    tx.unbounded_send(Ok(Event::Init)).unwrap();
    for (i, text) in texts.iter().enumerate() {
        let node: Node = serde_json::from_str(text).expect("a Node decodes");
        tx.unbounded_send(Ok(Event::InitApply(node))).unwrap();
        if i % 64 == 0 {
            // Let the informer store what was sent, as a watch stream delivers it.
            tokio::task::yield_now().await;
        }
    }
    tx.unbounded_send(Ok(Event::InitDone)).unwrap();
    assert!(informer.wait_until_synced().await);
    while informer.list().len() < nodes {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let store_per_node = heap().saturating_sub(heap_before) / nodes;
    let resident_per_node = resident().saturating_sub(resident_before) / nodes;

    let one = informer
        .get(&texts_name(0))
        .expect("the first Node is stored");
    let meta: &ObjectMeta = &one.metadata;
    let spec: &Option<NodeSpec> = &one.spec;
    let status: &Option<NodeStatus> = &one.status;
    let whole = held(&*one) + std::mem::size_of::<Node>();
    let rows: Vec<(&str, usize)> = vec![
        (
            "Node struct itself (inline, every field)",
            std::mem::size_of::<Node>(),
        ),
        ("metadata.labels (12)", held(&meta.labels)),
        ("metadata.annotations (1)", held(&meta.annotations)),
        (
            "metadata: name, uid, resourceVersion",
            held(&meta.name) + held(&meta.uid) + held(&meta.resource_version),
        ),
        ("spec (providerID)", held(spec)),
        (
            "status.conditions (Ready, NetworkUnavailable)",
            held(&status.as_ref().and_then(|s| s.conditions.clone())),
        ),
        (
            "status.addresses (2)",
            held(&status.as_ref().and_then(|s| s.addresses.clone())),
        ),
        (
            "status.nodeInfo (4 strings kept)",
            held(&status.as_ref().and_then(|s| s.node_info.clone())),
        ),
    ];
    println!(
        "Node memory, {nodes} kubelet-registered initialised Nodes, stripped as the runtime does"
    );
    println!("{:<52} {:>8}", "part", "bytes");
    for (part, bytes) in &rows {
        println!("{part:<52} {bytes:>8}");
    }
    println!("{:<52} {:>8}", "one Node, whole (struct + heap)", whole);
    println!(
        "{:<52} {:>8}",
        "informer store per Node (Node + store entry)", store_per_node
    );
    println!(
        "{:<52} {:>8}",
        "  of which store entry and Arc (store - whole)",
        store_per_node.saturating_sub(whole)
    );
    println!(
        "{:<52} {:>8}",
        "resident memory per stored Node (this process)", resident_per_node
    );
    println!(
        "{:<52} {:>8}",
        "JSON text per Node (without images)", json_per_node
    );

    let queue: WorkQueue<String> = WorkQueue::new("bench", Backoff::CONTROLLER, None);
    let before = heap();
    for i in 0..nodes {
        queue.add(texts_name(i));
    }
    println!(
        "{:<52} {:>8}",
        "work queue per waiting key (Node name)",
        heap().saturating_sub(before) / nodes
    );
    queue.shut_down();
    shutdown.cancel();
    let _ = task.await;
}

/// The name of the `i`th Node of [`initialised_node`].
fn texts_name(i: usize) -> String {
    format!("bench-node-{i:06}")
}

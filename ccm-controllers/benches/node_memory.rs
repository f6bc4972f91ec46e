//! What one cached Node costs the CCM, and where it goes (issues 25 and 34): the bytes the
//! shared Node informer holds per Node (kubelet-registered and initialised, stripped as the
//! runtime strips it), in the compact form the runtime keeps (`NodeView`, interned strings)
//! against the k8s-openapi `Node` it kept up to 0.2, and the bytes per key of a work queue.
//!
//! Run with `cargo bench -p ccm-controllers --bench node_memory` (add `-- <nodes>`, default
//! 20,000). It prints a table; it asserts nothing about the figures (memory is a figure, not a
//! test), only that every cached view rebuilds the `Node` the 0.2 store held.
//!
//! Bytes are counted by dhat's allocator (bytes asked of the allocator, live at the moment of
//! the reading). The resident memory a process pays on top of that (the allocator's headers,
//! rounding and free space) comes from child runs of this bench without dhat's profiler (`--
//! <nodes> --resident compact|full`, run by the bench itself: dhat keeps a record of some 65
//! bytes per live block), read from `/proc/self/statm` around the informer's fill, which also
//! time the fill and a run of watch updates (what compacting costs at start-up and per update).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_controllers::{Backoff, Informer, WorkQueue, strip_node};
use ccm_core::{Node, NodeView};
use ccm_testing::builders::kubelet_node;
use k8s_openapi::api::core::v1::{NodeAddress, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::watcher::Event;
use tokio_util::sync::CancellationToken;

#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

/// Bytes live in the heap now.
fn heap() -> usize {
    dhat::HeapStats::get().curr_bytes
}

/// Heap blocks (allocations) live now.
fn blocks() -> usize {
    dhat::HeapStats::get().curr_blocks
}

/// Resident bytes of this process now.
fn resident() -> usize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).map(str::to_owned))
        .and_then(|p| p.parse::<usize>().ok())
        .unwrap_or(0)
        * 4096
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

/// Sends the Nodes of `texts` to an informer as one list, decoded one by one as the watcher
/// decodes them, and waits until it holds them all.
async fn send_list<T: ccm_controllers::CachedObject>(
    tx: &futures::channel::mpsc::UnboundedSender<
        Result<Event<Node>, kube::runtime::watcher::Error>,
    >,
    informer: &Informer<Node, T>,
    texts: &[String],
) {
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
    while informer.len() < texts.len() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Sends `updates` watch updates (a heartbeat: a new resourceVersion and `Ready` heartbeat
/// time, as kubelet's status writes) round the Nodes of `texts`, and waits until the informer
/// applied them all.
async fn send_updates<T: ccm_controllers::CachedObject>(
    tx: &futures::channel::mpsc::UnboundedSender<
        Result<Event<Node>, kube::runtime::watcher::Error>,
    >,
    informer: &Informer<Node, T>,
    texts: &[String],
    updates: usize,
) {
    let target = informer.generation() + updates as u64;
    for u in 0..updates {
        let mut node: Node = serde_json::from_str(&texts[u % texts.len()]).expect("a Node decodes");
        node.metadata.resource_version = Some(format!("{}", 2_000_000 + u));
        if let Some(ready) = node
            .status
            .as_mut()
            .and_then(|s| s.conditions.as_mut())
            .and_then(|c| c.iter_mut().find(|c| c.type_ == "Ready"))
        {
            ready.last_heartbeat_time = Some(Time(jiff::Timestamp::now()));
        }
        tx.unbounded_send(Ok(Event::Apply(node))).unwrap();
        if u % 64 == 0 {
            tokio::task::yield_now().await;
        }
    }
    while informer.generation() < target {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

type Sender =
    futures::channel::mpsc::UnboundedSender<Result<Event<Node>, kube::runtime::watcher::Error>>;

/// The runtime's Node informer (compact views) or the 0.2 one (`Arc<Node>`), empty, with its
/// sender, driver task and shutdown token.
fn informer<T: ccm_controllers::CachedObject>(
    make: impl FnOnce(
        futures::channel::mpsc::UnboundedReceiver<
            Result<Event<Node>, kube::runtime::watcher::Error>,
        >,
        CancellationToken,
    ) -> (
        Informer<Node, T>,
        std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    ),
) -> (
    Informer<Node, T>,
    Sender,
    tokio::task::JoinHandle<()>,
    CancellationToken,
) {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let shutdown = CancellationToken::new();
    let (informer, driver) = make(rx, shutdown.clone());
    (informer, tx, tokio::spawn(driver), shutdown)
}

fn compact_informer() -> (
    Informer<Node, NodeView>,
    Sender,
    tokio::task::JoinHandle<()>,
    CancellationToken,
) {
    informer(|rx, shutdown| {
        let (i, d) = Informer::nodes_from_stream(rx, strip_node, shutdown);
        (i, Box::pin(d))
    })
}

fn full_informer() -> (
    Informer<Node>,
    Sender,
    tokio::task::JoinHandle<()>,
    CancellationToken,
) {
    informer(|rx, shutdown| {
        let (i, d) = Informer::from_stream(rx, strip_node, shutdown);
        (i, Box::pin(d))
    })
}

/// The JSON text of `nodes` initialised Nodes. The watcher decodes each Node from its JSON
/// text; decoding here too gives the same capacities (a Vec decoded by serde is not the one a
/// builder makes).
fn node_texts(nodes: usize) -> Vec<String> {
    (0..nodes)
        .map(|i| serde_json::to_string(&initialised_node(i)).expect("a Node encodes"))
        .collect()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let nodes: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(20_000);
    if let Some(i) = args.iter().position(|a| a == "--resident") {
        // A child run without dhat's profiler (its allocator then only forwards to glibc's,
        // keeping no record per block): resident memory and time as a process pays them.
        resident_child(nodes, args.get(i + 1).map_or("", String::as_str)).await;
        return;
    }
    let _profiler = dhat::Profiler::builder().testing().build();
    let texts = node_texts(nodes);
    let json_per_node = texts.iter().map(String::len).sum::<usize>() / nodes;

    // The 0.2 store (k8s-openapi `Node`s), filled first: what the views must give back.
    let (heap_before, blocks_before) = (heap(), blocks());
    let (full, full_tx, full_task, full_shutdown) = full_informer();
    send_list(&full_tx, &full, &texts).await;
    let full_per_node = heap().saturating_sub(heap_before) / nodes;
    let full_blocks = blocks().saturating_sub(blocks_before) as f64 / nodes as f64;

    // The runtime's store: compact views with interned strings.
    let (heap_before, blocks_before) = (heap(), blocks());
    let (compact, tx, task, shutdown) = compact_informer();
    send_list(&tx, &compact, &texts).await;
    let compact_per_node = heap().saturating_sub(heap_before) / nodes;
    let compact_blocks = blocks().saturating_sub(blocks_before) as f64 / nodes as f64;

    // Nothing the controllers and providers see is lost: every view rebuilds the Node the
    // 0.2 store holds.
    for view in compact.list() {
        let cached = full.get(view.name()).expect("both stores hold the Node");
        assert!(view.to_node() == *cached, "{} rebuilt differs", view.name());
    }

    // What rebuilding full Nodes costs (`NodeView::to_node`), per Node.
    let stats = dhat::HeapStats::get();
    let (total_before, total_blocks_before, live_before) =
        (stats.total_bytes, stats.total_blocks, stats.curr_bytes);
    let rebuilt: Vec<Arc<Node>> = compact
        .list()
        .iter()
        .map(|v| Arc::new(v.to_node()))
        .collect();
    let stats = dhat::HeapStats::get();
    let rebuilt_live = stats.curr_bytes.saturating_sub(live_before) / nodes;
    let rebuilt_total = (stats.total_bytes - total_before) as usize / nodes;
    let rebuilt_blocks = (stats.total_blocks - total_blocks_before) as f64 / nodes as f64;
    drop(rebuilt);

    let queue: WorkQueue<String> = WorkQueue::new("bench", Backoff::CONTROLLER, None);
    let before = heap();
    for i in 0..nodes {
        queue.add(texts_name(i));
    }
    let queue_per_key = heap().saturating_sub(before) / nodes;
    queue.shut_down();

    full_shutdown.cancel();
    let _ = full_task.await;
    shutdown.cancel();
    let _ = task.await;

    let full_child = child_figures(nodes, "full");
    let compact_child = child_figures(nodes, "compact");
    let figure =
        |figures: &HashMap<String, f64>, key: &str| figures.get(key).copied().unwrap_or(0.0);

    println!(
        "Node memory, {nodes} kubelet-registered initialised Nodes, stripped as the runtime does"
    );
    println!("(compact: the runtime's store since 0.3; Node: the 0.2 store, for comparison; every");
    println!("view's to_node() asserted equal to the 0.2 store's Node)");
    println!("{:<58} {:>10} {:>10}", "", "Node", "compact");
    let row = |what: &str, full: String, compact: String| {
        println!("{what:<58} {full:>10} {compact:>10}");
    };
    row(
        "struct itself (inline)",
        std::mem::size_of::<Node>().to_string(),
        std::mem::size_of::<NodeView>().to_string(),
    );
    row(
        "store per Node, heap bytes (interner included)",
        full_per_node.to_string(),
        compact_per_node.to_string(),
    );
    row(
        "allocations per stored Node",
        format!("{full_blocks:.1}"),
        format!("{compact_blocks:.1}"),
    );
    row(
        "resident per stored Node, glibc alone (child run)",
        format!("{:.0}", figure(&full_child, "resident_per_node")),
        format!("{:.0}", figure(&compact_child, "resident_per_node")),
    );
    row(
        "start-up: µs per Node listed (decode, strip, store)",
        format!("{:.2}", figure(&full_child, "list_us")),
        format!("{:.2}", figure(&compact_child, "list_us")),
    );
    row(
        "watch update: µs per update (decode, strip, store)",
        format!("{:.2}", figure(&full_child, "update_us")),
        format!("{:.2}", figure(&compact_child, "update_us")),
    );
    row(
        "list(): ns per Node (a host list's clones)",
        format!("{:.1}", figure(&full_child, "list_ns")),
        format!("{:.1}", figure(&compact_child, "list_ns")),
    );
    println!(
        "{:<58} {:>10}",
        "JSON text per Node (without images)", json_per_node
    );
    println!(
        "{:<58} {:>10}",
        "work queue per waiting key (Node name)", queue_per_key
    );
    println!();
    println!("NodeView::to_node(), per Node (a provider asking for a full Node)");
    println!("{:<58} {:>10}", "bytes allocated", rebuilt_total);
    println!(
        "{:<58} {:>10}",
        "  of which live while the Node lives", rebuilt_live
    );
    println!("{:<58} {:>10.1}", "allocations", rebuilt_blocks);
    println!(
        "{:<58} {:>10.0}",
        "ns per Node, rebuild (child run, best of 5)",
        figure(&compact_child, "rebuild_ns")
    );
}

/// Runs this bench again as a child with `--resident <what>` and reads its `key=value` lines.
fn child_figures(nodes: usize, what: &str) -> HashMap<String, f64> {
    let exe = std::env::current_exe().expect("the bench's own path");
    let output = std::process::Command::new(exe)
        .args([nodes.to_string().as_str(), "--resident", what])
        .output()
        .expect("the child runs");
    assert!(output.status.success(), "the {what} child failed");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .filter_map(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?)))
        .collect()
}

/// The child run: fills the compact (`compact`) or the 0.2 (`full`) store without dhat's
/// profiler, prints the resident bytes per Node and the time per listed Node, then times
/// watch updates, `list()` and (compact) `to_node()`.
async fn resident_child(nodes: usize, what: &str) {
    let texts = node_texts(nodes);
    if what == "compact" {
        let (informer, tx, task, shutdown) = compact_informer();
        measure(&informer, &tx, &texts).await;
        let mut rebuild = f64::MAX;
        let views = informer.list();
        for _ in 0..5 {
            let started = Instant::now();
            let hosts: Vec<Node> =
                std::hint::black_box(views.iter().map(NodeView::to_node).collect());
            rebuild = rebuild.min(started.elapsed().as_nanos() as f64 / nodes as f64);
            drop(hosts);
        }
        println!("rebuild_ns={rebuild}");
        shutdown.cancel();
        let _ = task.await;
    } else {
        let (informer, tx, task, shutdown) = full_informer();
        measure(&informer, &tx, &texts).await;
        shutdown.cancel();
        let _ = task.await;
    }
}

/// The child's figures for one store: resident bytes and µs per listed Node, µs per watch
/// update, ns per Node of `list()`.
async fn measure<T: ccm_controllers::CachedObject>(
    informer: &Informer<Node, T>,
    tx: &Sender,
    texts: &[String],
) {
    let nodes = texts.len();
    let before = resident();
    let started = Instant::now();
    send_list(tx, informer, texts).await;
    let list_us = started.elapsed().as_secs_f64() * 1e6 / nodes as f64;
    println!(
        "resident_per_node={}",
        resident().saturating_sub(before) / nodes
    );
    println!("list_us={list_us}");
    let updates = nodes.max(1);
    let started = Instant::now();
    send_updates(tx, informer, texts, updates).await;
    println!(
        "update_us={}",
        started.elapsed().as_secs_f64() * 1e6 / updates as f64
    );
    let mut list_ns = f64::MAX;
    for _ in 0..5 {
        let started = Instant::now();
        let hosts = std::hint::black_box(informer.list());
        list_ns = list_ns.min(started.elapsed().as_nanos() as f64 / nodes as f64);
        drop(hosts);
    }
    println!("list_ns={list_ns}");
}

/// The name of the `i`th Node of [`initialised_node`].
fn texts_name(i: usize) -> String {
    format!("bench-node-{i:06}")
}

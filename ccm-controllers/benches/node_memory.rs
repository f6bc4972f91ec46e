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
//! bench for that). In this process it includes dhat's own record of each live block (some 65
//! bytes a block); a child run of the bench without dhat's profiler (`-- <nodes> --resident
//! informer|compact`, run by the bench itself) gives the figure with glibc's malloc alone.
//!
//! It then holds the same Nodes in a prototype compact form (`CompactNode`, below: interned
//! label and annotation strings, only the fields the runtime keeps), asserts that every
//! compact Node rebuilds a `Node` equal to the informer's, counts it the same way, and
//! measures what rebuilding a full host list (`Vec<Arc<Node>>`) from it would cost.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_controllers::{Backoff, Informer, WorkQueue, strip_node};
use ccm_core::Node;
use ccm_testing::builders::kubelet_node;
use k8s_openapi::api::core::v1::{
    NodeAddress, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo, Taint,
};
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

/// Heap blocks (allocations) live now.
fn blocks() -> usize {
    dhat::HeapStats::get().curr_blocks
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

/// The shared informer filled with the Nodes of `texts`, decoded one by one as the watcher
/// decodes them; its driver task and shutdown token.
async fn fill_informer(
    texts: &[String],
) -> (
    Informer<Node>,
    tokio::task::JoinHandle<()>,
    CancellationToken,
) {
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
    while informer.list().len() < texts.len() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (informer, task, shutdown)
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

    let (heap_before, blocks_before, resident_before) = (heap(), blocks(), resident());
    let (informer, task, shutdown) = fill_informer(&texts).await;
    let store_per_node = heap().saturating_sub(heap_before) / nodes;
    let store_blocks_per_node = blocks().saturating_sub(blocks_before) as f64 / nodes as f64;
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
        "{:<52} {:>8.1}",
        "allocations per stored Node", store_blocks_per_node
    );
    println!(
        "{:<52} {:>8}",
        "  of which store entry and Arc (store - whole)",
        store_per_node.saturating_sub(whole)
    );
    println!(
        "{:<52} {:>8}",
        "resident per stored Node (this process, with dhat)", resident_per_node
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

    let full = (store_per_node, store_blocks_per_node, resident_per_node);
    compact(&texts, &informer, full);
    shutdown.cancel();
    let _ = task.await;
}

/// The compact store of the same Nodes against the informer's: checked equal Node by Node,
/// counted, and the cost of rebuilding a host list of full Nodes from it.
///
/// `full` is the informer's figures: heap bytes, allocations and resident bytes per Node.
fn compact(texts: &[String], informer: &Informer<Node>, full: (usize, f64, usize)) {
    let (store_per_node, store_blocks_per_node, resident) = full;
    let nodes = texts.len();
    let (heap_before, blocks_before) = (heap(), blocks());
    let mut store = CompactStore::fill(texts);
    let compact_per_node = heap().saturating_sub(heap_before) / nodes;
    let compact_blocks = blocks().saturating_sub(blocks_before) as f64 / nodes as f64;

    // Nothing the controllers and providers see is lost: every rebuilt Node equals the
    // informer's.
    assert_eq!(store.nodes.len(), nodes);
    for (name, compact) in &store.nodes {
        let cached = informer.get(name).expect("the informer holds the Node");
        assert!(compact.to_node() == *cached, "{name} rebuilt differs");
    }

    let before = heap();
    let interner = std::mem::take(&mut store.interner);
    let interned = interner.0.len();
    drop(interner);
    let interner_table = before.saturating_sub(heap());

    let stats = dhat::HeapStats::get();
    let (total_before, total_blocks_before, live_before) =
        (stats.total_bytes, stats.total_blocks, stats.curr_bytes);
    let hosts = store.host_list();
    let stats = dhat::HeapStats::get();
    let rebuilt_live = stats.curr_bytes.saturating_sub(live_before) / nodes;
    let rebuilt_total = (stats.total_bytes - total_before) as usize / nodes;
    let rebuilt_blocks = (stats.total_blocks - total_blocks_before) as f64 / nodes as f64;
    assert_eq!(hosts.len(), nodes);
    drop(hosts);

    let child = child_figures(nodes, "compact");
    let informer_child = child_figures(nodes, "informer");
    let figure =
        |figures: &HashMap<String, f64>, key: &str| figures.get(key).copied().unwrap_or(0.0);

    println!();
    println!("A compact cached Node (prototype, this bench): the same {nodes} Nodes, each rebuilt");
    println!("by to_node() equal to the informer's (asserted for every Node)");
    println!("{:<52} {:>10} {:>10}", "", "Node", "compact");
    let row = |what: &str, full: String, compact: String| {
        println!("{what:<52} {full:>10} {compact:>10}");
    };
    row(
        "struct itself (inline)",
        std::mem::size_of::<Node>().to_string(),
        std::mem::size_of::<CompactNode>().to_string(),
    );
    row(
        "store per Node (heap bytes, interner included)",
        store_per_node.to_string(),
        compact_per_node.to_string(),
    );
    row(
        "  interner's table, bytes for all Nodes together",
        "-".into(),
        interner_table.to_string(),
    );
    row(
        "allocations per stored Node",
        format!("{store_blocks_per_node:.1}"),
        format!("{compact_blocks:.1}"),
    );
    row(
        "resident per stored Node, dhat profiling (above)",
        resident.to_string(),
        "-".into(),
    );
    row(
        "resident per stored Node, glibc alone (child run)",
        format!("{:.0}", figure(&informer_child, "resident_per_node")),
        format!("{:.0}", figure(&child, "resident_per_node")),
    );
    println!("{:<52} {:>10}", "strings in the interner", interned);
    println!();
    println!("Rebuilding a host list: to_node() of every Node into a Vec<Arc<Node>>");
    println!("{:<52} {:>10}", "bytes allocated per Node", rebuilt_total);
    println!(
        "{:<52} {:>10}",
        "  of which live while the list lives", rebuilt_live
    );
    println!("{:<52} {:>10.1}", "allocations per Node", rebuilt_blocks);
    println!(
        "{:<52} {:>10.0}",
        "ns per Node, rebuild (child run, best of 5)",
        figure(&child, "rebuild_ns")
    );
    println!(
        "{:<52} {:>10.0}",
        "ns per Node, dropping the list (child run, best of 5)",
        figure(&child, "drop_ns")
    );
    println!(
        "{:<52} {:>10.1}",
        "ns per Node, today's list() of shared Arcs (best of 5)",
        figure(&informer_child, "list_ns")
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

/// The child run: fills the informer or the compact store without dhat's profiler and prints
/// the resident bytes per Node, and the time of a host list.
async fn resident_child(nodes: usize, what: &str) {
    let texts = node_texts(nodes);
    let before = resident();
    if what == "compact" {
        let store = CompactStore::fill(&texts);
        println!(
            "resident_per_node={}",
            resident().saturating_sub(before) / nodes
        );
        let mut rebuild = f64::MAX;
        let mut dropping = f64::MAX;
        for _ in 0..5 {
            let started = Instant::now();
            let hosts = std::hint::black_box(store.host_list());
            rebuild = rebuild.min(started.elapsed().as_nanos() as f64 / nodes as f64);
            let started = Instant::now();
            drop(hosts);
            dropping = dropping.min(started.elapsed().as_nanos() as f64 / nodes as f64);
        }
        println!("rebuild_ns={rebuild}");
        println!("drop_ns={dropping}");
    } else {
        let (informer, task, shutdown) = fill_informer(&texts).await;
        println!(
            "resident_per_node={}",
            resident().saturating_sub(before) / nodes
        );
        let mut list_ns = f64::MAX;
        for _ in 0..5 {
            let started = Instant::now();
            let hosts = std::hint::black_box(informer.list());
            list_ns = list_ns.min(started.elapsed().as_nanos() as f64 / nodes as f64);
            drop(hosts);
        }
        println!("list_ns={list_ns}");
        shutdown.cancel();
        let _ = task.await;
    }
}

/// The name of the `i`th Node of [`initialised_node`].
fn texts_name(i: usize) -> String {
    format!("bench-node-{i:06}")
}

// ---------------------------------------------------------------------------------------------
// A compact cached Node (a prototype, this bench only): what the informer store would hold if
// it kept its own form instead of k8s-openapi's `Node`. Label and annotation keys and values,
// condition types, statuses and reasons, address and taint words are `Arc<str>` interned by
// one interner shared by every Node; a value equal to the Node's name (the hostname label, the
// Hostname address) shares the name's `Arc`; the values unique to a Node are `Box<str>`.
// `to_node()` rebuilds the `Node`; the bench asserts it equals the stripped Node it was made
// from, for every Node.

/// The shared strings of every compact Node.
#[derive(Default)]
struct Interner(HashSet<Arc<str>>);

impl Interner {
    fn get(&mut self, s: &str) -> Arc<str> {
        if let Some(shared) = self.0.get(s) {
            return shared.clone();
        }
        let shared: Arc<str> = Arc::from(s);
        self.0.insert(shared.clone());
        shared
    }

    /// `s`, sharing the Node's name when equal to it (the hostname label, the Hostname
    /// address), interned otherwise.
    fn get_or_name(&mut self, s: &str, name: &Option<Arc<str>>) -> Arc<str> {
        match name {
            Some(n) if &**n == s => n.clone(),
            _ => self.get(s),
        }
    }
}

/// Labels or annotations (key, value), or addresses (type, address).
type Pairs = Option<Box<[(Arc<str>, Arc<str>)]>>;

struct CompactTaint {
    key: Arc<str>,
    value: Option<Arc<str>>,
    effect: Arc<str>,
    time_added: Option<Time>,
}

struct CompactCondition {
    type_: Arc<str>,
    status: Arc<str>,
    reason: Option<Arc<str>>,
    message: Option<Box<str>>,
    last_heartbeat_time: Option<Time>,
    last_transition_time: Option<Time>,
}

/// The four `nodeInfo` strings the runtime keeps (the others are emptied by `strip_node`).
struct CompactNodeInfo {
    architecture: Arc<str>,
    operating_system: Arc<str>,
    machine_id: Box<str>,
    system_uuid: Box<str>,
}

/// What the controllers and providers read of a cached Node. `spec`/`status` record whether
/// the Node had them (`Some` with every field unset is not `None`).
struct CompactNode {
    name: Option<Arc<str>>,
    uid: Option<Box<str>>,
    resource_version: Option<Box<str>>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    labels: Pairs,
    annotations: Pairs,
    spec: bool,
    provider_id: Option<Box<str>>,
    pod_cidr: Option<Box<str>>,
    pod_cidrs: Option<Box<[Box<str>]>>,
    taints: Option<Box<[CompactTaint]>>,
    unschedulable: Option<bool>,
    status: bool,
    addresses: Pairs,
    conditions: Option<Box<[CompactCondition]>>,
    node_info: Option<CompactNodeInfo>,
}

fn boxed(s: &Option<String>) -> Option<Box<str>> {
    s.as_deref().map(Box::from)
}

fn unboxed(s: &Option<Box<str>>) -> Option<String> {
    s.as_deref().map(String::from)
}

impl CompactNode {
    /// The compact form of a stripped Node. Fields outside it (finalizers, owner references,
    /// externalID, configSource, phase, swap, what `strip_node` drops) are not carried: the
    /// bench's equality check fails if a Node has them.
    fn new(node: &Node, interner: &mut Interner) -> Self {
        let meta = &node.metadata;
        let name: Option<Arc<str>> = meta.name.as_deref().map(Arc::from);
        let mut pairs = |map: &Option<BTreeMap<String, String>>| -> Pairs {
            map.as_ref().map(|m| {
                m.iter()
                    .map(|(k, v)| (interner.get(k), interner.get_or_name(v, &name)))
                    .collect()
            })
        };
        let labels = pairs(&meta.labels);
        let annotations = pairs(&meta.annotations);
        let spec = node.spec.as_ref();
        let status = node.status.as_ref();
        let taints = spec.and_then(|s| s.taints.as_ref()).map(|taints| {
            taints
                .iter()
                .map(|t| CompactTaint {
                    key: interner.get(&t.key),
                    value: t.value.as_deref().map(|v| interner.get(v)),
                    effect: interner.get(&t.effect),
                    time_added: t.time_added.clone(),
                })
                .collect()
        });
        let addresses = status.and_then(|s| s.addresses.as_ref()).map(|addresses| {
            addresses
                .iter()
                .map(|a| {
                    let address = match &name {
                        Some(n) if **n == *a.address => n.clone(),
                        _ => Arc::from(a.address.as_str()),
                    };
                    (interner.get(&a.type_), address)
                })
                .collect()
        });
        let conditions = status
            .and_then(|s| s.conditions.as_ref())
            .map(|conditions| {
                conditions
                    .iter()
                    .map(|c| CompactCondition {
                        type_: interner.get(&c.type_),
                        status: interner.get(&c.status),
                        reason: c.reason.as_deref().map(|r| interner.get(r)),
                        message: boxed(&c.message),
                        last_heartbeat_time: c.last_heartbeat_time.clone(),
                        last_transition_time: c.last_transition_time.clone(),
                    })
                    .collect()
            });
        let node_info = status
            .and_then(|s| s.node_info.as_ref())
            .map(|i| CompactNodeInfo {
                architecture: interner.get(&i.architecture),
                operating_system: interner.get(&i.operating_system),
                machine_id: Box::from(i.machine_id.as_str()),
                system_uuid: Box::from(i.system_uuid.as_str()),
            });
        CompactNode {
            uid: boxed(&meta.uid),
            resource_version: boxed(&meta.resource_version),
            creation_timestamp: meta.creation_timestamp.clone(),
            deletion_timestamp: meta.deletion_timestamp.clone(),
            labels,
            annotations,
            spec: spec.is_some(),
            provider_id: spec.and_then(|s| boxed(&s.provider_id)),
            pod_cidr: spec.and_then(|s| boxed(&s.pod_cidr)),
            pod_cidrs: spec
                .and_then(|s| s.pod_cidrs.as_ref())
                .map(|c| c.iter().map(|c| Box::from(c.as_str())).collect()),
            taints,
            unschedulable: spec.and_then(|s| s.unschedulable),
            status: status.is_some(),
            addresses,
            conditions,
            node_info,
            name,
        }
    }

    /// The full `Node` again, as a provider call takes it.
    fn to_node(&self) -> Node {
        let map = |pairs: &Pairs| {
            pairs.as_ref().map(|p| {
                p.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>()
            })
        };
        Node {
            metadata: ObjectMeta {
                name: self.name.as_deref().map(String::from),
                uid: unboxed(&self.uid),
                resource_version: unboxed(&self.resource_version),
                creation_timestamp: self.creation_timestamp.clone(),
                deletion_timestamp: self.deletion_timestamp.clone(),
                labels: map(&self.labels),
                annotations: map(&self.annotations),
                ..ObjectMeta::default()
            },
            spec: self.spec.then(|| NodeSpec {
                provider_id: unboxed(&self.provider_id),
                pod_cidr: unboxed(&self.pod_cidr),
                pod_cidrs: self
                    .pod_cidrs
                    .as_ref()
                    .map(|c| c.iter().map(|c| String::from(&**c)).collect()),
                taints: self.taints.as_ref().map(|taints| {
                    taints
                        .iter()
                        .map(|t| Taint {
                            key: t.key.to_string(),
                            value: t.value.as_deref().map(String::from),
                            effect: t.effect.to_string(),
                            time_added: t.time_added.clone(),
                        })
                        .collect()
                }),
                unschedulable: self.unschedulable,
                ..NodeSpec::default()
            }),
            status: self.status.then(|| NodeStatus {
                addresses: self.addresses.as_ref().map(|addresses| {
                    addresses
                        .iter()
                        .map(|(type_, address)| NodeAddress {
                            type_: type_.to_string(),
                            address: address.to_string(),
                        })
                        .collect()
                }),
                conditions: self.conditions.as_ref().map(|conditions| {
                    conditions
                        .iter()
                        .map(|c| NodeCondition {
                            type_: c.type_.to_string(),
                            status: c.status.to_string(),
                            reason: c.reason.as_deref().map(String::from),
                            message: unboxed(&c.message),
                            last_heartbeat_time: c.last_heartbeat_time.clone(),
                            last_transition_time: c.last_transition_time.clone(),
                        })
                        .collect()
                }),
                node_info: self.node_info.as_ref().map(|i| NodeSystemInfo {
                    architecture: i.architecture.to_string(),
                    operating_system: i.operating_system.to_string(),
                    machine_id: i.machine_id.to_string(),
                    system_uuid: i.system_uuid.to_string(),
                    ..NodeSystemInfo::default()
                }),
                ..NodeStatus::default()
            }),
        }
    }
}

/// A compact store: the compact Nodes by name (the key shares the Node's name), and the
/// interner of their strings.
struct CompactStore {
    nodes: HashMap<Arc<str>, Arc<CompactNode>>,
    interner: Interner,
}

impl CompactStore {
    /// Decodes, strips and compacts each Node as a compact informer would.
    fn fill(texts: &[String]) -> Self {
        let mut store = CompactStore {
            nodes: HashMap::new(),
            interner: Interner::default(),
        };
        for text in texts {
            let mut node: Node = serde_json::from_str(text).expect("a Node decodes");
            strip_node(&mut node);
            let compact = CompactNode::new(&node, &mut store.interner);
            let key = compact.name.clone().expect("a named Node");
            store.nodes.insert(key, Arc::new(compact));
        }
        store
    }

    /// Every Node rebuilt, as a provider's host list would be.
    fn host_list(&self) -> Vec<Arc<Node>> {
        self.nodes.values().map(|c| Arc::new(c.to_node())).collect()
    }
}

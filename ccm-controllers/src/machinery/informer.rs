//! Shared informers: one watch per resource kind per process, an in-memory store, and a
//! broadcast of changes with both the old and the new object.
//!
//! Why not kube's `reflect_shared`/`subscribe`: its subscribers receive only the new object,
//! while the Go controllers' update handlers compare old and new (the service controller reacts
//! to a Node only when its load-balancer eligibility or providerID flipped; the route controller
//! only when `spec.podCIDRs` or `status.addresses` changed). Its subscribers also apply
//! back-pressure to the watch, so a slow controller stalls every other one. Here the store is
//! kube's `reflector::Store`, and changes go out on a bounded `tokio::sync::broadcast`; a
//! subscriber that falls behind gets [`Change::Resync`] and rebuilds from the store instead of
//! blocking anyone.
//!
//! After every (re)list, the informer diffs the new list against what it held and emits the
//! resulting `Applied`/`Deleted` changes, so objects deleted while the watch was down are still
//! reported (client-go's `DeletedFinalStateUnknown`).
//!
//! A controller starts with [`Informer::subscribe`]: it waits for the first list, then hands out
//! the store's objects at one instant (as `Applied { old: None }`) followed by every change
//! after that instant, so each object present at start is delivered exactly once. The store
//! update and the broadcast of a change happen under one lock, and the snapshot and the
//! subscription are taken under it too: nothing falls between them, and nothing arrives twice
//! (reading the store and separately subscribing would deliver every object of the initial
//! list twice whenever the subscription was taken before the informer broadcast that list).

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::{Stream, StreamExt};
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// Default capacity of an informer's change broadcast. A subscriber more than this many changes
/// behind receives [`Change::Resync`].
pub(crate) const DEFAULT_BROADCAST_CAPACITY: usize = 4096;

/// One change seen by an informer.
#[derive(Debug)]
pub enum Change<K> {
    /// An object was added (`old` is `None`) or modified.
    Applied {
        /// The object before the change, when the informer had it.
        old: Option<Arc<K>>,
        /// The object after the change.
        new: Arc<K>,
    },
    /// An object was deleted (its last known state).
    Deleted(Arc<K>),
    /// The subscriber missed changes (it fell behind); treat every object in the store as
    /// changed.
    Resync,
}

impl<K> Clone for Change<K> {
    fn clone(&self) -> Self {
        match self {
            Change::Applied { old, new } => Change::Applied {
                old: old.clone(),
                new: new.clone(),
            },
            Change::Deleted(o) => Change::Deleted(o.clone()),
            Change::Resync => Change::Resync,
        }
    }
}

/// A shared informer handle: a read-only store plus a way to subscribe to changes. Cheap to
/// clone; every clone sees the same store.
pub struct Informer<K>
where
    K: Resource + 'static,
    K::DynamicType: Hash + Eq + Clone,
{
    store: Store<K>,
    changes: broadcast::Sender<Change<K>>,
    generation: Arc<AtomicU64>,
    /// Held while a change is applied to the store and broadcast, and while a subscriber takes
    /// its snapshot and subscribes: a subscriber sees each change either in its snapshot or on
    /// its subscription, never both, never neither.
    publish: Arc<Mutex<()>>,
    /// Initial objects handed to subscriptions and not yet received (see
    /// [`Informer::undelivered`]).
    initial_pending: Arc<AtomicUsize>,
}

fn lock(publish: &Mutex<()>) -> MutexGuard<'_, ()> {
    // Guards no data; a panic while it was held leaves nothing inconsistent behind it.
    publish.lock().unwrap_or_else(|e| e.into_inner())
}

impl<K> Clone for Informer<K>
where
    K: Resource + 'static,
    K::DynamicType: Hash + Eq + Clone,
{
    fn clone(&self) -> Self {
        Informer {
            store: self.store.clone(),
            changes: self.changes.clone(),
            generation: self.generation.clone(),
            publish: self.publish.clone(),
            initial_pending: self.initial_pending.clone(),
        }
    }
}

/// A subscription to an informer's objects and changes (see [`Informer::subscribe`]): first
/// every object the store held when it was taken, as `Applied { old: None }`, then every change
/// after that.
pub struct Subscription<K> {
    initial: std::vec::IntoIter<Arc<K>>,
    rx: broadcast::Receiver<Change<K>>,
    /// The informer's count of initial objects not yet received, less ours as we take them.
    initial_pending: Arc<AtomicUsize>,
}

impl<K> Subscription<K> {
    /// Takes the rest of the initial objects off the informer's pending count.
    fn forget_initial(&mut self) {
        let rest = self.initial.len();
        self.initial = Vec::new().into_iter();
        self.initial_pending.fetch_sub(rest, Ordering::SeqCst);
    }
}

impl<K> Drop for Subscription<K> {
    fn drop(&mut self) {
        self.forget_initial();
    }
}

impl<K: Clone> Subscription<K> {
    /// The next change; `None` once the informer has stopped. The objects of the initial
    /// state come first, each once. A subscriber that fell behind receives
    /// [`Change::Resync`] once, then the changes after the gap.
    pub async fn recv(&mut self) -> Option<Change<K>> {
        if let Some(new) = self.initial.next() {
            self.initial_pending.fetch_sub(1, Ordering::SeqCst);
            return Some(Change::Applied { old: None, new });
        }
        match self.rx.recv().await {
            Ok(change) => Some(change),
            Err(broadcast::error::RecvError::Lagged(_)) => Some(Change::Resync),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }

    /// Drops the objects of the initial state not yet received, for a controller whose own
    /// start-up pass already covers the whole store (the route controller reconciles at once
    /// on start); [`Subscription::recv`] then returns only changes.
    pub fn skip_initial(&mut self) {
        self.forget_initial();
    }
}

impl<K> Informer<K>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Hash + Eq + Clone + Default,
{
    /// Creates an informer over `api` and the future that drives its watch: a streaming
    /// initial list where the API server offers one, else `config`'s paginated lists (see
    /// `machinery/initial_list.rs`). The future runs
    /// until `shutdown` fires; spawn it. `strip` is applied to every object before it is stored
    /// (the runtime strips `managedFields`, and for Nodes `status.images`, which no controller
    /// reads: a node's image list is most of its size).
    ///
    /// Objects in the store are therefore **not** complete: never write one back with a PUT.
    pub fn new(
        api: Api<K>,
        config: watcher::Config,
        strip: fn(&mut K),
        shutdown: CancellationToken,
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let stream = super::initial_list::watch_events(api, config);
        Self::from_stream(stream, strip, shutdown)
    }

    /// Like [`Informer::new`], from any stream of watcher events (for tests).
    pub fn from_stream<S>(
        stream: S,
        strip: fn(&mut K),
        shutdown: CancellationToken,
    ) -> (Self, impl Future<Output = ()> + Send + 'static)
    where
        S: Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    {
        let (store, writer) = reflector::store::<K>();
        let (changes, _) = broadcast::channel(DEFAULT_BROADCAST_CAPACITY);
        let generation = Arc::new(AtomicU64::new(0));
        let publish = Arc::new(Mutex::new(()));
        let informer = Informer {
            store: store.clone(),
            changes: changes.clone(),
            generation: generation.clone(),
            publish: publish.clone(),
            initial_pending: Arc::new(AtomicUsize::new(0)),
        };
        let driver = drive(
            stream,
            Published {
                writer,
                store,
                changes,
                generation,
                publish,
            },
            strip,
            shutdown,
        );
        (informer, driver)
    }

    /// The store. Empty until the first list completed; see [`Informer::wait_until_synced`].
    pub fn store(&self) -> &Store<K> {
        &self.store
    }

    /// A counter that increases after every change applied to the store (never on a
    /// re-list that changed nothing). Equal values mean the store's contents did not change in
    /// between, so a value derived from [`Informer::list`] can be cached under it.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Every object in the store.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.store.state()
    }

    /// The object with this name (cluster-scoped) from the store.
    pub fn get(&self, name: &str) -> Option<Arc<K>> {
        self.store.get(&ObjectRef::new(name))
    }

    /// The namespaced object with this name from the store.
    pub fn get_namespaced(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        self.store.get(&ObjectRef::new(name).within(namespace))
    }

    /// Waits until the first list has completed (client-go's `WaitForCacheSync`). Returns
    /// false if the informer stopped before that.
    pub async fn wait_until_synced(&self) -> bool {
        // kube's `Store::wait_until_ready` wakes only the waiter that polled last (its
        // `DelayedInit` sits on a futures oneshot, which keeps a single waker), so with several
        // controllers waiting at once all but one would hang forever. Re-poll periodically.
        loop {
            let wait = self.store.wait_until_ready();
            match tokio::time::timeout(std::time::Duration::from_millis(50), wait).await {
                Ok(result) => return result.is_ok(),
                Err(_elapsed) => continue,
            }
        }
    }

    /// Changes and initial objects sent that some subscriber has not received yet (0 when
    /// every subscriber has taken everything, or there is none). The controller harness of
    /// `ccm-testing` waits for 0 to know that what the store holds has reached every
    /// controller.
    pub fn undelivered(&self) -> usize {
        self.changes.len() + self.initial_pending.load(Ordering::SeqCst)
    }

    /// Waits until the first list has completed, then subscribes: the subscription delivers
    /// every object in the store at that instant once (as `Applied { old: None }`), then every
    /// change after it, each once. This is how a controller starts: it needs no separate pass
    /// over [`Informer::list`], and an object present at start is never processed twice.
    /// `None` if the informer stopped before its first list.
    pub async fn subscribe(&self) -> Option<Subscription<K>> {
        if !self.wait_until_synced().await {
            return None;
        }
        let _publishing = lock(&self.publish);
        let initial = self.store.state();
        self.initial_pending
            .fetch_add(initial.len(), Ordering::SeqCst);
        Some(Subscription {
            initial: initial.into_iter(),
            rx: self.changes.subscribe(),
            initial_pending: self.initial_pending.clone(),
        })
    }
}

/// What the driver publishes to: the store, the change broadcast and the generation, updated
/// together under the `publish` lock.
struct Published<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Hash + Eq + Clone,
{
    writer: reflector::store::Writer<K>,
    store: Store<K>,
    changes: broadcast::Sender<Change<K>>,
    generation: Arc<AtomicU64>,
    publish: Arc<Mutex<()>>,
}

async fn drive<K, S>(
    stream: S,
    published: Published<K>,
    strip: fn(&mut K),
    shutdown: CancellationToken,
) where
    K: Resource + Clone + Debug + Send + Sync + 'static,
    K::DynamicType: Hash + Eq + Clone + Default,
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
{
    let Published {
        mut writer,
        store,
        changes,
        generation,
        publish,
    } = published;
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let mut stream = std::pin::pin!(stream);
    // What the store held when the current (re)list started, to diff against at InitDone.
    let mut before_relist: Option<HashMap<ObjectRef<K>, Arc<K>>> = None;
    loop {
        let next = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            next = stream.next() => next,
        };
        let event = match next {
            None => break,
            Some(Err(error)) => {
                // The watcher backs off and re-lists on its own; this is only reported.
                tracing::warn!(%kind, %error, "watch failed; retrying with backoff");
                continue;
            }
            Some(Ok(event)) => event,
        };
        let event = event.modify(|obj| {
            // `None`, not `clear()`: a cleared Vec keeps its buffer.
            obj.meta_mut().managed_fields = None;
            strip(obj);
        });
        match &event {
            Event::Init => {
                before_relist = Some(
                    store
                        .state()
                        .into_iter()
                        .map(|o| (ObjectRef::from_obj(o.as_ref()), o))
                        .collect(),
                );
                writer.apply_watcher_event(&event);
            }
            Event::InitApply(_) => writer.apply_watcher_event(&event),
            Event::InitDone => {
                // The store turns ready (first list) or swaps in the re-list here: under the
                // lock, together with the changes it makes, so a subscriber gets either this
                // state as its snapshot or these changes, not both.
                let _publishing = lock(&publish);
                writer.apply_watcher_event(&event);
                generation.fetch_add(1, Ordering::AcqRel);
                let mut before = before_relist.take().unwrap_or_default();
                for new in store.state() {
                    let key = ObjectRef::from_obj(new.as_ref());
                    let old = before.remove(&key);
                    let unchanged = old
                        .as_ref()
                        .is_some_and(|o| o.resource_version() == new.resource_version());
                    if !unchanged {
                        let _ = changes.send(Change::Applied { old, new });
                    }
                }
                for (_, gone) in before {
                    let _ = changes.send(Change::Deleted(gone));
                }
            }
            Event::Apply(obj) => {
                let _publishing = lock(&publish);
                let key = ObjectRef::from_obj(obj);
                let old = store.get(&key);
                writer.apply_watcher_event(&event);
                generation.fetch_add(1, Ordering::AcqRel);
                if let Some(new) = store.get(&key) {
                    let _ = changes.send(Change::Applied { old, new });
                }
            }
            Event::Delete(obj) => {
                let _publishing = lock(&publish);
                writer.apply_watcher_event(&event);
                generation.fetch_add(1, Ordering::AcqRel);
                let _ = changes.send(Change::Deleted(Arc::new(obj.clone())));
            }
        }
    }
    tracing::debug!(%kind, "informer stopped");
}

/// Nodes per page when the shared Node informer lists (kube's default is 500).
///
/// A page is decoded whole, images and all, before [`strip_node`], while the cache fills; the
/// allocator keeps much of that transient memory, so smaller pages leave the process smaller
/// (figures per page size: `docs/performance.md`, section "4. steady: memory"). 50 costs one
/// list request per 50 Nodes at start and after a relist, which the API server serves page by
/// page.
pub(crate) const NODE_LIST_PAGE_SIZE: u32 = 50;

/// The watcher configuration of the shared Node informer where the API server does not offer
/// streaming lists (`machinery/initial_list.rs`): consistent (`resourceVersion` unset) lists in
/// pages of [`NODE_LIST_PAGE_SIZE`].
///
/// A `resourceVersion=0` list would come from the API server's watch cache, which ignores
/// `limit` (up to Kubernetes 1.33): one response with every Node, all decoded at once. (kube
/// drops `resourceVersion=0` from a list that has a limit anyway; the semantic is spelled out
/// here so that stays true.)
pub(crate) fn node_watcher_config() -> watcher::Config {
    watcher::Config::default()
        .list_semantic(watcher::ListSemantic::MostRecent)
        .page_size(NODE_LIST_PAGE_SIZE)
}

/// Removes from a Node, before it is cached, what neither the controllers nor a cloud provider
/// reads: `status.images` (usually most of a Node's size), `capacity`, `allocatable`,
/// `volumesAttached`, `volumesInUse`, `daemonEndpoints`, `config`, `features`,
/// `runtimeHandlers`, every condition but `Ready` (node lifecycle) and `NetworkUnavailable`
/// (routes) and those two's `message`, and of `nodeInfo` the boot ID and the kernel, OS image,
/// container runtime, kubelet and kube-proxy versions (empty strings). Kept: all metadata
/// (but `managedFields`, which every informer drops), the whole spec, `addresses`, of
/// `nodeInfo` `systemUUID` (clouds match instances by it), `machineID`, `architecture` and
/// `operatingSystem`, `phase`.
///
/// A cached Node is what the providers' load-balancer calls receive as hosts, and what every
/// controller reads; what that saves per Node is measured in `docs/performance.md`, section
/// "4. steady: memory". A vendor whose provider or own controller
/// needs more replaces this with [`Builder::strip_cached_node`](crate::Builder::strip_cached_node).
pub fn strip_node(node: &mut k8s_openapi::api::core::v1::Node) {
    use ccm_core::well_known::{CONDITION_NETWORK_UNAVAILABLE, CONDITION_READY};
    let Some(status) = node.status.as_mut() else {
        return;
    };
    status.images = None;
    status.capacity = None;
    status.allocatable = None;
    status.volumes_attached = None;
    status.volumes_in_use = None;
    status.daemon_endpoints = None;
    status.config = None;
    status.features = None;
    status.runtime_handlers = None;
    if let Some(conditions) = status.conditions.as_mut() {
        conditions
            .retain(|c| c.type_ == CONDITION_READY || c.type_ == CONDITION_NETWORK_UNAVAILABLE);
        conditions.shrink_to_fit();
        for condition in conditions.iter_mut() {
            condition.message = None;
        }
    }
    if let Some(info) = status.node_info.as_mut() {
        // Strings no controller reads; an empty String holds no memory.
        for field in [
            &mut info.boot_id,
            &mut info.kernel_version,
            &mut info.os_image,
            &mut info.container_runtime_version,
            &mut info.kubelet_version,
            &mut info.kube_proxy_version,
        ] {
            *field = String::new();
        }
    }
}

/// Strips nothing beyond `managedFields` (which every informer drops).
pub(crate) fn strip_nothing<K>(_: &mut K) {}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use kube::api::ObjectMeta;

    fn node(name: &str, rv: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn several_concurrent_waiters_all_see_the_sync() {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let shutdown = CancellationToken::new();
        let (informer, driver) = Informer::from_stream(rx, strip_node, shutdown.clone());
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let informer = informer.clone();
                tokio::spawn(async move { informer.wait_until_synced().await })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let task = tokio::spawn(driver);
        for e in [
            Event::Init,
            Event::InitApply(node("a", "1")),
            Event::InitDone,
        ] {
            tx.unbounded_send(Ok(e)).unwrap();
        }
        for w in waiters {
            assert!(w.await.unwrap());
        }
        shutdown.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn relist_reports_adds_changes_and_missed_deletes() {
        let first_list: Vec<Result<Event<Node>, watcher::Error>> = vec![
            Ok(Event::Init),
            Ok(Event::InitApply(node("a", "1"))),
            Ok(Event::InitApply(node("b", "2"))),
            Ok(Event::InitDone),
        ];
        let later: Vec<Result<Event<Node>, watcher::Error>> = vec![
            Ok(Event::Apply(node("a", "3"))),
            // The watch broke; the re-list no longer has "b" and "a" changed again.
            Ok(Event::Init),
            Ok(Event::InitApply(node("a", "4"))),
            Ok(Event::InitDone),
        ];
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let shutdown = CancellationToken::new();
        let (informer, driver) = Informer::from_stream(rx, strip_node, shutdown.clone());
        let task = tokio::spawn(driver);
        for e in first_list {
            tx.unbounded_send(e).unwrap();
        }
        let mut sub = informer.subscribe().await.unwrap();
        for e in later {
            tx.unbounded_send(e).unwrap();
        }
        let mut seen = Vec::new();
        for _ in 0..5 {
            match sub.recv().await.unwrap() {
                Change::Applied { old, new } => seen.push(format!(
                    "apply {} {}->{}",
                    new.name_any(),
                    old.map(|o| o.resource_version().unwrap_or_default())
                        .unwrap_or_default(),
                    new.resource_version().unwrap_or_default()
                )),
                Change::Deleted(o) => seen.push(format!("delete {}", o.name_any())),
                Change::Resync => seen.push("resync".into()),
            }
        }
        seen[..2].sort();
        assert_eq!(
            seen,
            [
                "apply a ->1",
                "apply b ->2",
                "apply a 1->3",
                "apply a 3->4",
                "delete b"
            ]
        );
        assert!(informer.wait_until_synced().await);
        // Two (re)lists and one Apply changed the store.
        assert_eq!(informer.generation(), 3);
        assert_eq!(informer.list().len(), 1);
        assert_eq!(
            informer.get("a").unwrap().resource_version().as_deref(),
            Some("4")
        );
        shutdown.cancel();
        task.await.unwrap();
    }

    /// Subscribers racing with the first list (some subscribe before it completes, some while
    /// the informer publishes it, some after) each get every object exactly once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_subscriber_gets_the_initial_state_once() {
        for _ in 0..20 {
            let (tx, rx) = futures::channel::mpsc::unbounded();
            let shutdown = CancellationToken::new();
            let (informer, driver) = Informer::from_stream(rx, strip_node, shutdown.clone());
            let subscribed = Arc::new(AtomicU64::new(0));
            let subscribers: Vec<_> = (0..8)
                .map(|i| {
                    let (informer, subscribed) = (informer.clone(), subscribed.clone());
                    tokio::spawn(async move {
                        if i % 2 == 1 {
                            tokio::task::yield_now().await;
                        }
                        let mut sub = informer.subscribe().await.unwrap();
                        subscribed.fetch_add(1, Ordering::SeqCst);
                        let mut seen: HashMap<String, usize> = HashMap::new();
                        // "z" is applied after the list: every change before it is counted.
                        loop {
                            match sub.recv().await.unwrap() {
                                Change::Applied { new, .. } if new.name_any() == "z" => break,
                                Change::Applied { new, .. } => {
                                    *seen.entry(new.name_any()).or_default() += 1
                                }
                                other => panic!("unexpected {other:?}"),
                            }
                        }
                        seen
                    })
                })
                .collect();
            let task = tokio::spawn(driver);
            tx.unbounded_send(Ok(Event::Init)).unwrap();
            for n in 0..50 {
                tx.unbounded_send(Ok(Event::InitApply(node(&format!("n{n}"), "1"))))
                    .unwrap();
            }
            tx.unbounded_send(Ok(Event::InitDone)).unwrap();
            while subscribed.load(Ordering::SeqCst) < 8 {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            tx.unbounded_send(Ok(Event::Apply(node("z", "2")))).unwrap();
            for s in subscribers {
                let seen = s.await.unwrap();
                assert_eq!(seen.len(), 50);
                assert!(seen.values().all(|&n| n == 1), "{seen:?}");
            }
            shutdown.cancel();
            task.await.unwrap();
        }
    }
}

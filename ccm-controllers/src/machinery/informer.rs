//! Shared informers: one watch per resource kind per process, an in-memory store, and a
//! broadcast of changes with both the old and the new object.
//!
//! Why not kube's `reflect_shared`/`subscribe`: its subscribers receive only the new object,
//! while the Go controllers' update handlers compare old and new (the service controller reacts
//! to a Node only when its load-balancer eligibility or providerID flipped; the route controller
//! only when `spec.podCIDRs` or `status.addresses` changed). Its subscribers also apply
//! back-pressure to the watch, so a slow controller stalls every other one. Here changes go out
//! on a bounded `tokio::sync::broadcast`; a subscriber that falls behind gets
//! [`Change::Resync`] and rebuilds from the store instead of blocking anyone.
//!
//! Why not kube's `reflector::Store` either: it holds the watched type itself (`Arc<K>`), and
//! the Node informer holds a compact form instead ([`NodeView`], built by one
//! [`NodeViewInterner`] for the whole store: a sixth of a k8s-openapi `Node`). The store here
//! is a map from the object's key to a [`CachedObject`]: `Arc<K>` for the Service informer,
//! [`NodeView`] for the Node informer.
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
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use ccm_core::{NodeView, NodeViewInterner};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::Resource;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::lean_node::LeanNode;

/// Default capacity of an informer's change broadcast. A subscriber more than this many changes
/// behind receives [`Change::Resync`].
pub(crate) const DEFAULT_BROADCAST_CAPACITY: usize = 4096;

/// What an informer's store holds for one object: `Arc<K>` (the object itself, shared), or
/// [`NodeView`] for the Node informer. Cheap to clone.
pub trait CachedObject: Clone + Send + Sync + 'static {
    /// The store's key: `name` for a cluster-scoped object, `namespace/name` otherwise.
    fn cache_key(&self) -> Arc<str>;
    /// `metadata.resourceVersion`, which a re-list compares to tell changed objects.
    fn cached_resource_version(&self) -> Option<&str>;
}

impl<K: Resource + Send + Sync + 'static> CachedObject for Arc<K> {
    fn cache_key(&self) -> Arc<str> {
        let meta = self.meta();
        let name = meta.name.as_deref().unwrap_or_default();
        match meta.namespace.as_deref() {
            Some(ns) => Arc::from(format!("{ns}/{name}")),
            None => Arc::from(name),
        }
    }
    fn cached_resource_version(&self) -> Option<&str> {
        self.meta().resource_version.as_deref()
    }
}

impl CachedObject for NodeView {
    fn cache_key(&self) -> Arc<str> {
        // The view's own name: no copy of the string.
        self.name_arc().cloned().unwrap_or_else(|| Arc::from(""))
    }
    fn cached_resource_version(&self) -> Option<&str> {
        self.resource_version()
    }
}

/// One change seen by an informer. `T` is what the store holds: `Arc<Service>`, [`NodeView`].
#[derive(Debug, Clone)]
pub enum Change<T> {
    /// An object was added (`old` is `None`) or modified.
    Applied {
        /// The object before the change, when the informer had it.
        old: Option<T>,
        /// The object after the change.
        new: T,
    },
    /// An object was deleted (its last known state).
    Deleted(T),
    /// The subscriber missed changes (it fell behind); treat every object in the store as
    /// changed.
    Resync,
}

/// The store: objects by [`CachedObject::cache_key`].
type Objects<T> = HashMap<Arc<str>, T>;

/// A shared informer handle: a read-only store plus a way to subscribe to changes. Cheap to
/// clone; every clone sees the same store.
///
/// `K` is the watched kind, `T` what the store holds for each object: `Informer<Service>`
/// holds `Arc<Service>`s, the Node informer (`Informer<Node, NodeView>`) holds
/// [`NodeView`]s, the compact form also handed to providers.
pub struct Informer<K, T = Arc<K>> {
    store: Arc<RwLock<Objects<T>>>,
    synced: watch::Receiver<bool>,
    changes: broadcast::Sender<Change<T>>,
    generation: Arc<AtomicU64>,
    /// Held while a change is applied to the store and broadcast, and while a subscriber takes
    /// its snapshot and subscribes: a subscriber sees each change either in its snapshot or on
    /// its subscription, never both, never neither.
    publish: Arc<Mutex<()>>,
    /// Initial objects handed to subscriptions and not yet received (see
    /// [`Informer::undelivered`]).
    initial_pending: Arc<AtomicUsize>,
    kind: std::marker::PhantomData<fn() -> K>,
}

fn lock(publish: &Mutex<()>) -> MutexGuard<'_, ()> {
    // Guards no data; a panic while it was held leaves nothing inconsistent behind it.
    publish.lock().unwrap_or_else(|e| e.into_inner())
}

fn read<T>(store: &RwLock<Objects<T>>) -> std::sync::RwLockReadGuard<'_, Objects<T>> {
    // Every write replaces or removes whole entries: a panic in between leaves a consistent map.
    store.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(store: &RwLock<Objects<T>>) -> std::sync::RwLockWriteGuard<'_, Objects<T>> {
    store.write().unwrap_or_else(|e| e.into_inner())
}

impl<K, T: Clone> Clone for Informer<K, T> {
    fn clone(&self) -> Self {
        Informer {
            store: self.store.clone(),
            synced: self.synced.clone(),
            changes: self.changes.clone(),
            generation: self.generation.clone(),
            publish: self.publish.clone(),
            initial_pending: self.initial_pending.clone(),
            kind: std::marker::PhantomData,
        }
    }
}

/// A subscription to an informer's objects and changes (see [`Informer::subscribe`]): first
/// every object the store held when it was taken, as `Applied { old: None }`, then every change
/// after that.
pub struct Subscription<T> {
    initial: std::vec::IntoIter<T>,
    rx: broadcast::Receiver<Change<T>>,
    /// The informer's count of initial objects not yet received, less ours as we take them.
    initial_pending: Arc<AtomicUsize>,
}

impl<T> Subscription<T> {
    /// Takes the rest of the initial objects off the informer's pending count.
    fn forget_initial(&mut self) {
        let rest = self.initial.len();
        self.initial = Vec::new().into_iter();
        self.initial_pending.fetch_sub(rest, Ordering::SeqCst);
    }
}

impl<T> Drop for Subscription<T> {
    fn drop(&mut self) {
        self.forget_initial();
    }
}

impl<T: Clone> Subscription<T> {
    /// The next change; `None` once the informer has stopped. The objects of the initial
    /// state come first, each once. A subscriber that fell behind receives
    /// [`Change::Resync`] once, then the changes after the gap.
    pub async fn recv(&mut self) -> Option<Change<T>> {
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
    K::DynamicType: Default,
{
    /// Creates an informer over `api` that stores each object as an `Arc<K>`, and the future
    /// that drives its watch: a streaming initial list where the API server offers one, else
    /// `config`'s paginated lists (see `machinery/initial_list.rs`). The future runs until
    /// `shutdown` fires; spawn it. `strip` is applied to every object before it is stored
    /// (every informer drops `managedFields`).
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
        Self::building(
            stream,
            move |mut obj: K| {
                strip(&mut obj);
                Arc::new(obj)
            },
            shutdown,
        )
    }
}

impl Informer<Node, NodeView> {
    /// The Node informer: like [`Informer::new`], with each Node stripped by `strip` and then
    /// stored as a [`NodeView`] built by one [`NodeViewInterner`] for the whole store: label and
    /// annotation sets and the strings many Nodes share held once, swept when no Node uses them
    /// any more. The Nodes are decoded without `metadata.managedFields` and `status.images`,
    /// so `strip` never sees those.
    pub fn nodes(
        api: Api<Node>,
        config: watcher::Config,
        strip: fn(&mut Node),
        shutdown: CancellationToken,
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        // Decoded without `managedFields` and `status.images` (module docs of `lean_node`).
        let api = Api::<LeanNode>::all(api.into_client());
        let stream = super::initial_list::watch_events(api, config)
            .map(|event| event.map(|event| map_event(event, Node::from)));
        Self::nodes_from_stream(stream, strip, shutdown)
    }

    /// Like [`Informer::nodes`], from any stream of watcher events (for tests and benches).
    pub fn nodes_from_stream<S>(
        stream: S,
        strip: fn(&mut Node),
        shutdown: CancellationToken,
    ) -> (Self, impl Future<Output = ()> + Send + 'static)
    where
        S: Stream<Item = Result<Event<Node>, watcher::Error>> + Send + 'static,
    {
        let mut interner = NodeViewInterner::default();
        let build = move |mut node: Node| {
            strip(&mut node);
            interner.view(node)
        };
        Self::building(stream, build, shutdown)
    }
}

impl<K, T: CachedObject> Informer<K, T>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default,
{
    /// An informer storing what `build` makes of each (already `managedFields`-less) object.
    fn building<S, B>(
        stream: S,
        build: B,
        shutdown: CancellationToken,
    ) -> (Self, impl Future<Output = ()> + Send + 'static)
    where
        S: Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
        B: FnMut(K) -> T + Send + 'static,
    {
        let (changes, _) = broadcast::channel(DEFAULT_BROADCAST_CAPACITY);
        let (synced_tx, synced) = watch::channel(false);
        let informer = Informer {
            store: Arc::default(),
            synced,
            changes,
            generation: Arc::new(AtomicU64::new(0)),
            publish: Arc::new(Mutex::new(())),
            initial_pending: Arc::new(AtomicUsize::new(0)),
            kind: std::marker::PhantomData,
        };
        let driver = drive(stream, informer.clone(), synced_tx, build, shutdown);
        (informer, driver)
    }
}

impl<K, T: CachedObject> Informer<K, T> {
    /// A counter that increases after every change applied to the store (never on a
    /// re-list that changed nothing). Equal values mean the store's contents did not change in
    /// between, so a value derived from [`Informer::list`] can be cached under it.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Every object in the store. Empty until the first list completed; see
    /// [`Informer::wait_until_synced`].
    pub fn list(&self) -> Vec<T> {
        read(&self.store).values().cloned().collect()
    }

    /// How many objects the store holds.
    pub fn len(&self) -> usize {
        read(&self.store).len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        read(&self.store).is_empty()
    }

    /// The object with this name (cluster-scoped) from the store.
    pub fn get(&self, name: &str) -> Option<T> {
        read(&self.store).get(name).cloned()
    }

    /// The namespaced object with this name from the store.
    pub fn get_namespaced(&self, namespace: &str, name: &str) -> Option<T> {
        read(&self.store)
            .get(format!("{namespace}/{name}").as_str())
            .cloned()
    }

    /// Waits until the first list has completed (client-go's `WaitForCacheSync`). Returns
    /// false if the informer stopped before that.
    pub async fn wait_until_synced(&self) -> bool {
        let mut synced = self.synced.clone();
        synced.wait_for(|s| *s).await.is_ok()
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
    pub async fn subscribe(&self) -> Option<Subscription<T>> {
        if !self.wait_until_synced().await {
            return None;
        }
        let _publishing = lock(&self.publish);
        let initial = self.list();
        self.initial_pending
            .fetch_add(initial.len(), Ordering::SeqCst);
        Some(Subscription {
            initial: initial.into_iter(),
            rx: self.changes.subscribe(),
            initial_pending: self.initial_pending.clone(),
        })
    }

    /// Applies one change to the store and broadcasts it, under the publish lock.
    fn publish(&self, apply: impl FnOnce(&mut Objects<T>) -> Vec<Change<T>>) {
        let _publishing = lock(&self.publish);
        let changes = apply(&mut write(&self.store));
        self.generation.fetch_add(1, Ordering::AcqRel);
        for change in changes {
            let _ = self.changes.send(change);
        }
    }
}

async fn drive<K, T, S, B>(
    stream: S,
    informer: Informer<K, T>,
    synced: watch::Sender<bool>,
    mut build: B,
    shutdown: CancellationToken,
) where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default,
    T: CachedObject,
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    B: FnMut(K) -> T + Send + 'static,
{
    let kind = K::kind(&Default::default()).into_owned();
    let mut stream = std::pin::pin!(stream);
    // The objects of the (re)list in progress, swapped in whole at its end (as kube's store).
    let mut relist: Option<Objects<T>> = None;
    let mut make = |mut obj: K| {
        // `None`, not `clear()`: a cleared Vec keeps its buffer.
        obj.meta_mut().managed_fields = None;
        build(obj)
    };
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
        match event {
            Event::Init => relist = Some(Objects::new()),
            Event::InitApply(obj) => {
                let item = make(obj);
                relist
                    .get_or_insert_with(Objects::new)
                    .insert(item.cache_key(), item);
            }
            Event::InitDone => {
                // The store turns ready (first list) or swaps in the re-list here: under the
                // lock, together with the changes it makes, so a subscriber gets either this
                // state as its snapshot or these changes, not both.
                let listed = relist.take().unwrap_or_default();
                informer.publish(|store| {
                    let mut before = std::mem::replace(store, listed);
                    let mut changes = Vec::new();
                    for (key, new) in store.iter() {
                        let old = before.remove(key);
                        let unchanged = old.as_ref().is_some_and(|o| {
                            o.cached_resource_version() == new.cached_resource_version()
                        });
                        if !unchanged {
                            changes.push(Change::Applied {
                                old,
                                new: new.clone(),
                            });
                        }
                    }
                    changes.extend(before.into_values().map(Change::Deleted));
                    changes
                });
                synced.send_replace(true);
            }
            Event::Apply(obj) => {
                let new = make(obj);
                informer.publish(|store| {
                    let old = store.insert(new.cache_key(), new.clone());
                    vec![Change::Applied { old, new }]
                });
            }
            Event::Delete(obj) => {
                let gone = make(obj);
                informer.publish(|store| {
                    store.remove(&gone.cache_key());
                    vec![Change::Deleted(gone)]
                });
            }
        }
    }
    tracing::debug!(%kind, "informer stopped");
}

/// How long the API server keeps each watch of a shared informer open (`timeoutSeconds`)
/// before it ends it and the watcher resumes from the last resourceVersion (no list).
///
/// A watch is the one request that may be silent for long on a healthy connection: kube-apiserver
/// sends bookmarks only about once a minute. Ending it every 10 s makes the server show a sign
/// of life within every read-idle bound of the client (`runtime/client/liveness.rs`, 13 s), so a
/// watch on a dead connection is found in seconds, at the cost of one watch request per informer
/// every 10 s (measurements: docs/controllers.md, "Connections to the API server").
pub(crate) const WATCH_TIMEOUT_SECONDS: u32 = 10;

/// The watcher configuration every shared informer starts from: bookmarks (kube's default)
/// and the server-side timeout [`WATCH_TIMEOUT_SECONDS`].
pub(crate) fn watcher_config() -> watcher::Config {
    watcher::Config::default().timeout(WATCH_TIMEOUT_SECONDS)
}

/// Nodes per page when the shared Node informer lists (kube's default is 500).
///
/// A page is decoded whole (less `managedFields` and `status.images`, which are never decoded:
/// `machinery::lean_node`) before [`strip_node`], while the cache fills; the
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
    watcher_config()
        .list_semantic(watcher::ListSemantic::MostRecent)
        .page_size(NODE_LIST_PAGE_SIZE)
}

/// `event` with its object (if any) turned into another type by `f`.
fn map_event<A, B>(event: Event<A>, f: impl FnOnce(A) -> B) -> Event<B> {
    match event {
        Event::Apply(object) => Event::Apply(f(object)),
        Event::Delete(object) => Event::Delete(f(object)),
        Event::InitApply(object) => Event::InitApply(f(object)),
        Event::Init => Event::Init,
        Event::InitDone => Event::InitDone,
    }
}

/// Removes from a Node, before it is cached, what neither the controllers nor a cloud provider
/// reads: `status.images` (usually most of a Node's size; the Node informer does not even
/// decode it, nor `managedFields`), `capacity`, `allocatable`,
/// `volumesAttached`, `volumesInUse`, `daemonEndpoints`, `config`, `features`,
/// `runtimeHandlers`, every condition but `Ready` (node lifecycle), `NetworkUnavailable`
/// (routes) and `CloudProviderInstanceNotFound` (node lifecycle, written only when turned on)
/// and those three's `message`, and of `nodeInfo` the boot ID and the kernel, OS image,
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
    use ccm_core::well_known::{
        CONDITION_CLOUD_PROVIDER_INSTANCE_NOT_FOUND, CONDITION_NETWORK_UNAVAILABLE, CONDITION_READY,
    };
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
        conditions.retain(|c| {
            c.type_ == CONDITION_READY
                || c.type_ == CONDITION_NETWORK_UNAVAILABLE
                || c.type_ == CONDITION_CLOUD_PROVIDER_INSTANCE_NOT_FOUND
        });
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
    use kube::ResourceExt;
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
        let (informer, driver) = Informer::nodes_from_stream(rx, strip_node, shutdown.clone());
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
                    new.name(),
                    old.map(|o| o.resource_version().unwrap_or_default().to_owned())
                        .unwrap_or_default(),
                    new.resource_version().unwrap_or_default()
                )),
                Change::Deleted(o) => seen.push(format!("delete {}", o.name())),
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
        assert_eq!(informer.get("a").unwrap().resource_version(), Some("4"));
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

//! An in-process Kubernetes API server for tests.
//!
//! [`ApiServer::start`] binds `127.0.0.1:0` and serves, over real HTTP, the resources a
//! cloud-controller-manager uses: Nodes (and `/status`), Services (and `/status`), Namespaces
//! (and `/status`, `/finalize`), core/v1 and events.k8s.io/v1 Events (one storage, as in
//! kube-apiserver), coordination.k8s.io/v1 Leases, ConfigMaps, Secrets, ServiceAccounts (and
//! the TokenRequest API, `/token`), and rbac.authorization.k8s.io/v1 Roles, ClusterRoles,
//! RoleBindings and ClusterRoleBindings. A `kube::Client` from
//! [`ApiServer::client`] talks to it unchanged: watchers, reflectors, `Controller`s,
//! `kube-lease-manager` and the events `Recorder` all work against it.
//!
//! It behaves like kube-apiserver where a controller can tell the difference:
//!
//! - **Reads**: get; list with `labelSelector`, `fieldSelector` (`metadata.name`,
//!   `metadata.namespace` and the per-resource fields kube-apiserver indexes), `limit` and
//!   `continue` (a consistent snapshot across pages, valid 5 minutes as between two etcd
//!   compactions; `resourceVersion=0` is served whole, as
//!   kube-apiserver's watch cache ignores `limit` there); `resourceVersion` with
//!   `resourceVersionMatch=Exact` lists the state at that version (from the retained history;
//!   older is `410 Expired`), `NotOlderThan`/unset serve the latest state, a version from the
//!   future is `504`; `PartialObjectMetadata` answers when asked.
//! - **Watch**: one global resourceVersion counter; `resourceVersion` unset or `0` starts with
//!   synthetic `ADDED` events for the current state, `resourceVersion=N` replays what happened
//!   after `N`; a version older than the retained history gets an `ERROR` event carrying a
//!   `410 Expired` `Status`; `allowWatchBookmarks` brings periodic `BOOKMARK`s;
//!   `timeoutSeconds` ends the stream; `sendInitialEvents` ends the initial burst with the
//!   `k8s.io/initial-events-end` bookmark. Label/field selector transitions turn `MODIFIED`
//!   into `ADDED`/`DELETED` as the watch cache does.
//! - **Writes**: create (`AlreadyExists`, `generateName`, uid, creationTimestamp,
//!   resourceVersion), update (`409 Conflict` on a stale resourceVersion; PUT creates Leases and
//!   Events when missing), delete (finalizers set `deletionTimestamp` and emit `MODIFIED`; the
//!   object goes, with a `DELETED` event, when its last finalizer is removed), delete preconditions,
//!   deletecollection, `dryRun=All`. A write that changes nothing keeps the resourceVersion and
//!   emits no event.
//! - **Patch**: JSON merge patch, JSON patch (a failed `test` is `422 Invalid`), strategic
//!   merge patch with the merge keys of the Kubernetes types (Node `status.addresses` and
//!   `status.conditions` by `type`, `metadata.finalizers` as a set, Service `spec.ports` by
//!   `port`; `spec.taints` and `status.loadBalancer.ingress` are atomic) including the
//!   `$patch`, `$retainKeys` and `$deleteFromPrimitiveList` directives, and server-side apply
//!   with field ownership per manager (conflicts answer `409`, `force=true` takes ownership),
//!   reported in `metadata.managedFields`.
//!   PATCH on a missing object is `404`, except apply, which creates it.
//! - **Status subresource**: writes to Nodes and Services ignore `status`; writes to their
//!   `/status` ignore `spec` (metadata changes are kept, as kube-apiserver's node and service
//!   status strategies do). A Namespace's `spec.finalizers` change only through `/finalize`.
//! - **Admission**: `TaintNodesByCondition` appends `node.kubernetes.io/not-ready:NoSchedule`
//!   to every Node created (unless a taint with that key and effect is there); NamespaceLifecycle
//!   refuses creates in a missing or terminating namespace and the deletion of `default`,
//!   `kube-system` and `kube-public`. Both, validation and the namespace controller are on by
//!   default and can be turned off with [`ApiServer::builder`] ([`ApiServerBuilder`] lists
//!   every behaviour the server adds beyond storing, with its switch and default).
//! - **Namespaces**: DELETE marks a Namespace `Terminating`; a built-in namespace controller (on
//!   by default, [`ApiServer::set_namespace_controller`]) then deletes its content, waits for
//!   finalizers, and finalizes it, after which it goes.
//! - **Validation** answered with `422 Invalid` and field causes: names, label keys and values,
//!   annotation keys, finalizer names, `spec.providerID` set once and never changed, podCIDRs
//!   set once, taint effects and duplicate taint key+effect pairs, Service ports, type,
//!   `externalTrafficPolicy`, `loadBalancerClass` (immutable), clusterIP (immutable),
//!   `spec.loadBalancerSourceRanges` and the `service.beta.kubernetes.io/load-balancer-source-ranges`
//!   annotation, load-balancer ingress `ipMode`, Lease durations, Event namespaces (an Event
//!   about a cluster-scoped object lives in `default`). Services get their defaults (clusterIP,
//!   node ports, policies, `ipMode: VIP` for ingress entries with an IP).
//!   Node `spec.podCIDR`/`podCIDRs` are kept in step (valid CIDRs, one per family, set once);
//!   Secrets get `type: Opaque` and have `stringData` folded into `data`; events.k8s.io/v1
//!   Events need `eventTime`, `reportingController`, `reportingInstance`, `action` and `reason`.
//! - **Errors** are `Status` objects with `reason`, `code` and `details` as kube-apiserver
//!   words them; a `resourceVersion` from the future answers `504 Timeout`
//!   (`ResourceVersionTooLarge`).
//! - **Discovery**: `/api`, `/api/v1`, `/apis`, `/apis/<group>/v1` and `/version`, so
//!   `kube::Discovery` and dynamic clients work.
//!
//! - **Authentication**: a bearer token registered with [`ApiServer::add_token`] or issued by
//!   the TokenRequest API (`POST .../serviceaccounts/<name>/token`; default 3600 s, at least
//!   600 s, capped by [`ApiServer::set_max_token_expiration`]) authenticates as its user (a
//!   ServiceAccount's as `system:serviceaccount:<ns>:<name>` in `system:serviceaccounts`,
//!   `system:serviceaccounts:<ns>`, `system:authenticated`); an unknown or expired token, or
//!   one whose ServiceAccount is gone, is `401`. A request without credentials is the cluster
//!   administrator (`system:admin`, `system:masters`).
//! - **Authorisation**: off by default; [`ApiServer::enable_rbac`] checks every request against
//!   the stored RBAC objects (`403` with kube-apiserver's message when denied);
//!   [`ApiServer::add_bootstrap_controller_roles`] adds the bootstrap policy's roles of the
//!   node, service and route controllers.
//!
//! **Size**: each object is stored once, as its JSON text with the few values reads need
//! (name, namespace, labels, the selectable fields); the event history, list snapshots and
//! watches share it, lists and watches send the text as it is (large lists streamed in
//! chunks), and only writes parse it. The scale benchmark holds 100,000 Nodes this way
//! (docs/performance.md, "100,000 Nodes").
//!
//! Test hooks: [`ApiServer::fail_next`] (with `Retry-After` for 429), [`ApiServer::set_latency`],
//! [`ApiServer::close_watches`], [`ApiServer::compact`], [`ApiServer::set_bookmark_interval`],
//! [`ApiServer::open_watches`], and the request log [`ApiServer::requests`] /
//! [`ApiServer::requests_matching`] with each request's body, patch type, user agent and
//! authenticated user.
//!
//! ```
//! use ccm_testing::apiserver::ApiServer;
//! use k8s_openapi::api::core::v1::Node;
//! use kube::api::{Api, Patch, PatchParams, PostParams};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let server = ApiServer::start().await;
//! let nodes: Api<Node> = Api::all(server.client());
//! nodes
//!     .create(&PostParams::default(), &ccm_testing::builders::kubelet_node("n1").build())
//!     .await
//!     .unwrap();
//! // The next status patch of a Node fails with 409 Conflict.
//! server.fail_next("patch", "nodes/status", 1, 409, None);
//! let err = nodes
//!     .patch_status("n1", &PatchParams::default(), &Patch::Merge(serde_json::json!({})))
//!     .await
//!     .unwrap_err();
//! assert!(matches!(err, kube::Error::Api(s) if s.code == 409));
//! assert_eq!(server.requests().last().map(|r| r.status), Some(409));
//! # }
//! ```
//!
//! Reviews: `TokenReview` and `SubjectAccessReview` are answered from the tokens and
//! non-resource rules registered with [`ApiServer::add_token`] and
//! [`ApiServer::allow_non_resource`] (for components that delegate authn/authz).
//!
//! Known simplifications (docs/testing.md lists the differences from kube-apiserver in full):
//! no admission beyond the plugins above, no controllers of kube-controller-manager but the
//! namespace controller (the not-ready taint stays), no garbage collector (`propagationPolicy`
//! is accepted but owner references are not followed), server-side apply owns lists as a whole
//! (no per-item ownership of keyed lists) and `managedFields` entries do not record the
//! subresource, and strategic merge patch ignores `$setElementOrder`.

mod builder;
mod faults;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod http;
mod patch;
mod rbac;
mod requests;
mod resources;
mod reviews;
mod selector;
mod state;
mod status;
pub(crate) mod validation;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

pub use builder::ApiServerBuilder;
pub use faults::{ApiFaultKind, ApiFaultRule, ApiFaultRuleError, ApiFaults};
pub use requests::{RequestFilter, RequestRecord};
pub use state::PatchType;
use state::State;
use status::ApiError;

#[derive(Debug)]
struct FailRule {
    verb: String,
    resource: String,
    remaining: usize,
    status: u16,
    retry_after: Option<Duration>,
}

/// Shared state of a running server.
#[derive(Debug)]
pub(crate) struct Inner {
    state: Mutex<State>,
    requests: Mutex<Vec<RequestRecord>>,
    faults: Mutex<Vec<FailRule>>,
    /// Random faults ([`ApiServer::set_faults`]).
    api_faults: faults::Armed,
    latency: Mutex<Duration>,
    bookmark_interval: Mutex<Duration>,
    /// Open watch streams per resource (`nodes`, `leases.coordination.k8s.io`, ...).
    open_watches: Mutex<std::collections::BTreeMap<String, usize>>,
    close_tx: tokio::sync::watch::Sender<u64>,
    /// Tokens and non-resource rules of the TokenReview / SubjectAccessReview endpoints.
    reviews: reviews::Reviews,
    /// Whether the built-in namespace controller finalizes terminating namespaces.
    namespace_controller: std::sync::atomic::AtomicBool,
    /// Whether requests are authorised by RBAC.
    rbac: std::sync::atomic::AtomicBool,
    /// Whether the request log keeps request bodies.
    record_bodies: std::sync::atomic::AtomicBool,
    /// `--service-account-max-token-expiration`: the longest token the TokenRequest API issues.
    max_token_expiration: Mutex<Option<Duration>>,
    /// Whether watches may ask for `sendInitialEvents` (the WatchList feature gate).
    watch_list: std::sync::atomic::AtomicBool,
}

/// Locks a mutex, going on after a panic in another holder (test state stays inspectable).
pub(crate) fn lock_ignoring_poison<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    lock(m)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave the data half-updated in a way tests could
    // observe more harmfully than by stopping; keep serving.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Inner {
    /// A server's state with nothing stored, every switch at its default.
    pub(crate) fn new() -> Arc<Inner> {
        let (close_tx, _) = tokio::sync::watch::channel(0u64);
        Arc::new(Inner {
            state: Mutex::new(State::new(HISTORY_CAPACITY)),
            requests: Mutex::new(Vec::new()),
            faults: Mutex::new(Vec::new()),
            api_faults: faults::Armed::default(),
            latency: Mutex::new(Duration::ZERO),
            bookmark_interval: Mutex::new(Duration::from_secs(5)),
            open_watches: Mutex::new(std::collections::BTreeMap::new()),
            close_tx,
            reviews: reviews::Reviews::default(),
            namespace_controller: std::sync::atomic::AtomicBool::new(true),
            rbac: std::sync::atomic::AtomicBool::new(false),
            record_bodies: std::sync::atomic::AtomicBool::new(true),
            max_token_expiration: Mutex::new(None),
            watch_list: std::sync::atomic::AtomicBool::new(true),
        })
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    pub(crate) fn rbac_enabled(&self) -> bool {
        self.rbac.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) fn records_bodies(&self) -> bool {
        self.record_bodies.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) fn max_token_expiration(&self) -> Option<Duration> {
        *lock(&self.max_token_expiration)
    }

    pub(crate) fn watch_list(&self) -> bool {
        self.watch_list.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) fn latency(&self) -> Duration {
        *lock(&self.latency)
    }

    pub(crate) fn bookmark_interval(&self) -> Duration {
        *lock(&self.bookmark_interval)
    }

    pub(crate) fn close_rx(&self) -> tokio::sync::watch::Receiver<u64> {
        self.close_tx.subscribe()
    }

    pub(crate) fn watch_opened(&self, resource: &str) {
        *lock(&self.open_watches)
            .entry(resource.to_string())
            .or_default() += 1;
    }

    pub(crate) fn watch_closed(&self, resource: &str) {
        if let Some(n) = lock(&self.open_watches).get_mut(resource) {
            *n = n.saturating_sub(1);
        }
    }

    pub(crate) fn record(&self, r: RequestRecord) {
        lock(&self.requests).push(r);
    }

    /// Consumes one matching `fail_next` rule, if any.
    pub(crate) fn take_fault(&self, r: &RequestRecord) -> Option<ApiError> {
        let mut faults = lock(&self.faults);
        let resource = match &r.subresource {
            Some(s) => format!("{}/{}", r.resource, s),
            None => r.resource.clone(),
        };
        let rule = faults.iter_mut().find(|f| {
            f.remaining > 0
                && (f.verb == "*" || f.verb == r.verb)
                && (f.resource == "*" || f.resource == resource)
        })?;
        rule.remaining -= 1;
        let e = http::injected_error(rule.status, rule.retry_after);
        faults.retain(|f| f.remaining > 0);
        Some(e)
    }
}

/// The built-in namespace controller (see [`ApiServer::set_namespace_controller`]): reacts to
/// changes of terminating namespaces and their content, and looks again every second (a
/// lagged change stream misses nothing for long). Ends when the server's state is dropped.
async fn run_namespace_controller(inner: std::sync::Weak<Inner>) {
    use std::collections::BTreeSet;
    use tokio::sync::broadcast::error::{RecvError, TryRecvError};

    /// Tracks terminating namespaces; returns the namespace a change makes due for a pass.
    fn note(change: &state::Change, terminating: &mut BTreeSet<String>) -> Option<String> {
        if change.storage() == "namespaces" {
            let name = change.object.name().to_string();
            if change.kind == state::EventType::Deleted || !change.object.terminating() {
                terminating.remove(&name);
                return None;
            }
            terminating.insert(name.clone());
            return Some(name);
        }
        terminating
            .contains(change.namespace())
            .then(|| change.namespace().to_string())
    }

    let Some(mut rx) = inner.upgrade().map(|i| i.state().tx.subscribe()) else {
        return;
    };
    let mut terminating = BTreeSet::new();
    loop {
        let mut due = BTreeSet::new();
        let mut rescan = false;
        match tokio::time::timeout(Duration::from_secs(1), rx.recv()).await {
            Ok(Ok(change)) => due.extend(note(&change, &mut terminating)),
            Ok(Err(RecvError::Closed)) => return,
            // Lagged, or a quiet second: look at every terminating namespace.
            Ok(Err(RecvError::Lagged(_))) | Err(_) => rescan = true,
        }
        // Take what else is queued, so a burst of deletions makes one pass.
        loop {
            match rx.try_recv() {
                Ok(change) => due.extend(note(&change, &mut terminating)),
                Err(TryRecvError::Lagged(_)) => rescan = true,
                Err(TryRecvError::Closed) => return,
                Err(TryRecvError::Empty) => break,
            }
        }
        let Some(inner) = inner.upgrade() else { return };
        if !inner
            .namespace_controller
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            continue;
        }
        let mut state = inner.state();
        if rescan {
            terminating = state.namespaces_to_finalize().into_iter().collect();
            due.extend(terminating.iter().cloned());
        }
        for ns in due {
            state.finalize_namespace(&ns);
        }
    }
}

/// An in-process Kubernetes API server over loopback HTTP. See the [module docs](self).
///
/// Dropping it stops the server and ends its watches.
pub struct ApiServer {
    inner: Arc<Inner>,
    addr: SocketAddr,
    client: kube::Client,
    task: tokio::task::JoinHandle<()>,
    namespace_task: tokio::task::JoinHandle<()>,
}

/// Events kept for watch replay before older versions answer `410 Gone`.
const HISTORY_CAPACITY: usize = 10_000;

impl ApiServer {
    /// Starts a server on `127.0.0.1:0`.
    ///
    /// # Panics
    ///
    /// If no loopback port can be bound (a broken test environment).
    #[allow(clippy::expect_used)] // test harness: a machine without loopback cannot run tests
    pub async fn start() -> ApiServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("ccm-testing ApiServer: binding 127.0.0.1:0");
        ApiServer::serve(listener)
            .await
            .expect("ccm-testing ApiServer: serving on a bound loopback port")
    }

    /// Serves on a listener the caller bound, e.g. a chosen port (the `ccm-apiserver` binary).
    ///
    /// # Errors
    ///
    /// If the listener's address cannot be read or no client can be built for it.
    pub async fn serve(listener: tokio::net::TcpListener) -> std::io::Result<ApiServer> {
        let addr = listener.local_addr()?;
        let url: axum::http::Uri = format!("http://{addr}")
            .parse()
            .map_err(std::io::Error::other)?;
        let client =
            kube::Client::try_from(kube::Config::new(url)).map_err(std::io::Error::other)?;
        let inner = Inner::new();
        let namespace_task = tokio::spawn(run_namespace_controller(Arc::downgrade(&inner)));
        let app = axum::Router::new()
            .fallback(http::handle)
            .with_state(inner.clone());
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "ccm-testing ApiServer stopped");
            }
        });
        tracing::debug!(%addr, "ccm-testing ApiServer listening");
        Ok(ApiServer {
            inner,
            addr,
            client,
            task,
            namespace_task,
        })
    }

    /// The base URL, e.g. `http://127.0.0.1:41234`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A `kube::Client` for this server (default namespace `default`).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        lock(&self.inner.requests).clone()
    }

    /// The requests received so far that `filter` matches, in order.
    pub fn requests_matching(&self, filter: &RequestFilter) -> Vec<RequestRecord> {
        lock(&self.inner.requests)
            .iter()
            .filter(|r| filter.matches(r))
            .cloned()
            .collect()
    }

    /// Whether the request log keeps request bodies ([`RequestRecord::body`]; on by
    /// default). A benchmark that sends many large objects may turn it off to keep the log
    /// small.
    pub fn set_record_bodies(&self, record: bool) {
        self.inner
            .record_bodies
            .store(record, std::sync::atomic::Ordering::SeqCst);
    }

    /// Turns RBAC authorisation of requests on (off by default). On, every request is
    /// checked against the Roles, ClusterRoles, RoleBindings and ClusterRoleBindings stored in
    /// the server (create them through the API, or with
    /// [`ApiServer::add_bootstrap_controller_roles`]), as kube-apiserver's RBAC authorizer
    /// does; a denied request is `403 Forbidden` with kube-apiserver's message. Requests
    /// without credentials are the cluster administrator (`system:admin` in
    /// `system:masters`) and are always allowed, as with an admin kubeconfig; every
    /// authenticated user may read discovery, `/version` and the health paths.
    pub fn enable_rbac(&self) {
        self.inner
            .rbac
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Stores the ClusterRoles and ClusterRoleBindings that kube-apiserver's bootstrap policy
    /// gives the controllers of a cloud-controller-manager run with
    /// `--use-service-account-credentials`: `system:controller:node-controller`,
    /// `system:controller:service-controller` and `system:controller:route-controller`, with
    /// the rules of `controller_policy.go`, each bound to the ServiceAccount of the same name
    /// in `kube-system` (the ServiceAccounts themselves are not created). Objects that exist
    /// already are left alone.
    pub fn add_bootstrap_controller_roles(&self) {
        let mut state = self.inner.state();
        for (plural, obj) in rbac::bootstrap_controller_policy() {
            let Some(info) = resources::RESOURCES.iter().find(|r| r.plural == plural) else {
                continue;
            };
            match state.create(info, None, obj, "kube-apiserver", false) {
                Ok(_) => {}
                Err(e) if e.code == 409 => {}
                Err(e) => tracing::error!(error = ?e, "storing a bootstrap RBAC object"),
            }
        }
    }

    /// Caps the lifetime of the tokens the TokenRequest API issues, as kube-apiserver's
    /// `--service-account-max-token-expiration` does (the answer's `expirationSeconds` and
    /// `expirationTimestamp` say the lifetime given). Unlike kube-apiserver, any cap is
    /// accepted, so a test can make tokens expire within seconds.
    pub fn set_max_token_expiration(&self, max: Option<Duration>) {
        *lock(&self.inner.max_token_expiration) = max;
    }

    /// Forgets the recorded requests.
    pub fn clear_requests(&self) {
        lock(&self.inner.requests).clear();
    }

    /// Answers the next `count` requests matching `verb` (`"get"`, `"list"`, `"watch"`,
    /// `"create"`, `"update"`, `"patch"`, `"delete"`, `"deletecollection"` or `"*"`) and
    /// `resource` (`"nodes"`, `"services/status"`, `"leases"`, or `"*"`) with `status`
    /// and a `Status` body whose reason matches the code (429 `TooManyRequests`, 409
    /// `Conflict`, 500 `InternalError`, ...). `retry_after` adds a `Retry-After` header
    /// (whole seconds, rounded up). Note that kube's client retries 429, 503 and 504 by itself.
    /// A `watch` failed with 410 is answered as kube-apiserver expires a watch: a 200 stream
    /// with one `ERROR` event carrying the `410 Expired` status.
    pub fn fail_next(
        &self,
        verb: &str,
        resource: &str,
        count: usize,
        status: u16,
        retry_after: Option<Duration>,
    ) {
        if count == 0 {
            return;
        }
        lock(&self.inner.faults).push(FailRule {
            verb: verb.to_string(),
            resource: resource.to_string(),
            remaining: count,
            status,
            retry_after,
        });
    }

    /// Turns random fault injection on with these rules (`None` turns it off; off by
    /// default). See [`ApiFaults`]. Rules added by [`ApiServer::fail_next`] are consulted first.
    pub fn set_faults(&self, faults: Option<ApiFaults>) {
        self.inner.api_faults.set(faults);
    }

    /// How many faults [`ApiServer::set_faults`] injected so far, by kind name (`500`, `429`,
    /// `409`, `410`, `hang`, `close`; see [`ApiFaultKind::name`]).
    pub fn fault_counts(&self) -> std::collections::BTreeMap<String, u64> {
        self.inner.api_faults.counts()
    }

    /// Delays every request by `latency` before it is handled (zero turns it off).
    pub fn set_latency(&self, latency: Duration) {
        *lock(&self.inner.latency) = latency;
    }

    /// Sets how often watches that allow bookmarks get a `BOOKMARK` (default 5 s;
    /// kube-apiserver sends one about every minute).
    pub fn set_bookmark_interval(&self, interval: Duration) {
        *lock(&self.inner.bookmark_interval) = interval.max(Duration::from_millis(10));
    }

    /// Turns the WatchList feature on (the default, as in recent kube-apiservers) or off. Off, a
    /// watch with `sendInitialEvents=true` is rejected with `422 Invalid`, as by a v1.33
    /// kube-apiserver whose `WatchList` feature gate is off; clients list in pages instead.
    pub fn set_watch_list(&self, enabled: bool) {
        self.inner
            .watch_list
            .store(enabled, std::sync::atomic::Ordering::SeqCst);
    }

    /// Ends every open watch stream (clients re-watch from their last resourceVersion).
    pub fn close_watches(&self) {
        self.inner.close_tx.send_modify(|g| *g += 1);
    }

    /// How many watch streams on `resource` are open (`"nodes"`, `"services"`,
    /// `"leases.coordination.k8s.io"`, ...; `"*"` for all). A stream its client abandoned
    /// counts until the server notices, at the next event or bookmark it tries to send.
    pub fn open_watches(&self, resource: &str) -> usize {
        let open = lock(&self.inner.open_watches);
        if resource == "*" {
            open.values().sum()
        } else {
            open.get(resource).copied().unwrap_or(0)
        }
    }

    /// Forgets the event history and list snapshots: a watch from any earlier
    /// resourceVersion, or a `continue` token issued before, now gets `410 Gone`.
    pub fn compact(&self) {
        self.inner.state().compact();
    }

    /// Registers a bearer token for `POST .../tokenreviews`: a TokenReview of `token` answers
    /// `authenticated: true` with `username` and `groups` (plus `system:authenticated`).
    /// Tokens not registered are not authenticated.
    pub fn add_token(&self, token: &str, username: &str, groups: &[&str]) {
        self.inner.reviews.add_token(token, username, groups);
    }

    /// Allows `verb` on the non-resource `path` (exact, or a prefix ending in `*`) to the user
    /// or group `user_or_group` in `POST .../subjectaccessreviews` (`verb` may be `*`).
    /// Everything not allowed by such a rule is denied.
    pub fn allow_non_resource(&self, user_or_group: &str, verb: &str, path: &str) {
        self.inner
            .reviews
            .allow_non_resource(user_or_group, verb, path);
    }

    /// Turns the built-in namespace controller on (the default) or off. On, it does what
    /// kube-controller-manager's namespace controller does in a cluster: shortly after a
    /// Namespace is deleted (it is then `Terminating`), it deletes the namespace's content,
    /// waits for objects held by finalizers, then removes the `kubernetes` finalizer through
    /// `PUT /api/v1/namespaces/<name>/finalize` (as `kube-controller-manager`), and the
    /// Namespace goes. Off, a deleted Namespace stays `Terminating` with its content until a
    /// client empties `spec.finalizers` through `/finalize`, as in a cluster without
    /// kube-controller-manager.
    pub fn set_namespace_controller(&self, enabled: bool) {
        self.inner
            .namespace_controller
            .store(enabled, std::sync::atomic::Ordering::SeqCst);
        if enabled {
            let mut state = self.inner.state();
            for ns in state.namespaces_to_finalize() {
                state.finalize_namespace(&ns);
            }
        }
    }

    /// The current (latest) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.inner.state().current_rv()
    }

    /// The oldest resourceVersion a watch may start from without `410 Gone`.
    pub fn oldest_watchable_version(&self) -> u64 {
        self.inner.state().compacted_rv()
    }
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("url", &self.url())
            .finish_non_exhaustive()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.close_watches();
        self.task.abort();
        self.namespace_task.abort();
    }
}

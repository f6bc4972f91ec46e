//! [`ApiServerBuilder`]: the in-process API server's behaviours beyond storing objects, each a
//! switch whose default is what kube-apiserver (with its default admission plugins) does.

use super::ApiServer;

/// Which admission and validation steps a write goes through. Every field defaults to on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Admission {
    /// TaintNodesByCondition's not-ready taint on Node create.
    pub(crate) not_ready_taint: bool,
    /// NamespaceLifecycle: the namespace must exist and not be terminating; the built-in
    /// namespaces cannot be deleted.
    pub(crate) namespace_lifecycle: bool,
    /// Validation (`422 Invalid`).
    pub(crate) validation: bool,
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            not_ready_taint: true,
            namespace_lifecycle: true,
            validation: true,
        }
    }
}

/// Builds an [`ApiServer`] with chosen behaviours; every default is kube-apiserver's, so
/// `ApiServer::builder().start()` is [`ApiServer::start`].
///
/// What the server adds beyond storing, and which of it is a switch (docs/testing.md has the
/// same table, "The harness's behaviours and their defaults"):
///
/// | behaviour | switch | default |
/// |---|---|---|
/// | TaintNodesByCondition: `node.kubernetes.io/not-ready:NoSchedule` on every created Node | [`not_ready_taint`](Self::not_ready_taint) | on |
/// | NamespaceLifecycle: no create in a missing or terminating namespace, no delete of `default`, `kube-system`, `kube-public` | [`namespace_lifecycle`](Self::namespace_lifecycle) | on |
/// | validation: `422 Invalid` with field causes | [`validation`](Self::validation) | on |
/// | the namespace controller (empties and finalizes a deleted Namespace) | [`namespace_controller`](Self::namespace_controller) | on |
/// | RBAC authorisation | [`rbac`](Self::rbac) | off (no policy is stored) |
/// | defaulting (Service clusterIP, node ports, policies, `ipMode`; Secret `type`; Namespace label and finalizer; Node pod CIDRs kept in step) | none: the objects a controller reads always carry them | always |
/// | generated names (`generateName`), uid, `creationTimestamp`, `resourceVersion`, `generation`, `managedFields` | none: the storage contract | always |
/// | finalizers: delete sets `deletionTimestamp`, the last finalizer's removal deletes | none: the contract controllers rely on | always |
/// | status subresource split (`spec` vs `status` writes) | none | always |
///
/// ```
/// use ccm_testing::apiserver::ApiServer;
/// use k8s_openapi::api::core::v1::Node;
/// use kube::api::{Api, PostParams};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // A bare API, as Go's fake clientset models it: Nodes are stored as sent.
/// let server = ApiServer::builder().not_ready_taint(false).start().await;
/// let nodes: Api<Node> = Api::all(server.client());
/// let node = nodes
///     .create(&PostParams::default(), &ccm_testing::builders::kubelet_node("n1").build())
///     .await
///     .unwrap();
/// let taints = node.spec.unwrap().taints.unwrap_or_default();
/// assert!(taints.iter().all(|t| t.key != "node.kubernetes.io/not-ready"));
/// # }
/// ```
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct ApiServerBuilder {
    admission: Admission,
    namespace_controller: Option<bool>,
    rbac: bool,
    watch_list: Option<bool>,
}

impl ApiServerBuilder {
    /// TaintNodesByCondition (default on, as kube-apiserver): every created Node gets
    /// `node.kubernetes.io/not-ready:NoSchedule` unless it has a taint with that key and
    /// effect. Off, Nodes are stored as sent (Go's fake clientset).
    pub fn not_ready_taint(mut self, on: bool) -> Self {
        self.admission.not_ready_taint = on;
        self
    }

    /// NamespaceLifecycle (default on, as kube-apiserver): a create in a missing namespace is
    /// `404`, in a terminating one `403`, and `default`, `kube-system` and `kube-public` cannot
    /// be deleted. Off, namespaced objects are stored whether their namespace exists or not.
    pub fn namespace_lifecycle(mut self, on: bool) -> Self {
        self.admission.namespace_lifecycle = on;
        self
    }

    /// Validation (default on, as kube-apiserver): an invalid object (name, labels, taints,
    /// Service ports, immutable fields, ... in the [module docs](super)) is refused with
    /// `422 Invalid`. Off, it is stored, so a test can give a controller a malformed object
    /// that a real cluster would have refused (defaulting still happens).
    pub fn validation(mut self, on: bool) -> Self {
        self.admission.validation = on;
        self
    }

    /// The built-in namespace controller (default on, as in a cluster with
    /// kube-controller-manager); see [`ApiServer::set_namespace_controller`].
    pub fn namespace_controller(mut self, on: bool) -> Self {
        self.namespace_controller = Some(on);
        self
    }

    /// RBAC authorisation (default off: the server stores no policy to check against); see
    /// [`ApiServer::enable_rbac`].
    pub fn rbac(mut self, on: bool) -> Self {
        self.rbac = on;
        self
    }

    /// The WatchList feature (default on, as in recent kube-apiservers): a watch may ask
    /// for `sendInitialEvents=true` (the initial list streamed as events). Off, such a watch is
    /// refused with `422 Invalid`, as by a kube-apiserver whose `WatchList` feature gate is off, so
    /// clients list in pages; see
    /// [`ApiServer::set_watch_list`].
    pub fn watch_list(mut self, on: bool) -> Self {
        self.watch_list = Some(on);
        self
    }

    /// Starts the server on `127.0.0.1:0`, as [`ApiServer::start`].
    ///
    /// # Panics
    ///
    /// If no loopback port can be bound (a broken test environment).
    pub async fn start(self) -> ApiServer {
        self.apply(ApiServer::start().await)
    }

    /// Serves on a listener the caller bound, as [`ApiServer::serve`].
    ///
    /// # Errors
    ///
    /// If the listener's address cannot be read or no client can be built for it.
    pub async fn serve(self, listener: tokio::net::TcpListener) -> std::io::Result<ApiServer> {
        Ok(self.apply(ApiServer::serve(listener).await?))
    }

    /// Sets the behaviours on a server nobody has the address of yet.
    fn apply(self, server: ApiServer) -> ApiServer {
        server.inner.state().admission = self.admission;
        if let Some(on) = self.namespace_controller {
            server.set_namespace_controller(on);
        }
        if self.rbac {
            server.enable_rbac();
        }
        if let Some(on) = self.watch_list {
            server.set_watch_list(on);
        }
        server
    }
}

impl ApiServer {
    /// A builder for a server with chosen behaviours ([`ApiServerBuilder`]); its defaults are
    /// kube-apiserver's, those of [`ApiServer::start`].
    pub fn builder() -> ApiServerBuilder {
        ApiServerBuilder::default()
    }
}

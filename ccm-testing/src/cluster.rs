//! `TestCluster`: the in-process API server, or a real cluster named by `CCM_TEST_KUBECONFIG`.

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Resource, ResourceExt};
use rand::Rng;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::apiserver::{ApiServer, ApiServerBuilder};
use crate::shared_lock::{ClusterLock, LockMode};

/// The environment variable naming a kubeconfig of a real cluster to test against.
pub const KUBECONFIG_ENV: &str = "CCM_TEST_KUBECONFIG";

/// A tag unique to this process (so parallel test runs against one real cluster don't collide).
static PROCESS_TAG: LazyLock<String> = LazyLock::new(|| {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| CHARS[rng.random_range(0..CHARS.len())] as char)
        .collect()
});

static COUNTER: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, Clone)]
struct Created {
    resource: ApiResource,
    namespace: Option<String>,
    name: String,
}

/// One API for tests: an in-process [`ApiServer`], or the real cluster of the kubeconfig named
/// by `$CCM_TEST_KUBECONFIG`.
///
/// Tests written against it must work both ways: give objects [`unique_name`](Self::unique_name)s,
/// create them with [`create`](Self::create), call [`cleanup`](Self::cleanup) at the end, and
/// never assume the cluster is empty.
pub struct TestCluster {
    client: kube::Client,
    server: Option<ApiServer>,
    /// The kubeconfig path of a real cluster (for the cleanup on drop).
    kubeconfig: Option<String>,
    created: Mutex<Vec<Created>>,
    /// On a real cluster: the shared or exclusive hold on it, released on drop (after the
    /// cleanup of what is left).
    lock: Option<ClusterLock>,
}

impl Debug for TestCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCluster")
            .field("server", &self.server)
            .field("real", &self.is_real())
            .field("lock", &self.lock)
            .finish_non_exhaustive()
    }
}

impl TestCluster {
    /// Starts an in-process API server, or connects to the cluster of `$CCM_TEST_KUBECONFIG`.
    ///
    /// # Panics
    ///
    /// If `$CCM_TEST_KUBECONFIG` is set but the kubeconfig cannot be read or used (the message
    /// names the path and the error).
    pub async fn start() -> TestCluster {
        TestCluster::start_with(ApiServer::builder()).await
    }

    /// As [`start`](Self::start), with an in-process server of chosen behaviours (e.g.
    /// `ApiServer::builder().not_ready_taint(false)`, docs/testing.md lists them). A real
    /// cluster (`$CCM_TEST_KUBECONFIG`) keeps its own admission: a test whose assertion
    /// depends on a behaviour turned off checks [`is_real`](Self::is_real) and skips that part.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub async fn start_with(server: ApiServerBuilder) -> TestCluster {
        TestCluster::start_as(server, LockMode::Shared).await
    }

    /// As [`start`](Self::start), for a test whose assertion depends on the whole cluster,
    /// e.g. on every Node in it (the service controller puts every eligible Node of the
    /// cluster into each load balancer, so a test counting load-balancer updates sees other
    /// tests' Nodes join). In-process, every test has its own server and this is `start()`.
    /// On a real cluster it waits until no other `TestCluster` of any test process on this
    /// machine uses that cluster, and keeps them out until it drops: every `TestCluster` on
    /// a real cluster holds a shared lock, this one an exclusive lock (a file lock in the
    /// temp directory, named after the cluster's URL; writers go first, so it does not
    /// starve). Test processes on other machines are not covered.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start), or when the lock file cannot be opened or locked.
    pub async fn start_exclusive() -> TestCluster {
        TestCluster::start_as(ApiServer::builder(), LockMode::Exclusive).await
    }

    async fn start_as(server: ApiServerBuilder, mode: LockMode) -> TestCluster {
        match std::env::var(KUBECONFIG_ENV) {
            Ok(path) if !path.is_empty() => TestCluster::real(&path, mode).await,
            _ => {
                let server = server.start().await;
                TestCluster {
                    client: server.client(),
                    server: Some(server),
                    kubeconfig: None,
                    created: Mutex::new(Vec::new()),
                    lock: None,
                }
            }
        }
    }

    /// Uses the (real) cluster of the kubeconfig at `path`, as [`start`](Self::start) does when
    /// `$CCM_TEST_KUBECONFIG` is set (with its shared lock).
    ///
    /// # Panics
    ///
    /// If the kubeconfig cannot be read or used (the message names the path and the error).
    pub async fn from_kubeconfig(path: &str) -> TestCluster {
        TestCluster::real(path, LockMode::Shared).await
    }

    #[allow(clippy::panic)] // test harness: a broken test setup must stop the test loudly
    async fn real(path: &str, mode: LockMode) -> TestCluster {
        let (client, url) = match real_client(path).await {
            Ok(c) => c,
            Err(e) => panic!("kubeconfig {path}: {e}"),
        };
        let lock = match ClusterLock::acquire(&url, mode).await {
            Ok(lock) => lock,
            Err(e) => panic!("TestCluster: locking the cluster {url}: {e}"),
        };
        TestCluster {
            client,
            server: None,
            kubeconfig: Some(path.to_string()),
            created: Mutex::new(Vec::new()),
            lock: Some(lock),
        }
    }

    /// A client for the cluster.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// True when running against a real cluster.
    pub fn is_real(&self) -> bool {
        self.server.is_none()
    }

    /// The in-process server (for fault injection and the request log); `None` on a real
    /// cluster, so tests that need it should skip there.
    pub fn api_server(&self) -> Option<&ApiServer> {
        self.server.as_ref()
    }

    /// A DNS-1123 label `<prefix>-<process tag><counter>`, unique per call and per process.
    /// The prefix is lower-cased, other characters become `-`, and it is cut so the name fits
    /// 63 characters.
    pub fn unique_name(&self, prefix: &str) -> String {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let suffix = format!("{}{n}", *PROCESS_TAG);
        let mut p: String = prefix
            .to_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        p.truncate(62 - suffix.len());
        let p = p.trim_matches('-');
        if p.is_empty() || !p.starts_with(|c: char| c.is_ascii_lowercase()) {
            format!("x{}{}-{suffix}", if p.is_empty() { "" } else { "-" }, p)
                .chars()
                .take(63)
                .collect()
        } else {
            format!("{p}-{suffix}")
        }
    }

    /// Creates `obj` (in its `metadata.namespace`, if namespaced), remembers it for
    /// [`cleanup`](Self::cleanup), and returns it as the server stored it.
    ///
    /// # Panics
    ///
    /// If the server rejects it (the message shows the API error).
    #[allow(clippy::panic)] // test harness: a failed setup step must stop the test loudly
    pub async fn create<K>(&self, obj: &K) -> K
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug,
    {
        let ar = ApiResource::erase::<K>(&());
        let ns = obj.meta().namespace.clone();
        let api = dynamic_api(&self.client, &ar, ns.as_deref());
        let dynamic: DynamicObject =
            match serde_json::to_value(obj).and_then(serde_json::from_value) {
                Ok(d) => d,
                Err(e) => panic!("TestCluster::create: {} is not serializable: {e}", ar.kind),
            };
        let created = match api.create(&PostParams::default(), &dynamic).await {
            Ok(c) => c,
            Err(e) => panic!(
                "TestCluster::create {} {:?}: {e}",
                ar.kind,
                obj.meta().name.as_deref().unwrap_or_default()
            ),
        };
        let name = created.name_any();
        crate::apiserver::lock_ignoring_poison(&self.created).push(Created {
            resource: ar.clone(),
            namespace: ns,
            name: name.clone(),
        });
        match serde_json::to_value(&created).and_then(serde_json::from_value) {
            Ok(k) => k,
            Err(e) => panic!(
                "TestCluster::create: the created {} {name:?} did not parse: {e}",
                ar.kind
            ),
        }
    }

    /// Creates a fresh namespace (`ccm-test-<unique>`), removed again by
    /// [`cleanup`](Self::cleanup).
    pub async fn namespace(&self) -> String {
        let name = self.unique_name("ccm-test");
        let ns = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        self.create(&ns).await;
        name
    }

    /// Deletes everything [`create`](Self::create) made, newest first, removing finalizers
    /// first so nothing waits for a controller. Errors (e.g. already gone) are logged, not
    /// raised.
    pub async fn cleanup(&self) {
        let created: Vec<Created> =
            std::mem::take(&mut *crate::apiserver::lock_ignoring_poison(&self.created));
        delete_all(&self.client, created).await;
    }
}

/// On a real cluster, whatever a test created and did not clean up (e.g. because it panicked)
/// is deleted when the `TestCluster` drops, from a helper thread with its own runtime (the
/// test's runtime may be shutting down). In-process servers simply go away.
impl Drop for TestCluster {
    fn drop(&mut self) {
        let created: Vec<Created> =
            std::mem::take(&mut *crate::apiserver::lock_ignoring_poison(&self.created));
        let Some(path) = self.kubeconfig.clone() else {
            return;
        };
        if created.is_empty() {
            return;
        }
        let cleaner = std::thread::spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::warn!(error = %e, "TestCluster drop: no runtime for cleanup");
                    return;
                }
            };
            rt.block_on(async move {
                match real_client(&path).await {
                    Ok((client, _)) => delete_all(&client, created).await,
                    Err(e) => tracing::warn!(error = %e, "TestCluster drop: no client for cleanup"),
                }
            });
        });
        if cleaner.join().is_err() {
            tracing::warn!("TestCluster drop: the cleanup thread panicked");
        }
        // `self.lock` is released after this cleanup: fields drop after `drop` returns.
    }
}

/// Deletes the objects, newest first, removing finalizers first.
async fn delete_all(client: &kube::Client, created: Vec<Created>) {
    for c in created.into_iter().rev() {
        let api = dynamic_api(client, &c.resource, c.namespace.as_deref());
        let unfinalize = Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}}));
        match api
            .patch(&c.name, &PatchParams::default(), &unfinalize)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => continue,
            Err(e) => {
                tracing::warn!(kind = %c.resource.kind, name = %c.name, error = %e, "cleanup: removing finalizers")
            }
        }
        match api.delete(&c.name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                tracing::warn!(kind = %c.resource.kind, name = %c.name, error = %e, "cleanup: deleting")
            }
        }
    }
}

fn dynamic_api(client: &kube::Client, ar: &ApiResource, ns: Option<&str>) -> Api<DynamicObject> {
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
        None => Api::all_with(client.clone(), ar),
    }
}

/// A client for the kubeconfig at `path`, and the cluster's URL.
async fn real_client(
    path: &str,
) -> Result<(kube::Client, String), Box<dyn std::error::Error + Send + Sync>> {
    let kubeconfig = Kubeconfig::read_from(path)?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let url = config.cluster_url.to_string();
    Ok((kube::Client::try_from(config)?, url))
}

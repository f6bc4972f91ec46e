//! Waiting for conditions, with failure messages that show the last object seen.

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeAddress};
use kube::Api;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// How often the waiters poll.
const POLL: Duration = Duration::from_millis(50);

/// A wait that did not succeed in time.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    /// The timeout passed; `last` is the last object seen (YAML), `last_error` the last API
    /// error (e.g. 404 while the object did not exist yet).
    #[error(
        "timed out after {timeout:?} waiting for {what}; last seen: {}{}",
        last.as_deref().map_or_else(|| "nothing".to_string(), |y| format!("\n{y}")),
        last_error.as_deref().map_or_else(String::new, |e| format!("\nlast error: {e}"))
    )]
    Timeout {
        /// What was waited for, e.g. `Node "n1" to match the predicate`.
        what: String,
        /// The timeout.
        timeout: Duration,
        /// The last object seen, as YAML.
        last: Option<String>,
        /// The last error the API answered, if any.
        last_error: Option<String>,
    },
}

fn yaml<K: Serialize>(obj: &K) -> String {
    serde_norway::to_string(obj).unwrap_or_else(|e| format!("<not serializable: {e}>"))
}

/// Polls `api.get(name)` until `pred` holds, and returns that object. Fails after `timeout`
/// with a [`WaitError`] whose message shows the last object seen.
pub async fn wait_for<K>(
    api: &Api<K>,
    name: &str,
    timeout: Duration,
    pred: impl Fn(&K) -> bool,
) -> Result<K, WaitError>
where
    K: Clone + DeserializeOwned + Serialize + Debug,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last: Option<K> = None;
    let mut last_error: Option<String>;
    loop {
        match api.get(name).await {
            Ok(obj) => {
                if pred(&obj) {
                    return Ok(obj);
                }
                last = Some(obj);
                last_error = None;
            }
            Err(e) => last_error = Some(e.to_string()),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(WaitError::Timeout {
                what: format!("{name:?} to match the predicate"),
                timeout,
                last: last.as_ref().map(yaml),
                last_error,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Polls until `api.get(name)` answers 404.
pub async fn wait_for_deletion<K>(
    api: &Api<K>,
    name: &str,
    timeout: Duration,
) -> Result<(), WaitError>
where
    K: Clone + DeserializeOwned + Serialize + Debug,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last: Option<K> = None;
    let mut last_error = None;
    loop {
        match api.get(name).await {
            Ok(obj) => last = Some(obj),
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => last_error = Some(e.to_string()),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(WaitError::Timeout {
                what: format!("{name:?} to be deleted"),
                timeout,
                last: last.as_ref().map(yaml),
                last_error,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Polls `cond` until it returns true (then true) or `timeout` passes (then false).
pub async fn eventually<F, Fut>(timeout: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if cond().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Polls until Node `name` reports an address of each of `types` (e.g. `&["InternalIP"]`),
/// and returns all its addresses. Kubelet with `--cloud-provider=external` registers a Node
/// with its hostname only (and the `alpha.kubernetes.io/provided-node-ip` annotation); the
/// cloud-node controller sets the cloud's addresses when it initialises the Node, and again on
/// every address refresh (`--node-status-update-frequency`), so this is how a test waits for
/// either.
pub async fn wait_for_node_addresses(
    nodes: &Api<Node>,
    name: &str,
    types: &[&str],
    timeout: Duration,
) -> Result<Vec<NodeAddress>, WaitError> {
    let has_all = |node: &Node| {
        let addresses = node_addresses(node);
        types
            .iter()
            .all(|t| addresses.iter().any(|a| a.type_ == *t))
    };
    wait_for(nodes, name, timeout, has_all)
        .await
        .map(|node| node_addresses(&node))
}

fn node_addresses(node: &Node) -> Vec<NodeAddress> {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.clone())
        .unwrap_or_default()
}

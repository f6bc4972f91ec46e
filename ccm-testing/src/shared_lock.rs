//! A readers-writer lock on a real test cluster, across the test processes of one machine:
//! every [`TestCluster`](crate::TestCluster) on a real cluster holds it shared, one whose
//! test depends on the whole cluster (`TestCluster::start_exclusive`) holds it exclusive.
//!
//! Two files in the temp directory, named after the cluster's URL, locked with `flock` (std's
//! `File::lock`/`lock_shared`; the kernel releases them when a process dies, so a crashed
//! test run leaves nothing held): `<name>.lock` is the lock itself, `<name>.gate` a turnstile
//! every taker passes through exclusively, so that a waiting writer keeps new readers out
//! and is not starved by a steady stream of them (flock alone gives no writer preference).
//! Hand-written over a crate: the dozen lines are std calls, and the turnstile is the part
//! a crate would not give.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::PathBuf;

/// How a [`ClusterLock`] holds the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockMode {
    /// With every other shared holder.
    Shared,
    /// Alone.
    Exclusive,
}

/// A held lock on one cluster; released on drop (the file closes).
#[derive(Debug)]
pub(crate) struct ClusterLock {
    _file: File,
}

impl ClusterLock {
    /// Waits (on a blocking thread) until the cluster at `url` can be held in `mode`.
    pub(crate) async fn acquire(url: &str, mode: LockMode) -> io::Result<ClusterLock> {
        let base = lock_path(url);
        tokio::task::spawn_blocking(move || {
            let open = |ext: &str| {
                OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(base.with_extension(ext))
            };
            let gate = open("gate")?;
            let file = open("lock")?;
            gate.lock()?;
            if mode == LockMode::Shared {
                file.lock_shared()?;
            } else {
                tracing::info!(
                    path = %base.display(),
                    "TestCluster: waiting for the other tests on this cluster to finish"
                );
                file.lock()?;
            }
            drop(gate);
            Ok(ClusterLock { _file: file })
        })
        .await
        .map_err(io::Error::other)?
    }
}

/// `<temp>/ccm-test-cluster-<url with every other character than [a-z0-9] as '-'>`.
fn lock_path(url: &str) -> PathBuf {
    let name: String = url
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    std::env::temp_dir().join(format!("ccm-test-cluster-{}", name.trim_matches('-')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_file_is_named_after_the_url() {
        let path = lock_path("https://127.0.0.1:6443/");
        assert!(path.ends_with("ccm-test-cluster-https---127-0-0-1-6443"));
    }

    /// Whether `task` finishes within a while (it must not while the lock is held; a broken
    /// lock lets it finish at once, so this can only fail for a broken lock).
    async fn finishes_soon(task: &mut tokio::task::JoinHandle<ClusterLock>) -> bool {
        tokio::time::timeout(std::time::Duration::from_millis(300), task)
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn shared_holders_share_an_exclusive_one_waits_and_goes_before_new_readers() {
        let url = format!("test://lock-{}", uuid::Uuid::new_v4());
        let first = ClusterLock::acquire(&url, LockMode::Shared).await.unwrap();
        let second = ClusterLock::acquire(&url, LockMode::Shared).await.unwrap();
        let u = url.clone();
        let mut writer =
            tokio::spawn(
                async move { ClusterLock::acquire(&u, LockMode::Exclusive).await.unwrap() },
            );
        assert!(
            !finishes_soon(&mut writer).await,
            "exclusive while shared held"
        );
        // A reader arriving while the writer waits queues behind it.
        let u = url.clone();
        let mut reader =
            tokio::spawn(async move { ClusterLock::acquire(&u, LockMode::Shared).await.unwrap() });
        assert!(
            !finishes_soon(&mut reader).await,
            "a new reader passed a waiting writer"
        );
        drop(first);
        assert!(
            !finishes_soon(&mut writer).await,
            "exclusive while one shared holder is left"
        );
        drop(second);
        let held = writer.await.unwrap();
        assert!(
            !finishes_soon(&mut reader).await,
            "shared while exclusive held"
        );
        drop(held);
        reader.await.unwrap();
    }
}

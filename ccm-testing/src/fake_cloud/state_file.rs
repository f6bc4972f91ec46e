//! The optional state file of [`FakeCloud`](super::FakeCloud) (`state_file:` in the config): its
//! load balancers and routes as JSON, so the cloud outlives the process and can be listed from
//! outside.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use ccm_core::NodeAddress;
use serde::{Deserialize, Serialize};

use super::LoadBalancerState;

/// What a [`FakeCloud`](super::FakeCloud) holds: its load balancers and routes. The content of
/// its state file, and what [`FakeCloud::state`](super::FakeCloud::state) returns.
///
/// Read a state file from a test or a tool with [`FakeCloudState::load`]; from a shell it is
/// plain JSON (`jq '.load_balancers | keys' state.json` lists the load balancers).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FakeCloudState {
    /// The load balancers, keyed by `<namespace>/<name>` of the Service.
    pub load_balancers: BTreeMap<String, LoadBalancerState>,
    /// The route table, in route-name order.
    pub routes: Vec<RouteState>,
}

/// A route as the fake cloud stores it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouteState {
    /// The route's name.
    pub name: String,
    /// The cluster that created it (`None` for a route seeded with
    /// [`FakeCloud::insert_route`](super::FakeCloud::insert_route), listed for every cluster).
    pub cluster_name: Option<String>,
    /// The target Node's name.
    pub target_node: String,
    /// The destination (pod) CIDR.
    pub destination_cidr: String,
    /// The Node's addresses when the route was created.
    pub target_node_addresses: Vec<NodeAddress>,
    /// Whether the route is a blackhole.
    pub blackhole: bool,
    /// Whether the route tracks `target_node_addresses` (as stored; `track_node_addresses`
    /// applies on top in `list_routes`).
    pub enable_node_addresses: bool,
}

/// Why a state file cannot be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateFileError {
    /// The file exists but cannot be read, or cannot be written.
    #[error("fake cloud state file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a fake cloud state (JSON of [`FakeCloudState`]).
    #[error("fake cloud state file {path} is not a fake cloud state: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The JSON error.
        source: serde_json::Error,
    },
}

impl FakeCloudState {
    /// Reads a state file. A file that does not exist is an empty state (a cloud that has not
    /// made anything yet).
    pub fn load(path: impl AsRef<Path>) -> Result<Self, StateFileError> {
        let path = path.as_ref();
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(source) => {
                return Err(StateFileError::Io {
                    path: path.to_owned(),
                    source,
                });
            }
        };
        serde_json::from_slice(&bytes).map_err(|source| StateFileError::Parse {
            path: path.to_owned(),
            source,
        })
    }

    /// Writes the state atomically: to a temporary file in the same directory, flushed to
    /// disk, then renamed over `path`, so a reader (or a process killed mid-write) sees the old
    /// or the new state, never half of one.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), StateFileError> {
        static SEQUENCE: AtomicU64 = AtomicU64::new(0);
        let path = path.as_ref();
        let io = |source| StateFileError::Io {
            path: path.to_owned(),
            source,
        };
        let file_name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "fake-cloud-state".into());
        let tmp = path.with_file_name(format!(
            ".{file_name}.tmp-{}-{}",
            std::process::id(),
            SEQUENCE.fetch_add(1, Ordering::Relaxed)
        ));
        let json = serde_json::to_vec_pretty(self).map_err(|source| StateFileError::Parse {
            path: path.to_owned(),
            source,
        })?;
        let written = std::fs::File::create(&tmp).and_then(|mut file| {
            file.write_all(&json)?;
            file.write_all(b"\n")?;
            file.sync_all()
        });
        if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(io(e));
        }
        Ok(())
    }
}

//! The object store: one global resourceVersion counter, objects per resource as JSON, a
//! bounded event history for watch replay, and a broadcast channel for live watches.
//!
//! The store's types and the helpers every operation uses live here; the operations are split
//! by verb: [`list_watch`] (GET, LIST, WATCH), [`create`] (POST), [`update`] (PUT, PATCH),
//! [`delete`] (DELETE, DELETE on a collection), and [`namespaces`] (the Namespace lifecycle:
//! admission into a terminating namespace and the namespace controller's finalization).

mod create;
mod delete;
mod list_watch;
mod namespaces;
mod update;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use super::patch::ManagedFields;
use super::resources::{RESOURCES, ResourceInfo};
use super::selector::{FieldSelector, LabelSelector};
use super::status::{ApiError, FieldError};
use super::validation;

pub(crate) use list_watch::{change_kind, filter_change, too_large};

/// Watch event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as stored in the history and broadcast to watches (storage representation).
#[derive(Debug)]
pub(crate) struct Change {
    pub(crate) rv: u64,
    pub(crate) storage: &'static str,
    pub(crate) namespace: String,
    pub(crate) kind: EventType,
    pub(crate) object: Value,
    /// The object before the change (for MODIFIED), to compute selector transitions.
    pub(crate) old: Option<Value>,
    /// The object as every watch of a resource whose representation is the stored one sees
    /// it, serialized once for all of them (watch fan-out was the API server's largest cost
    /// in the node-burst benchmark).
    pub(crate) encoded: std::sync::OnceLock<String>,
}

impl Change {
    /// The JSON text of the object as presented to watches of `info`, cached when `info`
    /// presents the stored representation unchanged (every resource but events.k8s.io).
    pub(crate) fn encoded_for(&self, info: &ResourceInfo) -> Option<&str> {
        if !info.presents_storage() {
            return None;
        }
        let text = self
            .encoded
            .get_or_init(|| with_type_meta(info, self.object.clone()).to_string());
        Some(text)
    }
}

#[derive(Debug, Clone)]
struct Stored {
    obj: Value,
    managed: ManagedFields,
}

type Key = (String, String);

/// A snapshot kept for `continue` tokens.
#[derive(Debug)]
struct Snapshot {
    rv: u64,
    items: Arc<Vec<Value>>,
}

/// The type of a PATCH request, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// JSON merge patch (`application/merge-patch+json`).
    Merge,
    /// JSON patch (`application/json-patch+json`).
    Json,
    /// Strategic merge patch (`application/strategic-merge-patch+json`).
    Strategic,
    /// Server-side apply (`application/apply-patch+yaml`).
    Apply,
}

/// Parameters of a list or watch.
#[derive(Debug, Default)]
pub(crate) struct ListOptions {
    pub(crate) labels: LabelSelector,
    pub(crate) fields: FieldSelector,
    pub(crate) limit: Option<usize>,
    pub(crate) continue_token: Option<String>,
    /// `resourceVersionMatch=Exact`: list the state as it was at this version.
    pub(crate) exact_version: Option<u64>,
}

/// What a write returns: the object (resource representation) and whether it was created.
#[derive(Debug)]
pub(crate) struct WriteResult {
    pub(crate) object: Value,
    pub(crate) created: bool,
}

/// What a watch starts with: initial events, the live receiver, the resourceVersion at start.
pub(crate) type WatchStart = (
    Vec<(EventType, Value, u64)>,
    broadcast::Receiver<Arc<Change>>,
    u64,
);

/// The whole mutable state, behind one mutex.
#[derive(Debug)]
pub(crate) struct State {
    rv: u64,
    stores: BTreeMap<&'static str, BTreeMap<Key, Stored>>,
    history: VecDeque<Arc<Change>>,
    history_capacity: usize,
    /// Watches may start at any resourceVersion >= this one.
    compacted_rv: u64,
    snapshots: HashMap<u64, Snapshot>,
    next_snapshot: u64,
    next_cluster_ip: u32,
    next_node_port: i64,
    pub(crate) tx: broadcast::Sender<Arc<Change>>,
    /// Which admission and validation steps writes go through ([`super::ApiServerBuilder`]).
    pub(crate) admission: super::builder::Admission,
}

fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map_or_else(
            |_| jiff::Timestamp::now().to_string(),
            |t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        )
}

fn meta(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    match obj.get_mut("metadata").and_then(Value::as_object_mut) {
        Some(m) => m,
        None => unreachable!("metadata was just made an object"),
    }
}

fn meta_str<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    meta(obj).and_then(|m| m.get(key)).and_then(Value::as_str)
}

/// The strings of the array at `pointer` (none when it is missing or not an array).
pub(crate) fn strings_at(obj: &Value, pointer: &str) -> Vec<String> {
    obj.pointer(pointer)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn finalizers(obj: &Value) -> Vec<String> {
    strings_at(obj, "/metadata/finalizers")
}

fn set_rv(obj: &mut Value, rv: u64) {
    meta_mut(obj).insert("resourceVersion".into(), json!(rv.to_string()));
}

/// Compares two objects ignoring `metadata.resourceVersion` and `metadata.managedFields`.
fn same_content(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
            m.remove("managedFields");
            for k in ["labels", "annotations", "finalizers"] {
                let empty = m.get(k).is_some_and(|x| {
                    x.as_object().is_some_and(Map::is_empty)
                        || x.as_array().is_some_and(Vec::is_empty)
                });
                if empty {
                    m.remove(k);
                }
            }
        }
        v
    };
    strip(a) == strip(b)
}

impl State {
    pub(crate) fn new(history_capacity: usize) -> Self {
        let (tx, _) = broadcast::channel(65_536);
        let mut s = State {
            rv: 1,
            stores: BTreeMap::new(),
            history: VecDeque::new(),
            history_capacity,
            compacted_rv: 0,
            snapshots: HashMap::new(),
            next_snapshot: 1,
            next_cluster_ip: 10,
            next_node_port: 30_000,
            tx,
            admission: super::builder::Admission::default(),
        };
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            if let Some(info) = RESOURCES.iter().find(|r| r.plural == "namespaces") {
                let obj = json!({"metadata": {"name": ns}});
                if let Err(e) = s.create(info, None, obj, "kube-apiserver", false) {
                    tracing::error!(error = ?e, "creating built-in namespace");
                }
            }
        }
        s
    }

    /// Every stored object of one storage (`"clusterroles"`, ...), in the stored form.
    pub(crate) fn stored_objects(&self, storage: &str) -> impl Iterator<Item = &Value> {
        self.stores
            .get(storage)
            .into_iter()
            .flat_map(|s| s.values().map(|v| &v.obj))
    }

    pub(crate) fn current_rv(&self) -> u64 {
        self.rv
    }

    /// Drops the whole event history and every list snapshot: watches and `continue` tokens
    /// from before now get `410 Gone`.
    pub(crate) fn compact(&mut self) {
        self.history.clear();
        self.compacted_rv = self.rv;
        self.snapshots.clear();
    }

    fn store(&mut self, info: &ResourceInfo) -> &mut BTreeMap<Key, Stored> {
        self.stores.entry(info.storage).or_default()
    }

    fn emit(&mut self, change: Change) {
        let change = Arc::new(change);
        self.history.push_back(change.clone());
        while self.history.len() > self.history_capacity {
            if let Some(old) = self.history.pop_front() {
                self.compacted_rv = old.rv;
            }
        }
        // No receivers is fine.
        let _ = self.tx.send(change);
    }

    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }
}

fn check_type_meta(info: &ResourceInfo, obj: &Value) -> Result<(), ApiError> {
    if let Some(kind) = obj.get("kind").and_then(Value::as_str)
        && !kind.is_empty()
        && kind != info.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            info.kind
        )));
    }
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str)
        && !av.is_empty()
        && av != info.api_version()
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({})",
            info.api_version()
        )));
    }
    Ok(())
}

/// Sets `kind` and `apiVersion` of a single object in a response.
pub(crate) fn with_type_meta(info: &ResourceInfo, mut obj: Value) -> Value {
    if let Some(o) = obj.as_object_mut() {
        o.insert("kind".into(), json!(info.kind));
        o.insert("apiVersion".into(), json!(info.api_version()));
    }
    obj
}

fn validate(info: &ResourceInfo, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = validation::validate_meta(info, obj);
    match info.storage {
        "nodes" => {
            errs.extend(validation::validate_pod_cidrs(obj));
            errs.extend(validation::validate_node(obj));
            if let Some(old) = old {
                errs.extend(validation::validate_node_update(obj, old));
            }
        }
        "services" => {
            errs.extend(validation::validate_service(obj));
            errs.extend(validation::validate_service_status(obj));
            if let Some(old) = old {
                errs.extend(validation::validate_service_update(obj, old));
            }
        }
        "leases" => errs.extend(validation::validate_lease(obj)),
        "events" => errs.extend(validation::validate_event(
            obj,
            info.group == "events.k8s.io",
        )),
        _ => {}
    }
    errs
}

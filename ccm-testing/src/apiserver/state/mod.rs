//! The object store: one global resourceVersion counter, objects per resource as shared JSON
//! texts ([`object`]), a bounded event history for watch replay, and a broadcast channel for
//! live watches.
//!
//! The store's types and the helpers every operation uses live here; the operations are split
//! by verb: [`list_watch`] (GET, LIST, WATCH), [`create`] (POST), [`update`] (PUT, PATCH),
//! [`delete`] (DELETE, DELETE on a collection), and [`namespaces`] (the Namespace lifecycle:
//! admission into a terminating namespace and the namespace controller's finalization).

mod create;
mod delete;
mod list_watch;
mod namespaces;
mod object;
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

#[cfg(feature = "fuzzing")]
pub(crate) use create::RESOURCE_VERSION_ON_CREATE;
pub(crate) use list_watch::{ListPage, change_kind, too_large};
pub(crate) use object::StoredObject;

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
/// The objects are the store's own (shared, never copied); a watch sends their text.
#[derive(Debug)]
pub(crate) struct Change {
    pub(crate) rv: u64,
    pub(crate) kind: EventType,
    pub(crate) object: Arc<StoredObject>,
    /// The object before the change (for MODIFIED and DELETED), to compute selector
    /// transitions.
    pub(crate) old: Option<Arc<StoredObject>>,
}

impl Change {
    /// The storage (`"nodes"`, ...) the changed object lives in.
    pub(crate) fn storage(&self) -> &'static str {
        self.object.storage()
    }

    /// The changed object's namespace (empty for a cluster-scoped object).
    pub(crate) fn namespace(&self) -> &str {
        self.object.namespace()
    }
}

#[derive(Debug, Clone)]
struct Stored {
    obj: Arc<StoredObject>,
    /// The field ownership, when the object's own `metadata.managedFields` does not tell it
    /// exactly (a write that changed nothing but the ownership, or field paths its text cannot
    /// tell apart); else read back from the text on the next write.
    managed: Option<Box<ManagedFields>>,
}

impl Stored {
    /// `obj` (parsed: `value`) owned as `managed` says.
    fn new(obj: Arc<StoredObject>, value: &Value, managed: ManagedFields) -> Stored {
        Stored {
            obj,
            managed: exact_managed(managed, value),
        }
    }

    /// The field ownership; `value` is the stored object, parsed.
    fn managed(&self, value: &Value) -> ManagedFields {
        match &self.managed {
            Some(m) => (**m).clone(),
            None => ManagedFields::from_json(value.pointer("/metadata/managedFields"))
                .unwrap_or_default(),
        }
    }
}

/// `managed`, unless the stored object `value` says it exactly.
fn exact_managed(managed: ManagedFields, value: &Value) -> Option<Box<ManagedFields>> {
    let written = ManagedFields::from_json(value.pointer("/metadata/managedFields"));
    (written.as_ref() != Some(&managed)).then(|| Box::new(managed))
}

type Key = (String, String);

/// A snapshot kept for `continue` tokens (the objects of the first page's list, shared).
#[derive(Debug)]
struct Snapshot {
    rv: u64,
    items: Arc<Vec<Arc<StoredObject>>>,
    /// When it was taken: kept 5 minutes, as etcd's compaction keeps a continue token valid.
    taken: std::time::Instant,
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

/// What a watch starts with: initial events (the shared objects, sent lazily), the live
/// receiver, the resourceVersion at start.
pub(crate) type WatchStart = (
    Vec<(EventType, Arc<StoredObject>)>,
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

    /// Every stored object of one storage (`"clusterroles"`, ...), in the stored form, parsed.
    pub(crate) fn stored_objects(&self, storage: &str) -> impl Iterator<Item = Value> {
        self.stores
            .get(storage)
            .into_iter()
            .flat_map(|s| s.values().map(|v| v.obj.value()))
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

    /// Records and broadcasts a change of `object` (the store already holds its new state).
    fn emit(&mut self, kind: EventType, object: Arc<StoredObject>, old: Option<Arc<StoredObject>>) {
        let change = Arc::new(Change {
            rv: object.rv(),
            kind,
            object,
            old,
        });
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

/// A stored object as `info` presents it alone in a response (without copying it when the
/// representation is the stored one).
fn into_presented(info: &ResourceInfo, stored: Value) -> Value {
    if info.presents_storage() {
        with_type_meta(info, stored)
    } else {
        with_type_meta(info, info.present(&stored))
    }
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

#[cfg(test)]
mod tests;

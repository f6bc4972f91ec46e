//! The object store: one global resourceVersion counter, objects per resource as JSON, a
//! bounded event history for watch replay, and a broadcast channel for live watches.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use rand::Rng;
use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use super::patch::{ManagedFields, conflict_error, strategic_merge};
use super::resources::{RESOURCES, ResourceInfo};
use super::selector::{FieldSelector, LabelSelector};
use super::status::{ApiError, FieldError};
use super::validation;

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

fn finalizers(obj: &Value) -> Vec<String> {
    meta(obj)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The finalizer kube-apiserver gives every Namespace, removed by the namespace controller.
const NAMESPACE_FINALIZER: &str = "kubernetes";

/// A Namespace's `spec.finalizers`.
fn spec_finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/spec/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
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

const GENERATE_CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

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

    fn namespace_phase(&self, ns: &str) -> Option<bool> {
        self.stores
            .get("namespaces")
            .and_then(|s| s.get(&(String::new(), ns.to_string())))
            .map(|n| meta(&n.obj).is_some_and(|m| m.contains_key("deletionTimestamp")))
    }

    fn check_namespace(
        &self,
        info: &ResourceInfo,
        ns: &str,
        creating: bool,
    ) -> Result<(), ApiError> {
        match self.namespace_phase(ns) {
            None => Err(ApiError::namespace_not_found(ns)),
            Some(true) if creating => Err(ApiError {
                details: Some(json!({"name": ns, "kind": info.plural})),
                ..ApiError::new(
                    403,
                    "Forbidden",
                    format!(
                        "{} is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                        info.qualified()
                    ),
                )
            }),
            Some(_) => Ok(()),
        }
    }

    // ---------------------------------------------------------------- reads

    pub(crate) fn get(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        let key = (ns.unwrap_or_default().to_string(), name.to_string());
        self.stores
            .get(info.storage)
            .and_then(|s| s.get(&key))
            .map(|s| with_type_meta(info, info.present(&s.obj)))
            .ok_or_else(|| ApiError::not_found(info, name))
    }

    fn matching(&self, info: &ResourceInfo, ns: Option<&str>, opts: &ListOptions) -> Vec<Value> {
        let Some(store) = self.stores.get(info.storage) else {
            return Vec::new();
        };
        store
            .iter()
            .filter(|((k_ns, _), _)| ns.is_none_or(|n| n == k_ns))
            .filter(|(_, s)| opts.fields.matches(info, &s.obj) && opts.labels.matches(&s.obj))
            .map(|(_, s)| info.present(&s.obj))
            .collect()
    }

    /// Like [`matching`](Self::matching), for the state at resourceVersion `v`: the current
    /// state with the retained history after `v` undone. 504 for a future version, 410 for
    /// one older than the history.
    fn matching_at(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        opts: &ListOptions,
        v: u64,
    ) -> Result<Vec<Value>, ApiError> {
        if v > self.rv {
            return Err(too_large(v, self.rv));
        }
        if v < self.compacted_rv {
            return Err(ApiError::expired(format!(
                "too old resource version: {v} ({})",
                self.compacted_rv + 1
            )));
        }
        let mut objects: BTreeMap<Key, Value> = self
            .stores
            .get(info.storage)
            .map(|s| {
                s.iter()
                    .map(|(k, st)| (k.clone(), st.obj.clone()))
                    .collect()
            })
            .unwrap_or_default();
        for c in self.history.iter().rev().take_while(|c| c.rv > v) {
            if c.storage != info.storage {
                continue;
            }
            let key = (
                c.namespace.clone(),
                meta_str(&c.object, "name").unwrap_or_default().to_string(),
            );
            match (&c.kind, &c.old) {
                (EventType::Added, _) => {
                    objects.remove(&key);
                }
                (_, Some(old)) => {
                    objects.insert(key, old.clone());
                }
                (_, None) => {}
            }
        }
        Ok(objects
            .iter()
            .filter(|((k_ns, _), _)| ns.is_none_or(|n| n == k_ns))
            .filter(|(_, o)| opts.fields.matches(info, o) && opts.labels.matches(o))
            .map(|(_, o)| info.present(o))
            .collect())
    }

    /// A list response (kind `<Kind>List`).
    pub(crate) fn list(
        &mut self,
        info: &ResourceInfo,
        ns: Option<&str>,
        opts: &ListOptions,
    ) -> Result<Value, ApiError> {
        let (rv, items, offset) = match &opts.continue_token {
            Some(token) => {
                let (id, offset) = parse_continue(token)?;
                let snap = self.snapshots.get(&id).ok_or_else(|| {
                    ApiError::expired(
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
                    )
                })?;
                (snap.rv, snap.items.clone(), offset)
            }
            None => match opts.exact_version {
                Some(v) => (v, Arc::new(self.matching_at(info, ns, opts, v)?), 0),
                None => (self.rv, Arc::new(self.matching(info, ns, opts)), 0),
            },
        };
        let total = items.len();
        let end = match opts.limit {
            Some(l) if l > 0 => (offset + l).min(total),
            _ => total,
        };
        let page: Vec<Value> = items
            .get(offset..end)
            .map(<[Value]>::to_vec)
            .unwrap_or_default();
        let mut metadata = json!({ "resourceVersion": rv.to_string() });
        if end < total {
            let id = match &opts.continue_token {
                Some(token) => parse_continue(token)?.0,
                None => {
                    let id = self.next_snapshot;
                    self.next_snapshot += 1;
                    self.snapshots.insert(id, Snapshot { rv, items });
                    id
                }
            };
            metadata["continue"] = json!(format!("{id}-{end}"));
            metadata["remainingItemCount"] = json!(total - end);
        } else if let Some(token) = &opts.continue_token {
            let (id, _) = parse_continue(token)?;
            self.snapshots.remove(&id);
        }
        Ok(json!({
            "kind": format!("{}List", info.kind),
            "apiVersion": info.api_version(),
            "metadata": metadata,
            "items": page,
        }))
    }

    /// The initial events of a watch, and a receiver for the live ones, taken atomically.
    ///
    /// `rv`: `None` or `"0"` starts with synthetic ADDED events for the current state;
    /// `Some(n)` replays the history after `n`, or fails with 410 Expired if compacted.
    pub(crate) fn watch(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        opts: &ListOptions,
        rv: Option<u64>,
        send_initial: bool,
    ) -> Result<WatchStart, ApiError> {
        let rx = self.tx.subscribe();
        let mut initial = Vec::new();
        match rv {
            Some(n) if n != 0 && !send_initial => {
                if n > self.rv {
                    return Err(too_large(n, self.rv));
                }
                if n < self.compacted_rv {
                    return Err(ApiError::expired(format!(
                        "too old resource version: {n} ({})",
                        self.compacted_rv + 1
                    )));
                }
                for c in self.history.iter().filter(|c| c.rv > n) {
                    if let Some(ev) = filter_change(info, ns, opts, c) {
                        initial.push((ev.0, ev.1, c.rv));
                    }
                }
            }
            _ => {
                for obj in self.matching(info, ns, opts) {
                    let orv = meta_str(&obj, "resourceVersion")
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(self.rv);
                    initial.push((EventType::Added, with_type_meta(info, obj), orv));
                }
            }
        }
        Ok((initial, rx, self.rv))
    }

    pub(crate) fn compacted_rv(&self) -> u64 {
        self.compacted_rv
    }

    // ---------------------------------------------------------------- writes

    /// POST: create an object.
    pub(crate) fn create(
        &mut self,
        info: &ResourceInfo,
        ns: Option<&str>,
        obj: Value,
        manager: &str,
        dry_run: bool,
    ) -> Result<WriteResult, ApiError> {
        self.create_with(info, ns, obj, manager, None, dry_run)
    }

    /// Create, with the field ownership already decided (apply) or derived from the object.
    fn create_with(
        &mut self,
        info: &ResourceInfo,
        ns: Option<&str>,
        mut obj: Value,
        manager: &str,
        preset: Option<ManagedFields>,
        dry_run: bool,
    ) -> Result<WriteResult, ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be a JSON object",
            ));
        }
        check_type_meta(info, &obj)?;
        let ns = ns.unwrap_or_default().to_string();
        if info.namespaced {
            self.check_namespace(info, &ns, true)?;
            match meta_str(&obj, "namespace") {
                Some(n) if !n.is_empty() && n != ns => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                _ => {}
            }
        }
        if meta_str(&obj, "resourceVersion").is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::new(
                500,
                "InternalError",
                "Internal error occurred: resourceVersion should not be set on objects to be created",
            ));
        }
        let name = match meta_str(&obj, "name").filter(|s| !s.is_empty()) {
            Some(n) => n.to_string(),
            None => match meta_str(&obj, "generateName").filter(|s| !s.is_empty()) {
                Some(prefix) => {
                    let mut rng = rand::rng();
                    let prefix: String = prefix.chars().take(58).collect();
                    let suffix: String = (0..5)
                        .map(|_| GENERATE_CHARS[rng.random_range(0..GENERATE_CHARS.len())] as char)
                        .collect();
                    format!("{prefix}{suffix}")
                }
                None => {
                    return Err(ApiError::invalid(
                        info,
                        "",
                        &[FieldError::required(
                            "metadata.name",
                            "name or generateName is required",
                        )],
                    ));
                }
            },
        };
        {
            let m = meta_mut(&mut obj);
            m.insert("name".into(), json!(name));
            if info.namespaced {
                m.insert("namespace".into(), json!(ns));
            } else {
                m.remove("namespace");
            }
            m.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
            m.insert("creationTimestamp".into(), json!(now_rfc3339()));
            m.remove("deletionTimestamp");
            m.remove("deletionGracePeriodSeconds");
            m.remove("managedFields");
            m.remove("generation");
            if info.storage == "services" {
                m.insert("generation".into(), json!(1));
            }
        }
        let mut stored = info.to_storage(&obj);
        self.prepare_create(info, &mut stored);
        if info.storage == "nodes" {
            // Admission: TaintNodesByCondition (every create, apply-create included).
            validation::add_not_ready_taint(&mut stored);
        }
        validation::prune_like_go(&mut stored);
        let mut errs = validate(info, &stored, None);
        if info.group == "events.k8s.io" {
            errs.extend(validation::validate_events_v1_create(&obj));
        }
        if !errs.is_empty() {
            return Err(ApiError::invalid(info, &name, &errs));
        }
        let key = (ns.clone(), name.clone());
        if self.store(info).contains_key(&key) {
            return Err(ApiError::already_exists(info, &name));
        }
        let managed = preset.unwrap_or_else(|| {
            let mut m = ManagedFields::default();
            m.record_update(manager, None, &stored);
            m
        });
        meta_mut(&mut stored).insert("managedFields".into(), managed.to_json(&info.api_version()));
        if dry_run {
            set_rv(&mut stored, self.rv);
            return Ok(WriteResult {
                object: with_type_meta(info, info.present(&stored)),
                created: true,
            });
        }
        let rv = self.next_rv();
        set_rv(&mut stored, rv);
        self.store(info).insert(
            key,
            Stored {
                obj: stored.clone(),
                managed,
            },
        );
        self.emit(Change {
            encoded: Default::default(),
            rv,
            storage: info.storage,
            namespace: ns,
            kind: EventType::Added,
            object: stored.clone(),
            old: None,
        });
        Ok(WriteResult {
            object: with_type_meta(info, info.present(&stored)),
            created: true,
        })
    }

    /// Resource-specific defaults on create (status reset, allocated values).
    fn prepare_create(&mut self, info: &ResourceInfo, obj: &mut Value) {
        match info.storage {
            "services" => {
                if let Some(o) = obj.as_object_mut() {
                    o.insert("status".into(), json!({"loadBalancer": {}}));
                    o.entry("spec").or_insert(json!({}));
                }
                let ip = format!(
                    "10.96.{}.{}",
                    (self.next_cluster_ip / 250) % 250,
                    self.next_cluster_ip % 250 + 1
                );
                self.next_cluster_ip += 1;
                let mut port = self.next_node_port;
                validation::default_service(obj, &ip, || {
                    let p = port;
                    port += 1;
                    p
                });
                self.next_node_port = port;
                if self.next_node_port > 32_767 {
                    self.next_node_port = 30_000;
                }
            }
            "secrets" => secret_defaults(obj),
            "nodes" => {
                validation::normalize_pod_cidrs(obj);
                if let Some(o) = obj.as_object_mut() {
                    o.entry("spec").or_insert(json!({}));
                }
            }
            "namespaces" => {
                let name = meta_str(obj, "name").unwrap_or_default().to_string();
                let m = meta_mut(obj);
                let labels = m.entry("labels").or_insert(json!({}));
                labels["kubernetes.io/metadata.name"] = json!(name);
                if let Some(o) = obj.as_object_mut() {
                    o.insert("spec".into(), json!({"finalizers": ["kubernetes"]}));
                    o.insert("status".into(), json!({"phase": "Active"}));
                }
            }
            _ => {}
        }
    }

    /// PUT: replace an object (main resource or `status`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn update(
        &mut self,
        info: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
        subresource: Option<&str>,
        obj: Value,
        manager: &str,
        dry_run: bool,
    ) -> Result<WriteResult, ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be a JSON object",
            ));
        }
        check_type_meta(info, &obj)?;
        match meta_str(&obj, "name") {
            Some(n) if n == name => {}
            Some(n) if !n.is_empty() => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
            _ => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object () does not match the name on the URL ({name})"
                )));
            }
        }
        if info.namespaced
            && let Some(n) = meta_str(&obj, "namespace").filter(|n| !n.is_empty())
            && Some(n) != ns
        {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let key = (ns.unwrap_or_default().to_string(), name.to_string());
        if !self.store(info).contains_key(&key) {
            if info.create_on_update && subresource.is_none() {
                let mut obj = obj;
                meta_mut(&mut obj).remove("resourceVersion");
                return self.create(info, ns, obj, manager, dry_run);
            }
            if info.namespaced {
                self.check_namespace(info, &key.0, false)?;
            }
            return Err(ApiError::not_found(info, name));
        }
        self.write(info, key, subresource, obj, manager, None, dry_run)
    }

    /// PATCH: patch an object (main resource or `status`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn patch(
        &mut self,
        info: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
        subresource: Option<&str>,
        patch_type: PatchType,
        body: Value,
        manager: &str,
        force: bool,
        dry_run: bool,
    ) -> Result<WriteResult, ApiError> {
        let key = (ns.unwrap_or_default().to_string(), name.to_string());
        if patch_type == PatchType::Apply {
            check_apply_config(info, &body)?;
        }
        // The resource representation and the field ownership, without copying the stored
        // object first.
        let existing = self.store(info).get(&key).map(|e| {
            (
                with_type_meta(info, info.present(&e.obj)),
                e.managed.clone(),
            )
        });
        let Some((current, mut managed)) = existing else {
            if patch_type == PatchType::Apply && subresource.is_none() {
                // Apply creates from the configuration alone; it must name the object.
                if meta_str(&body, "name") != Some(name) {
                    return Err(ApiError::bad_request(format!(
                        "the name of the object ({}) does not match the name on the URL ({name})",
                        meta_str(&body, "name").unwrap_or_default()
                    )));
                }
                let mut managed = ManagedFields::default();
                let mut base = json!({"metadata": {"name": name}});
                if info.namespaced {
                    base["metadata"]["namespace"] = json!(key.0);
                }
                let obj = managed
                    .apply(manager, None, &merge_into(base, &body), force)
                    .map_err(|c| conflict_error(info, name, &c))?;
                return self.create_with(info, ns, obj, manager, Some(managed), dry_run);
            }
            if info.namespaced {
                self.check_namespace(info, &key.0, false)?;
            }
            return Err(ApiError::not_found(info, name));
        };
        let patched = match patch_type {
            PatchType::Merge => {
                if !body.is_object() {
                    return Err(ApiError::bad_request(
                        "the body of a merge patch must be a JSON object",
                    ));
                }
                let mut doc = current.clone();
                json_patch::merge(&mut doc, &body);
                doc
            }
            PatchType::Json => {
                let ops: json_patch::Patch = serde_json::from_value(body)
                    .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
                let mut doc = current.clone();
                // kube-apiserver: NewGenericServerResponse(422, ...) with the patch error as
                // the cause.
                apply_json_patch(&mut doc, ops).map_err(|message| ApiError {
                    details: Some(json!({
                        "causes": [{"reason": "UnexpectedServerResponse", "message": message}]
                    })),
                    ..ApiError::new(
                        422,
                        "Invalid",
                        "the server rejected our request due to an error in our request",
                    )
                })?;
                doc
            }
            PatchType::Strategic => {
                let mut doc = current.clone();
                strategic_merge(info.storage, &mut doc, body)?;
                doc
            }
            PatchType::Apply => {
                // Apply configurations address the main resource's fields; the conflict check
                // runs on the resource representation.
                let applied = managed
                    .apply(manager, Some(&current), &body, force)
                    .map_err(|c| conflict_error(info, name, &c))?;
                let mut applied = applied;
                // Apply never carries a resourceVersion precondition unless the config has one.
                if meta_str(&body, "resourceVersion").is_none()
                    && let Some(rv) = meta_str(&current, "resourceVersion")
                {
                    meta_mut(&mut applied).insert("resourceVersion".into(), json!(rv));
                }
                applied
            }
        };
        if !patched.is_object() {
            return Err(ApiError::bad_request(
                "the patched object is not a JSON object",
            ));
        }
        // A patch may not rename or move the object.
        if meta_str(&patched, "name") != Some(name) {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                meta_str(&patched, "name").unwrap_or_default()
            )));
        }
        // Apply has already decided the field ownership; other patches are updates.
        let applied = (patch_type == PatchType::Apply).then_some(managed);
        self.write(info, key, subresource, patched, manager, applied, dry_run)
    }

    /// The shared tail of update and patch: preconditions, subresource semantics, validation,
    /// no-op detection, finalizer-driven removal, commit.
    #[allow(clippy::too_many_arguments)]
    fn write(
        &mut self,
        info: &ResourceInfo,
        key: Key,
        subresource: Option<&str>,
        new: Value,
        manager: &str,
        applied_managed: Option<ManagedFields>,
        dry_run: bool,
    ) -> Result<WriteResult, ApiError> {
        let name = key.1.clone();
        let Some(Stored {
            obj: old,
            managed: old_managed,
        }) = self.store(info).get(&key).cloned()
        else {
            return Err(ApiError::not_found(info, &name));
        };
        let old_rv = meta_str(&old, "resourceVersion")
            .unwrap_or_default()
            .to_string();
        if let Some(rv) = meta_str(&new, "resourceVersion").filter(|s| !s.is_empty())
            && rv != old_rv
        {
            return Err(ApiError::stale(info, &name));
        }
        let old_uid = meta_str(&old, "uid").unwrap_or_default().to_string();
        if let Some(uid) = meta_str(&new, "uid").filter(|s| !s.is_empty())
            && uid != old_uid
        {
            return Err(ApiError::conflict(
                info,
                &name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {old_uid}"
                ),
            ));
        }
        let mut new = info.to_storage(&new);
        // Metadata the client may not change.
        {
            let old_meta = meta(&old).cloned().unwrap_or_default();
            let m = meta_mut(&mut new);
            for k in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "namespace",
                "name",
            ] {
                match old_meta.get(k) {
                    Some(v) => {
                        m.insert(k.into(), v.clone());
                    }
                    None => {
                        m.remove(k);
                    }
                }
            }
            m.remove("managedFields");
            m.remove("resourceVersion");
        }
        // Status subresource semantics. A Namespace's `spec.finalizers` change only through
        // `/finalize` (its main writes keep spec and status, as the namespace strategy does).
        if info.status_subresource {
            let keep: &[&str] = match subresource {
                Some("status") => &["spec"],
                Some(_) => &["status"],
                None if info.storage == "namespaces" => &["spec", "status"],
                None => &["status"],
            };
            if let Some(o) = new.as_object_mut() {
                for keep in keep {
                    match old.get(*keep) {
                        Some(v) => {
                            o.insert((*keep).into(), v.clone());
                        }
                        None => {
                            o.remove(*keep);
                        }
                    }
                }
            }
        }
        if info.storage == "secrets" {
            secret_defaults(&mut new);
        }
        if info.storage == "nodes" {
            validation::normalize_pod_cidrs(&mut new);
        }
        validation::prune_like_go(&mut new);
        if info.storage == "services" && subresource.is_none() {
            validation::keep_allocated_service_values(&mut new, &old);
            if new.get("spec") != old.get("spec") {
                let g = meta(&old)
                    .and_then(|m| m.get("generation"))
                    .and_then(Value::as_i64)
                    .unwrap_or(1);
                meta_mut(&mut new).insert("generation".into(), json!(g + 1));
            }
        }
        // No new finalizers on an object being deleted.
        let terminating = meta(&old).is_some_and(|m| m.contains_key("deletionTimestamp"));
        if terminating {
            let old_f = finalizers(&old);
            let added: Vec<String> = finalizers(&new)
                .into_iter()
                .filter(|f| !old_f.contains(f))
                .collect();
            if !added.is_empty() {
                return Err(ApiError::invalid(
                    info,
                    &name,
                    &[FieldError::forbidden(
                        "metadata.finalizers",
                        &format!(
                            "no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                            added
                                .iter()
                                .map(|f| format!("{f:?}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    )],
                ));
            }
        }
        let errs = validate(info, &new, Some(&old));
        if !errs.is_empty() {
            return Err(ApiError::invalid(info, &name, &errs));
        }
        let managed = match applied_managed {
            Some(m) => m,
            None => {
                let mut m = old_managed;
                m.record_update(manager, Some(&old), &new);
                m
            }
        };
        // A write that changes nothing is not persisted (no new resourceVersion, no event).
        if same_content(&old, &new) {
            if let Some(s) = self.store(info).get_mut(&key) {
                s.managed = managed;
            }
            return Ok(WriteResult {
                object: with_type_meta(info, info.present(&old)),
                created: false,
            });
        }
        if dry_run {
            set_rv(&mut new, self.rv);
            return Ok(WriteResult {
                object: with_type_meta(info, info.present(&new)),
                created: false,
            });
        }
        let rv = self.next_rv();
        set_rv(&mut new, rv);
        meta_mut(&mut new).insert("managedFields".into(), managed.to_json(&info.api_version()));
        let response = with_type_meta(info, info.present(&new));
        if terminating && finalizers(&new).is_empty() && spec_finalizers(&new).is_empty() {
            self.store(info).remove(&key);
            self.emit(Change {
                encoded: Default::default(),
                rv,
                storage: info.storage,
                namespace: key.0.clone(),
                kind: EventType::Deleted,
                object: new,
                old: Some(old),
            });
        } else {
            self.store(info).insert(
                key.clone(),
                Stored {
                    obj: new.clone(),
                    managed,
                },
            );
            self.emit(Change {
                encoded: Default::default(),
                rv,
                storage: info.storage,
                namespace: key.0.clone(),
                kind: EventType::Modified,
                object: new,
                old: Some(old),
            });
        }
        Ok(WriteResult {
            object: response,
            created: false,
        })
    }

    /// DELETE. Returns the object and whether it is gone (false: finalizers keep it).
    pub(crate) fn delete(
        &mut self,
        info: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
        options: &Value,
        dry_run: bool,
    ) -> Result<(Value, bool), ApiError> {
        let key = (ns.unwrap_or_default().to_string(), name.to_string());
        let Some(stored) = self.store(info).get(&key).cloned() else {
            return Err(ApiError::not_found(info, name));
        };
        let obj = stored.obj;
        if let Some(uid) = options
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
        {
            let actual = meta_str(&obj, "uid").unwrap_or_default();
            if uid != actual {
                return Err(ApiError::conflict(
                    info,
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}"
                    ),
                ));
            }
        }
        if let Some(rv) = options
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
        {
            let actual = meta_str(&obj, "resourceVersion").unwrap_or_default();
            if rv != actual {
                return Err(ApiError::conflict(
                    info,
                    name,
                    &format!(
                        "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {actual}"
                    ),
                ));
            }
        }
        if dry_run {
            return Ok((with_type_meta(info, info.present(&obj)), false));
        }
        let is_namespace = info.storage == "namespaces";
        let terminating = meta(&obj).is_some_and(|m| m.contains_key("deletionTimestamp"));
        // A Namespace is marked first; it goes on a later DELETE (or `/finalize`) once its
        // `spec.finalizers` are empty, as kube-apiserver's namespace storage does.
        let held = !finalizers(&obj).is_empty()
            || (is_namespace && (!terminating || !spec_finalizers(&obj).is_empty()));
        if held {
            if terminating {
                return Ok((with_type_meta(info, info.present(&obj)), false));
            }
            let mut new = obj.clone();
            {
                let m = meta_mut(&mut new);
                m.insert("deletionTimestamp".into(), json!(now_rfc3339()));
                m.insert("deletionGracePeriodSeconds".into(), json!(0));
            }
            if is_namespace {
                new["status"] = json!({"phase": "Terminating"});
            }
            let rv = self.next_rv();
            set_rv(&mut new, rv);
            if let Some(s) = self.store(info).get_mut(&key) {
                s.obj = new.clone();
            }
            self.emit(Change {
                encoded: Default::default(),
                rv,
                storage: info.storage,
                namespace: key.0.clone(),
                kind: EventType::Modified,
                object: new.clone(),
                old: Some(obj),
            });
            return Ok((with_type_meta(info, info.present(&new)), false));
        }
        let rv = self.next_rv();
        let mut gone = obj.clone();
        set_rv(&mut gone, rv);
        self.store(info).remove(&key);
        self.emit(Change {
            encoded: Default::default(),
            rv,
            storage: info.storage,
            namespace: key.0.clone(),
            kind: EventType::Deleted,
            object: gone.clone(),
            old: Some(obj),
        });
        Ok((with_type_meta(info, info.present(&gone)), true))
    }

    /// The names of the Namespaces being deleted whose `kubernetes` finalizer is still set.
    pub(crate) fn namespaces_to_finalize(&self) -> Vec<String> {
        self.stores
            .get("namespaces")
            .map(|s| {
                s.values()
                    .filter(|n| meta(&n.obj).is_some_and(|m| m.contains_key("deletionTimestamp")))
                    .filter(|n| {
                        spec_finalizers(&n.obj)
                            .iter()
                            .any(|f| f == NAMESPACE_FINALIZER)
                    })
                    .filter_map(|n| meta_str(&n.obj, "name").map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// One pass of kube-controller-manager's namespace controller over a terminating
    /// namespace: deletes its content (objects with finalizers get their `deletionTimestamp`
    /// and are waited for), and once nothing is left, removes the `kubernetes` finalizer
    /// through `/finalize`, which removes the namespace when no other finalizer holds it.
    pub(crate) fn finalize_namespace(&mut self, ns: &str) {
        let Some(ns_info) = RESOURCES.iter().find(|r| r.storage == "namespaces") else {
            return;
        };
        if !self.namespaces_to_finalize().iter().any(|n| n == ns) {
            return;
        }
        for info in RESOURCES.iter().filter(|r| r.namespaced) {
            // events.k8s.io shares the core events storage; visit each storage once.
            if info.group == "events.k8s.io" {
                continue;
            }
            let keys: Vec<Key> = self
                .stores
                .get(info.storage)
                .map(|s| {
                    s.iter()
                        .filter(|((n, _), v)| {
                            n == ns
                                && !meta(&v.obj)
                                    .is_some_and(|m| m.contains_key("deletionTimestamp"))
                        })
                        .map(|(k, _)| k.clone())
                        .collect()
                })
                .unwrap_or_default();
            for (n, name) in keys {
                if let Err(e) = self.delete(info, Some(&n), &name, &Value::Null, false) {
                    tracing::warn!(error = ?e, "namespace controller: deleting namespace content");
                }
            }
        }
        let remaining = RESOURCES
            .iter()
            .filter(|r| r.namespaced)
            .filter_map(|r| self.stores.get(r.storage))
            .any(|s| s.keys().any(|(n, _)| n == ns));
        if remaining {
            return;
        }
        let key = (String::new(), ns.to_string());
        let Some(current) = self.store(ns_info).get(&key).map(|s| s.obj.clone()) else {
            return;
        };
        let mut finalized = with_type_meta(ns_info, current);
        let left: Vec<String> = spec_finalizers(&finalized)
            .into_iter()
            .filter(|f| f != NAMESPACE_FINALIZER)
            .collect();
        finalized["spec"] = json!({ "finalizers": left });
        if let Err(e) = self.write(
            ns_info,
            key,
            Some("finalize"),
            finalized,
            "kube-controller-manager",
            None,
            false,
        ) {
            tracing::warn!(error = ?e, "namespace controller: finalizing namespace");
        }
    }

    /// DELETE on a collection: deletes every matching object.
    pub(crate) fn delete_collection(
        &mut self,
        info: &ResourceInfo,
        ns: Option<&str>,
        opts: &ListOptions,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let items = self.matching(info, ns, opts);
        let mut out = Vec::new();
        for item in items {
            let n = meta_str(&item, "namespace").map(str::to_string);
            let name = meta_str(&item, "name").unwrap_or_default().to_string();
            let (obj, _) = self.delete(info, n.as_deref(), &name, &Value::Null, dry_run)?;
            out.push(obj);
        }
        Ok(json!({
            "kind": format!("{}List", info.kind),
            "apiVersion": info.api_version(),
            "metadata": { "resourceVersion": self.rv.to_string() },
            "items": out,
        }))
    }
}

/// Applies an RFC 6902 patch with the semantics of the Go library kube-apiserver uses
/// (evanphx/json-patch): a `test` for `null` passes when the key is missing but its parent
/// exists (kube's finalizer helper relies on this for an object without finalizers).
fn apply_json_patch(doc: &mut Value, ops: json_patch::Patch) -> Result<(), String> {
    for op in ops.0 {
        if let json_patch::PatchOperation::Test(t) = &op
            && t.value.is_null()
        {
            let path = t.path.as_str();
            let parent = path.rsplit_once('/').map_or("", |(p, _)| p);
            let actual = doc.pointer(path);
            if doc.pointer(parent).is_none() {
                return Err(format!(
                    "test operation does not apply: is missing path: {path}"
                ));
            }
            if actual.is_none_or(Value::is_null) {
                continue;
            }
            return Err(format!("testing value {path} failed: test failed"));
        }
        json_patch::patch(doc, &json_patch::Patch(vec![op])).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Secret defaulting: `type: Opaque`, and `stringData` folded into `data` (base64), as
/// kube-apiserver does on every write.
fn secret_defaults(obj: &mut Value) {
    let Some(o) = obj.as_object_mut() else { return };
    o.entry("type").or_insert(json!("Opaque"));
    if let Some(Value::Object(string_data)) = o.remove("stringData") {
        let data = o.entry("data").or_insert(json!({}));
        for (k, v) in string_data {
            if let Some(s) = v.as_str() {
                data[k] = json!(base64_encode(s.as_bytes()));
            }
        }
    }
}

/// Standard base64 with padding. Hand-written: a dozen lines do not justify a dependency.
fn base64_encode(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Deep-merges `patch` into `base` (objects merge, other values replace).
fn merge_into(mut base: Value, patch: &Value) -> Value {
    json_patch::merge(&mut base, patch);
    base
}

/// kube-apiserver's answer to a resourceVersion from the future (after its 3 s wait).
pub(crate) fn too_large(requested: u64, current: u64) -> ApiError {
    ApiError {
        details: Some(json!({
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1
        })),
        ..ApiError::new(
            504,
            "Timeout",
            format!("Too large resource version: {requested}, current: {current}"),
        )
    }
}

fn parse_continue(token: &str) -> Result<(u64, usize), ApiError> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token:?}"));
    let (id, off) = token.split_once('-').ok_or_else(bad)?;
    Ok((
        id.parse().map_err(|_| bad())?,
        off.parse().map_err(|_| bad())?,
    ))
}

/// An apply configuration must carry the resource's apiVersion and kind.
fn check_apply_config(info: &ResourceInfo, body: &Value) -> Result<(), ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad_request(
            "error decoding YAML: the apply configuration must be an object",
        ));
    }
    let av = body
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if av != info.api_version() {
        return Err(ApiError::bad_request(format!(
            "Incorrect version specified in apply patch. Specified patch version: {av}, expected: {}",
            info.api_version()
        )));
    }
    let kind = body.get("kind").and_then(Value::as_str).unwrap_or_default();
    if kind != info.kind {
        return Err(ApiError::bad_request(format!(
            "Incorrect kind specified in apply patch. Specified patch kind: {kind}, expected: {}",
            info.kind
        )));
    }
    Ok(())
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
        _ => {}
    }
    errs
}

/// Filters a change for one watch: selector transitions become ADDED / DELETED as
/// kube-apiserver's watch cache does. Returns the event in the watched resource's form.
pub(crate) fn filter_change(
    info: &ResourceInfo,
    ns: Option<&str>,
    opts: &ListOptions,
    c: &Change,
) -> Option<(EventType, Value)> {
    let kind = change_kind(info, ns, opts, c)?;
    Some((kind, with_type_meta(info, info.present(&c.object))))
}

/// What a watch of `info` in `ns` with `opts` sees of change `c`: `None` when nothing, else
/// the event type (selector transitions turn `MODIFIED` into `ADDED`/`DELETED`).
pub(crate) fn change_kind(
    info: &ResourceInfo,
    ns: Option<&str>,
    opts: &ListOptions,
    c: &Change,
) -> Option<EventType> {
    if c.storage != info.storage {
        return None;
    }
    if let Some(ns) = ns
        && ns != c.namespace
    {
        return None;
    }
    // Labels live in metadata, the same in every representation.
    let matches = |o: &Value| opts.fields.matches(info, o) && opts.labels.matches(o);
    let now = matches(&c.object);
    let before = c.old.as_ref().is_some_and(matches);
    let kind = match c.kind {
        EventType::Added if now => EventType::Added,
        EventType::Deleted if before || now => EventType::Deleted,
        EventType::Modified if now && before => EventType::Modified,
        EventType::Modified if now => EventType::Added,
        EventType::Modified if before => EventType::Deleted,
        _ => return None,
    };
    Some(kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64() {
        assert_eq!(base64_encode(b""), "");
        assert_eq!(base64_encode(b"f"), "Zg==");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
        assert_eq!(base64_encode(b"foo"), "Zm9v");
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
    }
}

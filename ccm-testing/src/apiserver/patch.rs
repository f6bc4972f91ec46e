//! Strategic merge patch and a field-ownership model of server-side apply.
//!
//! Hand-written: no crate implements Kubernetes' strategic merge patch (it depends on the Go
//! struct tags `patchStrategy`/`patchMergeKey`). The table in [`list_strategy`] carries the
//! tags of the fields this framework and a vendor's tests write.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::status::ApiError;

/// How a list field is merged by a strategic merge patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListStrategy {
    /// No patch strategy: the patch's list replaces the original (atomic).
    Replace,
    /// `patchStrategy:"merge"` with `patchMergeKey`.
    MergeKey(&'static str),
    /// `patchStrategy:"merge"` on a list of scalars: set union.
    MergePrimitive,
}

/// The patch strategy of a list field, from the Kubernetes API types' struct tags.
fn list_strategy(storage: &str, path: &[String]) -> ListStrategy {
    let p: Vec<&str> = path.iter().map(String::as_str).collect();
    match (storage, p.as_slice()) {
        (_, ["metadata", "finalizers"]) => ListStrategy::MergePrimitive,
        (_, ["metadata", "ownerReferences"]) => ListStrategy::MergeKey("uid"),
        ("nodes", ["spec", "podCIDRs"]) => ListStrategy::MergePrimitive,
        // NodeSpec.Taints has no patch strategy: atomic.
        ("nodes", ["status", "addresses"]) => ListStrategy::MergeKey("type"),
        ("nodes", ["status", "conditions"]) => ListStrategy::MergeKey("type"),
        ("nodes", ["status", "volumesAttached"]) => ListStrategy::MergeKey("name"),
        ("services", ["spec", "ports"]) => ListStrategy::MergeKey("port"),
        ("services", ["status", "conditions"]) => ListStrategy::MergeKey("type"),
        // LoadBalancerStatus.Ingress has no patch strategy: atomic.
        ("namespaces", ["status", "conditions"]) => ListStrategy::MergeKey("type"),
        _ => ListStrategy::Replace,
    }
}

fn is_directive(k: &str) -> bool {
    k == "$patch"
        || k == "$retainKeys"
        || k.starts_with("$deleteFromPrimitiveList/")
        || k.starts_with("$setElementOrder/")
}

/// Removes patch directives from a value that is inserted as a whole.
fn strip_directives(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(k, _)| !is_directive(k))
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(
            a.into_iter()
                .filter(|i| i.get("$patch").is_none())
                .map(strip_directives)
                .collect(),
        ),
        other => other,
    }
}

/// Applies a strategic merge patch to `original` (the object of kind stored as `storage`).
pub(crate) fn strategic_merge(
    storage: &str,
    original: &mut Value,
    patch: Value,
) -> Result<(), ApiError> {
    let Value::Object(patch) = patch else {
        return Err(ApiError::bad_request(
            "the body of a strategic merge patch must be a JSON object",
        ));
    };
    let mut path = Vec::new();
    merge_map(storage, original, patch, &mut path)
}

fn merge_map(
    storage: &str,
    original: &mut Value,
    patch: Map<String, Value>,
    path: &mut Vec<String>,
) -> Result<(), ApiError> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            *original = strip_directives(Value::Object(patch));
            return Ok(());
        }
        Some("delete") => {
            *original = Value::Object(Map::new());
            return Ok(());
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "Unknown patch type: {other} in map: {patch:?}"
            )));
        }
        None => {}
    }
    if !original.is_object() {
        *original = Value::Object(Map::new());
    }
    let Some(orig) = original.as_object_mut() else {
        return Ok(());
    };
    if let Some(retain) = patch.get("$retainKeys") {
        let keep: BTreeSet<&str> = retain
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        orig.retain(|k, _| keep.contains(k.as_str()));
    }
    for (k, v) in patch {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let remove: Vec<Value> = v.as_array().cloned().unwrap_or_default();
            if let Some(list) = orig.get_mut(field).and_then(Value::as_array_mut) {
                list.retain(|x| !remove.contains(x));
            }
            continue;
        }
        if is_directive(&k) {
            continue;
        }
        if v.is_null() {
            orig.remove(&k);
            continue;
        }
        path.push(k.clone());
        let result = match (orig.get_mut(&k), v) {
            (Some(o @ Value::Object(_)), Value::Object(pm)) => merge_map(storage, o, pm, path),
            (Some(Value::Array(o)), Value::Array(pa)) => {
                let strategy = list_strategy(storage, path);
                merge_list(storage, o, pa, strategy, path)
            }
            (_, Value::Array(pa)) => {
                let strategy = list_strategy(storage, path);
                let mut fresh = Vec::new();
                let r = merge_list(storage, &mut fresh, pa, strategy, path);
                orig.insert(k.clone(), Value::Array(fresh));
                r
            }
            (_, v) => {
                orig.insert(k.clone(), strip_directives(v));
                Ok(())
            }
        };
        path.pop();
        result?;
    }
    Ok(())
}

fn merge_list(
    storage: &str,
    original: &mut Vec<Value>,
    patch: Vec<Value>,
    strategy: ListStrategy,
    path: &mut Vec<String>,
) -> Result<(), ApiError> {
    let replace_all = patch
        .iter()
        .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"));
    if replace_all || strategy == ListStrategy::Replace {
        *original = patch
            .into_iter()
            .filter(|i| i.get("$patch").is_none())
            .map(strip_directives)
            .collect();
        return Ok(());
    }
    match strategy {
        ListStrategy::MergePrimitive => {
            for item in patch {
                if !original.contains(&item) {
                    original.push(item);
                }
            }
        }
        ListStrategy::MergeKey(key) => {
            for item in patch {
                let Some(kv) = item.get(key).cloned() else {
                    return Err(ApiError::bad_request(format!(
                        "map: {item} does not contain declared merge key: {key}"
                    )));
                };
                let pos = original.iter().position(|o| o.get(key) == Some(&kv));
                if item.get("$patch").and_then(Value::as_str) == Some("delete") {
                    original.retain(|o| o.get(key) != Some(&kv));
                    continue;
                }
                match (pos, item) {
                    (Some(i), Value::Object(pm)) => merge_map(storage, &mut original[i], pm, path)?,
                    (_, item) => original.push(strip_directives(item)),
                }
            }
        }
        ListStrategy::Replace => {}
    }
    Ok(())
}

/// Field ownership of one object, for server-side apply: manager -> owned leaf paths.
///
/// Simplification: lists are owned as a whole (kube-apiserver tracks keyed list items
/// separately), and the subresource of a write is not recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ManagedFields {
    /// Key: `(manager, operation)` where operation is `Apply` or `Update`.
    owners: BTreeMap<(String, &'static str), BTreeSet<String>>,
    /// When each entry last changed (RFC 3339).
    times: BTreeMap<(String, &'static str), String>,
}

fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

const IGNORED_LEAVES: &[&str] = &[
    ".apiVersion",
    ".kind",
    ".metadata.name",
    ".metadata.namespace",
    ".metadata.resourceVersion",
    ".metadata.uid",
    ".metadata.creationTimestamp",
    ".metadata.generation",
    ".metadata.managedFields",
    ".metadata.deletionTimestamp",
    ".metadata.deletionGracePeriodSeconds",
    ".metadata.generateName",
];

/// Flattens an object into `.a.b` leaf paths (lists are leaves).
fn leaves(v: &Value, prefix: &str, out: &mut BTreeMap<String, Value>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, v) in m {
                let p = format!("{prefix}.{k}");
                if IGNORED_LEAVES.contains(&p.as_str()) {
                    continue;
                }
                leaves(v, &p, out);
            }
        }
        Value::Null => {}
        other => {
            if !prefix.is_empty() {
                out.insert(prefix.to_string(), other.clone());
            }
        }
    }
}

fn leaf_map(v: &Value) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    leaves(v, "", &mut out);
    out
}

/// Removes the leaf at a `.a.b` path, pruning emptied parents.
fn remove_leaf(obj: &mut Value, path: &str) {
    let parts: Vec<&str> = path.trim_start_matches('.').split('.').collect();
    fn rec(v: &mut Value, parts: &[&str]) {
        let Some(m) = v.as_object_mut() else { return };
        match parts {
            [] => {}
            [last] => {
                m.remove(*last);
            }
            [first, rest @ ..] => {
                if let Some(child) = m.get_mut(*first) {
                    rec(child, rest);
                    if child.as_object().is_some_and(Map::is_empty) {
                        m.remove(*first);
                    }
                }
            }
        }
    }
    rec(obj, &parts);
}

/// Deep merge for apply: objects merge, everything else (lists included) replaces; nulls are
/// ignored.
fn apply_merge(target: &mut Value, applied: &Value) {
    match (target, applied) {
        (Value::Object(t), Value::Object(a)) => {
            for (k, v) in a {
                if v.is_null() {
                    continue;
                }
                match t.get_mut(k) {
                    Some(existing) if existing.is_object() && v.is_object() => {
                        apply_merge(existing, v)
                    }
                    _ => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (t, a) => *t = a.clone(),
    }
}

/// One field conflict of an apply request.
#[derive(Debug, Clone)]
pub(crate) struct Conflict {
    pub(crate) manager: String,
    pub(crate) field: String,
}

impl ManagedFields {
    /// Records an update-type write (create, update, patch) by `manager`: it takes ownership of
    /// every leaf it changed or added; removed leaves lose their owners.
    pub(crate) fn record_update(&mut self, manager: &str, old: Option<&Value>, new: &Value) {
        let old_leaves = old.map(leaf_map).unwrap_or_default();
        let new_leaves = leaf_map(new);
        let changed: BTreeSet<String> = new_leaves
            .iter()
            .filter(|(k, v)| old_leaves.get(*k) != Some(*v))
            .map(|(k, _)| k.clone())
            .collect();
        let removed: BTreeSet<String> = old_leaves
            .keys()
            .filter(|k| !new_leaves.contains_key(*k))
            .cloned()
            .collect();
        for set in self.owners.values_mut() {
            set.retain(|p| !changed.contains(p) && !removed.contains(p));
        }
        if !changed.is_empty() {
            let key = (manager.to_string(), "Update");
            self.times.insert(key.clone(), now());
            self.owners.entry(key).or_default().extend(changed);
        }
        self.owners.retain(|_, s| !s.is_empty());
        let owners = &self.owners;
        self.times.retain(|k, _| owners.contains_key(k));
    }

    /// `metadata.managedFields` as kube-apiserver reports it (`FieldsV1` tries; lists appear
    /// as whole fields).
    pub(crate) fn to_json(&self, api_version: &str) -> Value {
        let entries: Vec<Value> = self
            .owners
            .iter()
            .map(|(key, paths)| {
                let mut trie = Map::new();
                for path in paths {
                    let mut node = &mut trie;
                    for part in path.trim_start_matches('.').split('.') {
                        let child = node
                            .entry(format!("f:{part}"))
                            .or_insert_with(|| Value::Object(Map::new()));
                        if !child.is_object() {
                            *child = Value::Object(Map::new());
                        }
                        node = match child.as_object_mut() {
                            Some(m) => m,
                            None => break,
                        };
                    }
                }
                serde_json::json!({
                    "manager": key.0,
                    "operation": key.1,
                    "apiVersion": api_version,
                    "time": self.times.get(key).cloned().unwrap_or_else(now),
                    "fieldsType": "FieldsV1",
                    "fieldsV1": Value::Object(trie),
                })
            })
            .collect();
        Value::Array(entries)
    }

    /// Reads back what [`to_json`](Self::to_json) wrote: the store keeps field ownership
    /// only inside the stored object's text. `None` when `json` is not such a list (then the
    /// store keeps the `ManagedFields` themselves).
    pub(crate) fn from_json(json: Option<&Value>) -> Option<ManagedFields> {
        fn paths(node: &Map<String, Value>, prefix: &str, out: &mut BTreeSet<String>) -> bool {
            for (k, child) in node {
                let Some(part) = k.strip_prefix("f:") else {
                    return false;
                };
                let path = format!("{prefix}.{part}");
                match child.as_object() {
                    Some(m) if m.is_empty() => {
                        out.insert(path);
                    }
                    Some(m) => {
                        if !paths(m, &path, out) {
                            return false;
                        }
                    }
                    None => return false,
                }
            }
            true
        }
        let mut out = ManagedFields::default();
        let Some(entries) = json else {
            return Some(out);
        };
        for entry in entries.as_array()? {
            let manager = entry.get("manager")?.as_str()?.to_string();
            let operation = match entry.get("operation")?.as_str()? {
                "Apply" => "Apply",
                "Update" => "Update",
                _ => return None,
            };
            let time = entry.get("time")?.as_str()?.to_string();
            let mut set = BTreeSet::new();
            if !paths(entry.get("fieldsV1")?.as_object()?, "", &mut set) {
                return None;
            }
            let key = (manager, operation);
            if out.owners.contains_key(&key) {
                return None;
            }
            out.times.insert(key.clone(), time);
            out.owners.insert(key, set);
        }
        Some(out)
    }

    /// Server-side apply of `applied` by `manager` onto `current` (None: the object is new).
    /// Returns the new object, or the conflicts when `force` is false.
    pub(crate) fn apply(
        &mut self,
        manager: &str,
        current: Option<&Value>,
        applied: &Value,
        force: bool,
    ) -> Result<Value, Vec<Conflict>> {
        let applied_leaves = leaf_map(applied);
        let current_leaves = current.map(leaf_map).unwrap_or_default();
        let me = (manager.to_string(), "Apply");
        let mut conflicts = Vec::new();
        for (path, value) in &applied_leaves {
            let differs = current_leaves.get(path).is_some_and(|cur| cur != value);
            if !differs {
                continue;
            }
            for (owner, set) in &self.owners {
                if *owner != me && set.contains(path) {
                    conflicts.push(Conflict {
                        manager: owner.0.clone(),
                        field: path.clone(),
                    });
                }
            }
        }
        if !conflicts.is_empty() && !force {
            return Err(conflicts);
        }
        let mut obj = current
            .cloned()
            .unwrap_or_else(|| Value::Object(Map::new()));
        // Fields this manager applied before but no longer applies are removed, unless
        // someone else owns them too.
        let previously = self.owners.get(&me).cloned().unwrap_or_default();
        for path in previously {
            if applied_leaves.contains_key(&path) {
                continue;
            }
            let shared = self
                .owners
                .iter()
                .any(|(o, s)| *o != me && s.contains(&path));
            if !shared {
                remove_leaf(&mut obj, &path);
            }
        }
        apply_merge(&mut obj, applied);
        let new_leaves = leaf_map(&obj);
        let applied_set: BTreeSet<String> = applied_leaves.keys().cloned().collect();
        for (owner, set) in self.owners.iter_mut() {
            if *owner != me {
                // Forced (or equal-valued) fields: with force, others lose them.
                if force {
                    let conflicted: BTreeSet<&String> =
                        conflicts.iter().map(|c| &c.field).collect();
                    set.retain(|p| !conflicted.contains(p));
                }
                set.retain(|p| new_leaves.contains_key(p));
            }
        }
        if self.owners.get(&me) != Some(&applied_set) {
            self.times.insert(me.clone(), now());
        }
        self.owners.insert(me, applied_set);
        self.owners.retain(|_, s| !s.is_empty());
        let owners = &self.owners;
        self.times.retain(|k, _| owners.contains_key(k));
        Ok(obj)
    }
}

/// The 409 answer for apply conflicts, worded as kube-apiserver does.
pub(crate) fn conflict_error(
    info: &super::resources::ResourceInfo,
    name: &str,
    conflicts: &[Conflict],
) -> ApiError {
    let message = if conflicts.len() == 1 {
        format!(
            "Apply failed with 1 conflict: conflict with {:?}: {}",
            conflicts[0].manager, conflicts[0].field
        )
    } else {
        let lines: Vec<String> = conflicts
            .iter()
            .map(|c| format!("conflict with {:?}: {}", c.manager, c.field))
            .collect();
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|c| {
            serde_json::json!({
                "reason": "FieldManagerConflict",
                "message": format!("conflict with {:?}", c.manager),
                "field": c.field,
            })
        })
        .collect();
    let mut details = serde_json::json!({ "name": name, "kind": info.plural, "causes": causes });
    if !info.group.is_empty() {
        details["group"] = serde_json::json!(info.group);
    }
    ApiError {
        details: Some(details),
        ..ApiError::new(409, "Conflict", message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merges_node_addresses_and_conditions_by_type() {
        let mut node = json!({"status": {
            "addresses": [{"type": "Hostname", "address": "n1"}],
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "MemoryPressure", "status": "False"}]
        }});
        let patch = json!({"status": {
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "n1b"}],
            "conditions": [{"type": "Ready", "status": "False", "reason": "X"}]
        }});
        strategic_merge("nodes", &mut node, patch).unwrap();
        assert_eq!(
            node["status"]["addresses"],
            json!([{"type": "Hostname", "address": "n1b"}, {"type": "InternalIP", "address": "10.0.0.1"}])
        );
        assert_eq!(
            node["status"]["conditions"][0],
            json!({"type": "Ready", "status": "False", "reason": "X"})
        );
        assert_eq!(node["status"]["conditions"][1]["type"], "MemoryPressure");
    }

    #[test]
    fn taints_are_atomic_finalizers_merge() {
        let mut node = json!({"metadata": {"finalizers": ["a"]}, "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}});
        strategic_merge(
            "nodes",
            &mut node,
            json!({"metadata": {"finalizers": ["b", "a"]}, "spec": {"taints": [{"key": "b", "effect": "NoExecute"}]}}),
        )
        .unwrap();
        assert_eq!(node["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(
            node["spec"]["taints"],
            json!([{"key": "b", "effect": "NoExecute"}])
        );
        strategic_merge(
            "nodes",
            &mut node,
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
        )
        .unwrap();
        assert_eq!(node["metadata"]["finalizers"], json!(["b"]));
    }

    #[test]
    fn directives() {
        let mut node = json!({"status": {"addresses": [{"type": "A", "address": "1"}, {"type": "B", "address": "2"}]}});
        strategic_merge(
            "nodes",
            &mut node,
            json!({"status": {"addresses": [{"type": "A", "$patch": "delete"}]}}),
        )
        .unwrap();
        assert_eq!(
            node["status"]["addresses"],
            json!([{"type": "B", "address": "2"}])
        );
        strategic_merge(
            "nodes",
            &mut node,
            json!({"status": {"addresses": [{"$patch": "replace"}, {"type": "C", "address": "3"}]}}),
        )
        .unwrap();
        assert_eq!(
            node["status"]["addresses"],
            json!([{"type": "C", "address": "3"}])
        );
        let mut obj = json!({"spec": {"a": 1, "b": 2}});
        strategic_merge(
            "x",
            &mut obj,
            json!({"spec": {"$retainKeys": ["a", "c"], "c": 3}}),
        )
        .unwrap();
        assert_eq!(obj["spec"], json!({"a": 1, "c": 3}));
    }

    #[test]
    fn apply_conflicts_between_managers() {
        let mut mf = ManagedFields::default();
        let a = json!({"spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}});
        let obj = mf
            .apply("a", Some(&json!({"metadata": {"name": "l"}})), &a, false)
            .unwrap();
        let b = json!({"spec": {"holderIdentity": "b", "leaseDurationSeconds": 15}});
        let err = mf.apply("b", Some(&obj), &b, false).unwrap_err();
        assert_eq!(err.len(), 1);
        assert_eq!(err[0].field, ".spec.holderIdentity");
        let forced = mf.apply("b", Some(&obj), &b, true).unwrap();
        assert_eq!(forced["spec"]["holderIdentity"], "b");
        // a now conflicts with b.
        assert!(mf.apply("a", Some(&forced), &a, false).is_err());
    }
}

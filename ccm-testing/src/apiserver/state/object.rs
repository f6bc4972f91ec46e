//! One stored object as the store, the event history, list snapshots and watches share it
//! (one `Arc`, never copied): its JSON text, which lists and watches send as it is, and the
//! few values reads need parsed (name, namespace, resourceVersion, labels, the fields field
//! selectors use, whether it is being deleted). A write parses the text back into a `Value`;
//! a list or a watch never does (except for the events.k8s.io form and metadata-only reads).
//!
//! At 100,000 Nodes the server held every object as a `serde_json::Value`, a copy of it in
//! each of the last 10,000 changes (object and old object, plus a serialised copy), in each
//! list snapshot, and in the queue of every watch that started with the current state.

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::Value;

use super::meta_str;
use crate::apiserver::resources::{RESOURCES, ResourceInfo};
use crate::apiserver::selector::{field_value, selectable_fields};

/// Strings in one allocation, with their end offsets in another.
#[derive(Debug, Default)]
struct StrList {
    text: Box<str>,
    ends: Box<[u32]>,
}

impl StrList {
    fn new<'a>(items: impl IntoIterator<Item = &'a str>) -> StrList {
        let mut text = String::new();
        let mut ends = Vec::new();
        for s in items {
            text.push_str(s);
            ends.push(u32::try_from(text.len()).unwrap_or(u32::MAX));
        }
        StrList {
            text: text.into_boxed_str(),
            ends: ends.into_boxed_slice(),
        }
    }

    fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)? as usize;
        let start = match i {
            0 => 0,
            _ => *self.ends.get(i - 1)? as usize,
        };
        self.text.get(start..end)
    }

    fn len(&self) -> usize {
        self.ends.len()
    }
}

/// An object as stored: see the [module docs](self).
#[derive(Debug)]
pub(crate) struct StoredObject {
    /// The stored representation as JSON text (resourceVersion and managedFields included).
    text: Box<str>,
    name: Box<str>,
    namespace: Box<str>,
    storage: &'static str,
    rv: u64,
    /// The text carries the `kind` and `apiVersion` of its storage's own resource, so a
    /// watch or GET sends it unchanged.
    typed: bool,
    /// `metadata.deletionTimestamp` is set.
    terminating: bool,
    /// The values of [`selectable_fields`] of the storage, in order, then the string-valued
    /// labels as key, value, key, value, ...
    strs: StrList,
}

/// The resource whose representation is the stored one (core Events for the `events`
/// storage that events.k8s.io shares).
fn storage_info(storage: &str) -> Option<&'static ResourceInfo> {
    RESOURCES
        .iter()
        .find(|r| r.storage == storage && r.presents_storage())
}

impl StoredObject {
    /// Stores `obj` (the stored representation) of `storage` under `(namespace, name)`.
    pub(crate) fn new(
        storage: &'static str,
        namespace: &str,
        name: &str,
        obj: &Value,
    ) -> Arc<Self> {
        let fields = selectable_fields(storage);
        let mut values: Vec<Cow<'_, str>> = fields
            .iter()
            .map(|(label, pointer)| Cow::Owned(field_value(obj, label, pointer)))
            .collect();
        if let Some(labels) = obj.pointer("/metadata/labels").and_then(Value::as_object) {
            for (k, v) in labels {
                if let Some(v) = v.as_str() {
                    values.push(Cow::Borrowed(k.as_str()));
                    values.push(Cow::Borrowed(v));
                }
            }
        }
        let typed = storage_info(storage).is_some_and(|info| {
            obj.get("kind").and_then(Value::as_str) == Some(info.kind)
                && obj.get("apiVersion").and_then(Value::as_str)
                    == Some(info.api_version().as_str())
        });
        Arc::new(StoredObject {
            text: obj.to_string().into_boxed_str(),
            name: name.into(),
            namespace: namespace.into(),
            storage,
            rv: meta_str(obj, "resourceVersion")
                .and_then(|s| s.parse().ok())
                .unwrap_or_default(),
            typed,
            terminating: obj.pointer("/metadata/deletionTimestamp").is_some(),
            strs: StrList::new(values.iter().map(|v| v.as_ref())),
        })
    }

    /// The stored JSON text.
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    /// The stored representation, parsed.
    pub(crate) fn value(&self) -> Value {
        // The text was serialised from a `Value`: it always parses.
        serde_json::from_str(&self.text).unwrap_or(Value::Null)
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The namespace (empty for a cluster-scoped object).
    pub(crate) fn namespace(&self) -> &str {
        &self.namespace
    }

    pub(crate) fn storage(&self) -> &'static str {
        self.storage
    }

    /// `metadata.resourceVersion`.
    pub(crate) fn rv(&self) -> u64 {
        self.rv
    }

    /// Whether `metadata.deletionTimestamp` is set.
    pub(crate) fn terminating(&self) -> bool {
        self.terminating
    }

    /// A string-valued label.
    pub(crate) fn label(&self, key: &str) -> Option<&str> {
        let first = selectable_fields(self.storage).len();
        (first..self.strs.len())
            .step_by(2)
            .find(|&i| self.strs.get(i) == Some(key))
            .and_then(|i| self.strs.get(i + 1))
    }

    /// The value a field selector compares for the field label `field`.
    pub(crate) fn field(&self, field: &str) -> Option<&str> {
        match field {
            "metadata.name" => Some(&self.name),
            "metadata.namespace" => Some(&self.namespace),
            _ => selectable_fields(self.storage)
                .iter()
                .position(|(label, _)| *label == field)
                .and_then(|i| self.strs.get(i)),
        }
    }

    /// The object as `info` presents it in a list (`info.present`, without setting
    /// `kind`/`apiVersion`): the stored text itself for every resource but events.k8s.io.
    pub(crate) fn list_item(&self, info: &ResourceInfo) -> Cow<'_, str> {
        if info.presents_storage() {
            Cow::Borrowed(&self.text)
        } else {
            Cow::Owned(info.present(&self.value()).to_string())
        }
    }

    /// The object as `info` presents it alone (GET, watch events): with `kind` and
    /// `apiVersion` set; the stored text itself when it carries them.
    pub(crate) fn presented(&self, info: &ResourceInfo) -> Cow<'_, str> {
        if info.presents_storage() && self.typed {
            Cow::Borrowed(&self.text)
        } else {
            Cow::Owned(self.presented_value(info).to_string())
        }
    }

    /// [`presented`](Self::presented), parsed.
    pub(crate) fn presented_value(&self, info: &ResourceInfo) -> Value {
        let value = self.value();
        let value = if info.presents_storage() {
            value
        } else {
            info.present(&value)
        };
        super::with_type_meta(info, value)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(labels: Value) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "n1", "resourceVersion": "42", "labels": labels},
            "spec": {"unschedulable": true},
        })
    }

    #[test]
    fn keeps_the_text_and_what_reads_need() {
        let obj = node(json!({"zone": "a", "kubernetes.io/hostname": "n1", "n": 5}));
        let s = StoredObject::new("nodes", "", "n1", &obj);
        assert_eq!(s.text(), obj.to_string());
        assert_eq!(s.value(), obj);
        assert_eq!((s.name(), s.namespace(), s.rv()), ("n1", "", 42));
        assert_eq!(s.label("zone"), Some("a"));
        assert_eq!(s.label("kubernetes.io/hostname"), Some("n1"));
        // Not a string: not a label a selector can match.
        assert_eq!(s.label("n"), None);
        assert_eq!(s.label("spec.unschedulable"), None);
        assert_eq!(s.field("spec.unschedulable"), Some("true"));
        assert_eq!(s.field("metadata.name"), Some("n1"));
        assert_eq!(s.field("spec.type"), None);
        assert!(!s.terminating());
        let info = storage_info("nodes").unwrap();
        assert!(matches!(s.presented(info), Cow::Borrowed(_)));
    }

    #[test]
    fn an_untyped_object_is_presented_with_its_kind() {
        let mut obj = node(json!({}));
        obj.as_object_mut().unwrap().remove("kind");
        obj["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        let s = StoredObject::new("nodes", "", "n1", &obj);
        let info = storage_info("nodes").unwrap();
        assert_eq!(s.presented_value(info)["kind"], "Node");
        assert_eq!(s.list_item(info), obj.to_string());
        assert!(s.terminating());
        // A missing `spec.unschedulable` selects as `false`.
        let s = StoredObject::new("nodes", "", "n1", &json!({"metadata": {"name": "n1"}}));
        assert_eq!(s.field("spec.unschedulable"), Some("false"));
    }
}

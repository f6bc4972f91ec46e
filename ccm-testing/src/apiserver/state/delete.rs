//! DELETE of one object (preconditions, finalizers, graceful deletion) and of a collection.

use serde_json::{Value, json};

use super::namespaces::spec_finalizers;
use super::{
    EventType, ListOptions, State, StoredObject, finalizers, into_presented, meta, meta_mut,
    meta_str, now_rfc3339, set_rv,
};
use crate::apiserver::resources::ResourceInfo;
use crate::apiserver::status::ApiError;
use crate::apiserver::validation;

impl State {
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
        let Some(stored) = self.store(info).get(&key).map(|s| s.obj.clone()) else {
            return Err(ApiError::not_found(info, name));
        };
        let obj = stored.value();
        if info.storage == "namespaces"
            && self.admission.namespace_lifecycle
            && validation::IMMORTAL_NAMESPACES.contains(&name)
        {
            // NamespaceLifecycle admission.
            return Err(ApiError {
                details: Some(json!({"name": name, "kind": "namespaces"})),
                ..ApiError::new(
                    403,
                    "Forbidden",
                    format!("namespaces {name:?} is forbidden: this namespace may not be deleted"),
                )
            });
        }
        // Preconditions: the UID, then the resourceVersion.
        for (field, label) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
            let Some(want) = options
                .pointer(&format!("/preconditions/{field}"))
                .and_then(Value::as_str)
            else {
                continue;
            };
            let actual = meta_str(&obj, field).unwrap_or_default();
            if want != actual {
                return Err(ApiError::conflict(
                    info,
                    name,
                    &format!(
                        "Precondition failed: {label} in precondition: {want}, {label} in object meta: {actual}"
                    ),
                ));
            }
        }
        if dry_run {
            return Ok((into_presented(info, obj), false));
        }
        let is_namespace = info.storage == "namespaces";
        let terminating = meta(&obj).is_some_and(|m| m.contains_key("deletionTimestamp"));
        // A Namespace is marked first; it goes on a later DELETE (or `/finalize`) once its
        // `spec.finalizers` are empty, as kube-apiserver's namespace storage does.
        let held = !finalizers(&obj).is_empty()
            || (is_namespace && (!terminating || !spec_finalizers(&obj).is_empty()));
        if held {
            if terminating {
                return Ok((into_presented(info, obj), false));
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
            let object = StoredObject::new(info.storage, &key.0, &key.1, &new);
            if let Some(s) = self.store(info).get_mut(&key) {
                // The managedFields in the text are unchanged: what `s.managed` says holds.
                s.obj = object.clone();
            }
            self.emit(EventType::Modified, object, Some(stored));
            return Ok((into_presented(info, new), false));
        }
        let rv = self.next_rv();
        let mut gone = obj;
        set_rv(&mut gone, rv);
        self.store(info).remove(&key);
        let object = StoredObject::new(info.storage, &key.0, &key.1, &gone);
        self.emit(EventType::Deleted, object, Some(stored));
        Ok((into_presented(info, gone), true))
    }

    /// DELETE on a collection: deletes every matching object, each with `options` (the
    /// request's `DeleteOptions`).
    pub(crate) fn delete_collection(
        &mut self,
        info: &ResourceInfo,
        ns: Option<&str>,
        opts: &ListOptions,
        options: &Value,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let items = self.matching(info, ns, opts);
        let mut out = Vec::new();
        for item in items {
            // The request's namespace: the object's own for a namespaced resource.
            let n = info.namespaced.then(|| item.namespace().to_string());
            let (obj, _) = self.delete(info, n.as_deref(), item.name(), options, dry_run)?;
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

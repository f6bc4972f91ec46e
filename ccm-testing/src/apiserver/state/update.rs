//! PUT and PATCH (merge, JSON, strategic merge, server-side apply), and the write path they
//! share: preconditions, subresource semantics, validation, no-op detection, commit.

use serde_json::{Value, json};

use super::create::secret_defaults;
use super::namespaces::spec_finalizers;
use super::{
    EventType, Key, PatchType, State, Stored, StoredObject, WriteResult, check_type_meta,
    exact_managed, finalizers, into_presented, meta, meta_mut, meta_str, same_content, set_rv,
    validate,
};
use crate::apiserver::patch::{ManagedFields, conflict_error, strategic_merge};
use crate::apiserver::resources::ResourceInfo;
use crate::apiserver::status::{ApiError, FieldError};
use crate::apiserver::validation;

impl State {
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
            let stored = e.obj.value();
            let managed = e.managed(&stored);
            (into_presented(info, stored), managed)
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
    pub(super) fn write(
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
        let Some(entry) = self.store(info).get(&key).cloned() else {
            return Err(ApiError::not_found(info, &name));
        };
        let old = entry.obj.value();
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
        if info.storage == "services" {
            validation::default_ingress_ip_mode(&mut new);
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
        let errs = if self.admission.validation {
            validate(info, &new, Some(&old))
        } else {
            Vec::new()
        };
        if !errs.is_empty() {
            return Err(ApiError::invalid(info, &name, &errs));
        }
        let managed = match applied_managed {
            Some(m) => m,
            None => {
                let mut m = entry.managed(&old);
                m.record_update(manager, Some(&old), &new);
                m
            }
        };
        // A write that changes nothing is not persisted (no new resourceVersion, no event).
        if same_content(&old, &new) {
            if let Some(s) = self.store(info).get_mut(&key) {
                s.managed = exact_managed(managed, &old);
            }
            return Ok(WriteResult {
                object: into_presented(info, old),
                created: false,
            });
        }
        if dry_run {
            set_rv(&mut new, self.rv);
            return Ok(WriteResult {
                object: into_presented(info, new),
                created: false,
            });
        }
        let rv = self.next_rv();
        set_rv(&mut new, rv);
        meta_mut(&mut new).insert("managedFields".into(), managed.to_json(&info.api_version()));
        let object = StoredObject::new(info.storage, &key.0, &key.1, &new);
        if terminating && finalizers(&new).is_empty() && spec_finalizers(&new).is_empty() {
            self.store(info).remove(&key);
            self.emit(EventType::Deleted, object, Some(entry.obj));
        } else {
            let stored = Stored::new(object.clone(), &new, managed);
            self.store(info).insert(key, stored);
            self.emit(EventType::Modified, object, Some(entry.obj));
        }
        Ok(WriteResult {
            object: into_presented(info, new),
            created: false,
        })
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

/// Deep-merges `patch` into `base` (objects merge, other values replace).
fn merge_into(mut base: Value, patch: &Value) -> Value {
    json_patch::merge(&mut base, patch);
    base
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

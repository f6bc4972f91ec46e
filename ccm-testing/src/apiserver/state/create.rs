//! POST: create an object, with the defaults kube-apiserver sets on create (names from
//! `generateName`, uid, timestamps, Service IPs and ports, Secret data, Namespace finalizers).

use rand::Rng;
use serde_json::{Value, json};

use super::{
    EventType, State, Stored, StoredObject, WriteResult, check_type_meta, into_presented, meta_mut,
    meta_str, now_rfc3339, set_rv, validate,
};
use crate::apiserver::patch::ManagedFields;
use crate::apiserver::resources::ResourceInfo;
use crate::apiserver::status::{ApiError, FieldError};
use crate::apiserver::validation;

const GENERATE_CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// kube-apiserver's answer to a create whose `metadata.resourceVersion` is set: its storage
/// layer refuses with a plain error, which the API server reports as `500 InternalError` (not a
/// 4xx). The in-process server's one intended `500` besides injected faults.
pub(crate) const RESOURCE_VERSION_ON_CREATE: &str =
    "Internal error occurred: resourceVersion should not be set on objects to be created";

impl State {
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
    pub(super) fn create_with(
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
                RESOURCE_VERSION_ON_CREATE,
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
        if info.storage == "nodes" && self.admission.not_ready_taint {
            // Admission: TaintNodesByCondition (every create, apply-create included).
            validation::add_not_ready_taint(&mut stored);
        }
        validation::prune_like_go(&mut stored);
        let mut errs = Vec::new();
        if self.admission.validation {
            errs = validate(info, &stored, None);
            if info.group == "events.k8s.io" {
                errs.extend(validation::validate_events_v1_create(&obj));
            }
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
                object: into_presented(info, stored),
                created: true,
            });
        }
        let rv = self.next_rv();
        set_rv(&mut stored, rv);
        let object = StoredObject::new(info.storage, &key.0, &key.1, &stored);
        let entry = Stored::new(object.clone(), &stored, managed);
        self.store(info).insert(key, entry);
        self.emit(EventType::Added, object, None);
        Ok(WriteResult {
            object: into_presented(info, stored),
            created: true,
        })
    }

    /// Resource-specific defaults on create (status reset, allocated values).
    pub(super) fn prepare_create(&mut self, info: &ResourceInfo, obj: &mut Value) {
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
}

/// Secret defaulting: `type: Opaque`, and `stringData` folded into `data` (base64), as
/// kube-apiserver does on every write.
pub(super) fn secret_defaults(obj: &mut Value) {
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

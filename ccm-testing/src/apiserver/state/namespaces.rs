//! The Namespace lifecycle: NamespaceLifecycle admission (no new content in a terminating
//! namespace) and one pass of kube-controller-manager's namespace controller.

use serde_json::{Value, json};

use super::{Key, State, strings_at, with_type_meta};
use crate::apiserver::resources::{RESOURCES, ResourceInfo};
use crate::apiserver::status::ApiError;

/// The finalizer kube-apiserver gives every Namespace, removed by the namespace controller.
const NAMESPACE_FINALIZER: &str = "kubernetes";

/// A Namespace's `spec.finalizers`.
pub(super) fn spec_finalizers(obj: &Value) -> Vec<String> {
    strings_at(obj, "/spec/finalizers")
}

impl State {
    pub(super) fn namespace_phase(&self, ns: &str) -> Option<bool> {
        self.stores
            .get("namespaces")
            .and_then(|s| s.get(&(String::new(), ns.to_string())))
            .map(|n| n.obj.terminating())
    }

    pub(super) fn check_namespace(
        &self,
        info: &ResourceInfo,
        ns: &str,
        creating: bool,
    ) -> Result<(), ApiError> {
        if !self.admission.namespace_lifecycle {
            return Ok(());
        }
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

    /// The names of the Namespaces being deleted whose `kubernetes` finalizer is still set.
    pub(crate) fn namespaces_to_finalize(&self) -> Vec<String> {
        self.stores
            .get("namespaces")
            .map(|s| {
                s.values()
                    .filter(|n| n.obj.terminating())
                    .filter(|n| {
                        spec_finalizers(&n.obj.value())
                            .iter()
                            .any(|f| f == NAMESPACE_FINALIZER)
                    })
                    .map(|n| n.obj.name().to_string())
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
                        .filter(|((n, _), v)| n == ns && !v.obj.terminating())
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
        let Some(current) = self.store(ns_info).get(&key).map(|s| s.obj.value()) else {
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
}

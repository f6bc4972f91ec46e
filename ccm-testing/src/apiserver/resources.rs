//! The resources the in-process API server serves, and how each behaves.

use serde_json::{Map, Value, json};

/// Which name format kube-apiserver validates for a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameRule {
    /// DNS-1123 subdomain (most resources).
    Subdomain,
    /// DNS-1035 label (Services).
    Dns1035Label,
    /// DNS-1123 label (Namespaces).
    Dns1123Label,
    /// Path segment name (Events: anything without `/` or `%`, not `.`/`..`).
    PathSegment,
}

/// Static facts about one served resource.
#[derive(Debug)]
pub(crate) struct ResourceInfo {
    pub(crate) group: &'static str,
    pub(crate) version: &'static str,
    pub(crate) plural: &'static str,
    pub(crate) kind: &'static str,
    pub(crate) namespaced: bool,
    /// Has a `/status` subresource whose writes ignore spec, and main writes ignore status.
    pub(crate) status_subresource: bool,
    /// PUT on a missing object creates it (`AllowCreateOnUpdate`).
    pub(crate) create_on_update: bool,
    /// DELETE answers with the deleted object instead of a `Status` (`ReturnDeletedObject`).
    pub(crate) return_deleted_object: bool,
    pub(crate) name_rule: NameRule,
    /// The storage this resource lives in (events.k8s.io/v1 Events share core Events' storage).
    pub(crate) storage: &'static str,
}

impl ResourceInfo {
    /// `nodes` or `leases.coordination.k8s.io`, as in kube-apiserver's messages.
    pub(crate) fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// `v1` or `coordination.k8s.io/v1`.
    pub(crate) fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Whether [`ResourceInfo::present`] is the stored representation unchanged.
    pub(crate) fn presents_storage(&self) -> bool {
        self.group != "events.k8s.io"
    }

    /// Converts a stored object into this resource's representation.
    pub(crate) fn present(&self, stored: &Value) -> Value {
        if !self.presents_storage() {
            core_event_to_events_v1(stored)
        } else {
            stored.clone()
        }
    }

    /// Converts this resource's representation into the stored form.
    pub(crate) fn to_storage(&self, obj: &Value) -> Value {
        if self.group == "events.k8s.io" {
            events_v1_to_core_event(obj)
        } else {
            obj.clone()
        }
    }
}

const fn res(
    group: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
) -> ResourceInfo {
    ResourceInfo {
        group,
        version: "v1",
        plural,
        kind,
        namespaced,
        status_subresource: false,
        create_on_update: false,
        return_deleted_object: false,
        name_rule: NameRule::Subdomain,
        storage: plural,
    }
}

/// Every resource served.
pub(crate) static RESOURCES: &[ResourceInfo] = &[
    ResourceInfo {
        status_subresource: true,
        ..res("", "nodes", "Node", false)
    },
    ResourceInfo {
        status_subresource: true,
        return_deleted_object: true,
        name_rule: NameRule::Dns1035Label,
        ..res("", "services", "Service", true)
    },
    ResourceInfo {
        status_subresource: true,
        return_deleted_object: true,
        name_rule: NameRule::Dns1123Label,
        ..res("", "namespaces", "Namespace", false)
    },
    ResourceInfo {
        create_on_update: true,
        name_rule: NameRule::PathSegment,
        ..res("", "events", "Event", true)
    },
    ResourceInfo {
        create_on_update: true,
        name_rule: NameRule::PathSegment,
        storage: "events",
        ..res("events.k8s.io", "events", "Event", true)
    },
    ResourceInfo {
        create_on_update: true,
        ..res("coordination.k8s.io", "leases", "Lease", true)
    },
    res("", "configmaps", "ConfigMap", true),
    res("", "secrets", "Secret", true),
    res("", "serviceaccounts", "ServiceAccount", true),
    // RBAC objects, evaluated when RBAC is on (see `ApiServer::enable_rbac`).
    ResourceInfo {
        name_rule: NameRule::PathSegment,
        ..res(
            "rbac.authorization.k8s.io",
            "clusterroles",
            "ClusterRole",
            false,
        )
    },
    ResourceInfo {
        name_rule: NameRule::PathSegment,
        ..res(
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            "ClusterRoleBinding",
            false,
        )
    },
    ResourceInfo {
        name_rule: NameRule::PathSegment,
        ..res("rbac.authorization.k8s.io", "roles", "Role", true)
    },
    ResourceInfo {
        name_rule: NameRule::PathSegment,
        ..res(
            "rbac.authorization.k8s.io",
            "rolebindings",
            "RoleBinding",
            true,
        )
    },
];

/// Looks a resource up by group and plural.
pub(crate) fn lookup(group: &str, version: &str, plural: &str) -> Option<&'static ResourceInfo> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

fn take(obj: &Map<String, Value>, key: &str) -> Option<Value> {
    obj.get(key).filter(|v| !v.is_null()).cloned()
}

fn put(out: &mut Map<String, Value>, key: &str, v: Option<Value>) {
    if let Some(v) = v {
        out.insert(key.to_string(), v);
    }
}

/// events.k8s.io/v1 -> core/v1 field mapping (as kube-apiserver's conversion does).
fn events_v1_to_core_event(obj: &Value) -> Value {
    let Some(o) = obj.as_object() else {
        return obj.clone();
    };
    let mut out = Map::new();
    out.insert("apiVersion".into(), json!("v1"));
    out.insert("kind".into(), json!("Event"));
    put(&mut out, "metadata", take(o, "metadata"));
    put(&mut out, "eventTime", take(o, "eventTime"));
    put(&mut out, "series", take(o, "series"));
    put(
        &mut out,
        "reportingComponent",
        take(o, "reportingController"),
    );
    put(&mut out, "reportingInstance", take(o, "reportingInstance"));
    put(&mut out, "action", take(o, "action"));
    put(&mut out, "reason", take(o, "reason"));
    put(&mut out, "involvedObject", take(o, "regarding"));
    put(&mut out, "related", take(o, "related"));
    put(&mut out, "message", take(o, "note"));
    put(&mut out, "type", take(o, "type"));
    put(&mut out, "source", take(o, "deprecatedSource"));
    put(
        &mut out,
        "firstTimestamp",
        take(o, "deprecatedFirstTimestamp"),
    );
    put(
        &mut out,
        "lastTimestamp",
        take(o, "deprecatedLastTimestamp"),
    );
    put(&mut out, "count", take(o, "deprecatedCount"));
    Value::Object(out)
}

/// core/v1 -> events.k8s.io/v1 field mapping.
fn core_event_to_events_v1(obj: &Value) -> Value {
    let Some(o) = obj.as_object() else {
        return obj.clone();
    };
    let mut out = Map::new();
    out.insert("apiVersion".into(), json!("events.k8s.io/v1"));
    out.insert("kind".into(), json!("Event"));
    put(&mut out, "metadata", take(o, "metadata"));
    put(&mut out, "eventTime", take(o, "eventTime"));
    put(&mut out, "series", take(o, "series"));
    put(
        &mut out,
        "reportingController",
        take(o, "reportingComponent"),
    );
    put(&mut out, "reportingInstance", take(o, "reportingInstance"));
    put(&mut out, "action", take(o, "action"));
    put(&mut out, "reason", take(o, "reason"));
    put(&mut out, "regarding", take(o, "involvedObject"));
    put(&mut out, "related", take(o, "related"));
    put(&mut out, "note", take(o, "message"));
    put(&mut out, "type", take(o, "type"));
    put(&mut out, "deprecatedSource", take(o, "source"));
    put(
        &mut out,
        "deprecatedFirstTimestamp",
        take(o, "firstTimestamp"),
    );
    put(
        &mut out,
        "deprecatedLastTimestamp",
        take(o, "lastTimestamp"),
    );
    put(&mut out, "deprecatedCount", take(o, "count"));
    if !out.contains_key("eventTime") {
        // kube-apiserver reports a null eventTime for core events created without one.
        out.insert("eventTime".into(), Value::Null);
    }
    Value::Object(out)
}

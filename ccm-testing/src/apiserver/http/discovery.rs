//! Discovery documents (`/api`, `/apis`, `/api/v1`, `/apis/<group>/<version>`) built from
//! the resource table.

use serde_json::{Value, json};

use crate::apiserver::resources::{self};

/// `/apis`: the API groups served (besides the core group).
pub(super) fn discovery_groups() -> Value {
    let mut groups: Vec<&str> = resources::RESOURCES
        .iter()
        .map(|r| r.group)
        .filter(|g| !g.is_empty())
        .collect();
    groups.dedup();
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|g| {
            let gv = json!({"groupVersion": format!("{g}/v1"), "version": "v1"});
            json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/api/v1` and `/apis/<group>/v1`: the resources of one group version.
pub(super) fn discovery_resources(path: &str) -> Option<Value> {
    let (group, version) = match path
        .trim_end_matches('/')
        .split('/')
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["", "api", v] => ("", *v),
        ["", "apis", g, v] => (*g, *v),
        _ => return None,
    };
    let mut list = Vec::new();
    for r in resources::RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        list.push(json!({
            "name": r.plural,
            "singularName": r.kind.to_lowercase(),
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
            "shortNames": short_names(r.group, r.plural),
        }));
        if r.status_subresource {
            list.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    if list.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": list}),
    )
}

/// kube-apiserver's short names of a resource, which kubectl resolves through discovery
/// (`kubectl get svc`).
fn short_names(group: &str, plural: &str) -> &'static [&'static str] {
    match (group, plural) {
        ("", "nodes") => &["no"],
        ("", "services") => &["svc"],
        ("", "namespaces") => &["ns"],
        ("", "configmaps") => &["cm"],
        ("", "events") | ("events.k8s.io", "events") => &["ev"],
        _ => &[],
    }
}

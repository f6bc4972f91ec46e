//! RBAC authorisation of the requests themselves, from the Roles, ClusterRoles, RoleBindings
//! and ClusterRoleBindings stored in the server, as kube-apiserver's RBAC authorizer
//! evaluates them (`pkg/apis/rbac/v1/evaluation_helpers.go`, `plugin/pkg/auth/authorizer/rbac`):
//!
//! - a ClusterRoleBinding grants its ClusterRole's rules everywhere; a RoleBinding grants its
//!   Role's (same namespace) or ClusterRole's rules in its own namespace only;
//! - subjects: `User` by name, `Group` by name, `ServiceAccount` as
//!   `system:serviceaccount:<namespace>:<name>` (a RoleBinding's subject without a namespace
//!   means the binding's);
//! - rules: verbs (`*`), API groups (`*`), resources (`*`, `resource/subresource`,
//!   `*/subresource`), resource names (an empty list matches all; a non-empty one only a
//!   request that names an object), `nonResourceURLs` (exact, or a prefix ending in `*`);
//! - `system:masters` is allowed everything (kube-apiserver's privileged group), and every
//!   authenticated user may read the discovery and health paths (the bootstrap roles
//!   `system:discovery` and `system:public-info-viewer`).
//!
//! Hand-written (about a hundred lines) because no crate evaluates Kubernetes RBAC.

use serde_json::Value;

use super::state::State;

/// The privileged group: allowed everything without any binding.
pub(crate) const MASTERS_GROUP: &str = "system:masters";

/// Who made a request (an authenticated user).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) username: String,
    pub(crate) groups: Vec<String>,
}

/// What a request does, as RBAC sees it (kube-apiserver's `RequestInfo`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Attributes {
    pub(crate) verb: String,
    /// `true` for a request on an API resource; `false` for a non-resource path.
    pub(crate) resource_request: bool,
    pub(crate) group: String,
    pub(crate) resource: String,
    pub(crate) subresource: Option<String>,
    pub(crate) namespace: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) path: String,
}

/// Paths every authenticated user may `get` (bootstrap `system:discovery`,
/// `system:public-info-viewer`).
const PUBLIC_PATHS: &[&str] = &[
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/version",
    "/version/",
    "/healthz",
    "/livez",
    "/readyz",
    "/openapi",
    "/openapi/*",
];

fn strs(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn path_matches(pattern: &str, path: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix),
        None => pattern == path,
    }
}

fn rule_allows(rule: &Value, a: &Attributes) -> bool {
    let verbs = strs(rule.get("verbs"));
    if !verbs.iter().any(|v| *v == "*" || *v == a.verb) {
        return false;
    }
    if !a.resource_request {
        return strs(rule.get("nonResourceURLs"))
            .iter()
            .any(|p| path_matches(p, &a.path));
    }
    let groups = strs(rule.get("apiGroups"));
    if !groups.iter().any(|g| *g == "*" || *g == a.group) {
        return false;
    }
    let combined = match &a.subresource {
        Some(sub) => format!("{}/{sub}", a.resource),
        None => a.resource.clone(),
    };
    let resources = strs(rule.get("resources"));
    let resource_ok = resources.iter().any(|r| {
        *r == "*"
            || *r == combined
            || a.subresource
                .as_ref()
                .is_some_and(|sub| r.strip_prefix("*/") == Some(sub.as_str()))
    });
    if !resource_ok {
        return false;
    }
    let names = strs(rule.get("resourceNames"));
    names.is_empty()
        || a.name
            .as_deref()
            .is_some_and(|n| !n.is_empty() && names.contains(&n))
}

fn subject_matches(subject: &Value, binding_ns: &str, who: &Identity) -> bool {
    let name = subject
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match subject.get("kind").and_then(Value::as_str) {
        Some("User") => who.username == name,
        Some("Group") => who.groups.iter().any(|g| g == name),
        Some("ServiceAccount") => {
            let ns = subject
                .get("namespace")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .unwrap_or(binding_ns);
            who.username == format!("system:serviceaccount:{ns}:{name}")
        }
        _ => false,
    }
}

fn meta_str<'a>(obj: &'a Value, key: &str) -> &'a str {
    obj.pointer(&format!("/metadata/{key}"))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// The rules of the role a binding refers to (`namespace` is the binding's, for Roles).
fn role_rules(state: &State, binding: &Value, namespace: &str) -> Vec<Value> {
    let kind = binding
        .pointer("/roleRef/kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let name = binding
        .pointer("/roleRef/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let (storage, ns) = match kind {
        "ClusterRole" => ("clusterroles", ""),
        "Role" => ("roles", namespace),
        _ => return Vec::new(),
    };
    state
        .stored_objects(storage)
        .filter(|r| meta_str(r, "name") == name && meta_str(r, "namespace") == ns)
        .flat_map(|mut r| match r.get_mut("rules").map(Value::take) {
            Some(Value::Array(rules)) => rules,
            _ => Vec::new(),
        })
        .collect()
}

/// Whether `who` may do `a`.
pub(crate) fn allows(state: &State, who: &Identity, a: &Attributes) -> bool {
    if who.groups.iter().any(|g| g == MASTERS_GROUP) {
        return true;
    }
    if !a.resource_request
        && a.verb == "get"
        && PUBLIC_PATHS.iter().any(|p| path_matches(p, &a.path))
    {
        return true;
    }
    let bound = |binding: &Value, binding_ns: &str| {
        binding
            .get("subjects")
            .and_then(Value::as_array)
            .is_some_and(|s| s.iter().any(|s| subject_matches(s, binding_ns, who)))
    };
    let cluster_wide = state
        .stored_objects("clusterrolebindings")
        .filter(|b| bound(b, ""))
        .any(|b| role_rules(state, &b, "").iter().any(|r| rule_allows(r, a)));
    if cluster_wide {
        return true;
    }
    let Some(ns) = a.namespace.as_deref().filter(|_| a.resource_request) else {
        return false;
    };
    state
        .stored_objects("rolebindings")
        .filter(|b| meta_str(b, "namespace") == ns && bound(b, ns))
        .any(|b| role_rules(state, &b, ns).iter().any(|r| rule_allows(r, a)))
}

/// kube-apiserver's `403` message for a denied request.
pub(crate) fn forbidden_message(who: &Identity, a: &Attributes) -> String {
    let user = &who.username;
    if !a.resource_request {
        return format!(
            "forbidden: User {user:?} cannot {} path {:?}",
            a.verb, a.path
        );
    }
    let combined = match &a.subresource {
        Some(sub) => format!("{}/{sub}", a.resource),
        None => a.resource.clone(),
    };
    let qualified = if a.group.is_empty() {
        a.resource.clone()
    } else {
        format!("{}.{}", a.resource, a.group)
    };
    let subject = match a.name.as_deref().filter(|n| !n.is_empty()) {
        Some(name) => format!("{qualified} {name:?}"),
        None => qualified,
    };
    let scope = match &a.namespace {
        Some(ns) => format!("in the namespace {ns:?}"),
        None => "at the cluster scope".to_string(),
    };
    format!(
        "{subject} is forbidden: User {user:?} cannot {} resource {combined:?} in API group {:?} {scope}",
        a.verb, a.group
    )
}

/// The ClusterRoles and ClusterRoleBindings kube-apiserver's bootstrap policy
/// (`plugin/pkg/auth/authorizer/rbac/bootstrappolicy/controller_policy.go`) gives the
/// ServiceAccounts a cloud-controller-manager's controllers run as with
/// `--use-service-account-credentials`: `system:controller:node-controller`,
/// `system:controller:service-controller` and `system:controller:route-controller`, each
/// bound to the ServiceAccount of the same name in `kube-system`.
pub(crate) fn bootstrap_controller_policy() -> Vec<(&'static str, Value)> {
    use serde_json::json;
    let events = json!({"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "update", "patch"]});
    let roles = [
        (
            "node-controller",
            json!([
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "update", "delete", "patch"]},
                {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch", "update"]},
                {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch", "update"]},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "get", "delete"]},
                events.clone(),
            ]),
        ),
        (
            "service-controller",
            json!([
                {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": [""], "resources": ["services/status"], "verbs": ["patch", "update"]},
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]},
                events.clone(),
            ]),
        ),
        (
            "route-controller",
            json!([
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]},
                {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
                events,
            ]),
        ),
    ];
    let mut out = Vec::new();
    for (account, rules) in roles {
        let name = format!("system:controller:{account}");
        let labels = json!({"kubernetes.io/bootstrapping": "rbac-defaults"});
        out.push((
            "clusterroles",
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": name, "labels": labels, "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}},
                "rules": rules,
            }),
        ));
        out.push((
            "clusterrolebindings",
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": name, "labels": labels, "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": "kube-system"}],
            }),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn attrs(verb: &str, resource: &str, sub: Option<&str>, name: Option<&str>) -> Attributes {
        Attributes {
            verb: verb.into(),
            resource_request: true,
            resource: resource.into(),
            subresource: sub.map(str::to_string),
            name: name.map(str::to_string),
            ..Attributes::default()
        }
    }

    #[test]
    fn rules_match_like_rbac() {
        let rule = json!({"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]});
        assert!(rule_allows(
            &rule,
            &attrs("patch", "nodes", Some("status"), Some("n"))
        ));
        assert!(!rule_allows(
            &rule,
            &attrs("patch", "nodes", None, Some("n"))
        ));
        assert!(!rule_allows(
            &rule,
            &attrs("update", "nodes", Some("status"), Some("n"))
        ));
        let star = json!({"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["*"]});
        assert!(rule_allows(
            &star,
            &attrs("update", "services", Some("status"), None)
        ));
        assert!(!rule_allows(
            &star,
            &attrs("update", "services", None, None)
        ));
        let named = json!({"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["x"], "verbs": ["get", "list"]});
        assert!(rule_allows(
            &named,
            &attrs("get", "configmaps", None, Some("x"))
        ));
        assert!(!rule_allows(
            &named,
            &attrs("get", "configmaps", None, Some("y"))
        ));
        assert!(!rule_allows(
            &named,
            &attrs("list", "configmaps", None, None)
        ));
    }

    #[test]
    fn subjects_match_users_groups_and_service_accounts() {
        let who = Identity {
            username: "system:serviceaccount:kube-system:node-controller".into(),
            groups: vec!["system:serviceaccounts".into()],
        };
        let sa = json!({"kind": "ServiceAccount", "name": "node-controller"});
        assert!(subject_matches(&sa, "kube-system", &who));
        assert!(!subject_matches(&sa, "default", &who));
        assert!(subject_matches(
            &json!({"kind": "Group", "name": "system:serviceaccounts"}),
            "",
            &who
        ));
        assert!(!subject_matches(
            &json!({"kind": "User", "name": "node-controller"}),
            "",
            &who
        ));
    }

    #[test]
    fn forbidden_messages_read_like_kube_apiserver() {
        let who = Identity {
            username: "u".into(),
            groups: vec![],
        };
        assert_eq!(
            forbidden_message(&who, &attrs("patch", "nodes", Some("status"), Some("n1"))),
            "nodes \"n1\" is forbidden: User \"u\" cannot patch resource \"nodes/status\" in API group \"\" at the cluster scope"
        );
        let mut a = attrs("list", "leases", None, None);
        a.group = "coordination.k8s.io".into();
        a.namespace = Some("kube-system".into());
        assert_eq!(
            forbidden_message(&who, &a),
            "leases.coordination.k8s.io is forbidden: User \"u\" cannot list resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"kube-system\""
        );
    }
}

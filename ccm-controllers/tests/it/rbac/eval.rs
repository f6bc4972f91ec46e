//! RBAC evaluation as kube-apiserver's authorizer does it, on plain data: which requests a set
//! of bound roles allows, and which grants of a role no request needs.
//!
//! Hand-written (about a hundred lines) because no crate evaluates Kubernetes RBAC rules
//! offline; it follows `k8s.io/kubernetes/pkg/apis/rbac/v1/evaluation_helpers.go`:
//! `VerbMatches`, `APIGroupMatches`, `ResourceMatches` (`*`, `resource/subresource`,
//! `*/subresource`) and `ResourceNameMatches` (an empty list matches every name; a non-empty
//! list only matches a request that names an object, so `create`, and `list`/`watch` without a
//! `metadata.name` field selector, are never allowed by a rule with `resourceNames`).
//! Role rules apply in their binding's namespace only; ClusterRoles bound by a
//! ClusterRoleBinding apply everywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, Subject,
};
use serde::Deserialize;

/// One request as RBAC sees it (kube-apiserver's `RequestInfo`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Access {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub(crate) verb: String,
    /// API group (`""` for core).
    pub(crate) group: String,
    /// Resource (plural).
    pub(crate) resource: String,
    /// Subresource, e.g. `status`.
    pub(crate) subresource: Option<String>,
    /// Namespace, `None` for cluster-scoped requests and all-namespace lists/watches.
    pub(crate) namespace: Option<String>,
    /// The object's name, when the request names one.
    pub(crate) name: Option<String>,
}

impl Access {
    /// `resource` or `resource/subresource`, as written in RBAC rules.
    pub(crate) fn combined_resource(&self) -> String {
        match &self.subresource {
            Some(sub) => format!("{}/{sub}", self.resource),
            None => self.resource.clone(),
        }
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{} {}/{}", self.verb, group, self.combined_resource())?;
        if let Some(ns) = &self.namespace {
            write!(f, " in namespace {ns}")?;
        }
        if let Some(name) = &self.name {
            write!(f, " named {name}")?;
        }
        Ok(())
    }
}

/// One atomic permission: a (apiGroup, resource, verb, resourceName) of one rule of one role,
/// with the scope its binding gives it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Grant {
    /// `ClusterRole/<name>` or `Role/<namespace>/<name>`.
    pub(crate) role: String,
    /// Index of the rule in the role.
    pub(crate) rule: usize,
    /// API group, or `*`.
    pub(crate) group: String,
    /// Resource (`nodes`, `nodes/status`, `*`, `*/status`).
    pub(crate) resource: String,
    /// Verb, or `*`.
    pub(crate) verb: String,
    /// `None`: any name.
    pub(crate) resource_name: Option<String>,
    /// `None`: every namespace and cluster-scoped resources; `Some(ns)`: only requests in `ns`.
    pub(crate) namespace: Option<String>,
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.group.is_empty() {
            "\"\""
        } else {
            &self.group
        };
        write!(
            f,
            "{} rule {}: apiGroups [{group}] resources [{}] verbs [{}]",
            self.role, self.rule, self.resource, self.verb
        )?;
        if let Some(name) = &self.resource_name {
            write!(f, " resourceNames [{name}]")?;
        }
        if let Some(ns) = &self.namespace {
            write!(f, " (namespace {ns})")?;
        }
        Ok(())
    }
}

/// Splits the resource rules of a role into grants (non-resource URL rules are not grants on
/// resources and are left out).
pub(crate) fn grants(role: &str, rules: &[PolicyRule], namespace: Option<&str>) -> Vec<Grant> {
    let mut out = Vec::new();
    for (i, rule) in rules.iter().enumerate() {
        let names: Vec<Option<String>> = match rule.resource_names.as_deref() {
            None | Some([]) => vec![None],
            Some(names) => names.iter().cloned().map(Some).collect(),
        };
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    for name in &names {
                        out.push(Grant {
                            role: role.to_owned(),
                            rule: i,
                            group: group.clone(),
                            resource: resource.clone(),
                            verb: verb.clone(),
                            resource_name: name.clone(),
                            namespace: namespace.map(str::to_owned),
                        });
                    }
                }
            }
        }
    }
    out
}

/// Whether `grant` allows `access`.
pub(crate) fn allows(grant: &Grant, access: &Access) -> bool {
    let scope = match &grant.namespace {
        None => true,
        Some(ns) => access.namespace.as_deref() == Some(ns.as_str()),
    };
    let verb = grant.verb == "*" || grant.verb == access.verb;
    let group = grant.group == "*" || grant.group == access.group;
    let resource = grant.resource == "*"
        || grant.resource == access.combined_resource()
        || access
            .subresource
            .as_ref()
            .is_some_and(|sub| grant.resource == format!("*/{sub}"));
    let name = match &grant.resource_name {
        None => true,
        Some(n) => access.name.as_deref() == Some(n.as_str()),
    };
    scope && verb && group && resource && name
}

/// The accesses no grant allows.
pub(crate) fn uncovered<'a>(grants: &[Grant], accesses: &'a BTreeSet<Access>) -> Vec<&'a Access> {
    accesses
        .iter()
        .filter(|a| !grants.iter().any(|g| allows(g, a)))
        .collect()
}

/// Grants of `role` that are not needed: wildcards (never least privilege), and grants whose
/// removal leaves every access allowed (nothing asked for them, or everything they allow is
/// allowed by another grant too).
pub(crate) fn unneeded(grants: &[Grant], role: &str, accesses: &BTreeSet<Access>) -> Vec<Grant> {
    let mut out = Vec::new();
    for (i, g) in grants.iter().enumerate() {
        if g.role != role {
            continue;
        }
        let wildcard = g.verb == "*" || g.group == "*" || g.resource.starts_with('*');
        let needed = accesses.iter().any(|a| {
            allows(g, a)
                && !grants
                    .iter()
                    .enumerate()
                    .any(|(j, other)| j != i && allows(other, a))
        });
        if wildcard || !needed {
            out.push(g.clone());
        }
    }
    out
}

/// The RBAC objects of a set of manifests.
#[derive(Debug, Default)]
pub(crate) struct Manifests {
    /// ClusterRoles by name.
    pub(crate) cluster_roles: BTreeMap<String, ClusterRole>,
    /// Roles by (namespace, name).
    pub(crate) roles: BTreeMap<(String, String), Role>,
    /// ClusterRoleBindings.
    pub(crate) cluster_role_bindings: Vec<ClusterRoleBinding>,
    /// RoleBindings.
    pub(crate) role_bindings: Vec<RoleBinding>,
}

impl Manifests {
    /// Adds the RBAC objects of a (multi-document) YAML file; other kinds are skipped.
    pub(crate) fn add_yaml(&mut self, file: &str, yaml: &str) -> Result<(), String> {
        for doc in serde_norway::Deserializer::from_str(yaml) {
            let value =
                serde_norway::Value::deserialize(doc).map_err(|e| format!("{file}: {e}"))?;
            let kind = value
                .get("kind")
                .and_then(|k| k.as_str())
                .unwrap_or("")
                .to_owned();
            let bad = |e: serde_norway::Error| format!("{file}: {kind}: {e}");
            match kind.as_str() {
                "ClusterRole" => {
                    let r: ClusterRole = serde_norway::from_value(value).map_err(bad)?;
                    let name = r.metadata.name.clone().unwrap_or_default();
                    self.cluster_roles.insert(name, r);
                }
                "Role" => {
                    let r: Role = serde_norway::from_value(value).map_err(bad)?;
                    let key = (
                        r.metadata.namespace.clone().unwrap_or_default(),
                        r.metadata.name.clone().unwrap_or_default(),
                    );
                    self.roles.insert(key, r);
                }
                "ClusterRoleBinding" => self
                    .cluster_role_bindings
                    .push(serde_norway::from_value(value).map_err(bad)?),
                "RoleBinding" => self
                    .role_bindings
                    .push(serde_norway::from_value(value).map_err(bad)?),
                _ => {}
            }
        }
        Ok(())
    }

    /// Every grant the ServiceAccount `namespace/name` gets through the bindings.
    pub(crate) fn grants_of_service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Vec<Grant>, String> {
        let is_subject = |subjects: &Option<Vec<Subject>>, binding_ns: &str| {
            subjects.iter().flatten().any(|s| match s.kind.as_str() {
                "ServiceAccount" => {
                    s.name == name && s.namespace.as_deref().unwrap_or(binding_ns) == namespace
                }
                "Group" => {
                    s.name == "system:authenticated"
                        || s.name == "system:serviceaccounts"
                        || s.name == format!("system:serviceaccounts:{namespace}")
                }
                "User" => s.name == format!("system:serviceaccount:{namespace}:{name}"),
                _ => false,
            })
        };
        let cluster_role = |role: &str, binding: &str| {
            self.cluster_roles.get(role).ok_or_else(|| {
                format!("{binding} refers to ClusterRole {role}, which is neither in the manifests nor a modelled built-in")
            })
        };
        let mut out = Vec::new();
        for b in &self.cluster_role_bindings {
            if !is_subject(&b.subjects, "") {
                continue;
            }
            let what = format!(
                "ClusterRoleBinding {}",
                b.metadata.name.as_deref().unwrap_or_default()
            );
            if b.role_ref.kind != "ClusterRole" {
                return Err(format!("{what}: roleRef kind {}", b.role_ref.kind));
            }
            let role = cluster_role(&b.role_ref.name, &what)?;
            out.extend(grants(
                &format!("ClusterRole/{}", b.role_ref.name),
                role.rules.as_deref().unwrap_or_default(),
                None,
            ));
        }
        for b in &self.role_bindings {
            let ns = b.metadata.namespace.clone().unwrap_or_default();
            if !is_subject(&b.subjects, &ns) {
                continue;
            }
            let what = format!(
                "RoleBinding {ns}/{}",
                b.metadata.name.as_deref().unwrap_or_default()
            );
            let (role_name, rules) = match b.role_ref.kind.as_str() {
                "ClusterRole" => (
                    format!("ClusterRole/{}", b.role_ref.name),
                    cluster_role(&b.role_ref.name, &what)?.rules.clone(),
                ),
                "Role" => {
                    let role = self
                        .roles
                        .get(&(ns.clone(), b.role_ref.name.clone()))
                        .ok_or_else(|| {
                            format!("{what} refers to Role {ns}/{}, which is neither in the manifests nor a modelled built-in", b.role_ref.name)
                        })?;
                    (format!("Role/{ns}/{}", b.role_ref.name), role.rules.clone())
                }
                other => return Err(format!("{what}: roleRef kind {other}")),
            };
            out.extend(grants(
                &role_name,
                rules.as_deref().unwrap_or_default(),
                Some(&ns),
            ));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(groups: &[&str], resources: &[&str], verbs: &[&str], names: &[&str]) -> PolicyRule {
        let v = |s: &[&str]| s.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        PolicyRule {
            api_groups: Some(v(groups)),
            resources: Some(v(resources)),
            verbs: v(verbs),
            resource_names: (!names.is_empty()).then(|| v(names)),
            non_resource_urls: None,
        }
    }

    fn access(
        verb: &str,
        group: &str,
        resource: &str,
        ns: Option<&str>,
        name: Option<&str>,
    ) -> Access {
        let (resource, sub) = match resource.split_once('/') {
            Some((r, s)) => (r, Some(s.to_owned())),
            None => (resource, None),
        };
        Access {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            subresource: sub,
            namespace: ns.map(Into::into),
            name: name.map(Into::into),
        }
    }

    #[test]
    fn matching_follows_the_api_server() {
        let g = grants(
            "r",
            &[rule(&[""], &["nodes"], &["get", "patch"], &[])],
            None,
        );
        assert!(allows(&g[0], &access("get", "", "nodes", None, Some("n"))));
        assert!(
            !allows(&g[0], &access("get", "", "nodes/status", None, Some("n"))),
            "subresources are separate"
        );
        assert!(!allows(
            &g[0],
            &access("get", "apps", "nodes", None, Some("n"))
        ));
        assert!(!allows(&g[0], &access("list", "", "nodes", None, None)));

        let star = grants("r", &[rule(&["*"], &["*/status"], &["*"], &[])], None);
        assert!(allows(
            &star[0],
            &access("patch", "", "nodes/status", None, Some("n"))
        ));
        assert!(!allows(
            &star[0],
            &access("patch", "", "nodes", None, Some("n"))
        ));
    }

    #[test]
    fn resource_names_only_restrict_requests_that_name_an_object() {
        let g = grants(
            "r",
            &[rule(
                &["coordination.k8s.io"],
                &["leases"],
                &["get", "create", "list"],
                &["l"],
            )],
            None,
        );
        let allowed = |a: &Access| g.iter().any(|g| allows(g, a));
        assert!(allowed(&access(
            "get",
            "coordination.k8s.io",
            "leases",
            Some("ns"),
            Some("l")
        )));
        assert!(!allowed(&access(
            "get",
            "coordination.k8s.io",
            "leases",
            Some("ns"),
            Some("m")
        )));
        assert!(
            !allowed(&access(
                "create",
                "coordination.k8s.io",
                "leases",
                Some("ns"),
                None
            )),
            "create cannot be limited by name"
        );
        assert!(!allowed(&access(
            "list",
            "coordination.k8s.io",
            "leases",
            Some("ns"),
            None
        )));
    }

    #[test]
    fn role_grants_stay_in_their_namespace() {
        let g = grants(
            "Role/kube-system/x",
            &[rule(&[""], &["configmaps"], &["get"], &[])],
            Some("kube-system"),
        );
        assert!(allows(
            &g[0],
            &access("get", "", "configmaps", Some("kube-system"), Some("c"))
        ));
        assert!(!allows(
            &g[0],
            &access("get", "", "configmaps", Some("default"), Some("c"))
        ));
        assert!(!allows(&g[0], &access("get", "", "configmaps", None, None)));
    }

    fn sample() -> (Vec<Grant>, BTreeSet<Access>) {
        let rules = [
            rule(&[""], &["nodes"], &["get", "patch"], &[]),
            rule(&["coordination.k8s.io"], &["leases"], &["get"], &["l"]),
        ];
        let accesses: BTreeSet<Access> = [
            access("get", "", "nodes", None, Some("n")),
            access("patch", "", "nodes", None, Some("n")),
            access(
                "get",
                "coordination.k8s.io",
                "leases",
                Some("ns"),
                Some("l"),
            ),
        ]
        .into_iter()
        .collect();
        (grants("ClusterRole/ccm", &rules, None), accesses)
    }

    #[test]
    fn an_exact_role_passes_both_checks() {
        let (g, a) = sample();
        assert!(uncovered(&g, &a).is_empty());
        assert!(unneeded(&g, "ClusterRole/ccm", &a).is_empty());
    }

    #[test]
    fn removing_any_grant_leaves_a_request_uncovered() {
        let (g, a) = sample();
        for i in 0..g.len() {
            let mut fewer = g.clone();
            let removed = fewer.remove(i);
            assert!(
                !uncovered(&fewer, &a).is_empty(),
                "still covered without {removed}"
            );
        }
    }

    #[test]
    fn an_added_verb_name_or_wildcard_is_unneeded() {
        let (g, a) = sample();
        let base = g[0].clone();
        for extra in [
            Grant {
                verb: "delete".into(),
                ..base.clone()
            },
            Grant {
                resource_name: Some("other".into()),
                ..g[2].clone()
            },
            Grant {
                verb: "*".into(),
                ..base.clone()
            },
            // A duplicate of a needed grant under another rule: neither copy is needed.
            Grant {
                rule: 7,
                ..base.clone()
            },
        ] {
            let mut more = g.clone();
            more.push(extra.clone());
            let unneeded = unneeded(&more, "ClusterRole/ccm", &a);
            assert!(
                unneeded.contains(&extra),
                "{extra} not reported: {unneeded:?}"
            );
        }
        // Grants of other roles (built-ins) are not judged.
        let mut more = g.clone();
        more.push(Grant {
            role: "ClusterRole/system:auth-delegator".into(),
            verb: "delete".into(),
            ..base
        });
        assert!(unneeded(&more, "ClusterRole/ccm", &a).is_empty());
    }

    #[test]
    fn bindings_decide_who_gets_what() {
        let yaml = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: ccm}
rules:
  - apiGroups: [""]
    resources: ["nodes"]
    verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: ccm}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: ccm}
subjects: [{kind: ServiceAccount, name: ccm, namespace: kube-system}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: reader, namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: ccm}
subjects: [{kind: ServiceAccount, name: ccm}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: other, namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: missing}
subjects: [{kind: ServiceAccount, name: someone-else}]
"#;
        let mut m = Manifests::default();
        m.add_yaml("test.yaml", yaml).unwrap();
        let g = m.grants_of_service_account("kube-system", "ccm").unwrap();
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].namespace, None);
        assert_eq!(
            g[1].namespace.as_deref(),
            Some("kube-system"),
            "a RoleBinding scopes a ClusterRole"
        );
        assert!(
            m.grants_of_service_account("kube-system", "nobody")
                .unwrap()
                .is_empty()
        );
        m.cluster_roles.clear();
        let err = m
            .grants_of_service_account("kube-system", "ccm")
            .unwrap_err();
        assert!(err.contains("refers to ClusterRole ccm"), "{err}");
    }
}

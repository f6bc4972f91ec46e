//! The request log's records and the filter tests select them with ([`ApiServer::requests`],
//! [`ApiServer::requests_matching`]).

use super::*;

/// One request the server received, for assertions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// Kubernetes verb: `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection` (or `unknown`).
    pub verb: String,
    /// HTTP method.
    pub method: String,
    /// URL path, e.g. `/api/v1/nodes/n1/status`.
    pub path: String,
    /// Raw query string (empty when none).
    pub query: String,
    /// API group (`""` for the core group).
    pub group: String,
    /// API version.
    pub version: String,
    /// Resource (plural), e.g. `nodes`; empty for non-resource paths.
    pub resource: String,
    /// Subresource, e.g. `status`.
    pub subresource: Option<String>,
    /// Namespace of the request, if namespaced.
    pub namespace: Option<String>,
    /// Object name, if the request names one.
    pub name: Option<String>,
    /// The request's `Content-Type` (patch type for PATCH).
    pub content_type: Option<String>,
    /// The request's `User-Agent`.
    pub user_agent: Option<String>,
    /// HTTP status code of the answer (200 for a watch that was opened).
    pub status: u16,
    /// The patch type of a PATCH (from its `Content-Type`; `None` for other verbs or an
    /// unknown type).
    pub patch_type: Option<PatchType>,
    /// The request body: the object sent by create and update, the patch sent by patch (JSON,
    /// or the apply configuration parsed from YAML), the options of a delete; a body that is
    /// neither JSON nor YAML is kept as a string. `None` without a body, or when the server
    /// does not record bodies ([`ApiServer::set_record_bodies`]).
    pub body: Option<serde_json::Value>,
    /// Whether the server handled the request as a dry run: `dryRun=All` where kube-apiserver
    /// reads it, the query of a create, update or patch, the `DeleteOptions` body of a delete
    /// or deletecollection (its query only when the body is empty). `false` for reads and for
    /// a request whose options are invalid.
    pub dry_run: bool,
    /// The authenticated user name: the user of the request's bearer token (a token issued
    /// by the TokenRequest API authenticates as `system:serviceaccount:<ns>:<name>`), or
    /// `system:admin` for a request without credentials. `None` when authentication failed
    /// (`401`).
    pub user: Option<String>,
    /// The authenticated user's groups (`system:authenticated` included).
    pub groups: Vec<String>,
}

impl RequestRecord {
    /// Whether the request writes (`create`, `update`, `patch`, `delete`, `deletecollection`).
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }

    /// `resource` or `resource/subresource`, e.g. `nodes/status`.
    pub fn resource_path(&self) -> String {
        match &self.subresource {
            Some(sub) => format!("{}/{sub}", self.resource),
            None => self.resource.clone(),
        }
    }
}

/// Which requests [`ApiServer::requests_matching`] returns; every criterion left unset
/// matches all. Built like a Go table test's expectation:
///
/// ```
/// use ccm_testing::apiserver::RequestFilter;
///
/// // The patches of node n1's status made by the cloud-node controller.
/// let filter = RequestFilter::new()
///     .verb("patch")
///     .resource("nodes/status")
///     .name("n1")
///     .user_agent_suffix("/cloud-node-controller");
/// # let _ = filter;
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestFilter {
    verb: Option<String>,
    resource: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    user_agent_suffix: Option<String>,
    user: Option<String>,
    writes_only: bool,
}

impl RequestFilter {
    /// A filter that matches every request.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only requests with this verb (`get`, `list`, `watch`, `create`, `update`, `patch`,
    /// `delete`, `deletecollection`).
    pub fn verb(mut self, verb: &str) -> Self {
        self.verb = Some(verb.to_string());
        self
    }

    /// Only requests on this resource: `nodes` (the main resource only) or
    /// `nodes/status` (that subresource only).
    pub fn resource(mut self, resource: &str) -> Self {
        self.resource = Some(resource.to_string());
        self
    }

    /// Only requests in this namespace.
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.namespace = Some(namespace.to_string());
        self
    }

    /// Only requests naming this object.
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }

    /// Only requests whose `User-Agent` ends with `suffix`, e.g. `/cloud-node-controller`
    /// (client-go's convention: `<binary>/<version> (...) kubernetes/<commit>/<controller>`).
    pub fn user_agent_suffix(mut self, suffix: &str) -> Self {
        self.user_agent_suffix = Some(suffix.to_string());
        self
    }

    /// Only requests authenticated as this user, e.g.
    /// `system:serviceaccount:kube-system:node-controller`.
    pub fn user(mut self, user: &str) -> Self {
        self.user = Some(user.to_string());
        self
    }

    /// Only writes ([`RequestRecord::is_write`]).
    pub fn writes(mut self) -> Self {
        self.writes_only = true;
        self
    }

    /// Whether `r` matches every criterion set.
    pub fn matches(&self, r: &RequestRecord) -> bool {
        let eq = |want: &Option<String>, have: Option<&str>| {
            want.as_deref().is_none_or(|w| have == Some(w))
        };
        eq(&self.verb, Some(&r.verb))
            && self
                .resource
                .as_deref()
                .is_none_or(|w| w == r.resource_path())
            && eq(&self.namespace, r.namespace.as_deref())
            && eq(&self.name, r.name.as_deref())
            && eq(&self.user, r.user.as_deref())
            && self
                .user_agent_suffix
                .as_deref()
                .is_none_or(|s| r.user_agent.as_deref().is_some_and(|ua| ua.ends_with(s)))
            && (!self.writes_only || r.is_write())
    }
}

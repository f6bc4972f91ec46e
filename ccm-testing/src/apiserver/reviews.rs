//! `TokenReview` and `SubjectAccessReview`: the two review APIs a component with delegated
//! authentication and authorisation (such as the CCM's secure port) calls.
//!
//! - `POST /apis/authentication.k8s.io/v1/tokenreviews`: the token is authenticated iff it was
//!   registered with [`ApiServer::add_token`](super::ApiServer::add_token), or issued by the
//!   TokenRequest API (`serviceaccounts/<name>/token`), is not expired and its ServiceAccount
//!   still exists; the answer carries its user name and groups (plus `system:authenticated`,
//!   as kube-apiserver adds it). Other tokens get `authenticated: false` without an error. An
//!   empty token is `400 BadRequest`, as in kube-apiserver.
//! - `POST /apis/authorization.k8s.io/v1/subjectaccessreviews`: allowed iff a rule added with
//!   [`ApiServer::allow_non_resource`](super::ApiServer::allow_non_resource) names the user or
//!   one of the groups, the verb (or `*`) and the path (exact, or a prefix ending in `*`, as
//!   RBAC `nonResourceURLs`), or the RBAC objects stored in the server allow it (resource
//!   attributes included; see the `rbac` module). A review without a user and groups, or
//!   without exactly one of `resourceAttributes`/`nonResourceAttributes`, is `422 Invalid`.
//!
//! Both answer `201 Created` with the review and its `status`, and are recorded in the request
//! log like every request (verb `create`, group, resource `tokenreviews` /
//! `subjectaccessreviews`); [`ApiServer::fail_next`](super::ApiServer::fail_next) applies. The
//! two groups are not listed in discovery.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde_json::{Value, json};

use super::lock;
use super::rbac::{self, Attributes, Identity};
use super::resources::RESOURCES;
use super::state::State;
use super::status::ApiError;

/// Path of the TokenReview collection.
pub(crate) const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
/// Path of the SubjectAccessReview collection.
pub(crate) const SUBJECT_ACCESS_REVIEWS: &str =
    "/apis/authorization.k8s.io/v1/subjectaccessreviews";

/// Group every authenticated user is in.
const AUTHENTICATED_GROUP: &str = "system:authenticated";

/// The audience of the API server itself (kube-apiserver's default `--api-audiences`): a
/// token issued without audiences gets it, and only tokens for it authenticate requests.
pub(crate) const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// A ServiceAccount a token is bound to: namespace, name, uid.
#[derive(Debug, Clone)]
struct BoundAccount {
    namespace: String,
    name: String,
    uid: String,
}

#[derive(Debug, Clone)]
struct TokenUser {
    username: String,
    groups: Vec<String>,
    /// When an issued token stops authenticating (registered tokens never expire).
    expires: Option<jiff::Timestamp>,
    /// Issued tokens only: the ServiceAccount, which must still exist with that uid.
    account: Option<BoundAccount>,
    /// Issued tokens only: the audiences it was issued for.
    audiences: Vec<String>,
}

/// Why a bearer token does not authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenRejection {
    /// Never registered nor issued here.
    Unknown,
    /// Issued here, and its `expirationTimestamp` has passed.
    Expired,
    /// Issued for a ServiceAccount that is gone (or was re-created).
    AccountGone,
    /// Issued for other audiences than the one asked for.
    WrongAudience,
}

/// A token issued by the TokenRequest API.
#[derive(Debug, Clone)]
pub(crate) struct IssuedToken {
    pub(crate) token: String,
    pub(crate) expires: jiff::Timestamp,
}

#[derive(Debug, Clone)]
struct NonResourceRule {
    subject: String,
    verb: String,
    path: String,
}

impl NonResourceRule {
    fn matches(&self, user: &str, groups: &[String], verb: &str, path: &str) -> bool {
        let subject = self.subject == user || groups.contains(&self.subject);
        let verb = self.verb == "*" || self.verb == verb;
        let path = match self.path.strip_suffix('*') {
            Some(prefix) => path.starts_with(prefix),
            None => self.path == path,
        };
        subject && verb && path
    }
}

/// Registered tokens and non-resource rules.
#[derive(Debug, Default)]
pub(crate) struct Reviews {
    tokens: Mutex<BTreeMap<String, TokenUser>>,
    rules: Mutex<Vec<NonResourceRule>>,
}

impl Reviews {
    pub(crate) fn add_token(&self, token: &str, username: &str, groups: &[&str]) {
        lock(&self.tokens).insert(
            token.to_owned(),
            TokenUser {
                username: username.to_owned(),
                groups: groups.iter().map(|g| (*g).to_owned()).collect(),
                expires: None,
                account: None,
                audiences: Vec::new(),
            },
        );
    }

    /// Issues a token for ServiceAccount `namespace/name` (uid `uid`), valid until `expires`,
    /// authenticating as `system:serviceaccount:<namespace>:<name>` in the groups
    /// `system:serviceaccounts` and `system:serviceaccounts:<namespace>`.
    pub(crate) fn issue(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        expires: jiff::Timestamp,
        audiences: Vec<String>,
    ) -> IssuedToken {
        let token = format!("ccm-testing-sa.{}", uuid::Uuid::new_v4().simple());
        lock(&self.tokens).insert(
            token.clone(),
            TokenUser {
                username: format!("system:serviceaccount:{namespace}:{name}"),
                groups: vec![
                    "system:serviceaccounts".to_owned(),
                    format!("system:serviceaccounts:{namespace}"),
                ],
                expires: Some(expires),
                account: Some(BoundAccount {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    uid: uid.to_owned(),
                }),
                audiences,
            },
        );
        IssuedToken { token, expires }
    }

    /// Authenticates a bearer token for `audiences` (the API server's own when empty): its
    /// user with `system:authenticated` added.
    pub(crate) fn authenticate(
        &self,
        token: &str,
        audiences: &[String],
        state: &State,
    ) -> Result<Identity, TokenRejection> {
        let user = lock(&self.tokens)
            .get(token)
            .cloned()
            .ok_or(TokenRejection::Unknown)?;
        if user.expires.is_some_and(|e| jiff::Timestamp::now() >= e) {
            return Err(TokenRejection::Expired);
        }
        if let Some(account) = &user.account {
            let wanted: Vec<&str> = if audiences.is_empty() {
                vec![API_AUDIENCE]
            } else {
                audiences.iter().map(String::as_str).collect()
            };
            if !user.audiences.iter().any(|a| wanted.contains(&a.as_str())) {
                return Err(TokenRejection::WrongAudience);
            }
            let info = RESOURCES
                .iter()
                .find(|r| r.storage == "serviceaccounts")
                .ok_or(TokenRejection::AccountGone)?;
            let current_uid = state
                .get(info, Some(&account.namespace), &account.name)
                .ok()
                .and_then(|sa| {
                    sa.pointer("/metadata/uid")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                });
            if current_uid.as_deref() != Some(account.uid.as_str()) {
                return Err(TokenRejection::AccountGone);
            }
        }
        let mut groups = user.groups;
        if !groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
            groups.push(AUTHENTICATED_GROUP.to_owned());
        }
        Ok(Identity {
            username: user.username,
            groups,
        })
    }

    pub(crate) fn allow_non_resource(&self, subject: &str, verb: &str, path: &str) {
        lock(&self.rules).push(NonResourceRule {
            subject: subject.to_owned(),
            verb: verb.to_owned(),
            path: path.to_owned(),
        });
    }

    /// Whether `POST path` is one of the review endpoints.
    pub(crate) fn handles(method: &str, path: &str) -> bool {
        method == "POST"
            && matches!(
                path.trim_end_matches('/'),
                TOKEN_REVIEWS | SUBJECT_ACCESS_REVIEWS
            )
    }

    /// Answers a review; `Ok` is the `201` body.
    pub(crate) fn serve(&self, path: &str, body: &[u8], state: &State) -> Result<Value, ApiError> {
        let review: Value = serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
        })?;
        if path.trim_end_matches('/') == TOKEN_REVIEWS {
            self.token_review(review, state)
        } else {
            self.access_review(review, state)
        }
    }

    fn token_review(&self, mut review: Value, state: &State) -> Result<Value, ApiError> {
        let token = review
            .pointer("/spec/token")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if token.is_empty() {
            return Err(ApiError::bad_request(
                "token is required for TokenReview in authentication",
            ));
        }
        let audiences: Vec<String> = review
            .pointer("/spec/audiences")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        let mut status = match self.authenticate(&token, &audiences, state) {
            Ok(user) => json!({
                "authenticated": true,
                "user": { "username": user.username, "groups": user.groups },
            }),
            Err(_) => json!({ "user": {} }),
        };
        if let Some(audiences) = review.pointer("/spec/audiences").cloned()
            && status["authenticated"] == true
        {
            status["audiences"] = audiences;
        }
        review["status"] = status;
        stamp(&mut review, "authentication.k8s.io/v1", "TokenReview");
        Ok(review)
    }

    fn access_review(&self, mut review: Value, state: &State) -> Result<Value, ApiError> {
        let spec = review.get("spec").cloned().unwrap_or(Value::Null);
        let user = spec
            .get("user")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let groups: Vec<String> = spec
            .get("groups")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        let resource = spec.get("resourceAttributes").filter(|v| !v.is_null());
        let non_resource = spec.get("nonResourceAttributes").filter(|v| !v.is_null());
        let mut causes = Vec::new();
        if user.is_empty() && groups.is_empty() {
            causes.push(
                "spec.user: Invalid value: \"\": at least one of user or group must be specified",
            );
        }
        match (resource, non_resource) {
            (Some(_), Some(_)) => causes.push(
                "spec.nonResourceAttributes: Invalid value: \"\": cannot be specified in combination with resourceAttributes",
            ),
            (None, None) => causes.push(
                "spec.resourceAttributes: Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified",
            ),
            _ => {}
        }
        if !causes.is_empty() {
            return Err(ApiError::new(
                422,
                "Invalid",
                format!(
                    "SubjectAccessReview.authorization.k8s.io \"\" is invalid: {}",
                    causes.join(", ")
                ),
            ));
        }
        let who = Identity {
            username: user.clone(),
            groups: groups.clone(),
        };
        let field = |v: &Value, k: &str| {
            v.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let status = match (non_resource, resource) {
            (Some(attrs), _) => {
                let verb = field(attrs, "verb");
                let path = field(attrs, "path");
                let allowed = lock(&self.rules)
                    .iter()
                    .any(|r| r.matches(&user, &groups, &verb, &path))
                    || rbac::allows(
                        state,
                        &who,
                        &Attributes {
                            verb: verb.clone(),
                            path: path.clone(),
                            ..Attributes::default()
                        },
                    );
                if allowed {
                    json!({ "allowed": true, "reason": format!("allowed: {verb} {path}") })
                } else {
                    json!({ "allowed": false, "reason": format!("no rule allows {user:?} to {verb} {path}") })
                }
            }
            (None, Some(attrs)) => {
                let opt = |k: &str| Some(field(attrs, k)).filter(|s| !s.is_empty());
                let a = Attributes {
                    verb: field(attrs, "verb"),
                    resource_request: true,
                    group: field(attrs, "group"),
                    resource: field(attrs, "resource"),
                    subresource: opt("subresource"),
                    namespace: opt("namespace"),
                    name: opt("name"),
                    path: String::new(),
                };
                if rbac::allows(state, &who, &a) {
                    json!({ "allowed": true, "reason": "allowed by RBAC" })
                } else {
                    json!({ "allowed": false, "reason": rbac::forbidden_message(&who, &a) })
                }
            }
            (None, None) => json!({ "allowed": false }),
        };
        review["status"] = status;
        stamp(
            &mut review,
            "authorization.k8s.io/v1",
            "SubjectAccessReview",
        );
        Ok(review)
    }
}

/// Sets `apiVersion`, `kind` and an empty `metadata` when missing (reviews are not stored, so
/// they get no name, uid or resourceVersion, as in kube-apiserver).
fn stamp(review: &mut Value, api_version: &str, kind: &str) {
    if !review.is_object() {
        *review = json!({});
    }
    review["apiVersion"] = json!(api_version);
    review["kind"] = json!(kind);
    if review.get("metadata").is_none_or(Value::is_null) {
        review["metadata"] = json!({});
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_resource_rules_match_like_rbac() {
        let r = NonResourceRule {
            subject: "g".into(),
            verb: "get".into(),
            path: "/debug/*".into(),
        };
        assert!(r.matches("u", &["g".into()], "get", "/debug/pprof"));
        assert!(!r.matches("u", &["g".into()], "post", "/debug/pprof"));
        assert!(!r.matches("u", &[], "get", "/debug/pprof"));
        assert!(!r.matches("u", &["g".into()], "get", "/metrics"));
        let r = NonResourceRule {
            subject: "u".into(),
            verb: "*".into(),
            path: "/metrics".into(),
        };
        assert!(r.matches("u", &[], "post", "/metrics"));
        assert!(!r.matches("u", &[], "get", "/metrics/x"));
    }
}

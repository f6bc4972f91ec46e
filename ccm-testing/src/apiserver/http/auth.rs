//! Authentication (bearer tokens, the admin client) and the TokenRequest subresource.

use axum::http::{HeaderMap, header};
use axum::response::Response;
use bytes::Bytes;
use serde_json::{Value, json};

use super::parse_body;
use super::responses::json_response;
use crate::apiserver::Inner;
use crate::apiserver::rbac::{self, Identity};
use crate::apiserver::resources::ResourceInfo;
use crate::apiserver::state::strings_at;
use crate::apiserver::status::ApiError;

/// Who is calling: the user of a bearer token registered with `add_token` or issued by the
/// TokenRequest API, or, without a token, the cluster administrator (as a client with an admin
/// kubeconfig is). A token that does not authenticate is `401 Unauthorized`.
pub(super) fn authenticate(inner: &Inner, headers: &HeaderMap) -> Result<Identity, ApiError> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        });
    match bearer {
        None => Ok(Identity {
            username: ADMIN_USER.to_string(),
            groups: vec![
                rbac::MASTERS_GROUP.to_string(),
                "system:authenticated".to_string(),
            ],
        }),
        Some(token) => {
            let state = inner.state();
            inner
                .reviews
                .authenticate(token, &[], &state)
                .map_err(|why| {
                    tracing::debug!(?why, "ccm-testing ApiServer: bearer token rejected");
                    ApiError::new(401, "Unauthorized", "Unauthorized")
                })
        }
    }
}

/// The user of requests made without credentials.
pub(crate) const ADMIN_USER: &str = "system:admin";

/// `POST .../serviceaccounts/<name>/token`: issues a token for the ServiceAccount, as
/// kube-apiserver's TokenRequest REST does (default and minimum lifetime, capped by the
/// server's maximum, audiences defaulted to the API server's).
pub(super) fn token_request(
    inner: &Inner,
    info: &ResourceInfo,
    ns: &str,
    name: &str,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let mut request = if body.is_empty() {
        json!({})
    } else {
        parse_body(body, false)?
    };
    if !request.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    }
    let requested = request
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(3600);
    let invalid = |detail: &str| {
        ApiError::new(
            422,
            "Invalid",
            format!(
                "TokenRequest.authentication.k8s.io {name:?} is invalid: spec.expirationSeconds: Invalid value: {requested}: {detail}"
            ),
        )
    };
    if requested < 600 {
        return Err(invalid("may not specify a duration less than 10 minutes"));
    }
    if requested > 1 << 32 {
        return Err(invalid(
            "may not specify a duration larger than 2^32 seconds",
        ));
    }
    let account = inner.state().get(info, Some(ns), name)?;
    let uid = account
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let seconds = match inner.max_token_expiration() {
        Some(max) => requested.min(i64::try_from(max.as_secs()).unwrap_or(i64::MAX)),
        None => requested,
    };
    let mut audiences = strings_at(&request, "/spec/audiences");
    if audiences.is_empty() {
        audiences.push(crate::apiserver::reviews::API_AUDIENCE.to_string());
    }
    let now = jiff::Timestamp::now();
    let expires = jiff::Timestamp::from_second(now.as_second().saturating_add(seconds))
        .unwrap_or(jiff::Timestamp::MAX);
    let issued = inner
        .reviews
        .issue(ns, name, &uid, expires, audiences.clone());
    request["apiVersion"] = json!("authentication.k8s.io/v1");
    request["kind"] = json!("TokenRequest");
    request["metadata"] = json!({
        "name": name,
        "namespace": ns,
        "creationTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
    });
    request["spec"]["audiences"] = json!(audiences);
    request["spec"]["expirationSeconds"] = json!(seconds);
    if request["spec"].get("boundObjectRef").is_none() {
        request["spec"]["boundObjectRef"] = Value::Null;
    }
    request["status"] = json!({
        "token": issued.token,
        "expirationTimestamp": issued.expires.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
    });
    Ok(json_response(201, &request))
}

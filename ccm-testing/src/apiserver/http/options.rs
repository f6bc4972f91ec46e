//! A write's options (`dryRun` above all) read where kube-apiserver reads them
//! (`k8s.io/apiserver/pkg/endpoints/handlers`):
//!
//! - create, update and patch (`create.go`, `update.go`, `patch.go`): `CreateOptions`,
//!   `UpdateOptions` and `PatchOptions` come from the query only; the body is the object or
//!   the patch;
//! - delete and deletecollection (`delete.go`): `DeleteOptions` come from the body when the
//!   body is not empty, and then the query is ignored; from the query only when the body is
//!   empty (kube's client sends `{}` for default options, so its `dryRun` must be in the body).
//!
//! Each is validated as `validation.Validate{Create,Update,Patch,Delete}Options` does: `dryRun`
//! may only hold `All` (`Unsupported value` otherwise, 422), and a delete's
//! `propagationPolicy` must be `Orphan`, `Background` or `Foreground` and not come with
//! `orphanDependents`.

use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::apiserver::status::ApiError;

/// The only `dryRun` value kube-apiserver accepts (`metav1.DryRunAll`).
const DRY_RUN_ALL: &str = "All";

/// The `propagationPolicy` values of `DeleteOptions`.
const PROPAGATION_POLICIES: &[&str] = &["Background", "Foreground", "Orphan"];

/// `<Kind>.meta.k8s.io "" is invalid: <errors>` (422), as `errors.NewInvalid` of an options
/// kind.
fn invalid_options(kind: &str, errors: &[(&str, &'static str, String)]) -> ApiError {
    let joined = if errors.len() == 1 {
        errors[0].2.clone()
    } else {
        let all: Vec<&str> = errors.iter().map(|e| e.2.as_str()).collect();
        format!("[{}]", all.join(", "))
    };
    let causes: Vec<Value> = errors
        .iter()
        .map(|(field, reason, message)| json!({"reason": reason, "message": message, "field": field}))
        .collect();
    ApiError {
        details: Some(json!({"group": "meta.k8s.io", "kind": kind, "causes": causes})),
        ..ApiError::new(
            422,
            "Invalid",
            format!("{kind}.meta.k8s.io \"\" is invalid: {joined}"),
        )
    }
}

/// Go's `%#v` of a `[]string`: `[]string{"a", "b"}`.
fn go_string_slice(values: &[String]) -> String {
    let quoted: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
    format!("[]string{{{}}}", quoted.join(", "))
}

/// The `dryRun` field error, if any value is not `All` (`ValidateDryRun`).
fn dry_run_error(values: &[String]) -> Option<(&'static str, &'static str, String)> {
    values.iter().any(|v| v != DRY_RUN_ALL).then(|| {
        (
            "dryRun",
            "FieldValueNotSupported",
            format!(
                "dryRun: Unsupported value: {}: supported values: \"{DRY_RUN_ALL}\"",
                go_string_slice(values)
            ),
        )
    })
}

/// Every value of the query parameter `key`.
fn query_values(query: &[(String, String)], key: &str) -> Vec<String> {
    query
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
        .collect()
}

/// Whether a create (`kind` `CreateOptions`), update (`UpdateOptions`) or patch
/// (`PatchOptions`) is a dry run: its query's `dryRun`, validated.
pub(super) fn query_dry_run(kind: &str, query: &[(String, String)]) -> Result<bool, ApiError> {
    let values = query_values(query, "dryRun");
    if let Some(e) = dry_run_error(&values) {
        return Err(invalid_options(kind, &[e]));
    }
    Ok(!values.is_empty())
}

/// A delete's or deletecollection's options, read and validated as kube-apiserver does.
#[derive(Debug)]
pub(super) struct DeleteOptions {
    /// The options as a `DeleteOptions` object (preconditions, grace period, ...).
    pub(super) value: Value,
    /// `dryRun: ["All"]`.
    pub(super) dry_run: bool,
}

/// The `DeleteOptions` of a DELETE: from `body` when it is not empty (the query is then
/// ignored), else from the query.
pub(super) fn delete_options(
    body: &Bytes,
    query: &[(String, String)],
) -> Result<DeleteOptions, ApiError> {
    let value = if body.is_empty() {
        from_query(query)?
    } else {
        from_body(body)?
    };
    let dry_run: Vec<String> = match value.get("dryRun") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(|| undecodable("dryRun must be a list of strings"))?,
        Some(_) => return Err(undecodable("dryRun must be a list of strings")),
    };
    let mut errors = Vec::new();
    if let Some(e) = dry_run_error(&dry_run) {
        errors.push(e);
    }
    let policy = value.get("propagationPolicy").and_then(Value::as_str);
    if value.get("orphanDependents").is_some_and(|v| !v.is_null()) && policy.is_some() {
        errors.push((
            "propagationPolicy",
            "FieldValueInvalid",
            format!(
                "propagationPolicy: Invalid value: {:?}: orphanDependents and deletionPropagation cannot be both set",
                policy.unwrap_or_default()
            ),
        ));
    }
    if let Some(p) = policy.filter(|p| !PROPAGATION_POLICIES.contains(p)) {
        errors.push((
            "propagationPolicy",
            "FieldValueNotSupported",
            format!(
                "propagationPolicy: Unsupported value: {p:?}: supported values: \"Background\", \"Foreground\", \"Orphan\""
            ),
        ));
    }
    if !errors.is_empty() {
        return Err(invalid_options("DeleteOptions", &errors));
    }
    Ok(DeleteOptions {
        value,
        dry_run: !dry_run.is_empty(),
    })
}

/// Whether a request with `method` is a dry run by the rules above; `false` for a read and
/// for invalid options (the request is refused then).
pub(super) fn handled_as_dry_run(method: &str, body: &Bytes, query: &[(String, String)]) -> bool {
    if method == "DELETE" {
        return delete_options(body, query).is_ok_and(|o| o.dry_run);
    }
    query_options_kind(method).is_some_and(|kind| query_dry_run(kind, query).unwrap_or(false))
}

/// The options kind a request with `method` reads from its query: `CreateOptions` (POST),
/// `UpdateOptions` (PUT), `PatchOptions` (PATCH); `None` for reads and deletes.
pub(super) fn query_options_kind(method: &str) -> Option<&'static str> {
    match method {
        "POST" => Some("CreateOptions"),
        "PUT" => Some("UpdateOptions"),
        "PATCH" => Some("PatchOptions"),
        _ => None,
    }
}

fn undecodable(detail: &str) -> ApiError {
    ApiError::bad_request(format!("cannot decode DeleteOptions: {detail}"))
}

/// A body's `DeleteOptions`: a JSON object whose `kind`, if any, is `DeleteOptions`.
fn from_body(body: &Bytes) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
    })?;
    let Value::Object(map) = &value else {
        return Err(undecodable("the body is not a JSON object"));
    };
    match map.get("kind").and_then(Value::as_str) {
        None | Some("") | Some("DeleteOptions") => Ok(value),
        Some(_) => Err(ApiError::bad_request(
            "decoded object cannot be converted to DeleteOptions",
        )),
    }
}

/// The query's `DeleteOptions` (`dryRun`, `gracePeriodSeconds`, `propagationPolicy`,
/// `orphanDependents`); other parameters are not options and are ignored, as Go's parameter
/// codec does.
fn from_query(query: &[(String, String)]) -> Result<Value, ApiError> {
    let mut map = Map::new();
    let dry_run = query_values(query, "dryRun");
    if !dry_run.is_empty() {
        map.insert("dryRun".into(), json!(dry_run));
    }
    for (k, v) in query {
        match k.as_str() {
            "gracePeriodSeconds" => {
                let secs: i64 = v.parse().map_err(|_| {
                    ApiError::bad_request(format!("invalid gracePeriodSeconds {v:?}"))
                })?;
                map.insert(k.clone(), json!(secs));
            }
            "propagationPolicy" => {
                map.insert(k.clone(), json!(v));
            }
            "orphanDependents" => {
                let b: bool = v.parse().map_err(|_| {
                    ApiError::bad_request(format!("invalid orphanDependents {v:?}"))
                })?;
                map.insert(k.clone(), json!(b));
            }
            _ => {}
        }
    }
    Ok(Value::Object(map))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_body_hides_the_query() {
        let query = q(&[("dryRun", "All")]);
        let opts = delete_options(&Bytes::from_static(b"{}"), &query).unwrap();
        assert!(!opts.dry_run, "the body's options win");
        let opts = delete_options(&Bytes::new(), &query).unwrap();
        assert!(opts.dry_run, "an empty body: the query's");
        let opts = delete_options(&Bytes::from_static(br#"{"dryRun":["All"]}"#), &[]).unwrap();
        assert!(opts.dry_run);
    }

    #[test]
    fn dry_run_values_other_than_all_are_unsupported() {
        let e = delete_options(&Bytes::from_static(br#"{"dryRun":["Yes"]}"#), &[]).unwrap_err();
        assert_eq!(e.code, 422);
        assert_eq!(
            e.message,
            "DeleteOptions.meta.k8s.io \"\" is invalid: dryRun: Unsupported value: []string{\"Yes\"}: supported values: \"All\""
        );
        let e = query_dry_run("PatchOptions", &q(&[("dryRun", "true")])).unwrap_err();
        assert!(
            e.message.starts_with("PatchOptions.meta.k8s.io"),
            "{}",
            e.message
        );
        assert_eq!(
            query_dry_run("CreateOptions", &q(&[("dryRun", "All")])).ok(),
            Some(true)
        );
        assert_eq!(query_dry_run("CreateOptions", &[]).ok(), Some(false));
    }
}

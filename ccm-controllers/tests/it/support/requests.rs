//! Reading the in-process API server's request log.

use ccm_testing::apiserver::{ApiServer, RequestRecord};

/// The statuses the server answered to PATCHes of object `name` itself (not a subresource),
/// in order; only those of `content_type` when given.
pub(crate) fn spec_patch_statuses(
    server: &ApiServer,
    name: &str,
    content_type: Option<&str>,
) -> Vec<u16> {
    patch_statuses(server, name, |r| {
        r.subresource.is_none() && content_type.is_none_or(|c| r.content_type.as_deref() == Some(c))
    })
}

/// The statuses the server answered to PATCHes of object `name`'s `status`, in order.
pub(crate) fn status_patch_statuses(server: &ApiServer, name: &str) -> Vec<u16> {
    patch_statuses(server, name, |r| r.subresource.as_deref() == Some("status"))
}

/// The statuses the server answered to the PATCHes of object `name` that `keep` picks, in order.
fn patch_statuses(
    server: &ApiServer,
    name: &str,
    keep: impl Fn(&RequestRecord) -> bool,
) -> Vec<u16> {
    server
        .requests()
        .iter()
        .filter(|r| r.name.as_deref() == Some(name) && r.verb == "patch" && keep(r))
        .map(|r| r.status)
        .collect()
}

//! The route controller's write: a Node's `NetworkUnavailable` condition, through the `status`
//! subresource, as [`plan::condition_patch`] decides it (a strategic-merge patch of the one
//! condition, or a JSON patch guarded by `test`s of the condition it keeps a value of).

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

use super::plan::{self, DesiredCondition};
use crate::machinery::lean_node::lean_api;

/// What one attempt to write the condition did.
#[derive(Debug)]
pub(super) enum ConditionWrite {
    /// The Node already has the desired status and reason.
    Unneeded,
    /// Written.
    Written,
    /// The Node no longer exists.
    Gone,
    /// The Node changed in what the patch depends on (409, or 422 from a failed `test`):
    /// decide again on a fresh read.
    Conflict(kube::Error),
}

/// One attempt to write `desired` as the `NetworkUnavailable` condition of `node`, planned at
/// `now`. `full` says whether `node` is the whole Node as the API server has it (a GET), not
/// the informer's copy, which is stripped of the conditions no controller reads.
///
/// A patch that keeps the condition's transition time is a JSON patch that addresses the
/// condition by its position among all the Node's conditions: only a full Node has those, so
/// from the informer's copy it is planned again on a fresh read (one GET, only when a Node's
/// condition has the desired status with another reason, e.g. one a CNI set). Writes between
/// that read and the patch fail its `test`s only if they changed that condition.
pub(super) async fn write_condition(
    api: &Api<Node>,
    node: &Node,
    full: bool,
    desired: &DesiredCondition,
    now: &Time,
) -> Result<ConditionWrite, kube::Error> {
    let Some(mut patch) = plan::condition_patch(node, desired, now) else {
        return Ok(ConditionWrite::Unneeded);
    };
    let name = node.name_any();
    // An array is a guarded JSON patch, an object a strategic-merge patch (see
    // `plan::condition_patch`).
    if patch.is_array() && !full {
        let Some(fresh) = api.get_opt(&name).await? else {
            return Ok(ConditionWrite::Gone);
        };
        match plan::condition_patch(&fresh, desired, now) {
            Some(planned) => patch = planned,
            None => return Ok(ConditionWrite::Unneeded),
        }
    }
    let params = PatchParams::default();
    let result = if patch.is_array() {
        let ops: json_patch::Patch =
            serde_json::from_value(patch).map_err(kube::Error::SerdeError)?;
        lean_api(api)
            .patch_status(&name, &params, &Patch::Json::<()>(ops))
            .await
    } else {
        lean_api(api)
            .patch_status(&name, &params, &Patch::Strategic(patch))
            .await
    };
    match result {
        Ok(_) => Ok(ConditionWrite::Written),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(ConditionWrite::Gone),
        Err(kube::Error::Api(status)) if status.code == 409 || status.code == 422 => {
            Ok(ConditionWrite::Conflict(kube::Error::Api(status)))
        }
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    //! Against the in-process API server: a Node write between the controller's read and its
    //! patch costs a round trip only when it changed the condition the patch keeps a value of.
    use super::*;
    use ccm_testing::apiserver::{ApiServer, RequestFilter};
    use ccm_testing::builders::kubelet_node;
    use kube::api::PostParams;
    use serde_json::json;

    fn t(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    /// A Node whose CNI set `NetworkUnavailable=False` with its own reason, as read by the
    /// controller.
    async fn cni_node(api: &Api<Node>, name: &str) -> Node {
        api.create(&PostParams::default(), &kubelet_node(name).build())
            .await
            .unwrap();
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "", "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "NetworkUnavailable", "status": "False", "reason": "CalicoIsUp", "message": "", "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            ]}})),
        )
        .await
        .unwrap()
    }

    fn network_unavailable(node: &Node) -> serde_json::Value {
        let conditions = &serde_json::to_value(node).unwrap()["status"]["conditions"];
        conditions
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "NetworkUnavailable")
            .cloned()
            .unwrap()
    }

    fn node_requests(server: &ApiServer) -> Vec<String> {
        server
            .requests_matching(&RequestFilter::new().name("n1"))
            .iter()
            .map(|r| format!("{} {} {}", r.verb, r.resource_path(), r.status))
            .collect()
    }

    #[tokio::test]
    async fn a_heartbeat_or_a_label_after_the_read_costs_no_round_trip() {
        let server = ApiServer::start().await;
        let api: Api<Node> = Api::all(server.client());
        let read = cni_node(&api, "n1").await;
        // kubelet's heartbeat of its Ready condition, and a label, after the controller read.
        api.patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "", "lastHeartbeatTime": "2026-01-01T00:00:10Z", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            ]}})),
        )
        .await
        .unwrap();
        api.patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "x"}}})),
        )
        .await
        .unwrap();
        server.clear_requests();
        let now = t("2026-01-01T00:01:00Z");
        let outcome = write_condition(&api, &read, true, &DesiredCondition::ROUTE_CREATED, &now)
            .await
            .unwrap();
        assert!(matches!(outcome, ConditionWrite::Written), "{outcome:?}");
        assert_eq!(node_requests(&server), ["patch nodes/status 200"]);
        let written = api.get("n1").await.unwrap();
        let c = network_unavailable(&written);
        assert_eq!(c["reason"], "RouteCreated");
        assert_eq!(c["lastTransitionTime"], "2026-01-01T00:00:00Z");
        assert_eq!(c["lastHeartbeatTime"], "2026-01-01T00:01:00Z");
        assert_eq!(written.labels().get("team").map(String::as_str), Some("x"));
    }

    #[tokio::test]
    async fn a_changed_condition_after_the_read_is_decided_again() {
        let server = ApiServer::start().await;
        let api: Api<Node> = Api::all(server.client());
        let read = cni_node(&api, "n1").await;
        // The CNI flips the condition to True and back: another transition time.
        for (status, at) in [
            ("True", "2026-01-01T00:00:20Z"),
            ("False", "2026-01-01T00:00:30Z"),
        ] {
            api.patch_status(
                "n1",
                &PatchParams::default(),
                &Patch::Strategic(json!({"status": {"conditions": [
                    {"type": "NetworkUnavailable", "status": status, "reason": "CalicoIsUp", "message": "", "lastHeartbeatTime": at, "lastTransitionTime": at},
                ]}})),
            )
            .await
            .unwrap();
        }
        let now = t("2026-01-01T00:01:00Z");
        let outcome = write_condition(&api, &read, true, &DesiredCondition::ROUTE_CREATED, &now)
            .await
            .unwrap();
        assert!(
            matches!(outcome, ConditionWrite::Conflict(_)),
            "{outcome:?}"
        );
        // Nothing was written from the stale read; decided again on a fresh one, the write
        // keeps the current transition time.
        let fresh = api.get("n1").await.unwrap();
        assert_eq!(network_unavailable(&fresh)["reason"], "CalicoIsUp");
        let outcome = write_condition(&api, &fresh, true, &DesiredCondition::ROUTE_CREATED, &now)
            .await
            .unwrap();
        assert!(matches!(outcome, ConditionWrite::Written), "{outcome:?}");
        let c = network_unavailable(&api.get("n1").await.unwrap());
        assert_eq!(c["reason"], "RouteCreated");
        assert_eq!(c["lastTransitionTime"], "2026-01-01T00:00:30Z");
    }

    #[tokio::test]
    async fn from_a_stripped_copy_the_condition_is_read_before_it_is_kept() {
        let server = ApiServer::start().await;
        let api: Api<Node> = Api::all(server.client());
        let mut cached = cni_node(&api, "n1").await;
        // The informer's copy: only Ready and NetworkUnavailable (positions differ).
        if let Some(conditions) = cached.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            conditions.retain(|c| c.type_ == "NetworkUnavailable");
        }
        server.clear_requests();
        let now = t("2026-01-01T00:01:00Z");
        let outcome = write_condition(&api, &cached, false, &DesiredCondition::ROUTE_CREATED, &now)
            .await
            .unwrap();
        assert!(matches!(outcome, ConditionWrite::Written), "{outcome:?}");
        assert_eq!(
            node_requests(&server),
            ["get nodes 200", "patch nodes/status 200"]
        );
        let written = api.get("n1").await.unwrap();
        let c = network_unavailable(&written);
        assert_eq!(c["reason"], "RouteCreated");
        assert_eq!(c["lastTransitionTime"], "2026-01-01T00:00:00Z");
        let conditions = &serde_json::to_value(&written).unwrap()["status"]["conditions"];
        let conditions = conditions.as_array().unwrap();
        assert!(
            conditions.len() > 2
                && conditions
                    .iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True"),
            "the other conditions are untouched: {conditions:?}"
        );
    }
}

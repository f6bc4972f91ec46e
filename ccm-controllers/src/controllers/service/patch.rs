//! The service controller's writes to Services: the cleanup finalizer, added and removed with
//! JSON patches of the `status` subresource guarded by `test`s of exactly what the decision
//! read ([`plan::add_finalizer_patch`], [`plan::remove_finalizer_patch`]), and the load
//! balancer's ingress in `status.loadBalancer` ([`write_status`]).
//!
//! Why the status subresource: Go writes finalizers there too (`PatchService`), so the same
//! RBAC (`services/status` patch) works. Why not a `test` of `metadata.resourceVersion`:
//! every write to the Service bumps it (a label, an annotation, another controller's status
//! write), and each cost a 422, a GET and a second PATCH, for a change the write does not
//! depend on. A failed `test` (422) or a conflict (409) is decided again on a fresh read, a
//! bounded number of times.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{LoadBalancerStatus, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

use super::classes::ServedClasses;
use super::plan::{self, Decision};

/// How often a write that hit a conflict is retried on a fresh read within one sync.
pub(super) const MAX_CONFLICT_ATTEMPTS: usize = 5;

/// Why a finalizer write did not complete.
#[derive(Debug)]
pub(super) enum WriteError {
    /// The Service no longer exists.
    Gone,
    /// The Service changed so that the decision must be made again, on this fresh copy.
    Changed(Arc<Service>),
    /// The write failed (the message says why); retry with backoff.
    Failed(String),
}

fn is_status(error: &kube::Error, codes: &[u16]) -> bool {
    matches!(error, kube::Error::Api(s) if codes.contains(&s.code))
}

/// A conflict: 409, or 422 from a failed JSON-patch `test`.
fn is_conflict(error: &kube::Error) -> bool {
    is_status(error, &[409, 422])
}

pub(super) fn is_not_found(error: &kube::Error) -> bool {
    is_status(error, &[404])
}

fn json_patch(value: serde_json::Value) -> Result<Patch<()>, WriteError> {
    serde_json::from_value::<json_patch::Patch>(value)
        .map(Patch::Json)
        .map_err(|e| WriteError::Failed(format!("building JSON patch: {e}")))
}

/// After a conflict: the Service as the API server has it now. `Ok(None)`: it is gone. An
/// error when the read failed, or when the patch was refused as invalid (422) although the
/// Service did not change since `current`: then no `test` failed, the server refused the
/// change itself, and retrying it cannot help.
async fn fresh_read(
    api: &Api<Service>,
    current: &Service,
    refused: kube::Error,
) -> Result<Option<Arc<Service>>, WriteError> {
    let fresh = match api.get(&current.name_any()).await {
        Ok(fresh) => fresh,
        Err(e) if is_not_found(&e) => return Ok(None),
        Err(e) => return Err(WriteError::Failed(e.to_string())),
    };
    if is_status(&refused, &[422])
        && fresh.metadata.resource_version == current.metadata.resource_version
    {
        return Err(WriteError::Failed(refused.to_string()));
    }
    Ok(Some(Arc::new(fresh)))
}

/// Adds the cleanup finalizer to `service` (as read when the controller decided to ensure its
/// load balancer). Returns the Service as written.
pub(super) async fn add_finalizer(
    api: &Api<Service>,
    service: &Arc<Service>,
    classes: &ServedClasses,
) -> Result<Arc<Service>, WriteError> {
    let name = service.name_any();
    let mut current = service.clone();
    for _ in 0..MAX_CONFLICT_ATTEMPTS {
        let Some(patch) = plan::add_finalizer_patch(&current) else {
            return Ok(current);
        };
        match api
            .patch_status(&name, &PatchParams::default(), &json_patch(patch)?)
            .await
        {
            Ok(updated) if plan::has_cleanup_finalizer(&updated) => return Ok(Arc::new(updated)),
            Ok(_) => {
                return Err(WriteError::Failed(
                    "the API server accepted the patch but did not keep the finalizer".into(),
                ));
            }
            Err(e) if is_not_found(&e) => return Err(WriteError::Gone),
            Err(e) if is_conflict(&e) => {
                let Some(fresh) = fresh_read(api, &current, e).await? else {
                    return Err(WriteError::Gone);
                };
                if fresh.metadata.uid != service.metadata.uid
                    || plan::decide(&fresh, true, classes) != Decision::Ensure
                {
                    return Err(WriteError::Changed(fresh));
                }
                current = fresh;
            }
            Err(e) => return Err(WriteError::Failed(e.to_string())),
        }
    }
    Err(WriteError::Failed(format!(
        "conflict persisted after {MAX_CONFLICT_ATTEMPTS} attempts"
    )))
}

/// Removes the cleanup finalizer from `service` (as read when the controller decided to
/// delete its load balancer). A Service that is gone or no longer carries the finalizer is
/// done. Returns whether the Service is gone: it no longer exists, was replaced, or our write
/// removed the last finalizer of a Service being deleted (the API server then deletes it), so
/// there is no status left to write. [`WriteError::Changed`] when it wants a load balancer
/// again.
pub(super) async fn remove_finalizer(
    api: &Api<Service>,
    service: &Arc<Service>,
    classes: &ServedClasses,
) -> Result<bool, WriteError> {
    let name = service.name_any();
    let mut current = service.clone();
    for _ in 0..MAX_CONFLICT_ATTEMPTS {
        let Some(patch) = plan::remove_finalizer_patch(&current) else {
            return Ok(false);
        };
        match api
            .patch_status(&name, &PatchParams::default(), &json_patch(patch)?)
            .await
        {
            Ok(updated) => {
                let deleted = plan::is_being_deleted(&updated)
                    && updated
                        .metadata
                        .finalizers
                        .as_ref()
                        .is_none_or(Vec::is_empty);
                return Ok(deleted);
            }
            Err(e) if is_not_found(&e) => return Ok(true),
            Err(e) if is_conflict(&e) => {
                let Some(fresh) = fresh_read(api, &current, e).await? else {
                    return Ok(true);
                };
                if fresh.metadata.uid != service.metadata.uid {
                    // The Service we cleaned up is gone; its successor is someone else's
                    // business.
                    return Ok(true);
                }
                if plan::decide(&fresh, true, classes) == Decision::Ensure {
                    // It wants a load balancer again: keep the finalizer and ensure.
                    return Err(WriteError::Changed(fresh));
                }
                current = fresh;
            }
            Err(e) => return Err(WriteError::Failed(e.to_string())),
        }
    }
    Err(WriteError::Failed(format!(
        "conflict persisted after {MAX_CONFLICT_ATTEMPTS} attempts"
    )))
}

/// Writes `status.loadBalancer.ingress` and the load balancer's condition (`state`) with one
/// strategic-merge patch of the status subresource when either differs from the Service
/// ([`plan::status_patch`]; no write when neither does). A Service that no longer exists is not
/// an error.
pub(super) async fn write_status(
    api: &Api<Service>,
    service: &Service,
    status: &LoadBalancerStatus,
    state: &plan::LoadBalancerState,
) -> Result<(), kube::Error> {
    let now = Time(jiff::Timestamp::now());
    let Some(body) = plan::status_patch(service, status, state, &now) else {
        return Ok(());
    };
    match api
        .patch_status(
            &service.name_any(),
            &PatchParams::default(),
            &if body["status"].get("conditions").is_some() {
                Patch::Strategic(body)
            } else {
                Patch::Merge(body)
            },
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    //! Against the in-process API server: what another writer changed between the
    //! controller's read and its patch costs a round trip only when the patch depends on it.
    use super::*;
    use ccm_core::well_known::FINALIZER_LOAD_BALANCER_CLEANUP;
    use ccm_testing::apiserver::{ApiServer, RequestFilter, RequestRecord};
    use ccm_testing::builders::load_balancer_service;
    use kube::api::PostParams;
    use serde_json::json;

    const NS: &str = "default";

    async fn create(api: &Api<Service>, name: &str) -> Arc<Service> {
        let svc = load_balancer_service(NS, name).build();
        Arc::new(api.create(&PostParams::default(), &svc).await.unwrap())
    }

    async fn merge(api: &Api<Service>, name: &str, body: serde_json::Value) {
        api.patch(name, &PatchParams::default(), &Patch::Merge(body))
            .await
            .unwrap();
    }

    /// The service requests since the last `clear_requests`, as `VERB resource status`.
    fn requests(server: &ApiServer) -> Vec<String> {
        server
            .requests_matching(&RequestFilter::new().namespace(NS))
            .iter()
            .filter(|r| r.resource == "services")
            .map(|r: &RequestRecord| format!("{} {} {}", r.verb, r.resource_path(), r.status))
            .collect()
    }

    fn finalizers(service: &Service) -> Vec<String> {
        service.metadata.finalizers.clone().unwrap_or_default()
    }

    #[tokio::test]
    async fn unrelated_writes_after_the_read_cost_no_round_trip() {
        let server = ApiServer::start().await;
        let api: Api<Service> = Api::namespaced(server.client(), NS);
        let read = create(&api, "web").await;
        // Between the controller's read and its patch: a label, an annotation, and another
        // writer's status (each bumps the resourceVersion).
        merge(
            &api,
            "web",
            json!({"metadata": {"labels": {"team": "x"}, "annotations": {"a": "b"}}}),
        )
        .await;
        api.patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{"type": "Example", "status": "True", "reason": "R", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})),
        )
        .await
        .unwrap();
        server.clear_requests();
        let written = add_finalizer(&api, &read, &ServedClasses::default())
            .await
            .unwrap();
        assert_eq!(finalizers(&written), [FINALIZER_LOAD_BALANCER_CLEANUP]);
        assert_eq!(written.labels().get("team").map(String::as_str), Some("x"));
        assert_eq!(requests(&server), ["patch services/status 200"]);

        // The removal, planned on a read from before another label write.
        merge(
            &api,
            "web",
            json!({"spec": {"type": "ClusterIP", "externalTrafficPolicy": null}}),
        )
        .await;
        let read = Arc::new(api.get("web").await.unwrap());
        merge(&api, "web", json!({"metadata": {"labels": {"team": "y"}}})).await;
        server.clear_requests();
        assert!(
            !remove_finalizer(&api, &read, &ServedClasses::default())
                .await
                .unwrap()
        );
        assert_eq!(requests(&server), ["patch services/status 200"]);
        let now = api.get("web").await.unwrap();
        assert!(finalizers(&now).is_empty());
        assert_eq!(now.labels().get("team").map(String::as_str), Some("y"));
    }

    #[tokio::test]
    async fn a_concurrent_change_of_what_was_read_is_decided_again_on_a_fresh_read() {
        let server = ApiServer::start().await;
        let api: Api<Service> = Api::namespaced(server.client(), NS);

        // Another writer's finalizer: kept, ours added after one failed test and a GET.
        let read = create(&api, "a").await;
        merge(
            &api,
            "a",
            json!({"metadata": {"finalizers": ["example.com/x"]}}),
        )
        .await;
        server.clear_requests();
        let written = add_finalizer(&api, &read, &ServedClasses::default())
            .await
            .unwrap();
        assert_eq!(
            finalizers(&written),
            ["example.com/x", FINALIZER_LOAD_BALANCER_CLEANUP]
        );
        assert_eq!(
            requests(&server),
            [
                "patch services/status 422",
                "get services 200",
                "patch services/status 200"
            ]
        );

        // The type changed: no finalizer; the caller decides again on the fresh copy.
        let read = create(&api, "b").await;
        merge(
            &api,
            "b",
            json!({"spec": {"type": "ClusterIP", "externalTrafficPolicy": null}}),
        )
        .await;
        match add_finalizer(&api, &read, &ServedClasses::default()).await {
            Err(WriteError::Changed(fresh)) => {
                assert!(!plan::wants_load_balancer(
                    &fresh,
                    &ServedClasses::default()
                ));
            }
            other => panic!("{other:?}"),
        }
        assert!(finalizers(&api.get("b").await.unwrap()).is_empty());

        // Removal while another finalizer was put in front of ours: only ours goes.
        merge(
            &api,
            "a",
            json!({"spec": {"type": "ClusterIP", "externalTrafficPolicy": null}}),
        )
        .await;
        let read = Arc::new(api.get("a").await.unwrap());
        merge(
            &api,
            "a",
            json!({"metadata": {"finalizers": ["example.com/y", "example.com/x", FINALIZER_LOAD_BALANCER_CLEANUP]}}),
        )
        .await;
        server.clear_requests();
        assert!(
            !remove_finalizer(&api, &read, &ServedClasses::default())
                .await
                .unwrap()
        );
        assert_eq!(
            finalizers(&api.get("a").await.unwrap()),
            ["example.com/y", "example.com/x"]
        );
        assert_eq!(
            requests(&server)[..3],
            [
                "patch services/status 422",
                "get services 200",
                "patch services/status 200"
            ]
        );

        // Removal while the Service became a LoadBalancer again: the finalizer stays.
        add_finalizer(&api, &create(&api, "c").await, &ServedClasses::default())
            .await
            .unwrap();
        merge(
            &api,
            "c",
            json!({"spec": {"type": "ClusterIP", "externalTrafficPolicy": null}}),
        )
        .await;
        let read_as_cluster_ip = Arc::new(api.get("c").await.unwrap());
        merge(&api, "c", json!({"spec": {"type": "LoadBalancer"}})).await;
        match remove_finalizer(&api, &read_as_cluster_ip, &ServedClasses::default()).await {
            Err(WriteError::Changed(fresh)) => {
                assert_eq!(
                    plan::decide(&fresh, true, &ServedClasses::default()),
                    Decision::Ensure
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            finalizers(&api.get("c").await.unwrap()),
            [FINALIZER_LOAD_BALANCER_CLEANUP]
        );
    }
}

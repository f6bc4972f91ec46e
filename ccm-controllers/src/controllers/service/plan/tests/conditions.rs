//! The status patch with `--load-balancer-status-conditions`: the `LoadBalancerProvisioned`
//! condition rides in the ingress's patch and is written only when it changes.

use super::*;

#[test]
fn status_patch_only_when_ingress_or_condition_changed() {
    let now = Time("2026-01-01T00:00:00Z".parse().unwrap());
    let ok = LoadBalancerState::Provisioned;
    let mut s = lb();
    assert_eq!(
        status_patch(
            &s,
            &LoadBalancerStatus::default(),
            &LoadBalancerState::NotServed,
            &now
        ),
        None
    );
    let patch = status_patch(&s, &status(&["203.0.113.10"]), &ok, &now).unwrap();
    assert_eq!(
        patch,
        json!({"status": {
            "loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]},
            "conditions": [{"type": "LoadBalancerProvisioned", "status": "True", "reason": "Provisioned", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        }})
    );
    s.status = Some(ServiceStatus {
        load_balancer: Some(status(&["203.0.113.10"])),
        conditions: Some(vec![
            serde_json::from_value(patch["status"]["conditions"][0].clone()).unwrap(),
        ]),
    });
    assert_eq!(
        status_patch(&s, &status(&["203.0.113.10"]), &ok, &now),
        None
    );
    assert_eq!(
        status_patch(
            &s,
            &LoadBalancerStatus::default(),
            &LoadBalancerState::NotServed,
            &now
        )
        .unwrap(),
        json!({"status": {
            "loadBalancer": {"ingress": null},
            "conditions": [{"type": "LoadBalancerProvisioned", "$patch": "delete"}],
        }})
    );
}

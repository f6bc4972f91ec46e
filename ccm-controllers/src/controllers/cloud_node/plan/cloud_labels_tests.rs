//! The rule of label reconciliation with the cloud (`plan_cloud_labels`).

use std::collections::{BTreeMap, HashMap};

use ccm_core::InstanceMetadata;
use ccm_core::well_known::{
    LABEL_FAILURE_DOMAIN_BETA_REGION, LABEL_FAILURE_DOMAIN_BETA_ZONE, LABEL_INSTANCE_TYPE,
    LABEL_INSTANCE_TYPE_BETA, LABEL_TOPOLOGY_REGION, LABEL_TOPOLOGY_ZONE,
};

use super::{cloud_label_metric_key, plan_cloud_labels};

fn meta(
    zone: &str,
    region: &str,
    instance_type: &str,
    additional: &[(&str, &str)],
) -> InstanceMetadata {
    InstanceMetadata {
        zone: zone.into(),
        region: region.into(),
        instance_type: instance_type.into(),
        additional_labels: additional
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    }
}

fn in_step(zone: &str, region: &str, instance_type: &str) -> HashMap<String, String> {
    [
        (LABEL_TOPOLOGY_ZONE, zone),
        (LABEL_FAILURE_DOMAIN_BETA_ZONE, zone),
        (LABEL_TOPOLOGY_REGION, region),
        (LABEL_FAILURE_DOMAIN_BETA_REGION, region),
        (LABEL_INSTANCE_TYPE, instance_type),
        (LABEL_INSTANCE_TYPE_BETA, instance_type),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

fn plan(labels: &HashMap<String, String>, meta: &InstanceMetadata) -> BTreeMap<String, String> {
    plan_cloud_labels(|k| labels.get(k).map(String::as_str), meta)
}

#[test]
fn labels_in_step_plan_nothing() {
    let labels = in_step("z1", "r1", "small");
    assert!(plan(&labels, &meta("z1", "r1", "small", &[])).is_empty());
}

#[test]
fn a_resize_or_migration_moves_ga_and_beta_labels() {
    let labels = in_step("z1", "r1", "small");
    let planned = plan(&labels, &meta("z2", "r1", "large", &[]));
    let expected: BTreeMap<String, String> = [
        (LABEL_TOPOLOGY_ZONE, "z2"),
        (LABEL_FAILURE_DOMAIN_BETA_ZONE, "z2"),
        (LABEL_INSTANCE_TYPE, "large"),
        (LABEL_INSTANCE_TYPE_BETA, "large"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    assert_eq!(planned, expected);
}

#[test]
fn an_edited_or_removed_label_is_set_back() {
    let mut labels = in_step("z1", "r1", "small");
    labels.insert(LABEL_TOPOLOGY_ZONE.into(), "edited".into());
    labels.remove(LABEL_INSTANCE_TYPE_BETA);
    let planned = plan(&labels, &meta("z1", "r1", "small", &[]));
    assert_eq!(
        planned.get(LABEL_TOPOLOGY_ZONE).map(String::as_str),
        Some("z1")
    );
    assert_eq!(
        planned.get(LABEL_INSTANCE_TYPE_BETA).map(String::as_str),
        Some("small")
    );
    assert_eq!(planned.len(), 2);
}

#[test]
fn an_empty_cloud_value_leaves_the_label() {
    let labels = in_step("z1", "r1", "small");
    assert!(plan(&labels, &meta("", "", "", &[])).is_empty());
    assert!(plan(&HashMap::new(), &meta("", "", "", &[])).is_empty());
}

#[test]
fn additional_labels_follow_the_cloud_outside_kubernetes_namespaces() {
    let mut labels = in_step("z1", "r1", "small");
    labels.insert("acme.io/rack".into(), "r7".into());
    labels.insert("acme.io/gone".into(), "kept".into());
    let cloud = meta(
        "z1",
        "r1",
        "small",
        &[
            ("acme.io/rack", "r9"),
            ("acme.io/new", "yes"),
            ("node.kubernetes.io/sneaky", "no"),
            ("sub.k8s.io/sneaky", "no"),
        ],
    );
    let planned = plan(&labels, &cloud);
    let expected: BTreeMap<String, String> = [("acme.io/rack", "r9"), ("acme.io/new", "yes")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    // Changed and added; reserved namespaces never written; a label the cloud no longer
    // reports (acme.io/gone) is not removed.
    assert_eq!(planned, expected);
}

#[test]
fn metric_keys_are_bounded() {
    assert_eq!(
        cloud_label_metric_key(LABEL_TOPOLOGY_ZONE),
        LABEL_TOPOLOGY_ZONE
    );
    assert_eq!(cloud_label_metric_key("acme.io/rack"), "additional");
}

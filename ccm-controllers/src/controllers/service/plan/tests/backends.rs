//! Backends chosen per Service by the annotation `service.ccm-rs.io/backend-node-selector`.

use super::*;

fn annotated(selector: &str) -> Service {
    let mut s = lb();
    s.metadata.annotations = Some(BTreeMap::from([(
        ANNOTATION_BACKEND_NODE_SELECTOR.to_owned(),
        selector.to_owned(),
    )]));
    s
}

fn with_labels(mut n: Node, labels: &[(&str, &str)]) -> Node {
    let map = n.metadata.labels.get_or_insert_with(BTreeMap::new);
    for (k, v) in labels {
        map.insert((*k).to_owned(), (*v).to_owned());
    }
    n
}

fn names(hosts: &[NodeView]) -> Vec<&str> {
    hosts.iter().map(|h| h.name()).collect()
}

fn sel(text: &str) -> crate::machinery::label_selector::ManagedNodeSelector {
    parse_selector(text).unwrap()
}

#[test]
fn the_annotation_is_read_trimmed_and_an_empty_one_is_none() {
    assert_eq!(
        ANNOTATION_BACKEND_NODE_SELECTOR,
        "service.ccm-rs.io/backend-node-selector"
    );
    assert_eq!(selector_text(&lb()), None);
    assert_eq!(selector_text(&annotated("")), None);
    assert_eq!(selector_text(&annotated("  ")), None);
    assert_eq!(selector_text(&annotated(" pool=web ")), Some("pool=web"));
}

/// The hosts of a Service with a selector: the eligible hosts (Go's rules first) that match.
#[test]
fn hosts_are_the_eligible_ones_the_selector_matches() {
    let nodes: Vec<NodeView> = [
        with_labels(node("a"), &[("pool", "web")]),
        with_labels(node("b"), &[("pool", "db")]),
        with_labels(labelled(node("c"), "true"), &[("pool", "web")]),
        node("d"),
        with_labels(node("e"), &[("pool", "web"), ("zone", "z1")]),
    ]
    .iter()
    .map(view)
    .collect();
    let eligible = eligible_hosts(&nodes);
    assert_eq!(names(&eligible), ["a", "b", "d", "e"]);
    // "c" matches but is excluded by Go's label: never a host.
    assert_eq!(
        names(&selected_hosts(&eligible, &sel("pool=web"))),
        ["a", "e"]
    );
    assert_eq!(
        names(&selected_hosts(
            &eligible,
            &sel("pool in (web,db),zone!=z1")
        )),
        ["a", "b"]
    );
    assert_eq!(names(&selected_hosts(&eligible, &sel("!pool"))), ["d"]);
    // Matching no eligible host is an empty list, as Go passes with no eligible Node.
    assert!(selected_hosts(&eligible, &sel("pool=none")).is_empty());
}

#[test]
fn an_invalid_selector_is_an_error_naming_the_annotation() {
    for bad in ["pool in ()", "a b", "-x=y", "pool=(web"] {
        let error = parse_selector(bad).unwrap_err();
        let note = invalid_selector_note(&error);
        assert!(
            note.starts_with(
                "annotation service.ccm-rs.io/backend-node-selector: invalid label selector"
            ),
            "{note}"
        );
        assert!(
            note.ends_with("left as it is until the annotation is fixed"),
            "{note}"
        );
    }
}

/// With the condition on, an invalid selector is `False` with a reason of its own.
#[test]
fn an_invalid_selector_has_its_own_condition_reason() {
    let now = Time("2026-03-01T00:00:00Z".parse().unwrap());
    let state = LoadBalancerState::InvalidBackendSelector("bad".into());
    let entry = condition_entry(&lb(), &state, &now).unwrap();
    assert_eq!(entry["status"], "False");
    assert_eq!(entry["reason"], "InvalidBackendNodeSelector");
    assert_eq!(entry["message"], "bad");
}

/// Label changes trigger a node sync only when they move a host in or out of a selector in
/// use; with no selector in use, never (as in Go).
#[test]
fn label_changes_trigger_only_when_a_selector_answer_changes() {
    let plain = view(&node("a"));
    let web = view(&with_labels(node("a"), &[("pool", "web")]));
    let other = view(&with_labels(node("a"), &[("pool", "web"), ("team", "x")]));
    let excluded = view(&with_labels(
        labelled(node("a"), "true"),
        &[("pool", "web")],
    ));
    let excluded_plain = view(&labelled(node("a"), "true"));
    // No selector in use: label changes are no trigger (Go's rule).
    assert_eq!(
        crate::controllers::service::plan::host_change(Some(&plain), Some(&web)),
        None
    );
    assert_eq!(selector_host_change(&plain, &web, &[]), None);
    let selectors = [sel("pool=web"), sel("team")];
    assert_eq!(
        selector_host_change(&plain, &web, &selectors),
        Some(HostChange::Addition)
    );
    assert_eq!(
        selector_host_change(&web, &plain, &selectors),
        Some(HostChange::Removal)
    );
    // Joins `team`, stays in `pool=web`.
    assert_eq!(
        selector_host_change(&web, &other, &selectors),
        Some(HostChange::Addition)
    );
    // Leaves one, joins another: a removal (synced within the base window).
    let team_only = view(&with_labels(node("a"), &[("team", "x")]));
    assert_eq!(
        selector_host_change(&web, &team_only, &selectors),
        Some(HostChange::Removal)
    );
    // A label no selector reads.
    let zone = view(&with_labels(node("a"), &[("pool", "web"), ("zone", "z")]));
    assert_eq!(selector_host_change(&web, &zone, &selectors), None);
    // Not a host before nor after: nothing to any load balancer.
    assert_eq!(
        selector_host_change(&excluded_plain, &excluded, &selectors),
        None
    );
}

#[test]
fn selectors_in_use_are_counted_per_distinct_text() {
    let mut in_use = SelectorsInUse::default();
    assert!(in_use.snapshot().is_empty());
    in_use.set("ns/a", Some(sel("pool=web")));
    in_use.set("ns/b", Some(sel("pool=web")));
    in_use.set("ns/c", Some(sel("team")));
    let texts = |u: &SelectorsInUse| -> Vec<String> {
        u.snapshot().iter().map(|s| s.to_string()).collect()
    };
    assert_eq!(texts(&in_use), ["pool=web", "team"]);
    in_use.set("ns/a", None);
    assert_eq!(texts(&in_use), ["pool=web", "team"]);
    in_use.set("ns/b", Some(sel("tier=1")));
    assert_eq!(texts(&in_use), ["team", "tier=1"]);
    in_use.set("ns/b", None);
    in_use.set("ns/c", None);
    in_use.set("ns/unknown", None);
    assert!(in_use.snapshot().is_empty());
    in_use.set("ns/d", Some(sel("x")));
    in_use.clear();
    assert!(in_use.snapshot().is_empty());
}

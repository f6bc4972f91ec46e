//! The load-balancer class rules: which Services a controller serves, cleans up and leaves
//! alone, with the classes it serves (`ServedClasses`).

use super::*;

const OURS: &str = "acme.example/internal";
const FOREIGN: &str = "other.example/lb";

/// Serves Services without a class and `OURS`.
fn both() -> ServedClasses {
    ServedClasses::of(&[(None, None), (Some(OURS), Some(OURS))])
}

/// Serves `OURS` only (a second instance serving one class).
fn only_ours() -> ServedClasses {
    ServedClasses::of(&[(Some(OURS), None)])
}

fn classed(class: &str) -> Service {
    let mut s = lb();
    spec(&mut s).load_balancer_class = Some(class.into());
    s
}

#[test]
fn serves_exactly_the_served_classes() {
    assert!(wants_load_balancer(&lb(), &both()));
    assert!(wants_load_balancer(&classed(OURS), &both()));
    assert!(!wants_load_balancer(&classed(FOREIGN), &both()));
    // Serving one class: Services without a class are another controller's.
    assert!(!wants_load_balancer(&lb(), &only_ours()));
    assert!(wants_load_balancer(&classed(OURS), &only_ours()));
    // Not a LoadBalancer: never served, whatever the classes.
    assert!(!wants_load_balancer(&svc("ClusterIP"), &both()));
    assert!(is_foreign_load_balancer(&lb(), &only_ours()));
    assert!(!is_foreign_load_balancer(&svc("ClusterIP"), &only_ours()));
}

#[test]
fn a_served_class_is_ensured_and_cleaned_up_as_go_does_without_a_class() {
    let ours = classed(OURS);
    assert_eq!(decide(&ours, false, &both()), Decision::Ensure);
    assert!(should_enqueue_add(&ours, &both()));
    assert!(needs_cleanup(
        &deleting(with_finalizer(ours.clone())),
        &both()
    ));
    assert_eq!(
        decide(&deleting(with_finalizer(ours.clone())), false, &both()),
        Decision::Delete
    );
    assert_eq!(decide(&deleting(ours), false, &both()), Decision::Skip);
}

#[test]
fn a_foreign_class_is_never_touched_even_with_the_finalizer() {
    for (service, classes) in [
        (classed(FOREIGN), both()),
        // The other instance's Services without a class carry the same finalizer.
        (lb(), only_ours()),
    ] {
        for s in [
            service.clone(),
            with_finalizer(service.clone()),
            deleting(with_finalizer(service.clone())),
        ] {
            assert_eq!(decide(&s, false, &classes), Decision::Skip, "{s:?}");
            assert!(!should_enqueue_add(&s, &classes), "{s:?}");
            assert!(!needs_cleanup(&s, &classes), "{s:?}");
        }
        // Updates of a foreign Service never queue it.
        let old = with_finalizer(service.clone());
        let mut new = old.clone();
        new.metadata.annotations = Some(BTreeMap::from([("a".into(), "b".into())]));
        assert!(!should_enqueue_update(&old, &new, &classes));
        assert!(!should_enqueue_update(
            &old,
            &deleting(old.clone()),
            &classes
        ));
    }
}

#[test]
fn a_service_handled_before_it_became_foreign_has_its_load_balancer_deleted() {
    // Seen as ours (same UID), now of a foreign class: Go's "wants flipped" delete.
    assert_eq!(decide(&classed(FOREIGN), true, &both()), Decision::Delete);
    assert_eq!(decide(&lb(), true, &only_ours()), Decision::Delete);
    let t = update_trigger(&lb(), &classed(FOREIGN), &both()).unwrap();
    assert_eq!(t.reason, "Type");
}

#[test]
fn a_type_change_away_from_load_balancer_is_cleaned_up_by_every_instance() {
    // The API server clears the class with the type: nothing says whose it was, so every
    // instance with the finalizer in sight deletes what its cloud has (Go's rule).
    let cluster_ip = with_finalizer(svc("ClusterIP"));
    for classes in [go(), both(), only_ours()] {
        assert!(needs_cleanup(&cluster_ip, &classes));
        assert_eq!(decide(&cluster_ip, false, &classes), Decision::Delete);
    }
    // The type flip of a served Service triggers its sync (the Go event "Type").
    let t = update_trigger(&classed(OURS), &svc("ClusterIP"), &both()).unwrap();
    assert_eq!(t.reason, "Type");
    // A foreign Service turning ClusterIP without our finalizer stays untouched.
    assert!(update_trigger(&classed(FOREIGN), &svc("ClusterIP"), &both()).is_none());
    assert!(!should_enqueue_add(&svc("ClusterIP"), &both()));
}

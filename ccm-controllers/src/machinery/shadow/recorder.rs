//! The recorder: planned changes in, current divergences out, with the pending rule, a log
//! line per new and per resolved divergence, and the metrics kept in step.

use std::collections::BTreeMap;

use serde_json::Value;
use tokio::time::Instant;

use super::{Divergence, DivergenceLabels, Key, Planned, Shadow, State, key_of};

fn labels(controller: &str, kind: &str) -> DivergenceLabels {
    DivergenceLabels {
        controller: controller.to_owned(),
        kind: kind.to_owned(),
    }
}

fn key(p: &Planned) -> Key {
    (
        p.controller.clone(),
        p.kind.to_owned(),
        p.object.clone(),
        p.field.clone(),
    )
}

/// Why a divergence is removed.
#[derive(Clone, Copy, Debug)]
enum Removal {
    /// The object or the cloud changed: it no longer holds.
    Resolved,
    /// A beta label's divergence became part of its GA label's (`also`).
    Folded,
}

/// A "would delete Node" divergence.
fn is_would_delete(d: &Divergence) -> bool {
    d.kind == "Node" && d.field == super::fields::FIELD_NODE_DELETED
}

/// Now, in RFC 3339.
fn now_rfc3339() -> String {
    jiff::Timestamp::now().to_string()
}

impl Shadow {
    /// Records the changes a controller plans for one object (or one cloud resource). A
    /// change to a pending object waits until the object settles or the grace period passes
    /// since it was first seen pending; any other change is a divergence.
    pub(crate) fn observe(&self, planned: Vec<Planned>) {
        let now = Instant::now();
        let mut state = self.lock();
        for p in planned {
            let k = key(&p);
            // Alias fields folded into this one are no longer their own divergence.
            for alias in &p.also {
                let alias_key = (k.0.clone(), k.1.clone(), k.2.clone(), alias.clone());
                self.drop_pending(&mut state, &alias_key);
                self.remove(&mut state, &alias_key, Removal::Folded);
            }
            if p.pending {
                let since = *state
                    .pending_since
                    .entry((p.kind.to_owned(), p.object.clone()))
                    .or_insert(now);
                if now.duration_since(since) < self.grace {
                    if state.pending.insert(k, (p.clone(), since)).is_none() {
                        self.metrics
                            .pending
                            .get_or_create(&labels(&p.controller, p.kind))
                            .inc();
                    }
                    continue;
                }
            }
            self.drop_pending(&mut state, &k);
            self.insert(&mut state, p);
        }
    }

    /// Makes `p` a current divergence (logged and counted when new).
    fn insert(&self, state: &mut State, p: Planned) {
        let k = key(&p);
        if let Some(existing) = state.divergences.get_mut(&k) {
            existing.incumbent = p.incumbent;
            existing.ours = p.ours;
            existing.also = p.also;
            return;
        }
        let d = Divergence {
            controller: p.controller,
            kind: p.kind.to_owned(),
            object: p.object,
            field: p.field,
            also: p.also,
            incumbent: p.incumbent,
            ours: p.ours,
            since: now_rfc3339(),
        };
        tracing::warn!(
            controller = %d.controller,
            kind = %d.kind,
            object = %d.object,
            field = %d.field,
            also = ?d.also,
            incumbent = %d.incumbent,
            ours = %d.ours,
            "shadow: new divergence"
        );
        if is_would_delete(&d) {
            *state.would_delete.entry(d.object.clone()).or_default() += 1;
        }
        let l = labels(&d.controller, &d.kind);
        self.metrics.current.get_or_create(&l).inc();
        self.metrics.seen.get_or_create(&l).inc();
        state.divergences.insert(k, d);
    }

    fn drop_pending(&self, state: &mut State, k: &Key) {
        if let Some((p, _)) = state.pending.remove(k) {
            self.metrics
                .pending
                .get_or_create(&labels(&p.controller, p.kind))
                .dec();
        }
    }

    /// Removes the divergences of `kind/object` for which `resolved` is true, logging each.
    pub(crate) fn resolve_where(
        &self,
        kind: &str,
        object: &str,
        mut resolved: impl FnMut(&Divergence) -> bool,
    ) {
        let mut state = self.lock();
        let keys: Vec<Key> = state
            .divergences
            .values()
            .filter(|d| d.kind == kind && d.object == object && resolved(d))
            .map(key_of)
            .collect();
        for k in keys {
            self.remove(&mut state, &k, Removal::Resolved);
        }
    }

    /// Removes the divergence `k`, if there is one, logging why.
    fn remove(&self, state: &mut State, k: &Key, why: Removal) {
        if let Some(d) = state.divergences.remove(k) {
            if is_would_delete(&d)
                && let Some(n) = state.would_delete.get_mut(&d.object)
            {
                *n -= 1;
                if *n == 0 {
                    state.would_delete.remove(&d.object);
                }
            }
            match why {
                Removal::Resolved => tracing::info!(
                    controller = %d.controller,
                    kind = %d.kind,
                    object = %d.object,
                    field = %d.field,
                    also = ?d.also,
                    "shadow: divergence resolved"
                ),
                Removal::Folded => tracing::info!(
                    controller = %d.controller,
                    kind = %d.kind,
                    object = %d.object,
                    field = %d.field,
                    "shadow: divergence folded into its GA label's"
                ),
            }
            self.metrics
                .current
                .get_or_create(&labels(&d.controller, &d.kind))
                .dec();
        }
    }

    /// Resolves the divergence `controller/kind/object/field`, if there is one.
    pub(crate) fn resolve(&self, controller: &str, kind: &str, object: &str, field: &str) {
        self.resolve_where(kind, object, |d| {
            d.controller == controller && d.field == field
        });
    }

    /// The cloud knows the instance of `node` again: its would-delete divergence, if any, no
    /// longer holds.
    pub(crate) fn instance_known(&self, node: &str) {
        self.resolve_where("Node", node, |d| {
            d.field == super::fields::FIELD_NODE_DELETED
        });
    }

    /// `kind/object` settled (or is gone): its pending changes are dropped (the controllers
    /// plan again on the change that settled it).
    pub(crate) fn settled(&self, kind: &str, object: &str) {
        let mut state = self.lock();
        state
            .pending_since
            .remove(&(kind.to_owned(), object.to_owned()));
        let keys: Vec<Key> = state
            .pending
            .keys()
            .filter(|(_, k, o, _)| k == kind && o == object)
            .cloned()
            .collect();
        for k in keys {
            self.drop_pending(&mut state, &k);
        }
    }

    /// Makes the pending changes whose grace period has passed divergences.
    pub(crate) fn promote_expired(&self) {
        let now = Instant::now();
        let mut state = self.lock();
        let expired: Vec<Key> = state
            .pending
            .iter()
            .filter(|(_, (_, since))| now.duration_since(*since) >= self.grace)
            .map(|(k, _)| k.clone())
            .collect();
        for k in expired {
            if let Some((p, _)) = state.pending.get(&k).cloned() {
                self.drop_pending(&mut state, &k);
                self.insert(&mut state, p);
            }
        }
    }

    /// The recorded value of a divergence's field no longer matches what the object shows:
    /// `current` is the field's value now (`Value::Null` when absent).
    pub(crate) fn stale(d: &Divergence, current: &Value) -> bool {
        &d.incumbent != current
    }

    /// The recorded value of the divergence's field, or of an alias folded into it, no longer
    /// matches the object's `fields` (as [`super::fields::node_fields`] gives them).
    pub(crate) fn stale_in(d: &Divergence, fields: &BTreeMap<String, Value>) -> bool {
        d.fields()
            .any(|f| Shadow::stale(d, fields.get(f).unwrap_or(&Value::Null)))
    }

    /// Sets the number of objects compared, by kind.
    pub(crate) fn set_compared(&self, kind: &str, n: usize) {
        self.metrics
            .compared
            .get_or_create(&super::KindLabel {
                kind: kind.to_owned(),
            })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::machinery::metrics::MetricsRegistry;

    fn planned(field: &str, pending: bool) -> Planned {
        Planned {
            controller: "node-controller".into(),
            kind: "Node",
            object: "n1".into(),
            field: field.into(),
            also: Vec::new(),
            incumbent: json!("a"),
            ours: json!("b"),
            pending,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn pending_changes_become_divergences_after_the_grace_period() {
        let shadow = Shadow::new(Duration::from_secs(60), &MetricsRegistry::new());
        shadow.observe(vec![planned("f", true)]);
        assert!(shadow.divergences().is_empty());
        assert_eq!(shadow.pending_count(), 1);
        tokio::time::advance(Duration::from_secs(61)).await;
        shadow.promote_expired();
        assert_eq!(shadow.divergences().len(), 1);
        assert_eq!(shadow.pending_count(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_settled_object_drops_its_pending_changes_and_a_repeat_is_one_divergence() {
        let shadow = Shadow::new(Duration::from_secs(60), &MetricsRegistry::new());
        shadow.observe(vec![planned("f", true)]);
        shadow.settled("Node", "n1");
        assert_eq!(shadow.pending_count(), 0);
        shadow.observe(vec![planned("f", false)]);
        shadow.observe(vec![planned("f", false)]);
        assert_eq!(shadow.divergences().len(), 1);
        shadow.resolve("node-controller", "Node", "n1", "f");
        assert!(shadow.divergences().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_folded_alias_replaces_its_own_divergence_and_resolves_with_either_field() {
        let shadow = Shadow::new(Duration::from_secs(60), &MetricsRegistry::new());
        // First the beta label alone (e.g. the GA label agreed then), then both folded.
        shadow.observe(vec![planned("beta", false)]);
        let mut folded = planned("ga", false);
        folded.also = vec!["beta".into()];
        shadow.observe(vec![folded]);
        let all = shadow.divergences();
        assert_eq!(all.len(), 1, "{all:?}");
        assert_eq!(all[0].field, "ga");
        assert_eq!(all[0].also, vec!["beta".to_owned()]);
        let json = serde_json::to_value(&all[0]).unwrap_or_default();
        assert_eq!(json["also"], json!(["beta"]), "{json}");
        // The object now shows another value on the alias only: the divergence is stale.
        let fields = BTreeMap::from([
            ("ga".to_owned(), json!("a")),
            ("beta".to_owned(), json!("b")),
        ]);
        assert!(Shadow::stale_in(&all[0], &fields));
        let unchanged = BTreeMap::from([
            ("ga".to_owned(), json!("a")),
            ("beta".to_owned(), json!("a")),
        ]);
        assert!(!Shadow::stale_in(&all[0], &unchanged));
    }
}

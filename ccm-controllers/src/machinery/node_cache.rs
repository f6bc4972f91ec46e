//! The Node informer's compact form: each Node is stripped and stored as a [`NodeView`] whose
//! shared strings (label and annotation keys and values, condition types, ...) come from one
//! interner, so 100,000 Nodes with the same dozen labels hold each label string once.
//!
//! Interning is hand-written (a `HashSet<Arc<str>>`): the interner crates either leak (a
//! global, never-freed arena: a churning cluster's unique label values would accumulate) or
//! hand out indices into their own table (which `NodeView`, a ccm-core type providers read
//! without the table, cannot carry). Here a string lives as long as a Node holds it: the
//! interner sweeps the strings only it still holds (`Arc::strong_count == 1`) whenever it has
//! doubled since the last sweep, so its size stays within twice the strings in use at an
//! amortised cost of O(1) per string.

use std::collections::HashSet;
use std::sync::Arc;

use ccm_core::{Node, NodeView};

/// Below this many strings the interner never sweeps (a sweep would free next to nothing).
const MIN_SWEEP: usize = 1024;

/// The shared strings of the Node store.
#[derive(Default)]
pub(crate) struct NodeInterner {
    strings: HashSet<Arc<str>>,
    /// The number of strings after the last sweep.
    kept: usize,
}

impl NodeInterner {
    /// `node` stripped with `strip`, as a view sharing this interner's strings.
    pub(crate) fn view(&mut self, mut node: Node, strip: fn(&mut Node)) -> NodeView {
        strip(&mut node);
        let view = NodeView::from_node_interned(node, &mut |s| self.intern(s));
        if self.strings.len() >= MIN_SWEEP.max(2 * self.kept) {
            self.sweep();
        }
        view
    }

    /// The one shared copy of `s`.
    fn intern(&mut self, s: &str) -> Arc<str> {
        if let Some(shared) = self.strings.get(s) {
            return shared.clone();
        }
        let shared: Arc<str> = Arc::from(s);
        self.strings.insert(shared.clone());
        shared
    }

    /// Drops the strings no view holds any more.
    fn sweep(&mut self) {
        self.strings.retain(|s| Arc::strong_count(s) > 1);
        self.strings.shrink_to_fit();
        self.kept = self.strings.len();
    }

    /// How many distinct strings the interner holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.strings.len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::machinery::informer::strip_node;
    use ccm_core::ObjectMeta;

    fn node(name: &str, unique: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([
                    ("kubernetes.io/hostname".into(), name.into()),
                    ("topology.kubernetes.io/zone".into(), "zone-a".into()),
                    ("example.com/unique".into(), unique.into()),
                ])),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn shared_strings_are_held_once_and_swept_when_no_node_holds_them() {
        let mut interner = NodeInterner::default();
        let a = interner.view(node("a", "u-a"), strip_node);
        let b = interner.view(node("b", "u-b"), strip_node);
        // Three keys, one zone, two unique values; the hostname values share the names.
        assert_eq!(interner.len(), 6);
        assert_eq!(a.label("topology.kubernetes.io/zone"), Some("zone-a"));
        assert_eq!(b.to_node(), node("b", "u-b"));
        drop(a);
        // Churn: Nodes come and go, each with a unique value; the interner never holds much
        // more than twice what the live Nodes hold.
        let mut live = vec![b];
        for i in 0..10 * MIN_SWEEP {
            live.push(interner.view(node(&format!("n{i}"), &format!("u{i}")), strip_node));
            if live.len() > 10 {
                live.remove(0);
            }
            assert!(interner.len() <= MIN_SWEEP.max(2 * (4 + live.len())) + 1);
        }
        interner.sweep();
        // The 3 keys, the zone, one unique value per live Node.
        assert_eq!(interner.len(), 4 + live.len());
    }
}

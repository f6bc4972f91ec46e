//! Building [`NodeView`]s: [`NodeViewInterner`], the shared strings and label sets of the views
//! of many Nodes, and the packing of each Node's own strings into one allocation.
//!
//! Interning is hand-written over hashbrown's tables: the interner crates either leak (a global,
//! never-freed arena: a churning cluster's unique label values would accumulate) or hand out
//! indices into their own table (which a `NodeView`, read by providers without the table,
//! cannot carry), and none interns a set of pairs. Here a string or a set lives as long as a
//! view holds it: the interner sweeps what only it still holds (`Arc::strong_count == 1`)
//! whenever it has doubled since the last sweep, so its size stays within twice what is in use
//! at an amortised cost of O(1) per entry. A label set is looked up by a hash of the decoded
//! map itself, so a watch update whose labels did not change (a heartbeat) interns no string of
//! them and allocates nothing for them.

use std::collections::BTreeMap;
use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

use hashbrown::{DefaultHashBuilder, HashSet, HashTable};

use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus, NodeSystemInfo};

use super::{Inner, NodeView, NodeViewCondition, Pair, Pairs, Present, Str, Value};
use crate::Node;

/// Below this many entries the interner never sweeps (a sweep would free next to nothing).
pub(super) const MIN_SWEEP: usize = 1024;

/// The strings and label sets that the [`NodeView`]s of many Nodes share: a cache of Nodes
/// builds every view with one interner (the framework's Node informer does), so 100,000 Nodes
/// with the same dozen labels hold each label string, and each distinct label set, once.
///
/// What it shares: label and annotation sets (a value equal to the Node's name counts as "the
/// name", so the hostname label does not make a set unique), their keys and values, address
/// types, condition types, statuses and reasons, and the `nodeInfo` architecture and operating
/// system. What each Node has alone (uid, resourceVersion, providerID, pod CIDRs, addresses,
/// machine ID, system UUID) is packed into one allocation per view. An entry is dropped from
/// the interner when no view holds it any more (swept as the interner grows).
///
/// ```
/// use ccm_core::{Node, NodeViewInterner, ObjectMeta};
///
/// let node = |name: &str| Node {
///     metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
///     ..Default::default()
/// };
/// let mut interner = NodeViewInterner::default();
/// let a = interner.view(node("worker-1"));
/// assert_eq!(a.name(), "worker-1");
/// assert_eq!(a.to_node(), node("worker-1"));
/// ```
#[derive(Default)]
pub struct NodeViewInterner {
    strings: HashSet<Arc<str>>,
    /// Label and annotation sets, by [`set_hash`] of their pairs.
    sets: HashTable<Pairs>,
    hasher: DefaultHashBuilder,
    /// The number of entries after the last sweep.
    kept: usize,
}

impl fmt::Debug for NodeViewInterner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeViewInterner")
            .field("strings", &self.strings.len())
            .field("sets", &self.sets.len())
            .finish()
    }
}

impl NodeViewInterner {
    /// The view of `node`, taking its fields, sharing this interner's strings and label sets.
    /// It keeps every field `node` has: [`NodeView::to_node`] gives back an equal `Node`.
    pub fn view(&mut self, node: Node) -> NodeView {
        let view = self.build(node);
        if self.len() >= MIN_SWEEP.max(2 * self.kept) {
            self.sweep();
        }
        view
    }

    /// How many distinct strings and label or annotation sets the interner holds.
    pub fn len(&self) -> usize {
        self.strings.len() + self.sets.len()
    }

    /// Whether the interner holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops the sets and strings no view holds any more (the sets first: they hold strings).
    pub(super) fn sweep(&mut self) {
        let hasher = &self.hasher;
        self.sets.retain(|s| Arc::strong_count(s) > 1);
        self.sets.shrink_to_fit(|s| set_hash(hasher, stored(s)));
        self.strings.retain(|s| Arc::strong_count(s) > 1);
        self.strings.shrink_to_fit();
        self.kept = self.len();
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

    /// `s` shared: the empty string needs no entry.
    fn shared(&mut self, s: &str) -> Str {
        if s.is_empty() {
            Str::EMPTY
        } else {
            Str::Shared(self.intern(s))
        }
    }

    /// The one shared copy of a label or annotation map, values equal to `name` as
    /// [`Value::Name`]. Looked up by the map's own content first: when the set is known (every
    /// Node but the first of a pool, every update that left the labels alone) nothing is
    /// interned or allocated.
    fn set(&mut self, map: BTreeMap<String, String>, name: Option<&str>) -> Pairs {
        let decoded = || {
            map.iter()
                .map(|(k, v)| (k.as_str(), (name != Some(v.as_str())).then_some(v.as_str())))
        };
        let hash = set_hash(&self.hasher, decoded());
        let same =
            |set: &Pairs| set.len() == map.len() && stored(set).zip(decoded()).all(|(s, d)| s == d);
        if let Some(shared) = self.sets.find(hash, same) {
            return shared.clone();
        }
        let pairs: Vec<Pair> = decoded()
            .map(|(k, v)| Pair {
                key: self.intern(k),
                value: v.map_or(Value::Name, |v| Value::Shared(self.intern(v))),
            })
            .collect();
        let shared: Pairs = Arc::from(pairs);
        let hasher = &self.hasher;
        self.sets
            .insert_unique(hash, shared.clone(), |s| set_hash(hasher, stored(s)));
        shared
    }

    fn build(&mut self, mut node: Node) -> NodeView {
        let meta = &mut node.metadata;
        let name: Option<Arc<str>> = meta.name.take().map(Arc::from);
        let labels = meta.labels.take().map(|m| self.set(m, name.as_deref()));
        let annotations = meta
            .annotations
            .take()
            .map(|m| self.set(m, name.as_deref()));
        let uid = meta.uid.take();
        let resource_version = meta.resource_version.take();
        let creation_timestamp = meta.creation_timestamp.take();
        let deletion_timestamp = meta.deletion_timestamp.take();

        let mut present = Present {
            spec: node.spec.is_some(),
            status: node.status.is_some(),
            ..Present::default()
        };
        let mut spec = node.spec.take().unwrap_or_default();
        let provider_id = spec.provider_id.take();
        let pod_cidr = spec.pod_cidr.take();
        let pod_cidrs = spec.pod_cidrs.take();
        let taints = spec.taints.take().map(Vec::into_boxed_slice);
        let unschedulable = spec.unschedulable.take();
        if spec != NodeSpec::default() {
            node.spec = Some(spec);
        }

        let mut status = node.status.take().unwrap_or_default();
        let addresses = status.addresses.take();
        let conditions = status.conditions.take().map(|conditions| {
            conditions
                .into_iter()
                .map(|c| NodeViewCondition {
                    type_: self.intern(&c.type_),
                    status: self.intern(&c.status),
                    reason: c.reason.as_deref().map(|r| self.intern(r)),
                    message: c.message.map(String::into_boxed_str),
                    last_heartbeat_time: c.last_heartbeat_time,
                    last_transition_time: c.last_transition_time,
                })
                .collect()
        });
        let info = status.node_info.take().map(|mut info| {
            let kept = [
                std::mem::take(&mut info.architecture),
                std::mem::take(&mut info.operating_system),
                std::mem::take(&mut info.machine_id),
                std::mem::take(&mut info.system_uuid),
            ];
            if info != NodeSystemInfo::default() {
                status.node_info = Some(info);
            }
            kept
        });
        if status != NodeStatus::default() {
            node.status = Some(status);
        }
        let rest = (node != Node::default()).then(|| Box::new(node));

        // The Node's own strings, in one allocation of exactly their length.
        let is_name = |s: &str| name.as_deref() == Some(s);
        let own_len = [&uid, &resource_version, &provider_id, &pod_cidr]
            .into_iter()
            .flatten()
            .chain(pod_cidrs.iter().flatten())
            .chain(info.iter().flat_map(|i| &i[2..]))
            .map(String::len)
            .sum::<usize>()
            + addresses
                .iter()
                .flatten()
                .filter(|a| !is_name(&a.address))
                .map(|a| a.address.len())
                .sum::<usize>();
        let mut text = Text(String::with_capacity(own_len));
        let mut own = |s: Option<String>| s.map_or(Str::UNSET, |s| text.push(&s));
        let uid = own(uid);
        let resource_version = own(resource_version);
        let provider_id = own(provider_id);
        let pod_cidr = own(pod_cidr);

        present.addresses = addresses.is_some();
        present.pod_cidrs = pod_cidrs.is_some();
        let addresses = addresses.unwrap_or_default();
        let pod_cidrs = pod_cidrs.unwrap_or_default();
        let mut lists = Vec::with_capacity(2 * addresses.len() + pod_cidrs.len());
        for address in &addresses {
            lists.push(self.shared(&address.type_));
            lists.push(match &name {
                Some(name) if **name == *address.address => Str::Shared(name.clone()),
                _ => text.push(&address.address),
            });
        }
        let address_strs = lists.len();
        lists.extend(pod_cidrs.iter().map(|c| text.push(c)));

        present.node_info = info.is_some();
        let node_info = match info {
            Some([architecture, operating_system, machine_id, system_uuid]) => [
                self.shared(&architecture),
                self.shared(&operating_system),
                text.push(&machine_id),
                text.push(&system_uuid),
            ],
            None => [Str::UNSET, Str::UNSET, Str::UNSET, Str::UNSET],
        };

        NodeView(Arc::new(Inner {
            name,
            text: text.0.into_boxed_str(),
            uid,
            resource_version,
            provider_id,
            pod_cidr,
            labels,
            annotations,
            lists: lists.into_boxed_slice(),
            address_strs,
            node_info,
            creation_timestamp,
            deletion_timestamp,
            taints,
            conditions,
            unschedulable,
            present,
            rest,
        }))
    }
}

/// A stored set's pairs as `(key, value)`, `None` for [`Value::Name`]: what [`set_hash`] hashes.
fn stored(set: &[Pair]) -> impl Iterator<Item = (&str, Option<&str>)> {
    set.iter().map(|p| {
        let value = match &p.value {
            Value::Shared(v) => Some(&**v),
            Value::Name => None,
        };
        (&*p.key, value)
    })
}

/// The hash of a label or annotation set from its pairs (`None`: the Node's name), the same
/// for a decoded map and the stored set it interns to.
fn set_hash<'a>(
    hasher: &DefaultHashBuilder,
    pairs: impl Iterator<Item = (&'a str, Option<&'a str>)>,
) -> u64 {
    let mut h = hasher.build_hasher();
    for pair in pairs {
        pair.hash(&mut h);
    }
    h.finish()
}

/// A view's own text as it is built.
pub(super) struct Text(pub(super) String);

impl Text {
    /// `s` appended, as the span that reads it back; a string [`span`] does not fit gets an
    /// allocation of its own instead.
    pub(super) fn push(&mut self, s: &str) -> Str {
        if s.is_empty() {
            return Str::EMPTY;
        }
        match span(self.0.len(), s.len()) {
            Some((start, len)) => {
                self.0.push_str(s);
                Str::Own { start, len }
            }
            None => Str::Shared(Arc::from(s)),
        }
    }
}

/// The span of `len` bytes at `start` of a text, if it ends before `u32::MAX` bytes (a Node
/// of over 4 GiB, which no API server sends, is the only one whose strings do not fit): every
/// span then fits in 32 bits and none starts at `u32::MAX` ([`Str::UNSET`]).
pub(super) fn span(start: usize, len: usize) -> Option<(u32, u32)> {
    let (start, len) = (u32::try_from(start).ok()?, u32::try_from(len).ok()?);
    start
        .checked_add(len)
        .is_some_and(|end| end < u32::MAX)
        .then_some((start, len))
}

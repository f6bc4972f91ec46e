//! Nodes decoded without the two fields nothing here reads and that make most of a Node's
//! decoding cost: `metadata.managedFields` (decoded by k8s-openapi into `serde_json::Value`
//! maps) and `status.images` (about 40 entries of two strings each on a typical Node).
//!
//! The Nodes the CCM receives in bulk come through here: the Node informer's list and watch
//! events and the answers to the controllers' Node patches (cloud-node, route, node IPAM,
//! node lifecycle; [`lean_api`]). The GETs after a conflict, rare, decode whole Nodes. A 10,000-Node burst is at least four Node
//! versions per Node (the kubelet's create and status write, our two initialisation writes),
//! and the fields skipped were two thirds of the CCM's CPU time decoding them (allocation and
//! freeing, mostly). The informer dropped both fields anyway (`informer::strip_node`, and
//! `managedFields` for every informer), so what the controllers and a provider see is
//! unchanged.
//!
//! Skipping happens in the decoder, not after it: [`Pruned`] wraps a serde `Deserializer` and
//! drops the listed map keys at the listed paths, so that their values are only scanned
//! (`IgnoredAny`), never built. It is written here because serde has no such adapter and the
//! crates that wrap deserializers (`serde_ignored`, `serde_path_to_error`) observe keys but do not
//! drop them; mirroring k8s-openapi's `ObjectMeta` and `NodeStatus` field by field instead would
//! differ with each Kubernetes version feature.

use std::borrow::Cow;
use std::fmt;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, IgnoredAny, IntoDeserializer, MapAccess,
    SeqAccess, Visitor,
};

/// A Node as the API server sent it, less `metadata.managedFields` and `status.images` (both
/// `None`). The type an `Api` is built over to read Nodes that way.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct LeanNode(pub(crate) Node);

impl Resource for LeanNode {
    type DynamicType = ();
    type Scope = <Node as Resource>::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        <Node as Resource>::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        <Node as Resource>::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        <Node as Resource>::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        <Node as Resource>::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.0.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

/// Which keys of a JSON object are skipped, and which keys' values are pruned further.
#[derive(Debug)]
struct Prune {
    /// Keys whose values are skipped, as if absent.
    skip: &'static [&'static str],
    /// Keys whose values (objects) are pruned by the paired rule.
    descend: &'static [(&'static str, &'static Prune)],
}

impl Prune {
    /// `deserializer`, with its objects pruned by this rule.
    fn deserializer<D>(&'static self, deserializer: D) -> Pruned<D> {
        Pruned {
            inner: deserializer,
            prune: self,
        }
    }

    /// `visitor`, handed objects pruned by this rule.
    fn visitor<V>(&'static self, visitor: V) -> PrunedVisitor<V> {
        PrunedVisitor {
            inner: visitor,
            prune: self,
        }
    }
}

/// A Node: `metadata.managedFields` and `status.images`.
const NODE: Prune = Prune {
    skip: &[],
    descend: &[("metadata", &OBJECT_META), ("status", &NODE_STATUS)],
};
const OBJECT_META: Prune = Prune {
    skip: &["managedFields"],
    descend: &[],
};
const NODE_STATUS: Prune = Prune {
    skip: &["images"],
    descend: &[],
};

impl<'de> de::Deserialize<'de> for LeanNode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let node = <Node as de::Deserialize>::deserialize(NODE.deserializer(deserializer))?;
        Ok(LeanNode(node))
    }
}

/// `api` (the Nodes' API), answering with [`LeanNode`]s: for writes whose answer is only read
/// for what the two skipped fields are not.
pub(crate) fn lean_api(api: &kube::Api<Node>) -> kube::Api<LeanNode> {
    kube::Api::all(api.clone().into_client())
}

impl From<LeanNode> for Node {
    fn from(node: LeanNode) -> Node {
        node.0
    }
}

/// A deserializer whose objects (maps and structs) lose the keys `prune` names. Everything
/// else is passed through unchanged.
struct Pruned<D> {
    inner: D,
    prune: &'static Prune,
}

/// Methods passed straight to the inner deserializer with the caller's visitor.
macro_rules! forward {
    ($($method:ident ($($arg:ident : $ty:ty),*)),* $(,)?) => {
        $(
            fn $method<V: Visitor<'de>>(self, $($arg: $ty,)* visitor: V) -> Result<V::Value, Self::Error> {
                self.inner.$method($($arg,)* visitor)
            }
        )*
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Pruned<D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.inner.deserialize_any(self.prune.visitor(visitor))
    }
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.inner.deserialize_option(self.prune.visitor(visitor))
    }
    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.inner.deserialize_map(self.prune.visitor(visitor))
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner
            .deserialize_struct(name, fields, self.prune.visitor(visitor))
    }

    forward! {
        deserialize_bool(), deserialize_i8(), deserialize_i16(), deserialize_i32(),
        deserialize_i64(), deserialize_i128(), deserialize_u8(), deserialize_u16(),
        deserialize_u32(), deserialize_u64(), deserialize_u128(), deserialize_f32(),
        deserialize_f64(), deserialize_char(), deserialize_str(), deserialize_string(),
        deserialize_bytes(), deserialize_byte_buf(), deserialize_unit(), deserialize_seq(),
        deserialize_identifier(), deserialize_ignored_any(),
        deserialize_tuple(len: usize),
        deserialize_unit_struct(name: &'static str),
        deserialize_newtype_struct(name: &'static str),
        deserialize_tuple_struct(name: &'static str, len: usize),
        deserialize_enum(name: &'static str, variants: &'static [&'static str]),
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

/// The caller's visitor, handed a pruned map (or, for an `Option`, a pruned `Some`).
struct PrunedVisitor<V> {
    inner: V,
    prune: &'static Prune,
}

/// Visitor methods passed straight to the caller's visitor.
macro_rules! forward_visit {
    ($($method:ident ($ty:ty)),* $(,)?) => {
        $(
            fn $method<E: de::Error>(self, v: $ty) -> Result<Self::Value, E> {
                self.inner.$method(v)
            }
        )*
    };
}

impl<'de, V: Visitor<'de>> Visitor<'de> for PrunedVisitor<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.inner.expecting(f)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.inner.visit_map(PrunedMap {
            inner: map,
            prune: self.prune,
            next_value: None,
        })
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<V::Value, D::Error> {
        self.inner.visit_some(self.prune.deserializer(deserializer))
    }
    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_none()
    }
    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_unit()
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<V::Value, D::Error> {
        self.inner.visit_newtype_struct(deserializer)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.inner.visit_seq(seq)
    }
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        self.inner.visit_enum(data)
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<V::Value, E> {
        self.inner.visit_borrowed_str(v)
    }
    fn visit_borrowed_bytes<E: de::Error>(self, v: &'de [u8]) -> Result<V::Value, E> {
        self.inner.visit_borrowed_bytes(v)
    }

    forward_visit! {
        visit_bool(bool), visit_i8(i8), visit_i16(i16), visit_i32(i32), visit_i64(i64),
        visit_i128(i128), visit_u8(u8), visit_u16(u16), visit_u32(u32), visit_u64(u64),
        visit_u128(u128), visit_f32(f32), visit_f64(f64), visit_char(char), visit_str(&str),
        visit_string(String), visit_bytes(&[u8]), visit_byte_buf(Vec<u8>),
    }
}

/// A map whose keys in `prune.skip` are skipped and whose values under `prune.descend` keys
/// are pruned in turn.
struct PrunedMap<A> {
    inner: A,
    prune: &'static Prune,
    /// The rule for the value of the key just returned, if it has one.
    next_value: Option<&'static Prune>,
}

/// What the key just read means to [`PrunedMap`].
enum Key<T, S> {
    /// A key the caller receives (as `T`), and the rule for its value.
    Kept(T, Option<&'static Prune>),
    /// A key in `skip`: its value is to be skipped; the caller's seed, unused, for the next key.
    Skipped(S),
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for PrunedMap<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        let mut seed = Some(seed);
        loop {
            let Some(take) = seed.take() else {
                return Ok(None);
            };
            match self.inner.next_key_seed(KeySeed {
                seed: take,
                prune: self.prune,
            })? {
                None => return Ok(None),
                Some(Key::Kept(key, rule)) => {
                    self.next_value = rule;
                    return Ok(Some(key));
                }
                Some(Key::Skipped(seed_back)) => {
                    self.inner.next_value::<IgnoredAny>()?;
                    seed = Some(seed_back);
                }
            }
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        match self.next_value.take() {
            Some(prune) => self.inner.next_value_seed(PrunedSeed { seed, prune }),
            None => self.inner.next_value_seed(seed),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

/// Reads a key as a string and decides: skipped, or handed to the caller's seed.
struct KeySeed<K> {
    seed: K,
    prune: &'static Prune,
}

impl<'de, K: DeserializeSeed<'de>> DeserializeSeed<'de> for KeySeed<K> {
    type Value = Key<K::Value, K>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de, K: DeserializeSeed<'de>> KeySeed<K> {
    /// Skips `key`, or hands it to the caller's seed with `decode`.
    fn read<E>(
        self,
        key: &str,
        decode: impl FnOnce(K) -> Result<K::Value, E>,
    ) -> Result<Key<K::Value, K>, E> {
        if self.prune.skip.contains(&key) {
            return Ok(Key::Skipped(self.seed));
        }
        let rule = self
            .prune
            .descend
            .iter()
            .find_map(|(name, rule)| (*name == key).then_some(*rule));
        Ok(Key::Kept(decode(self.seed)?, rule))
    }
}

impl<'de, K: DeserializeSeed<'de>> Visitor<'de> for KeySeed<K> {
    type Value = Key<K::Value, K>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Self::Value, E> {
        self.read(key, |seed| seed.deserialize(key.into_deserializer()))
    }

    fn visit_borrowed_str<E: de::Error>(self, key: &'de str) -> Result<Self::Value, E> {
        self.read(key, |seed| {
            seed.deserialize(de::value::BorrowedStrDeserializer::new(key))
        })
    }

    fn visit_string<E: de::Error>(self, key: String) -> Result<Self::Value, E> {
        self.visit_str(&key)
    }
}

/// The caller's seed for a value, handed a pruned deserializer.
struct PrunedSeed<S> {
    seed: S,
    prune: &'static Prune,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for PrunedSeed<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<S::Value, D::Error> {
        self.seed.deserialize(self.prune.deserializer(deserializer))
    }
}

#[cfg(test)]
mod tests;

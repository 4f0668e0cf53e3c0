//! A nesting limit for serde deserialization: [`DepthLimited`].
//!
//! bincode has no recursion limit of its own, and serde's derived impls recurse once per
//! level of nesting, so a small payload of a recursive type (`enum Tree { Leaf,
//! Node(Box<Tree>) }`, a run of `Node` tags) would decode deeper and deeper until the
//! thread's stack overflows, aborting the process. [`DepthLimited`] wraps the deserializer
//! in an adapter that counts levels on the way down and fails with a decode error past
//! [`MAX_DEPTH`], as serde_json does on its own.
//!
//! A level is a value that holds other values: a sequence, tuple, map, struct, `Some`,
//! newtype struct, or enum variant with data (each is handed to its visitor as an access
//! object or a nested deserializer, which the adapter wraps again one level down). Scalars,
//! strings, bytes, units and unit variants hold nothing and cost nothing; a long flat
//! sequence is one level however long it is. The remaining depth is passed down by value.

use std::fmt;

use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor,
};

/// How many levels of nesting a payload may have: 128, serde_json's default recursion limit
/// (which reads 127 levels of arrays and objects, and refuses the 128th). Far more than a job
/// type nests, and few enough that the frames they take fit a small thread stack (each level
/// costs a handful of frames; the tests decode to the limit on 256 KiB).
pub(crate) const MAX_DEPTH: usize = 128;

/// A `T` deserialized through the nesting limit: deeper than `MAX` levels ([`MAX_DEPTH`]
/// unless a test says otherwise) is an error of the deserializer (`D::Error::custom`), raised
/// before the stack runs out.
pub(crate) struct DepthLimited<T, const MAX: usize = MAX_DEPTH>(pub T);

impl<'de, T: de::Deserialize<'de>, const MAX: usize> de::Deserialize<'de> for DepthLimited<T, MAX> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let deserializer = Limited {
            inner: deserializer,
            depth: MAX,
            max: MAX,
        };
        T::deserialize(deserializer).map(DepthLimited)
    }
}

/// Wraps a deserializer, a visitor, a seed or an access object, with `depth` levels of
/// nesting still allowed inside the value it reads (of `max` in all, for the error).
struct Limited<X> {
    inner: X,
    depth: usize,
    max: usize,
}

impl<X> Limited<X> {
    /// `other` wrapped at this one's depth.
    fn same<Y>(&self, other: Y) -> Limited<Y> {
        Limited {
            inner: other,
            depth: self.depth,
            max: self.max,
        }
    }

    /// `other` wrapped one level down, or the error if no level is left.
    fn down<Y, E: de::Error>(&self, other: Y) -> Result<Limited<Y>, E> {
        match self.depth.checked_sub(1) {
            Some(depth) => Ok(Limited {
                inner: other,
                depth,
                max: self.max,
            }),
            None => Err(E::custom(format_args!(
                "payload nested deeper than {} levels",
                self.max
            ))),
        }
    }
}

// ---- Deserializer: every call forwarded with the visitor wrapped at the same depth. ----

macro_rules! forward_deserialize {
    ($($method:ident $(($($arg:ident: $ty:ty),*))?;)*) => {
        $(
            fn $method<V: Visitor<'de>>(
                self,
                $($($arg: $ty,)*)?
                visitor: V,
            ) -> Result<V::Value, D::Error> {
                let visitor = self.same(visitor);
                self.inner.$method($($($arg,)*)? visitor)
            }
        )*
    };
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Limited<D> {
    type Error = D::Error;

    forward_deserialize! {
        deserialize_any;
        deserialize_bool;
        deserialize_i8;
        deserialize_i16;
        deserialize_i32;
        deserialize_i64;
        deserialize_i128;
        deserialize_u8;
        deserialize_u16;
        deserialize_u32;
        deserialize_u64;
        deserialize_u128;
        deserialize_f32;
        deserialize_f64;
        deserialize_char;
        deserialize_str;
        deserialize_string;
        deserialize_bytes;
        deserialize_byte_buf;
        deserialize_option;
        deserialize_unit;
        deserialize_unit_struct(name: &'static str);
        deserialize_newtype_struct(name: &'static str);
        deserialize_seq;
        deserialize_tuple(len: usize);
        deserialize_tuple_struct(name: &'static str, len: usize);
        deserialize_map;
        deserialize_struct(name: &'static str, fields: &'static [&'static str]);
        deserialize_enum(name: &'static str, variants: &'static [&'static str]);
        deserialize_identifier;
        deserialize_ignored_any;
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

// ---- Visitor: scalars forwarded; whatever holds nested values is wrapped one level down. ----

macro_rules! forward_visit {
    ($($method:ident($ty:ty);)*) => {
        $(
            fn $method<E: de::Error>(self, v: $ty) -> Result<Self::Value, E> {
                self.inner.$method(v)
            }
        )*
    };
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Limited<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.expecting(f)
    }

    forward_visit! {
        visit_bool(bool);
        visit_i8(i8);
        visit_i16(i16);
        visit_i32(i32);
        visit_i64(i64);
        visit_i128(i128);
        visit_u8(u8);
        visit_u16(u16);
        visit_u32(u32);
        visit_u64(u64);
        visit_u128(u128);
        visit_f32(f32);
        visit_f64(f64);
        visit_char(char);
        visit_str(&str);
        visit_borrowed_str(&'de str);
        visit_string(String);
        visit_bytes(&[u8]);
        visit_borrowed_bytes(&'de [u8]);
        visit_byte_buf(Vec<u8>);
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        self.inner.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        self.inner.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        let deserializer = self.down(deserializer)?;
        self.inner.visit_some(deserializer)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        let deserializer = self.down(deserializer)?;
        self.inner.visit_newtype_struct(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        let seq = self.down(seq)?;
        self.inner.visit_seq(seq)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        let map = self.down(map)?;
        self.inner.visit_map(map)
    }

    /// Not a level yet: a unit variant holds nothing. The variant's data, if any, is one
    /// level down ([`VariantAccess`] below).
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Self::Value, A::Error> {
        let data = self.same(data);
        self.inner.visit_enum(data)
    }
}

// ---- Seeds: the nested value read through the wrapped deserializer. ----

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Limited<S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        let deserializer = self.same(deserializer);
        self.inner.deserialize(deserializer)
    }
}

// ---- Access objects: already one level down (the visitor took the level); their seeds are
// wrapped at that depth. ----

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for Limited<A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, A::Error> {
        let seed = self.same(seed);
        self.inner.next_element_seed(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Limited<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        let seed = self.same(seed);
        self.inner.next_key_seed(seed)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        let seed = self.same(seed);
        self.inner.next_value_seed(seed)
    }

    fn next_entry_seed<K: DeserializeSeed<'de>, V: DeserializeSeed<'de>>(
        &mut self,
        kseed: K,
        vseed: V,
    ) -> Result<Option<(K::Value, V::Value)>, A::Error> {
        let (kseed, vseed) = (self.same(kseed), self.same(vseed));
        self.inner.next_entry_seed(kseed, vseed)
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

/// The enum itself, at the depth of the value that is the enum.
impl<'de, A: EnumAccess<'de>> EnumAccess<'de> for Limited<A> {
    type Error = A::Error;
    type Variant = Limited<A::Variant>;

    fn variant_seed<S: DeserializeSeed<'de>>(
        self,
        seed: S,
    ) -> Result<(S::Value, Self::Variant), A::Error> {
        // The tag is inside the enum, one level down; but a unit variant at depth 0 still
        // needs its tag, so there the tag is read at depth 0 too, where it may hold nothing
        // nested (bincode's tag is a `u32`, serde_json's a string: neither nests at all).
        let tag = Limited {
            inner: seed,
            depth: self.depth.saturating_sub(1),
            max: self.max,
        };
        let (depth, max) = (self.depth, self.max);
        let (value, variant) = self.inner.variant_seed(tag)?;
        let variant = Limited {
            inner: variant,
            depth,
            max,
        };
        Ok((value, variant))
    }
}

/// The variant's data is one level down from the enum; a unit variant has none.
impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for Limited<A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.inner.unit_variant()
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        let seed = self.down(seed)?;
        self.inner.newtype_variant_seed(seed)
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        let visitor = self.down(visitor)?;
        self.inner.tuple_variant(len, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        let visitor = self.down(visitor)?;
        self.inner.struct_variant(fields, visitor)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use bincode::config;
    use bincode::error::DecodeError;
    use serde::de::DeserializeOwned;
    use serde::{Deserialize, Serialize};

    use super::*;

    fn encode<T: Serialize>(value: &T) -> Vec<u8> {
        bincode::serde::encode_to_vec(value, config::standard()).unwrap()
    }

    /// Decoded through the limit (of `MAX` levels); all the bytes are used.
    fn limited<T: DeserializeOwned, const MAX: usize>(bytes: &[u8]) -> Result<T, DecodeError> {
        let (DepthLimited(value), used) = bincode::serde::decode_from_slice::<
            DepthLimited<T, MAX>,
            _,
        >(bytes, config::standard())?;
        assert_eq!(used, bytes.len());
        Ok(value)
    }

    /// Decoded as before the limit.
    fn plain<T: DeserializeOwned>(bytes: &[u8]) -> T {
        let (value, used) = bincode::serde::decode_from_slice(bytes, config::standard()).unwrap();
        assert_eq!(used, bytes.len());
        value
    }

    fn assert_too_deep<T: std::fmt::Debug>(r: Result<T, DecodeError>, max: usize) {
        match r {
            Err(e) => assert_eq!(
                e.to_string(),
                DecodeError::OtherString(format!("payload nested deeper than {max} levels"))
                    .to_string()
            ),
            Ok(v) => panic!("decoded past the limit: {v:?}"),
        }
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    enum Tree {
        Leaf,
        Node(Box<Tree>),
    }

    /// One level a step: the sequence (transparent: no newtype level).
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    #[serde(transparent)]
    struct NestVec(Vec<NestVec>);

    /// One level a step: the `Some`.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    #[serde(transparent)]
    struct NestOpt(Option<Box<NestOpt>>);

    /// One level a step: the map.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    #[serde(transparent)]
    struct NestMap(BTreeMap<u8, NestMap>);

    /// Every path by which serde nests, each under a variant. `Node` is one level (the
    /// variant's data); every other variant is two (the variant's data, and the sequence,
    /// map, `Some`, tuple, struct or newtype struct inside it).
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    enum Deep {
        End,
        Node(Box<Deep>),
        TupleVariant(u8, Box<Deep>),
        StructVariant { tag: u8, next: Box<Deep> },
        Seq(Vec<Deep>),
        Opt(Option<Box<Deep>>),
        Map(BTreeMap<u8, Deep>),
        Tuple(Box<(u8, Deep)>),
        Newtype(Wrap),
        TupleStruct(Box<Pair>),
        Struct(Box<Record>),
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Wrap(Box<Deep>);

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Pair(u8, Deep);

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Record {
        a: u8,
        text: String,
        next: Deep,
    }

    /// One step of nesting: a `Deep` around a `Deep`.
    type Step = fn(Deep) -> Deep;

    /// Each two-level step of `Deep`, with the nested value last in its encoding (so a step's
    /// bytes are its encoding around `End` without the final `End` byte).
    fn two_level_steps() -> Vec<(&'static str, Step)> {
        vec![
            ("tuple variant", |d| Deep::TupleVariant(7, Box::new(d))),
            ("struct variant", |d| Deep::StructVariant {
                tag: 7,
                next: Box::new(d),
            }),
            ("seq", |d| Deep::Seq(vec![Deep::End, Deep::End, d])),
            ("option", |d| Deep::Opt(Some(Box::new(d)))),
            ("map", |d| {
                Deep::Map(BTreeMap::from([(1, Deep::End), (2, Deep::End), (3, d)]))
            }),
            ("tuple", |d| Deep::Tuple(Box::new((7, d)))),
            ("newtype struct", |d| Deep::Newtype(Wrap(Box::new(d)))),
            ("tuple struct", |d| Deep::TupleStruct(Box::new(Pair(7, d)))),
            ("struct", |d| {
                Deep::Struct(Box::new(Record {
                    a: 7,
                    text: "x".into(),
                    next: d,
                }))
            }),
        ]
    }

    fn node(d: Deep) -> Deep {
        Deep::Node(Box::new(d))
    }

    /// `End` inside `nodes` one-level steps inside `steps` of `step`.
    fn chain(step: Step, steps: usize, nodes: usize) -> Deep {
        let inner = (0..nodes).fold(Deep::End, |d, _| node(d));
        (0..steps).fold(inner, |d, _| step(d))
    }

    /// `n` copies of the bytes of one step, then `end`.
    fn repeated(step: &[u8], n: usize, end: &[u8]) -> Vec<u8> {
        let mut bytes = step.repeat(n);
        bytes.extend_from_slice(end);
        bytes
    }

    #[test]
    fn the_limit_is_serde_json_s() {
        assert_eq!(MAX_DEPTH, 128);
        // serde_json's limit of 128 reads 127 levels; this one reads 128.
        let json = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(serde_json::from_str::<serde_json::Value>(&json(127)).is_ok());
        assert!(serde_json::from_str::<serde_json::Value>(&json(128)).is_err());
    }

    #[test]
    fn recursive_types_decode_to_128_levels_and_no_further() {
        for n in [0, 1, 127, 128, 129] {
            let ok = n <= MAX_DEPTH;
            // `n` Nodes around a Leaf: n levels.
            let tree = repeated(&[1], n, &[0]);
            // `n` nested sequences, the innermost empty.
            let vec = repeated(&[1], n - n.min(1), &[0]);
            // `n` Somes around a None.
            let opt = repeated(&[1], n, &[0]);
            // `n` nested maps of one entry (key 0), the innermost empty.
            let map = repeated(&[1, 0], n - n.min(1), &[0]);
            // The same `n` levels as `Deep` Nodes.
            let deep = repeated(&[1], n, &[0]);
            if ok {
                assert_eq!(
                    limited::<Tree, MAX_DEPTH>(&tree).unwrap(),
                    plain::<Tree>(&tree)
                );
                assert_eq!(
                    limited::<NestVec, MAX_DEPTH>(&vec).unwrap(),
                    plain::<NestVec>(&vec)
                );
                assert_eq!(
                    limited::<NestOpt, MAX_DEPTH>(&opt).unwrap(),
                    plain::<NestOpt>(&opt)
                );
                assert_eq!(
                    limited::<NestMap, MAX_DEPTH>(&map).unwrap(),
                    plain::<NestMap>(&map)
                );
                assert_eq!(
                    limited::<Deep, MAX_DEPTH>(&deep).unwrap(),
                    chain(node, 0, n)
                );
            } else {
                assert_too_deep(limited::<Tree, MAX_DEPTH>(&tree), MAX_DEPTH);
                assert_too_deep(limited::<NestVec, MAX_DEPTH>(&vec), MAX_DEPTH);
                assert_too_deep(limited::<NestOpt, MAX_DEPTH>(&opt), MAX_DEPTH);
                assert_too_deep(limited::<NestMap, MAX_DEPTH>(&map), MAX_DEPTH);
                assert_too_deep(limited::<Deep, MAX_DEPTH>(&deep), MAX_DEPTH);
            }
        }
        // The value nests as counted: 128 Nodes are 128 levels, encoded and decoded back.
        let v = chain(node, 0, 128);
        assert_eq!(limited::<Deep, MAX_DEPTH>(&encode(&v)).unwrap(), v);
    }

    #[test]
    fn every_nesting_path_counts_and_decodes_to_128_levels() {
        for (name, step) in two_level_steps() {
            // 63 two-level steps and 1 or 2 Nodes: 127 and 128 levels; 3 Nodes: 129.
            for (nodes, levels) in [(1, 127), (2, 128), (3, 129)] {
                let value = chain(step, 63, nodes);
                let bytes = encode(&value);
                let r = limited::<Deep, MAX_DEPTH>(&bytes);
                if levels <= MAX_DEPTH {
                    let back = r.unwrap_or_else(|e| panic!("{name}, {levels} levels: {e}"));
                    assert_eq!(back, value, "{name}");
                    assert_eq!(back, plain::<Deep>(&bytes), "{name}");
                } else {
                    assert_too_deep(r, MAX_DEPTH);
                }
            }
            // 64 steps (128 levels) decode; a Node more does not.
            let value = chain(step, 64, 0);
            assert_eq!(limited::<Deep, MAX_DEPTH>(&encode(&value)).unwrap(), value);
            assert_too_deep(limited::<Deep, MAX_DEPTH>(&encode(&node(value))), MAX_DEPTH);
        }
    }

    #[test]
    fn map_keys_and_small_limits_count_the_same_way() {
        // A limit of 3: a map (1) whose keys are tuples (2) holding a Some (3).
        type Keys = BTreeMap<(u8, Option<u8>), u8>;
        let keys: Keys = BTreeMap::from([((1, Some(2)), 3), ((4, None), 5)]);
        assert_eq!(limited::<Keys, 3>(&encode(&keys)).unwrap(), keys);
        assert_too_deep(limited::<Keys, 2>(&encode(&keys)), 2);
        // Limit 0: scalars, strings, units and unit variants only.
        assert_eq!(limited::<u64, 0>(&encode(&7u64)).unwrap(), 7);
        assert_eq!(limited::<String, 0>(&encode(&"s")).unwrap(), "s");
        assert_eq!(limited::<(), 0>(&encode(&())).unwrap(), ());
        assert_eq!(
            limited::<Tree, 0>(&encode(&Tree::Leaf)).unwrap(),
            Tree::Leaf
        );
        assert_eq!(
            limited::<Option<u8>, 0>(&encode(&None::<u8>)).unwrap(),
            None
        );
        assert_too_deep(limited::<Option<u8>, 0>(&encode(&Some(1u8))), 0);
        assert_too_deep(limited::<Vec<u8>, 0>(&encode(&Vec::<u8>::new())), 0);
        assert_too_deep(limited::<(u8,), 0>(&encode(&(1u8,))), 0);
        assert_too_deep(limited::<Wrap, 0>(&encode(&Wrap(Box::new(Deep::End)))), 0);
        assert_too_deep(limited::<Tree, 0>(&encode(&node_tree(1))), 0);
        // A long flat sequence is one level, however long.
        let flat: Vec<Vec<u8>> = vec![vec![1, 2, 3]; 10_000];
        assert_eq!(limited::<Vec<Vec<u8>>, 2>(&encode(&flat)).unwrap(), flat);
        assert_too_deep(limited::<Vec<Vec<u8>>, 1>(&encode(&flat)), 1);
    }

    fn node_tree(n: usize) -> Tree {
        (0..n).fold(Tree::Leaf, |t, _| Tree::Node(Box::new(t)))
    }

    #[test]
    fn a_million_levels_fail_at_the_limit_on_a_small_stack() {
        // 256 KiB of stack: a million levels without the limit would need hundreds of MiB.
        type Decode = fn(&[u8]) -> Result<(), DecodeError>;
        let mut cases: Vec<(&str, Vec<u8>, Decode)> = vec![
            ("tree", repeated(&[1], 1_000_000, &[0]), |b| {
                limited::<Tree, MAX_DEPTH>(b).map(drop)
            }),
            ("vec", repeated(&[1], 1_000_000, &[0]), |b| {
                limited::<NestVec, MAX_DEPTH>(b).map(drop)
            }),
            ("option", repeated(&[1], 1_000_000, &[0]), |b| {
                limited::<NestOpt, MAX_DEPTH>(b).map(drop)
            }),
            ("map", repeated(&[1, 0], 1_000_000, &[0]), |b| {
                limited::<NestMap, MAX_DEPTH>(b).map(drop)
            }),
            // The payload: variant 1 deep, ending in a variant `Tree` lacks.
            ("tree, bad end", repeated(&[1], 64 * 1024, &[7]), |b| {
                limited::<Tree, MAX_DEPTH>(b).map(drop)
            }),
        ];
        for (name, step) in two_level_steps() {
            let mut one = encode(&step(Deep::End));
            assert_eq!(one.pop(), Some(0), "{name}: the nested value is last");
            cases.push((name, repeated(&one, 1_000_000, &[0]), |b| {
                limited::<Deep, MAX_DEPTH>(b).map(drop)
            }));
        }
        std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || {
                for (name, bytes, decode) in cases {
                    match decode(&bytes) {
                        Err(e) => assert_eq!(
                            e.to_string(),
                            DecodeError::OtherString(format!(
                                "payload nested deeper than {MAX_DEPTH} levels"
                            ))
                            .to_string(),
                            "{name}"
                        ),
                        Ok(()) => panic!("{name}: decoded a million levels"),
                    }
                }
            })
            .unwrap()
            .join()
            .unwrap();
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Job {
        id: u64,
        name: String,
        tags: Vec<String>,
        weights: Vec<f64>,
        kind: Kind,
        parent: Option<u64>,
        note: Option<String>,
        attrs: HashMap<String, u32>,
        by_pair: BTreeMap<(u16, char), Vec<i64>>,
        raw: Vec<u8>,
        big: u128,
        small: i8,
        flag: bool,
        unit: (),
        pair: (i32, String),
        wrapped: Meters,
        marker: Marker,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    enum Kind {
        Idle,
        Email(String),
        Resize(u32, u32),
        Copy {
            from: String,
            to: String,
            overwrite: bool,
        },
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Meters(f32);

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Marker;

    fn jobs() -> Vec<Job> {
        (0..50u64)
            .map(|i| Job {
                id: i,
                name: format!("job é {i}"),
                tags: (0..i % 4).map(|t| format!("t{t}")).collect(),
                weights: vec![0.5, -1.25, f64::MAX],
                kind: match i % 4 {
                    0 => Kind::Idle,
                    1 => Kind::Email(format!("{i}@example.com")),
                    2 => Kind::Resize(640, 480),
                    _ => Kind::Copy {
                        from: "a".into(),
                        to: "b".into(),
                        overwrite: i % 2 == 0,
                    },
                },
                parent: i.checked_sub(1),
                note: (i % 3 == 0).then(|| "n".to_string()),
                attrs: HashMap::from([("k".to_string(), i as u32)]),
                by_pair: BTreeMap::from([((i as u16, 'λ'), vec![-1, 2, i as i64])]),
                raw: vec![0, 255, i as u8],
                big: u128::MAX - u128::from(i),
                small: -(i as i8),
                flag: i % 2 == 1,
                unit: (),
                pair: (-7, "p".into()),
                wrapped: Meters(1.5),
                marker: Marker,
            })
            .collect()
    }

    #[test]
    fn ordinary_job_types_decode_exactly_as_before() {
        let jobs = jobs();
        for job in &jobs {
            let bytes = encode(job);
            assert_eq!(&limited::<Job, MAX_DEPTH>(&bytes).unwrap(), job);
            assert_eq!(
                limited::<Job, MAX_DEPTH>(&bytes).unwrap(),
                plain::<Job>(&bytes)
            );
        }
        let bytes = encode(&jobs);
        assert_eq!(limited::<Vec<Job>, MAX_DEPTH>(&bytes).unwrap(), jobs);
        // Long flat vectors: 10,000 elements, of numbers, strings and structs.
        let numbers: Vec<u64> = (0..10_000).map(|i| i * 7_919).collect();
        let strings: Vec<String> = (0..10_000).map(|i| i.to_string()).collect();
        let many: Vec<Job> = jobs.iter().cycle().take(10_000).cloned().collect();
        let bytes = encode(&numbers);
        assert_eq!(limited::<Vec<u64>, MAX_DEPTH>(&bytes).unwrap(), numbers);
        let bytes = encode(&strings);
        assert_eq!(limited::<Vec<String>, MAX_DEPTH>(&bytes).unwrap(), strings);
        let bytes = encode(&many);
        assert_eq!(limited::<Vec<Job>, MAX_DEPTH>(&bytes).unwrap(), many);
        // Wrong bytes fail as they did (same error): a bad variant, a short input.
        let mut bad = encode(&jobs[1]);
        let plain_err = bincode::serde::decode_from_slice::<Job, _>(&bad[..3], config::standard())
            .unwrap_err()
            .to_string();
        assert_eq!(
            limited::<Job, MAX_DEPTH>(&bad[..3])
                .unwrap_err()
                .to_string(),
            plain_err
        );
        bad.truncate(bad.len() - 1);
        assert!(limited::<Job, MAX_DEPTH>(&bad).is_err());
    }

    /// Through the adapter, serde_json (self-describing: `deserialize_any`, identifiers,
    /// borrowed strings, untagged and internally tagged enums) decodes as it does alone.
    #[test]
    fn a_self_describing_format_decodes_the_same_through_the_adapter() {
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "type")]
        enum Tagged {
            A { x: u8 },
            B { y: Option<String> },
        }
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        #[serde(untagged)]
        enum Untagged {
            N(u64),
            S(String),
            V(Vec<Untagged>),
        }
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct Doc<'a> {
            #[serde(borrow)]
            name: &'a str,
            kinds: Vec<Kind>,
            map: HashMap<String, Vec<Option<u32>>>,
            misc: (u128, i8, char, Meters, Marker, ()),
            tagged: Vec<Tagged>,
            untagged: Untagged,
            any: serde_json::Value,
        }
        let doc = Doc {
            name: "doc",
            kinds: jobs().into_iter().map(|j| j.kind).collect(),
            map: HashMap::from([("a".into(), vec![Some(1), None]), ("b".into(), vec![])]),
            misc: (u128::MAX, -1, 'λ', Meters(2.5), Marker, ()),
            tagged: vec![Tagged::A { x: 1 }, Tagged::B { y: None }],
            untagged: Untagged::V(vec![Untagged::N(1), Untagged::S("s".into())]),
            any: serde_json::json!({"a": [1, {"b": null}], "c": "d"}),
        };
        let text = serde_json::to_string(&doc).unwrap();
        let mut de = serde_json::Deserializer::from_str(&text);
        let DepthLimited(back) = DepthLimited::<Doc, MAX_DEPTH>::deserialize(&mut de).unwrap();
        assert_eq!(back, doc);
        assert_eq!(back, serde_json::from_str::<Doc>(&text).unwrap());
        // The adapter's limit applies to it as to bincode (an array or object is a level).
        let json = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        let through = |s: &str| {
            let mut de = serde_json::Deserializer::from_str(s);
            DepthLimited::<serde_json::Value, 5>::deserialize(&mut de).map(|v| v.0)
        };
        assert!(through(&json(5)).is_ok());
        let e = through(&json(6)).unwrap_err().to_string();
        assert!(e.starts_with("payload nested deeper than 5 levels"), "{e}");
    }

    /// Types that serialize differently for people and machines ask the deserializer; the
    /// adapter answers as the deserializer it wraps, at every level.
    #[test]
    fn is_human_readable_is_the_wrapped_deserializer_s() {
        #[derive(Debug, PartialEq)]
        struct Readable(bool);
        impl<'de> de::Deserialize<'de> for Readable {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let readable = d.is_human_readable();
                <()>::deserialize(d)?;
                Ok(Readable(readable))
            }
        }
        let bytes = encode(&((), vec![((), Some(()))]));
        type Nested = (Readable, Vec<(Readable, Option<Readable>)>);
        let (top, rest) = limited::<Nested, MAX_DEPTH>(&bytes).unwrap();
        assert_eq!(top, Readable(false));
        assert_eq!(rest, vec![(Readable(false), Some(Readable(false)))]);
        let mut de = serde_json::Deserializer::from_str("[null, [[null, null]]]");
        let DepthLimited((top, rest)) =
            DepthLimited::<Nested, MAX_DEPTH>::deserialize(&mut de).unwrap();
        assert_eq!(top, Readable(true));
        assert_eq!(rest, vec![(Readable(true), None)]);
        // And a real one: std's `SocketAddr` is a string for people, bytes for machines.
        let addr: std::net::SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(
            limited::<std::net::SocketAddr, MAX_DEPTH>(&encode(&addr)).unwrap(),
            addr
        );
    }
}

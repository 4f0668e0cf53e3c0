//! Guards for decoding typed payloads with serde: a nesting limit, and for bincode a check
//! of every sequence and map length ([`decode_bincode`], the entry point).
//!
//! bincode has no recursion limit of its own, and serde's derived impls recurse once per
//! level of nesting, so a small payload of a recursive type (`enum Tree { Leaf,
//! Node(Box<Tree>) }`, a run of `Node` tags) would decode deeper and deeper until the
//! thread's stack overflows, aborting the process. The adapter here wraps the deserializer,
//! counts levels on the way down and fails with a decode error past [`DEPTH_MAX`], as
//! serde_json does on its own. (`DepthLimited`, the same adapter over any deserializer,
//! is for tests with a self-describing format.)
//!
//! A level is a value that holds other values: a sequence, tuple, map, struct, `Some`,
//! newtype struct, or enum variant with data (each is handed to its visitor as an access
//! object or a nested deserializer, which the adapter wraps again one level down). Scalars,
//! strings, bytes, units and unit variants hold nothing and cost nothing; a long flat
//! sequence is one level however long it is. The remaining depth is passed down by value.

use crate::limits::DEPTH_MAX;
use std::cell::Cell;
use std::fmt;

use bincode::config::{Config, Configuration, LittleEndian, Varint};
use bincode::de::read::Reader;
use bincode::error::DecodeError;
use bincode::serde::OwnedSerdeDecoder;
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess,
    VariantAccess, Visitor,
};

/// A `T` deserialized through the nesting limit: deeper than `MAX` levels ([`DEPTH_MAX`]
/// unless a test says otherwise) is an error of the deserializer (`D::Error::custom`), raised
/// before the stack runs out.
#[cfg(test)]
pub(crate) struct DepthLimited<T, const MAX: usize = DEPTH_MAX>(pub T);

#[cfg(test)]
impl<'de, T: de::Deserialize<'de>, const MAX: usize> de::Deserialize<'de> for DepthLimited<T, MAX> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let deserializer = Limited {
            inner: deserializer,
            depth: MAX,
            max: MAX,
            lengths: None,
        };
        T::deserialize(deserializer).map(DepthLimited)
    }
}

/// Wraps a deserializer, a visitor, a seed or an access object, with `depth` levels of
/// nesting still allowed inside the value it reads (of `max` in all, for the error).
///
/// With `lengths` (bincode input read through [`Lengths`]), the length a sequence or map is
/// about to read is checked to fit a `usize` first (see [`decode_bincode`]).
struct Limited<'g, X> {
    inner: X,
    depth: usize,
    max: usize,
    lengths: Option<&'g Lengths<'g>>,
}

impl<'g, X> Limited<'g, X> {
    /// `other` wrapped at this one's depth.
    fn same<Y>(&self, other: Y) -> Limited<'g, Y> {
        Limited {
            inner: other,
            depth: self.depth,
            max: self.max,
            lengths: self.lengths,
        }
    }

    /// `other` wrapped one level down, or the error if no level is left.
    fn down<Y, E: de::Error>(&self, other: Y) -> Result<Limited<'g, Y>, E> {
        match self.depth.checked_sub(1) {
            Some(depth) => Ok(Limited {
                inner: other,
                depth,
                max: self.max,
                lengths: self.lengths,
            }),
            None => Err(E::custom(format_args!(
                "payload nested deeper than {} levels",
                self.max
            ))),
        }
    }
}

// ---- Lengths: bincode's sequence and map lengths checked on every target. ----

/// bincode input, read through [`LengthsReader`], whose next sequence or map length the
/// adapter can look at before bincode reads it.
///
/// bincode 2 reads the length of a serde sequence or map as a `u64` and converts it with
/// `as usize`: on a 32-bit target a damaged length of 2^32 or more is cut to its low 32 bits
/// (2^62 becomes 0), and the payload decodes to a wrong value instead of failing. Strings and
/// byte strings are read with a checked conversion and need no help.
pub(crate) struct Lengths<'b> {
    bytes: &'b [u8],
    pos: Cell<usize>,
}

/// bincode's varint marker of a `u64` in the next 8 bytes (little-endian).
const VARINT_U64: u8 = 253;

impl<'b> Lengths<'b> {
    fn new(bytes: &'b [u8]) -> Lengths<'b> {
        Lengths {
            bytes,
            pos: Cell::new(0),
        }
    }

    /// Fails if the varint at the read position holds a `u64` that does not fit a `usize`.
    /// Anything else (a short or malformed varint included) is left for bincode to read and
    /// judge, so on a 64-bit target this never fails where bincode would not.
    fn validate_next_length(&self) -> Result<(), String> {
        let rest = self.bytes.get(self.pos.get()..).unwrap_or_default();
        if let [VARINT_U64, tail @ ..] = rest
            && let Some(le) = tail.first_chunk::<8>()
        {
            let len = u64::from_le_bytes(*le);
            if usize::try_from(len).is_err() {
                return Err(format!(
                    "length {len} does not fit this target's {}-bit usize",
                    usize::BITS
                ));
            }
        }
        Ok(())
    }
}

/// A bincode [`Reader`] over [`Lengths`]' bytes that keeps the read position there.
struct LengthsReader<'g>(&'g Lengths<'g>);

impl Reader for LengthsReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> Result<(), DecodeError> {
        let pos = self.0.pos.get();
        let end = pos
            .checked_add(out.len())
            .filter(|&e| e <= self.0.bytes.len());
        let Some(end) = end else {
            return Err(DecodeError::UnexpectedEnd {
                additional: pos + out.len() - self.0.bytes.len(),
            });
        };
        out.copy_from_slice(&self.0.bytes[pos..end]);
        self.0.pos.set(end);
        Ok(())
    }

    fn peek_read(&mut self, n: usize) -> Option<&[u8]> {
        let pos = self.0.pos.get();
        self.0.bytes.get(pos..pos.checked_add(n)?)
    }

    fn consume(&mut self, n: usize) {
        let pos = self.0.pos.get();
        debug_assert!(pos + n <= self.0.bytes.len(), "consumed past the end");
        self.0.pos.set((pos + n).min(self.0.bytes.len()));
    }
}

/// Decodes a `T` from bincode `bytes` with `config`, through the nesting limit
/// ([`DEPTH_MAX`]) and with every sequence and map length checked to fit a `usize` before
/// bincode reads it ([`Lengths`]). Returns the value and the bytes read, as
/// `bincode::serde::decode_from_slice`.
///
/// The configuration is bincode's standard one (little-endian varints, the encoding
/// [`Lengths`] reads) with any byte limit `L`.
pub(crate) fn decode_bincode<T: DeserializeOwned, L>(
    bytes: &[u8],
    config: Configuration<LittleEndian, Varint, L>,
) -> Result<(T, usize), DecodeError>
where
    Configuration<LittleEndian, Varint, L>: Config,
{
    decode_bincode_within(bytes, config, DEPTH_MAX)
}

/// [`decode_bincode`] with `max` levels of nesting (tests use small ones).
fn decode_bincode_within<T: DeserializeOwned, L>(
    bytes: &[u8],
    config: Configuration<LittleEndian, Varint, L>,
    max: usize,
) -> Result<(T, usize), DecodeError>
where
    Configuration<LittleEndian, Varint, L>: Config,
{
    let lengths = Lengths::new(bytes);
    let mut decoder = OwnedSerdeDecoder::from_reader(LengthsReader(&lengths), config);
    let value = T::deserialize(Limited {
        inner: decoder.as_deserializer(),
        depth: max,
        max,
        lengths: Some(&lengths),
    })?;
    Ok((value, lengths.pos.get()))
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

impl<'de, 'g, D: Deserializer<'de>> Deserializer<'de> for Limited<'g, D> {
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
        deserialize_tuple(len: usize);
        deserialize_tuple_struct(name: &'static str, len: usize);
        deserialize_struct(name: &'static str, fields: &'static [&'static str]);
        deserialize_enum(name: &'static str, variants: &'static [&'static str]);
        deserialize_identifier;
        deserialize_ignored_any;
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.validate_length()?;
        let visitor = self.same(visitor);
        self.inner.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.validate_length()?;
        let visitor = self.same(visitor);
        self.inner.deserialize_map(visitor)
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

impl<X> Limited<'_, X> {
    /// With [`Lengths`]: fails if the length bincode reads next does not fit a `usize`.
    fn validate_length<E: de::Error>(&self) -> Result<(), E> {
        match self.lengths {
            Some(lengths) => lengths.validate_next_length().map_err(E::custom),
            None => Ok(()),
        }
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

impl<'de, 'g, V: Visitor<'de>> Visitor<'de> for Limited<'g, V> {
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

impl<'de, 'g, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Limited<'g, S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        let deserializer = self.same(deserializer);
        self.inner.deserialize(deserializer)
    }
}

// ---- Access objects: already one level down (the visitor took the level); their seeds are
// wrapped at that depth. ----

impl<'de, 'g, A: SeqAccess<'de>> SeqAccess<'de> for Limited<'g, A> {
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

impl<'de, 'g, A: MapAccess<'de>> MapAccess<'de> for Limited<'g, A> {
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
impl<'de, 'g, A: EnumAccess<'de>> EnumAccess<'de> for Limited<'g, A> {
    type Error = A::Error;
    type Variant = Limited<'g, A::Variant>;

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
            lengths: self.lengths,
        };
        let (depth, max, lengths) = (self.depth, self.max, self.lengths);
        let (value, variant) = self.inner.variant_seed(tag)?;
        let variant = Limited {
            inner: variant,
            depth,
            max,
            lengths,
        };
        Ok((value, variant))
    }
}

/// The variant's data is one level down from the enum; a unit variant has none.
impl<'de, 'g, A: VariantAccess<'de>> VariantAccess<'de> for Limited<'g, A> {
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
        let (value, used) = decode_bincode_within::<T, _>(bytes, config::standard(), MAX)?;
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

    /// A sequence or map length of 2^32 or more: an error on every target. bincode alone cuts
    /// it to 32 bits on a 32-bit target (2^62 + 2 becomes 2: `[7, 9]` below would decode);
    /// the length check refuses it there, and on 64-bit bincode's byte limit does.
    #[test]
    fn lengths_past_32_bits_are_errors_on_every_target() {
        let long = |len: u64, tail: &[u8]| {
            let mut b = vec![VARINT_U64];
            b.extend_from_slice(&len.to_le_bytes());
            b.extend_from_slice(tail);
            b
        };
        let cfg = config::standard().with_limit::<{ 1 << 20 }>();
        for len in [1u64 << 32, (1 << 62) + 2, u64::MAX] {
            let bytes = long(len, &[7, 9]);
            let seq = decode_bincode::<Vec<u8>, _>(&bytes, cfg);
            let seq_u64 = decode_bincode::<Vec<u64>, _>(&bytes, cfg);
            let map = decode_bincode::<BTreeMap<u8, u8>, _>(&long(len, &[7, 9]), cfg);
            let in_struct =
                decode_bincode::<(u8, Vec<u16>), _>(&[[1].as_slice(), &bytes].concat(), cfg);
            for e in [seq.err(), seq_u64.err(), map.err(), in_struct.err()] {
                let e = e
                    .expect("a length past 32 bits must not decode")
                    .to_string();
                if usize::BITS == 32 {
                    assert!(e.contains("does not fit this target's 32-bit usize"), "{e}");
                }
            }
        }
        // The largest length that fits 32 bits is bincode's to judge (too long here).
        let fits = long(u64::from(u32::MAX), &[]);
        let e = decode_bincode::<Vec<u8>, _>(&fits, cfg)
            .unwrap_err()
            .to_string();
        assert!(!e.contains("usize"), "{e}");
        // Small lengths decode as before, through the reader and its peeks.
        let v: Vec<Vec<u64>> = vec![vec![1, u64::MAX, 300], vec![], vec![1 << 40]];
        let bytes = encode(&v);
        assert_eq!(
            decode_bincode::<Vec<Vec<u64>>, _>(&bytes, cfg).unwrap(),
            (v, bytes.len())
        );
        // A cut input is bincode's end-of-input error, read no further.
        let cut = &bytes[..bytes.len() - 3];
        assert!(matches!(
            decode_bincode::<Vec<Vec<u64>>, _>(cut, cfg),
            Err(DecodeError::UnexpectedEnd { .. })
        ));
    }

    #[test]
    fn the_limit_is_serde_json_s() {
        assert_eq!(DEPTH_MAX, 128);
        // serde_json's limit of 128 reads 127 levels; this one reads 128.
        let json = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(serde_json::from_str::<serde_json::Value>(&json(127)).is_ok());
        assert!(serde_json::from_str::<serde_json::Value>(&json(128)).is_err());
    }

    #[test]
    fn recursive_types_decode_to_128_levels_and_no_further() {
        for n in [0, 1, 127, 128, 129] {
            let ok = n <= DEPTH_MAX;
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
                    limited::<Tree, DEPTH_MAX>(&tree).unwrap(),
                    plain::<Tree>(&tree)
                );
                assert_eq!(
                    limited::<NestVec, DEPTH_MAX>(&vec).unwrap(),
                    plain::<NestVec>(&vec)
                );
                assert_eq!(
                    limited::<NestOpt, DEPTH_MAX>(&opt).unwrap(),
                    plain::<NestOpt>(&opt)
                );
                assert_eq!(
                    limited::<NestMap, DEPTH_MAX>(&map).unwrap(),
                    plain::<NestMap>(&map)
                );
                assert_eq!(
                    limited::<Deep, DEPTH_MAX>(&deep).unwrap(),
                    chain(node, 0, n)
                );
            } else {
                assert_too_deep(limited::<Tree, DEPTH_MAX>(&tree), DEPTH_MAX);
                assert_too_deep(limited::<NestVec, DEPTH_MAX>(&vec), DEPTH_MAX);
                assert_too_deep(limited::<NestOpt, DEPTH_MAX>(&opt), DEPTH_MAX);
                assert_too_deep(limited::<NestMap, DEPTH_MAX>(&map), DEPTH_MAX);
                assert_too_deep(limited::<Deep, DEPTH_MAX>(&deep), DEPTH_MAX);
            }
        }
        // The value nests as counted: 128 Nodes are 128 levels, encoded and decoded back.
        let v = chain(node, 0, 128);
        assert_eq!(limited::<Deep, DEPTH_MAX>(&encode(&v)).unwrap(), v);
    }

    #[test]
    fn every_nesting_path_counts_and_decodes_to_128_levels() {
        for (name, step) in two_level_steps() {
            // 63 two-level steps and 1 or 2 Nodes: 127 and 128 levels; 3 Nodes: 129.
            for (nodes, levels) in [(1, 127), (2, 128), (3, 129)] {
                let value = chain(step, 63, nodes);
                let bytes = encode(&value);
                let r = limited::<Deep, DEPTH_MAX>(&bytes);
                if levels <= DEPTH_MAX {
                    let back = r.unwrap_or_else(|e| panic!("{name}, {levels} levels: {e}"));
                    assert_eq!(back, value, "{name}");
                    assert_eq!(back, plain::<Deep>(&bytes), "{name}");
                } else {
                    assert_too_deep(r, DEPTH_MAX);
                }
            }
            // 64 steps (128 levels) decode; a Node more does not.
            let value = chain(step, 64, 0);
            assert_eq!(limited::<Deep, DEPTH_MAX>(&encode(&value)).unwrap(), value);
            assert_too_deep(limited::<Deep, DEPTH_MAX>(&encode(&node(value))), DEPTH_MAX);
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
                limited::<Tree, DEPTH_MAX>(b).map(drop)
            }),
            ("vec", repeated(&[1], 1_000_000, &[0]), |b| {
                limited::<NestVec, DEPTH_MAX>(b).map(drop)
            }),
            ("option", repeated(&[1], 1_000_000, &[0]), |b| {
                limited::<NestOpt, DEPTH_MAX>(b).map(drop)
            }),
            ("map", repeated(&[1, 0], 1_000_000, &[0]), |b| {
                limited::<NestMap, DEPTH_MAX>(b).map(drop)
            }),
            // The payload: variant 1 deep, ending in a variant `Tree` lacks.
            ("tree, bad end", repeated(&[1], 64 * 1024, &[7]), |b| {
                limited::<Tree, DEPTH_MAX>(b).map(drop)
            }),
        ];
        for (name, step) in two_level_steps() {
            let mut one = encode(&step(Deep::End));
            assert_eq!(one.pop(), Some(0), "{name}: the nested value is last");
            cases.push((name, repeated(&one, 1_000_000, &[0]), |b| {
                limited::<Deep, DEPTH_MAX>(b).map(drop)
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
                                "payload nested deeper than {DEPTH_MAX} levels"
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
            assert_eq!(&limited::<Job, DEPTH_MAX>(&bytes).unwrap(), job);
            assert_eq!(
                limited::<Job, DEPTH_MAX>(&bytes).unwrap(),
                plain::<Job>(&bytes)
            );
        }
        let bytes = encode(&jobs);
        assert_eq!(limited::<Vec<Job>, DEPTH_MAX>(&bytes).unwrap(), jobs);
        // Long flat vectors: 10,000 elements, of numbers, strings and structs.
        let numbers: Vec<u64> = (0..10_000).map(|i| i * 7_919).collect();
        let strings: Vec<String> = (0..10_000).map(|i| i.to_string()).collect();
        let many: Vec<Job> = jobs.iter().cycle().take(10_000).cloned().collect();
        let bytes = encode(&numbers);
        assert_eq!(limited::<Vec<u64>, DEPTH_MAX>(&bytes).unwrap(), numbers);
        let bytes = encode(&strings);
        assert_eq!(limited::<Vec<String>, DEPTH_MAX>(&bytes).unwrap(), strings);
        let bytes = encode(&many);
        assert_eq!(limited::<Vec<Job>, DEPTH_MAX>(&bytes).unwrap(), many);
        // Wrong bytes fail as they did (same error): a bad variant, a short input.
        let mut bad = encode(&jobs[1]);
        let plain_err = bincode::serde::decode_from_slice::<Job, _>(&bad[..3], config::standard())
            .unwrap_err()
            .to_string();
        assert_eq!(
            limited::<Job, DEPTH_MAX>(&bad[..3])
                .unwrap_err()
                .to_string(),
            plain_err
        );
        bad.truncate(bad.len() - 1);
        assert!(limited::<Job, DEPTH_MAX>(&bad).is_err());
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
        let DepthLimited(back) = DepthLimited::<Doc, DEPTH_MAX>::deserialize(&mut de).unwrap();
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
        let (top, rest) = limited::<Nested, DEPTH_MAX>(&bytes).unwrap();
        assert_eq!(top, Readable(false));
        assert_eq!(rest, vec![(Readable(false), Some(Readable(false)))]);
        let mut de = serde_json::Deserializer::from_str("[null, [[null, null]]]");
        let DepthLimited((top, rest)) =
            DepthLimited::<Nested, DEPTH_MAX>::deserialize(&mut de).unwrap();
        assert_eq!(top, Readable(true));
        assert_eq!(rest, vec![(Readable(true), None)]);
        // And a real one: std's `SocketAddr` is a string for people, bytes for machines.
        let addr: std::net::SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(
            limited::<std::net::SocketAddr, DEPTH_MAX>(&encode(&addr)).unwrap(),
            addr
        );
    }
}

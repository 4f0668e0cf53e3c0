//! Typed payloads: how `enqueue_value` encodes a value and `Lease::decode` reads it back
//! (bincode 2 or JSON, via serde), with the nesting and length checks of `depth`. The encoding
//! a job recorded is a tag in its record (`record.rs`).

use bincode::config;
use serde::Serialize;

use crate::error::{Error, Result};

mod depth;

/// Encodes a typed payload with `encoding`, and checks that it decodes back as a `T`: a value
/// that serializes but can never be read (serde's internally tagged enums and
/// `#[serde(flatten)]` under bincode, which is not self-describing) is refused at enqueue, not
/// found out at dequeue.
pub(crate) fn encode_payload<T>(value: &T, encoding: Encoding) -> Result<Vec<u8>>
where
    T: Serialize + serde::de::DeserializeOwned,
{
    let codec_error = |detail: String| Error::PayloadCodec { detail };
    let bytes = match encoding {
        Encoding::Bincode => bincode::serde::encode_to_vec(value, config::standard())
            .map_err(|e| codec_error(e.to_string()))?,
        Encoding::Json => serde_json::to_vec(value).map_err(|e| codec_error(e.to_string()))?,
    };
    decode_payload::<T>(&bytes, encoding).map_err(|e| {
        let why = match e {
            Error::PayloadCodec { detail } => detail,
            other => other.to_string(),
        };
        let hint = match encoding {
            Encoding::Bincode => {
                " (bincode cannot read serde's tagged or untagged enums or flattened fields: \
                 use Encoding::Json for this type)"
            }
            Encoding::Json => "",
        };
        codec_error(format!(
            "the value encodes with {encoding:?} but does not decode back: {why}{hint}"
        ))
    })?;
    Ok(bytes)
}

/// Decodes a typed payload written by [`encode_payload`] with `encoding`; trailing bytes are
/// an error. Reads at most the payload cap: no length inside the bytes makes it allocate more.
pub(crate) fn decode_payload<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    encoding: Encoding,
) -> Result<T> {
    let codec_error = |detail: String| Error::PayloadCodec { detail };
    match encoding {
        Encoding::Bincode => {
            let cfg = config::standard().with_limit::<{ crate::limits::PAYLOAD_BYTES_MAX_CAP }>();
            let (value, used) = depth::decode_bincode::<T, _>(bytes, cfg)
                .map_err(|e| codec_error(e.to_string()))?;
            if used != bytes.len() {
                return Err(codec_error(format!(
                    "{} trailing bytes",
                    bytes.len() - used
                )));
            }
            Ok(value)
        }
        // serde_json rejects trailing characters itself, and allocates in proportion to the
        // text it reads.
        Encoding::Json => serde_json::from_slice(bytes).map_err(|e| codec_error(e.to_string())),
    }
}

/// How [`Queue::enqueue_value`](crate::Queue::enqueue_value) encodes a typed payload, and
/// [`Lease::decode`](crate::Lease::decode) decodes it. Each job records the encoding it was
/// enqueued with, so a queue can change encodings with jobs of the old one still waiting.
///
/// - `Bincode` (the default): compact and fast, but not self-describing. Fields are read by
///   position, without names: adding, removing or reordering a field of a job type makes the
///   jobs already stored fail to decode (`PayloadCodec`), or, where the types happen to line
///   up (two `u32` fields swapped), decode into the wrong fields without an error. serde's
///   internally tagged enums (`#[serde(tag = "..")]`), `#[serde(flatten)]` and untagged enums
///   cannot be decoded at all: [`Queue::enqueue_value`](crate::Queue::enqueue_value) decodes
///   every value back before it writes, so those are refused at enqueue with `PayloadCodec`,
///   not found out at dequeue.
/// - `Json` (serde_json): self-describing, larger and slower. A field added with
///   `#[serde(default)]` reads old jobs; unknown fields are ignored (unless the type says
///   `#[serde(deny_unknown_fields)]`); every serde enum representation works. Choose it for
///   job types that change across app versions.
///
/// Set it per handle ([`Queue::with_encoding`](crate::Queue::with_encoding)) or for every
/// handle a builder opens ([`Builder::encoding`](crate::Builder::encoding)); raw payloads
/// ([`Queue::enqueue`](crate::Queue::enqueue)) are bytes and have none.
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// # let queue = leaseq::Queue::open(dir.path().join("q.leaseq"))?;
/// use leaseq::{Encoding, Error};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, Debug, PartialEq)]
/// #[serde(tag = "type")] // internally tagged: {"type":"Email","to":"..."}
/// enum Job {
///     Email { to: String },
///     Resize { width: u32 },
/// }
///
/// // bincode cannot read an internally tagged enum back: refused, nothing written.
/// let r = queue.enqueue_value(&Job::Resize { width: 640 }, Default::default());
/// assert!(matches!(r, Err(Error::PayloadCodec { .. })));
/// assert_eq!(queue.len()?, 0);
///
/// let json = queue.with_encoding(Encoding::Json);
/// json.enqueue_value(&Job::Resize { width: 640 }, Default::default())?;
/// // Any handle decodes it: the job recorded its encoding.
/// let lease = queue.dequeue()?.expect("a job");
/// assert_eq!(lease.encoding(), Encoding::Json);
/// assert_eq!(lease.payload(), br#"{"type":"Resize","width":640}"#);
/// assert_eq!(lease.decode::<Job>()?, Job::Resize { width: 640 });
/// lease.ack()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Encoding {
    /// bincode 2, standard configuration (variable-length integers), via serde.
    #[default]
    Bincode,
    /// JSON via serde_json (UTF-8 text).
    Json,
}

impl Encoding {
    /// Its tag in a job record.
    pub(crate) fn tag(self) -> u8 {
        match self {
            Encoding::Bincode => 0,
            Encoding::Json => 1,
        }
    }

    /// The encoding of a record's tag, if known.
    pub(crate) fn from_tag(tag: u8) -> Option<Encoding> {
        match tag {
            0 => Some(Encoding::Bincode),
            1 => Some(Encoding::Json),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_payload_round_trips_and_rejects_trailing_bytes() {
        let v = ("order".to_string(), 42u32, vec![1.5f64]);
        for enc in [Encoding::Bincode, Encoding::Json] {
            let bytes = encode_payload(&v, enc).unwrap();
            let back: (String, u32, Vec<f64>) = decode_payload(&bytes, enc).unwrap();
            assert_eq!(back, v);
            let mut longer = bytes.clone();
            longer.push(b'0');
            assert!(matches!(
                decode_payload::<(String, u32, Vec<f64>)>(&longer, enc),
                Err(Error::PayloadCodec { .. })
            ));
        }
    }
}

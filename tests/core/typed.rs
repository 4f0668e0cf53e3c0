//! Typed payloads: the round-trip check at enqueue, the per-job encoding, and schema
//! evolution with a self-describing encoding.
//!
//! Adversarial tests of issue 11 (typed payload encodings): each checks the state that should
//! result (stats, `Queue::job`, `check()`), not only that nothing panics.

use crate::common;
use crate::common::{Fixture, assert_consistent, plain};
use leaseq::{Encoding, EnqueueOptions, Error, Queue};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

#[derive(Serialize, Deserialize, Debug, PartialEq)]
#[serde(tag = "type")]
enum Tagged {
    Email { to: String },
    Resize { width: u32 },
}

#[test]
fn an_internally_tagged_enum_is_refused_with_bincode_and_nothing_is_written() {
    let f = Fixture::new();
    let q = f.open();
    let r = q.enqueue_value(&Tagged::Resize { width: 640 }, EnqueueOptions::default());
    match r {
        Err(Error::PayloadCodec { detail }) => assert!(detail.contains("decode back"), "{detail}"),
        other => panic!("expected PayloadCodec, got {other:?}"),
    }
    assert_eq!(q.stats().unwrap().total, 0);
    // Inside a transaction too: refused, and the write goes on without it.
    let n = q
        .write(|tx| {
            assert!(matches!(
                tx.enqueue_value(&Tagged::Email { to: "a@b".into() }, Default::default()),
                Err(Error::PayloadCodec { .. })
            ));
            Ok(1)
        })
        .unwrap();
    assert_eq!((n, q.stats().unwrap().total), (1, 0));
}

#[test]
fn json_carries_an_internally_tagged_enum() {
    let f = Fixture::new();
    let q = f.open().with_encoding(Encoding::Json);
    let id = q
        .enqueue_value(
            &Tagged::Email { to: "a@b".into() },
            EnqueueOptions::default(),
        )
        .unwrap()
        .id();
    assert_eq!(q.job(id).unwrap().unwrap().encoding, Some(Encoding::Json));
    assert_eq!(
        q.payload(id).unwrap().unwrap(),
        br#"{"type":"Email","to":"a@b"}"#
    );
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.encoding(), Encoding::Json);
    assert_eq!(
        l.decode::<Tagged>().unwrap(),
        Tagged::Email { to: "a@b".into() }
    );
    l.ack().unwrap();
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct JobV1 {
    user: u64,
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct JobV2 {
    user: u64,
    #[serde(default)]
    notify: bool,
}

/// An app adds an optional field to its job type while jobs of the old one wait: with JSON
/// they decode (the new field takes its default); with bincode they do not.
#[test]
fn schema_evolution_json_reads_old_jobs_bincode_does_not() {
    let f = Fixture::new();
    let q = f.open();
    let json = q.with_encoding(Encoding::Json);
    json.enqueue_value(&JobV1 { user: 7 }, EnqueueOptions::default().priority(-1))
        .unwrap();
    q.enqueue_value(&JobV1 { user: 8 }, EnqueueOptions::default())
        .unwrap();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(
        l.decode::<JobV2>().unwrap(),
        JobV2 {
            user: 7,
            notify: false
        }
    );
    l.ack().unwrap();
    let l = q.dequeue().unwrap().unwrap();
    assert!(matches!(
        l.decode::<JobV2>(),
        Err(Error::PayloadCodec { .. })
    ));
    // The bytes are still there, and decode as the old type.
    assert_eq!(l.decode::<JobV1>().unwrap(), JobV1 { user: 8 });
    l.ack().unwrap();
}

#[test]
fn each_job_decodes_with_its_own_encoding_whatever_handle_delivers_it() {
    let f = Fixture::new();
    let bincode = f.open();
    let json = bincode.with_encoding(Encoding::Json);
    json.enqueue_value(&(1u32, "json".to_string()), EnqueueOptions::default())
        .unwrap();
    bincode
        .enqueue_value(&(2u32, "bincode".to_string()), EnqueueOptions::default())
        .unwrap();
    // Delivered by the JSON handle: the bincode job still decodes as bincode, and back.
    for want in [(1u32, "json"), (2, "bincode")] {
        let l = json.dequeue().unwrap().unwrap();
        assert_eq!(
            l.decode::<(u32, String)>().unwrap(),
            (want.0, want.1.to_string())
        );
        l.ack().unwrap();
    }
    // A raw payload has no recorded encoding: the handle's is used.
    json.enqueue(br#"[3,"raw"]"#, EnqueueOptions::default())
        .unwrap();
    let l = bincode.dequeue().unwrap().unwrap();
    assert_eq!(l.encoding(), Encoding::Bincode);
    assert!(l.decode::<(u32, String)>().is_err());
    l.nack("wrong handle").unwrap();
    let l = json.dequeue().unwrap().unwrap();
    assert_eq!(l.decode::<(u32, String)>().unwrap(), (3, "raw".to_string()));
    l.ack().unwrap();
}

#[test]
fn the_builder_sets_the_encoding_of_every_handle_it_opens() {
    let f = Fixture::new();
    let q = f.builder().encoding(Encoding::Json).open(&f.path).unwrap();
    let side = q.named("side").unwrap();
    let id = side
        .enqueue_value(&JobV1 { user: 1 }, EnqueueOptions::default())
        .unwrap()
        .id();
    assert_eq!(side.payload(id).unwrap().unwrap(), br#"{"user":1}"#);
    // Follow-ups enqueued inside ack_with use the handle's encoding too.
    side.dequeue()
        .unwrap()
        .unwrap()
        .ack_with(|tx| {
            tx.enqueue_value(&Tagged::Resize { width: 3 }, Default::default())?;
            Ok(())
        })
        .unwrap();
    let l = side.dequeue().unwrap().unwrap();
    assert_eq!(l.decode::<Tagged>().unwrap(), Tagged::Resize { width: 3 });
    l.ack().unwrap();
}

#[test]
fn a_json_payload_that_is_not_the_type_is_a_codec_error() {
    let f = Fixture::new();
    let q = f.open().with_encoding(Encoding::Json);
    q.enqueue(b"{\"user\": \"not a number\"}", EnqueueOptions::default())
        .unwrap();
    q.enqueue(b"{\"user\": 1} trailing", EnqueueOptions::default())
        .unwrap();
    for _ in 0..2 {
        let l = q.dequeue().unwrap().unwrap();
        assert!(matches!(
            l.decode::<JobV1>(),
            Err(Error::PayloadCodec { .. })
        ));
        l.ack().unwrap();
    }
}

// ---------------------------------------------------------------------------------------
// Encodings.
// ---------------------------------------------------------------------------------------

#[derive(Serialize, Deserialize, Debug, PartialEq)]
enum Tree {
    Leaf,
    Node(Box<Tree>),
}

#[track_caller]
fn codec_err<T: std::fmt::Debug>(r: leaseq::Result<T>) {
    assert!(matches!(r, Err(Error::PayloadCodec { .. })), "{r:?}");
}

/// Foreign or damaged payloads (enqueued as raw bytes) decode to `PayloadCodec`, quickly, and
/// never to a panic or an allocation the size a length prefix claims.
#[test]
fn corrupt_payloads_are_codec_errors() {
    let f = Fixture::new();
    let q = f.open();
    let json = q.with_encoding(Encoding::Json);
    let mut huge_len = vec![253u8];
    huge_len.extend_from_slice(&(1u64 << 62).to_le_bytes());
    let bincode_cases: Vec<Vec<u8>> = vec![
        huge_len.clone(),          // Vec<u64> / String / Vec<Vec<u8>> of 2^62 items
        vec![3, 0xff, 0xfe, 0xfd], // a String of invalid UTF-8
        vec![255],                 // no such varint
        vec![],                    // nothing
        vec![2, 7, 7, 9, 9, 9],    // trailing bytes after a Vec<u8> of 2
        vec![251, 0xff],           // a truncated u16
    ];
    for p in &bincode_cases {
        q.enqueue(p, plain()).unwrap();
    }
    let json_cases: Vec<Vec<u8>> = vec![
        br#"{"a":"#.to_vec(),
        b"\"\xff\xfe\"".to_vec(),
        [b"[".repeat(100_000), b"]".repeat(100_000)].concat(),
        [
            br#"{"Node":"#.repeat(50_000),
            br#""Leaf""#.to_vec(),
            b"}".repeat(50_000),
        ]
        .concat(),
        b"[1,2] trailing".to_vec(),
        b"1e999999".to_vec(),
    ];
    for p in &json_cases {
        json.enqueue(p, plain()).unwrap();
    }
    let t = Instant::now();
    for i in 0..bincode_cases.len() {
        let l = q.dequeue().unwrap().unwrap();
        assert_eq!(l.encoding(), Encoding::Bincode);
        codec_err(l.decode::<Vec<u64>>());
        codec_err(l.decode::<String>());
        codec_err(l.decode::<Vec<Vec<u8>>>());
        codec_err(l.decode::<(u16, u64, u64)>());
        if i == 4 {
            assert_eq!(
                l.decode::<(Vec<u8>, u8, u8, u8)>().unwrap(),
                (vec![7, 7], 9, 9, 9)
            );
        }
        l.ack().unwrap();
    }
    for i in 0..json_cases.len() {
        let l = json.dequeue().unwrap().unwrap();
        assert_eq!(l.encoding(), Encoding::Json, "case {i}");
        codec_err(l.decode::<serde_json::Value>());
        codec_err(l.decode::<Tree>());
        codec_err(l.decode::<Vec<u8>>());
        l.ack().unwrap();
    }
    assert!(t.elapsed() < Duration::from_secs(10));
    assert_eq!(q.stats().unwrap().total, 0);
}

/// A deeply nested bincode payload decoded into a recursive job type: `PayloadCodec`, not a
/// stack overflow that aborts the worker process. Runs in a child process so an abort is seen
/// as an exit status instead of killing the test binary.
#[test]
fn a_deeply_nested_bincode_payload_is_a_codec_error_not_a_crash() {
    const NAME: &str = "typed::a_deeply_nested_bincode_payload_is_a_codec_error_not_a_crash";
    if let Some((scenario, path)) = common::child_scenario() {
        if scenario == "decode-deep" {
            let q = Queue::open(&path).unwrap();
            let l = q.dequeue().unwrap().unwrap();
            // A worker thread with the default stack.
            let r = std::thread::spawn(move || match l.decode::<Tree>() {
                Ok(_) => "decoded".to_string(),
                Err(Error::PayloadCodec { .. }) => "PayloadCodec".to_string(),
                Err(e) => format!("other error: {e}"),
            })
            .join()
            .unwrap();
            common::say(format!("RESULT {r}"));
        }
        return;
    }
    let f = Fixture::new();
    {
        let q = f.open();
        // Variant 1 (Node) nested 64 Ki deep, ending in variant 7, which `Tree` does not
        // have: not a `Tree` whatever the stack, so the only right answer is PayloadCodec.
        // (8 Ki deep and a Leaf decodes fine on a 2 MiB worker stack; 64 Ki aborts.)
        let mut p = vec![1u8; 64 * 1024];
        p.push(7);
        q.enqueue(&p, plain()).unwrap();
    }
    let mut child = common::ChildProc::spawn(NAME, "decode-deep", &f.path);
    let said = child.next_message();
    let status = (0..100).find_map(|_| {
        std::thread::sleep(Duration::from_millis(50));
        child.exited()
    });
    assert_eq!(
        said.as_deref(),
        Some("RESULT PayloadCodec"),
        "the child died decoding (exit: {status:?})"
    );
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Wrapped {
    text: String,
}

#[test]
fn a_json_value_at_the_payload_limit_and_lossy_values_are_refused() {
    let f = Fixture::new();
    let q = f
        .builder()
        .payload_bytes_max(4096)
        .encoding(Encoding::Json)
        .open(&f.path)
        .unwrap();
    // `"` + text + `"`: exactly the limit, then one byte over.
    let at = "é".repeat(2047); // 4094 bytes
    let id = q.enqueue_value(&at, plain()).unwrap().id();
    assert_eq!(q.job(id).unwrap().unwrap().payload_bytes, 4096);
    let over = format!("{at}a");
    assert!(matches!(
        q.enqueue_value(&over, plain()),
        Err(Error::PayloadTooLarge { .. })
    ));
    // A value JSON cannot carry: NaN is written as null, which is no f64.
    codec_err(q.enqueue_value(&f64::NAN, plain()));
    codec_err(q.enqueue_value(&vec![1.0, f64::INFINITY], plain()));
    // Map keys JSON cannot write.
    let mut m = std::collections::BTreeMap::new();
    m.insert((1u8, 2u8), 3u8);
    codec_err(q.enqueue_value(&m, plain()));
    assert_eq!(
        q.stats().unwrap().total,
        1,
        "nothing written by the refusals"
    );
    // Bincode carries them.
    let b = q.with_encoding(Encoding::Bincode);
    b.enqueue_value(&m, plain()).unwrap();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.decode::<String>().unwrap(), at);
    l.ack().unwrap();
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(
        l.encoding(),
        Encoding::Bincode,
        "the job's own, not the handle's"
    );
    assert_eq!(
        l.decode::<std::collections::BTreeMap<(u8, u8), u8>>()
            .unwrap(),
        m
    );
    l.ack().unwrap();
    assert_consistent(&q);
}

#[test]
fn tx_enqueue_value_records_the_encoding_of_its_handle() {
    let f = Fixture::new();
    let q = f.open();
    let json = q.with_encoding(Encoding::Json);
    json.enqueue(b"raw parent", plain()).unwrap();
    let parent = json.dequeue().unwrap().unwrap();
    assert_eq!(parent.encoding(), Encoding::Json, "raw: the handle's");
    let mut child_ids = Vec::new();
    parent
        .ack_with(|tx| {
            let id = tx
                .enqueue_value(
                    &Wrapped {
                        text: "from json".into(),
                    },
                    plain(),
                )?
                .id();
            child_ids.push(id);
            Ok(())
        })
        .unwrap();
    let from_json = *child_ids.last().unwrap();
    let from_bincode = q
        .write(|tx| {
            Ok(tx
                .enqueue_value(
                    &Wrapped {
                        text: "from bincode".into(),
                    },
                    plain(),
                )?
                .id())
        })
        .unwrap();
    assert_eq!(
        q.job(from_json).unwrap().unwrap().encoding,
        Some(Encoding::Json)
    );
    assert_eq!(
        q.job(from_bincode).unwrap().unwrap().encoding,
        Some(Encoding::Bincode)
    );
    assert!(q.payload(from_json).unwrap().unwrap().starts_with(b"{"));
    // Both decode through either handle.
    let l = q.dequeue().unwrap().unwrap();
    assert_eq!(l.decode::<Wrapped>().unwrap().text, "from json");
    l.ack().unwrap();
    let l = json.dequeue().unwrap().unwrap();
    assert_eq!(l.decode::<Wrapped>().unwrap().text, "from bincode");
    l.ack().unwrap();
    assert_consistent(&q);
}

/// An encoding set on the options chooses how `enqueue_value` encodes (on the handle, in a
/// `Tx`): an internally tagged enum, refused by bincode (the handle's), goes in as JSON and
/// decodes back on a bincode handle; without the option the handle's encoding is used.
#[test]
fn an_encoding_on_the_options_chooses_how_enqueue_value_encodes() {
    let f = Fixture::new();
    let q = f.open();
    let value = Tagged::Resize { width: 640 };
    let id = q
        .enqueue_value(&value, plain().encoding(Encoding::Json))
        .unwrap()
        .id();
    let in_tx = q
        .write(|tx| {
            Ok(tx
                .enqueue_value(
                    &Tagged::Email { to: "a@b".into() },
                    plain().encoding(Encoding::Json),
                )?
                .id())
        })
        .unwrap();
    let plain_id = q.enqueue_value(&7u32, plain()).unwrap().id();
    for (job, want) in [
        (id, Encoding::Json),
        (in_tx, Encoding::Json),
        (plain_id, Encoding::Bincode),
    ] {
        assert_eq!(q.job(job).unwrap().unwrap().encoding, Some(want), "{job:?}");
    }
    assert_eq!(
        q.payload(id).unwrap().unwrap(),
        br#"{"type":"Resize","width":640}"#
    );
    let lease = q.dequeue().unwrap().unwrap();
    assert_eq!((lease.id(), lease.decode::<Tagged>().unwrap()), (id, value));
    lease.ack().unwrap();
    let lease = q.dequeue().unwrap().unwrap();
    assert_eq!(
        lease.decode::<Tagged>().unwrap(),
        Tagged::Email { to: "a@b".into() }
    );
    lease.ack().unwrap();
    let lease = q.dequeue().unwrap().unwrap();
    assert_eq!(lease.decode::<u32>().unwrap(), 7);
    lease.ack().unwrap();
    assert_consistent(&q);
}

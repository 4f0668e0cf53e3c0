//! Typed payloads: the round-trip check at enqueue, the per-job encoding, and schema
//! evolution with a self-describing encoding.

mod common;

use common::Fixture;
use leaseq::{Encoding, EnqueueOptions, Error};
use serde::{Deserialize, Serialize};

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

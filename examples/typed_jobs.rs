//! Typed jobs: a serde enum as the job type, a schema change between two app versions, and a
//! worker that matches on the enum.
//!
//! ```text
//! cargo run --example typed_jobs
//! ```
//!
//! 1. The job type is an internally tagged enum (`#[serde(tag = "type")]`, so a job reads as
//!    `{"type":"SendEmail",...}`). bincode cannot decode that representation, and
//!    `enqueue_value` decodes every value back before writing it, so under the default
//!    `Encoding::Bincode` the enqueue is refused (`PayloadCodec`) and nothing is written.
//! 2. App version 1 opens the file with `Encoding::Json` and enqueues v1 jobs, then exits.
//! 3. App version 2 changed the type: a field added to a variant (`#[serde(default)]`), a new
//!    variant. It reopens the file, enqueues v2 jobs, and its worker decodes every job (the v1
//!    ones too) as the v2 enum and matches on it.
//! 4. For contrast, a plain struct under bincode: a job stored by v1 no longer decodes as v2
//!    (fields are read by position), and the worker falls back to the v1 type.
//!
//! Every step asserts what it shows.

use std::path::Path;

use leaseq::{Encoding, EnqueueOptions, Error, Lease, Queue};

/// App version 1's jobs.
mod v1 {
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    #[serde(tag = "type")]
    pub enum Job {
        SendEmail { to: String, subject: String },
        ResizeImage { path: String, width: u32 },
    }

    /// A job type kept in bincode, for step 4.
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    pub struct Thumbnail {
        pub photo_id: u64,
    }
}

/// App version 2's jobs: `ResizeImage` gained `quality`, `SendEmail` gained `cc`, and there is
/// a new variant. Jobs stored by version 1 still decode: the new fields take their defaults.
mod v2 {
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    #[serde(tag = "type")]
    pub enum Job {
        SendEmail {
            to: String,
            subject: String,
            #[serde(default)]
            cc: Vec<String>,
        },
        ResizeImage {
            path: String,
            width: u32,
            #[serde(default = "default_quality")]
            quality: u8,
        },
        ArchiveFolder {
            path: String,
        },
    }

    fn default_quality() -> u8 {
        85
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    pub struct Thumbnail {
        pub photo_id: u64,
        #[serde(default)]
        pub size_px: u32,
    }
}

/// What the worker did, for the summary and the checks.
#[derive(Default, Debug)]
struct Handled {
    emails: Vec<(String, usize)>,
    resizes: Vec<(String, u32, u8)>,
    archives: Vec<String>,
}

fn app_v1(path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    // Under the default encoding, bincode, the tagged enum is refused at enqueue.
    let bincode = Queue::open(path)?;
    let job = v1::Job::SendEmail {
        to: "ada@example.com".into(),
        subject: "hello".into(),
    };
    match bincode.enqueue_value(&job, EnqueueOptions::default()) {
        Err(Error::PayloadCodec { detail }) => {
            println!("bincode refuses the tagged enum at enqueue: {detail}")
        }
        other => panic!("expected PayloadCodec, got {other:?}"),
    }
    assert_eq!(
        bincode.stats()?.total,
        0,
        "a refused enqueue writes nothing"
    );

    // The same queue with JSON, which reads every serde enum representation.
    let queue = bincode.with_encoding(Encoding::Json);
    queue.enqueue_value(&job, EnqueueOptions::default())?;
    queue.enqueue_value(
        &v1::Job::ResizeImage {
            path: "photos/1.jpg".into(),
            width: 640,
        },
        EnqueueOptions::default(),
    )?;
    // A job type that stays in bincode (step 4).
    bincode.enqueue_value(&v1::Thumbnail { photo_id: 17 }, EnqueueOptions::default())?;
    println!("app v1 enqueued 3 jobs and exits");
    Ok(())
}

fn handle(job: v2::Job, handled: &mut Handled) {
    match job {
        v2::Job::SendEmail { to, cc, .. } => handled.emails.push((to, cc.len())),
        v2::Job::ResizeImage {
            path,
            width,
            quality,
        } => handled.resizes.push((path, width, quality)),
        v2::Job::ArchiveFolder { path } => handled.archives.push(path),
    }
}

/// A bincode thumbnail job of either version: v2 first, else v1 upgraded.
fn thumbnail(lease: &Lease) -> leaseq::Result<v2::Thumbnail> {
    match lease.decode::<v2::Thumbnail>() {
        Ok(t) => Ok(t),
        Err(Error::PayloadCodec { detail }) => {
            println!("a v1 bincode job does not decode as v2 ({detail}); read as v1");
            let old: v1::Thumbnail = lease.decode()?;
            Ok(v2::Thumbnail {
                photo_id: old.photo_id,
                size_px: 0,
            })
        }
        Err(e) => Err(e),
    }
}

fn app_v2(path: &Path) -> Result<Handled, Box<dyn std::error::Error>> {
    // Every handle this builder opens encodes with JSON.
    let queue = Queue::builder().encoding(Encoding::Json).open(path)?;
    queue.enqueue_value(
        &v2::Job::SendEmail {
            to: "bob@example.com".into(),
            subject: "report".into(),
            cc: vec!["carol@example.com".into()],
        },
        EnqueueOptions::default(),
    )?;
    queue.enqueue_value(
        &v2::Job::ArchiveFolder {
            path: "photos/2023".into(),
        },
        EnqueueOptions::default(),
    )?;

    let mut handled = Handled::default();
    let mut thumbnails = Vec::new();
    while let Some(lease) = queue.dequeue()? {
        // Each job decodes with the encoding it recorded, whatever this handle's.
        match lease.encoding() {
            Encoding::Json => handle(lease.decode::<v2::Job>()?, &mut handled),
            _ => thumbnails.push(thumbnail(&lease)?),
        }
        lease.ack()?;
    }
    assert!(queue.is_empty()?);
    assert_eq!(
        thumbnails,
        vec![v2::Thumbnail {
            photo_id: 17,
            size_px: 0
        }]
    );
    Ok(handled)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("jobs.leaseq");
    app_v1(&path)?; // the queue is dropped: the file closes, as when the app exits
    let handled = app_v2(&path)?;

    // The v1 email and resize, read as v2 with the new fields' defaults, and the v2 jobs.
    assert_eq!(
        handled.emails,
        vec![
            ("ada@example.com".to_string(), 0),
            ("bob@example.com".to_string(), 1)
        ]
    );
    assert_eq!(handled.resizes, vec![("photos/1.jpg".to_string(), 640, 85)]);
    assert_eq!(handled.archives, vec!["photos/2023".to_string()]);
    println!(
        "app v2 handled {} emails, {} resize (v1 job, quality defaulted to {}), {} archive",
        handled.emails.len(),
        handled.resizes.len(),
        handled.resizes[0].2,
        handled.archives.len()
    );
    Ok(())
}

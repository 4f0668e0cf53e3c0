//! A delivery's progress as people read it: a percentage and a message, from the bytes
//! [`Lease::set_progress`](crate::Lease::set_progress) stored.

use serde_json::{Value, json};

/// A delivery's progress as a UI shows it: how far (0 to 100 %) and what it is doing, read
/// from the bytes [`Lease::set_progress`](crate::Lease::set_progress) stored
/// ([`JobInfo::progress`](crate::JobInfo::progress)) by [`Progress::read`]. The dashboard
/// and the `leaseq` tool show progress this way.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Progress {
    /// How far, 0 to 100, when the bytes say.
    pub percent: Option<u8>,
    /// What the job is doing, when the bytes say (text, or JSON's `message`).
    pub message: Option<String>,
}

impl Progress {
    /// The bytes [`Lease::set_progress_percent`](crate::Lease::set_progress_percent) stores:
    /// `{"percent":P,"message":M}` as JSON (`message` left out when `None`).
    pub(crate) fn encode(percent: u8, message: Option<&str>) -> Vec<u8> {
        let mut v = json!({ "percent": percent });
        if let Some(m) = message {
            v["message"] = json!(m);
        }
        v.to_string().into_bytes()
    }

    /// Reads progress bytes, in this order:
    /// - one byte of 0 to 100: that percentage (the one-byte form of `set_progress`);
    /// - a JSON object with `percent` (a number 0 to 100) and an optional `message` string
    ///   (what [`Lease::set_progress_percent`](crate::Lease::set_progress_percent) writes),
    ///   or with `done` and `of` (numbers, `of` above 0: `done * 100 / of`, at most 100);
    /// - other UTF-8 text: the message alone;
    /// - anything else: neither (show the bytes as hex).
    pub fn read(bytes: &[u8]) -> Progress {
        if let [p] = bytes
            && *p <= 100
        {
            return Progress {
                percent: Some(*p),
                message: None,
            };
        }
        if let Ok(Value::Object(o)) = serde_json::from_slice::<Value>(bytes) {
            let message = o.get("message").and_then(Value::as_str).map(str::to_string);
            let percent = match (o.get("percent"), o.get("done"), o.get("of")) {
                (Some(p), _, _) => p.as_f64().filter(|p| (0.0..=100.0).contains(p)),
                (None, Some(done), Some(of)) => match (done.as_f64(), of.as_f64()) {
                    (Some(d), Some(t)) if t > 0.0 && d >= 0.0 => Some((d * 100.0 / t).min(100.0)),
                    _ => None,
                },
                _ => None,
            };
            if percent.is_some() || message.is_some() {
                return Progress {
                    percent: percent.map(|p| p.floor() as u8),
                    message,
                };
            }
        }
        match std::str::from_utf8(bytes) {
            Ok(text) if !text.is_empty() => Progress {
                percent: None,
                message: Some(text.to_string()),
            },
            _ => Progress::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_reads_each_form() {
        let read = |b: &[u8]| {
            let p = Progress::read(b);
            (p.percent, p.message)
        };
        assert_eq!(read(&[40]), (Some(40), None));
        assert_eq!(read(&[100]), (Some(100), None));
        // A byte above 100 is not a percentage; it is not text either.
        assert_eq!(read(&[101]), (None, Some("e".into())));
        assert_eq!(read(&[0xff]), (None, None));
        assert_eq!(
            read(&Progress::encode(30, Some("uploading 3 of 10"))),
            (Some(30), Some("uploading 3 of 10".into()))
        );
        assert_eq!(read(&Progress::encode(7, None)), (Some(7), None));
        assert_eq!(read(br#"{"done":40,"of":120}"#), (Some(33), None));
        assert_eq!(read(br#"{"done":500,"of":120}"#), (Some(100), None));
        assert_eq!(
            read(br#"{"done":1,"of":0}"#),
            (None, Some(r#"{"done":1,"of":0}"#.into()))
        );
        assert_eq!(
            read(br#"{"percent":140}"#),
            (None, Some(r#"{"percent":140}"#.into()))
        );
        assert_eq!(read(b"half"), (None, Some("half".into())));
        assert_eq!(read(b""), (None, None));
        assert_eq!(read(&[0xff, 0x00]), (None, None));
    }
}

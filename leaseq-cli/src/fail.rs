//! What a command ends with when it does not succeed: one line for stderr and an exit code
//! (1: the command ran and found a problem; 2: usage or runtime error).

use std::fmt;
use std::path::Path;

/// A command that did not succeed.
#[derive(Debug)]
pub struct Fail {
    /// 1 or 2.
    pub code: u8,
    /// One line, without the `leaseq: ` prefix.
    pub message: String,
    /// Stdout went away (a closed pipe): end quietly, as a successful run.
    pub quiet: bool,
    /// The file failed redb's or leaseq's checks (`Error::Corrupted`): a finding for
    /// `leaseq check`.
    pub corrupted: bool,
    /// Another process holds the file (`AlreadyOpen`, `HeldExclusively`): a read command
    /// may read through that app's control channel instead.
    pub held: bool,
}

impl Fail {
    /// The command ran but found a problem (exit 1).
    pub fn problem(message: impl Into<String>) -> Fail {
        Fail {
            code: 1,
            message: message.into(),
            quiet: false,
            corrupted: false,
            held: false,
        }
    }

    /// A usage or runtime error (exit 2).
    pub fn error(message: impl Into<String>) -> Fail {
        Fail {
            code: 2,
            message: message.into(),
            quiet: false,
            corrupted: false,
            held: false,
        }
    }

    /// A leaseq error met while working on `path`.
    pub fn leaseq(path: &Path, e: leaseq::Error) -> Fail {
        use leaseq::Error as E;
        let p = path.display();
        match e {
            E::AlreadyOpen { .. } => Fail {
                held: true,
                ..Fail::error(format!(
                    "{p}: in use by another process (a leaseq file is written by one process at a \
                 time, and a read command or watch holds a file left by a crash while it \
                 repairs a copy). The write commands, and stats, ls, show, queues, schedules, \
                 check and watch, work beside an app that opened its control channel (leaseq::control::serve): \
                 they go through the app; every read command works beside an app that \
                 opened the file with Builder::live_reads(true)"
                ))
            },
            E::HeldExclusively { .. } => Fail {
                held: true,
                ..Fail::error(format!(
                    "{p}: in use by a process that holds it exclusively; to read it while that \
                 process runs, open it there with Builder::live_reads(true); else stop that \
                 process first, or copy the file and read the copy (the jobs in flight show as \
                 leased there, as of the copy). The write commands, and stats, ls, show, \
                 queues, schedules, check and watch, work beside an app that opened its control channel \
                 (leaseq::control::serve)"
                ))
            },
            E::NotLeaseq { detail, .. } => {
                Fail::error(format!("{p}: not a leaseq file ({detail}); left unchanged"))
            }
            E::Truncated { len_bytes, .. } => Fail::error(format!(
                "{p}: not a leaseq file (truncated: {len_bytes} bytes); left unchanged"
            )),
            E::UnsupportedVersion { found, supported } => Fail::error(format!(
                "{p}: written by a newer leaseq (format {found}, this tool reads up to {supported}); left unchanged"
            )),
            E::Corrupted { detail } => Fail {
                corrupted: true,
                ..Fail::error(format!("{p}: corrupted: {}", one_line(&detail)))
            },
            E::JobNotFound { job_id } => Fail::problem(format!("{p}: no job {job_id}")),
            E::QueueNotFound { name } => Fail::problem(format!("{p}: no queue named {name:?}")),
            E::ScheduleNotFound { name } => {
                Fail::problem(format!("{p}: no schedule named {name:?}"))
            }
            E::Remote { message, .. } => {
                Fail::error(format!("{p}: the app answered: {}", one_line(&message)))
            }
            E::InvalidState {
                job_id,
                actual,
                expected,
            } => Fail::problem(format!(
                "{p}: job {job_id} is {}, the command needs {expected}",
                crate::output::state_name(actual)
            )),
            other => Fail::error(format!("{p}: {}", one_line(&other.to_string()))),
        }
    }

    /// An I/O error while doing `what`. A closed stdout is not an error to report.
    pub fn io(what: &str, e: std::io::Error) -> Fail {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            return Fail {
                code: 0,
                message: String::new(),
                quiet: true,
                corrupted: false,
                held: false,
            };
        }
        Fail::error(format!("{what}: {e}"))
    }
}

impl fmt::Display for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Joins a multi-line text into one line.
pub fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `Result` of a command.
pub type CliResult<T = ()> = Result<T, Fail>;

//! `leaseq dashboard FILE`: the web dashboard of a file, served until interrupted.

use std::io::Write;

use leaseq::dashboard::Dashboard;

use crate::args::DashboardArgs;
use crate::fail::{CliResult, Fail};
use crate::files;

/// Serves the dashboard of `a.file` at `a.addr` and prints its URL (with the access token)
/// once, then serves until the process is interrupted.
pub fn dashboard(a: &DashboardArgs) -> CliResult {
    // The file's errors (not leaseq's, held exclusively, unreadable) said as the read
    // commands say them; what is left for `serve` is the address's.
    drop(files::open_reader_quietly(&a.file, true)?);
    let mut dashboard = Dashboard::for_file(&a.file)
        .read_only(a.read_only)
        .allow_remote(a.allow_remote);
    if let Some(limit) = a.stalled_after {
        if limit.is_zero() {
            return Err(Fail::error("--stalled-after: at least 1ms"));
        }
        dashboard = dashboard.stalled_after(limit);
    }
    let server = dashboard.serve(a.addr.as_str()).map_err(|e| match e {
        leaseq::Error::Io(io) if io.kind() == std::io::ErrorKind::AddrInUse => {
            Fail::error(format!(
                "cannot serve at {}: the address is in use (--addr 127.0.0.1:0 picks a \
                     free port)",
                a.addr
            ))
        }
        leaseq::Error::Io(io) => Fail::error(format!(
            "cannot serve at {}: {}",
            a.addr,
            crate::fail::one_line(&io.to_string())
        )),
        leaseq::Error::InvalidOption { reason, .. } => Fail::error(format!(
            "--addr {}: {}",
            a.addr,
            reason.replace("Dashboard::allow_remote(true)", "--allow-remote")
        )),
        e => Fail::leaseq(&a.file, e),
    })?;
    let mode = if a.read_only { " (read-only)" } else { "" };
    println!(
        "leaseq: dashboard of {}{mode} at {} (the URL carries the access token; Ctrl-C stops)",
        a.file.display(),
        server.url()
    );
    std::io::stdout()
        .flush()
        .map_err(|e| Fail::io("stdout", e))?;
    loop {
        std::thread::park();
    }
}

//! The control file, `<queue file>-control`: where a running app's control channel listens
//! and its access token, readable by the app's user (and the queue file's group, when it
//! may write the queue file) and by nobody
//! else (Unix: its mode and group follow the queue file's; Windows: it inherits the
//! directory's access list, as the queue file and its journal do).

use std::io::{Read, Write};
use std::net::SocketAddr;
#[cfg(unix)]
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt, fchown};
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::token::{API_VERSION, CONTROL_FILE_SUFFIX, validate_token};
use crate::{Error, Result};

/// Bytes of a control file read at most (one is about 150 bytes).
const CONTROL_FILE_BYTES_MAX: u64 = 4096;

/// What a control file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    /// Where the channel listens (a loopback address).
    pub(crate) addr: SocketAddr,
    /// The channel's access token.
    pub(crate) token: String,
    /// The app's process id (for messages).
    pub(crate) pid: u32,
}

/// The control file of the queue file at `queue_path`.
pub(crate) fn path_of(queue_path: &Path) -> PathBuf {
    let mut name = queue_path.as_os_str().to_os_string();
    name.push(CONTROL_FILE_SUFFIX);
    PathBuf::from(name)
}

/// Writes the control file of `queue_path` whole, then moves it into place (replacing one an
/// app that stopped without removing it left). Returns its path.
///
/// # Errors
/// `Io` if it cannot be written, synced or moved.
pub(crate) fn write(queue_path: &Path, found: &Found) -> Result<PathBuf> {
    let path = path_of(queue_path);
    let mut temp = path.as_os_str().to_os_string();
    temp.push(format!(".{}.tmp", std::process::id()));
    let temp = PathBuf::from(temp);
    let text = json!({
        "leaseq_control": API_VERSION,
        "addr": found.addr.to_string(),
        "token": found.token,
        "pid": found.pid,
    })
    .to_string();
    let written = (|| -> std::io::Result<()> {
        let _ = std::fs::remove_file(&temp);
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        options.mode(0o600);
        let mut file = options.open(&temp)?;
        restrict(&file, queue_path)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&temp, &path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(Error::Io(std::io::Error::new(
            e.kind(),
            format!("the control file {} cannot be written: {e}", path.display()),
        )));
    }
    Ok(path)
}

/// Gives the control file the queue file's readers who may also write it (Unix: the owner,
/// and the queue file's group if that group may read and write it; nobody else). Windows:
/// the directory's access list, inherited at creation.
#[cfg(unix)]
fn restrict(file: &std::fs::File, queue_path: &Path) -> std::io::Result<()> {
    let queue = std::fs::metadata(queue_path)?;
    let mut mode = 0o600;
    if queue.mode() & 0o060 == 0o060 {
        // The group may write the queue file: the same group may use the channel.
        if fchown(file, None, Some(queue.gid())).is_ok() {
            mode |= 0o040;
        }
    }
    file.set_permissions(std::fs::Permissions::from_mode(mode))
}

#[cfg(not(unix))]
fn restrict(_file: &std::fs::File, _queue_path: &Path) -> std::io::Result<()> {
    Ok(())
}

/// Reads the control file of `queue_path`; `None` when there is none.
///
/// # Errors
/// `Io` if it cannot be read (permission denied: this user may not act on the app); `Io`
/// (`InvalidData`) if it is not a control file of this API version.
pub(crate) fn read(queue_path: &Path) -> Result<Option<Found>> {
    let path = path_of(queue_path);
    // Only a regular file is read (a FIFO planted there would block the open).
    match std::fs::symlink_metadata(&path) {
        Ok(meta) if !meta.file_type().is_file() => {
            return Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{}: not a leaseq control file (not a regular file)",
                    path.display()
                ),
            )));
        }
        _ => {}
    }
    let file = match std::fs::File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(Error::Io(std::io::Error::new(
                e.kind(),
                format!(
                    "{}: {e} (the app's control channel admits the users who may write the \
                     queue file)",
                    path.display()
                ),
            )));
        }
    };
    let mut text = Vec::new();
    file.take(CONTROL_FILE_BYTES_MAX + 1)
        .read_to_end(&mut text)?;
    let bad = |why: &str| {
        Error::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: not a leaseq control file ({why})", path.display()),
        ))
    };
    if text.len() as u64 > CONTROL_FILE_BYTES_MAX {
        return Err(bad("too long"));
    }
    let value: Value = serde_json::from_slice(&text).map_err(|_| bad("not JSON"))?;
    if value["leaseq_control"] != json!(API_VERSION) {
        return Err(bad(&format!(
            "API version {}, this leaseq speaks {API_VERSION}",
            value["leaseq_control"]
        )));
    }
    let addr: SocketAddr = value["addr"]
        .as_str()
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| bad("no address"))?;
    if !addr.ip().is_loopback() {
        return Err(bad("an address that is not loopback"));
    }
    let token = value["token"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| bad("no token"))?;
    let token = validate_token(token).map_err(|_| bad("a token out of its rules"))?;
    let pid = value["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .ok_or_else(|| bad("no process id"))?;
    Ok(Some(Found { addr, token, pid }))
}

/// Removes the control file of `queue_path` if it is still the one `ours` wrote (address,
/// token and process all the same: a later app's file is left alone).
pub(crate) fn remove(queue_path: &Path, ours: &Found) {
    if let Ok(Some(found)) = read(queue_path)
        && found == *ours
    {
        let _ = std::fs::remove_file(path_of(queue_path));
    }
}

//! The store never leaves its root: plain names, directories that are not
//! links, writer identities in temporary names, and the geometry marker
//! written atomically and read with a cap.
//!
//! Every directory the store creates or enters beneath its root is checked
//! with `lstat` (a symbolic link or a non-directory in its place is an
//! error, never followed) and restricted through a descriptor opened with
//! `O_DIRECTORY | O_NOFOLLOW`. Files are opened by the HAL with
//! `O_NOFOLLOW` and must be regular.

use std::fs;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use crate::error::{NameError, Result, StoreError};
use ucm_device::io::fs as iofs;

/// Longest plain name (a group name, a shared-pool prefix).
pub const MAX_NAME: usize = 64;
// NameError states the bound in words.
const _: () = assert!(MAX_NAME == 64);

/// Largest geometry marker read (its text is a line of a few dozen bytes).
pub const MAX_MARKER_BYTES: u64 = 4096;

/// A temporary file whose writer cannot be proven alive (another machine's,
/// on a shared file system) is removed once it is this old. A live writer
/// renames or removes its files within seconds.
pub const STALE_TMP_AGE: Duration = Duration::from_secs(15 * 60);

/// Checks that `name` is a plain identifier: 1 to [`MAX_NAME`] letters,
/// digits, `_` or `-`, starting with a letter or digit. `what` names the
/// field in the error.
pub fn check_name(what: &'static str, name: &str) -> std::result::Result<(), NameError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(NameError {
            what,
            name: short(name),
        })
    }
}

/// At most 64 characters of `s`, control characters replaced: what an error
/// message may echo of untrusted text.
pub fn short(s: &str) -> String {
    let mut out: String = s
        .chars()
        .take(64)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if s.chars().count() > 64 {
        out.push('…');
    }
    out
}

fn unsafe_path(path: &Path, why: &str) -> StoreError {
    StoreError::Unsafe {
        path: path.to_path_buf(),
        why: why.to_string(),
    }
}

/// Makes sure `path` is a real directory (created 0700 when missing, never
/// through a link) and restricts it to 0700 through a descriptor that did
/// not follow a link. Returns whether this call created it (then its
/// entry in the parent is durable only once the parent is fsynced).
pub fn ensure_dir(path: &Path) -> Result<bool> {
    let mut created = false;
    match iofs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => return Err(unsafe_path(path, "is a symbolic link")),
        Ok(m) if !m.is_dir() => return Err(unsafe_path(path, "is not a directory")),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            match iofs::create_dir(path, 0o700) {
                Ok(()) => created = true,
                // Another process made it meanwhile: checked below.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(StoreError::fs("create directory", path)(e)),
            }
        }
        Err(e) => return Err(StoreError::fs("inspect", path)(e)),
    }
    let d = iofs::open_with(
        fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW),
        path,
    )
    .map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) | Some(libc::ENOTDIR) => {
            unsafe_path(path, "is not a directory (or became a link)")
        }
        _ => StoreError::fs("open directory", path)(e),
    })?;
    let m = iofs::metadata_of(&d, path).map_err(StoreError::fs("inspect", path))?;
    if m.mode() & 0o777 != 0o700 {
        iofs::set_mode(&d, path, 0o700).map_err(StoreError::fs("restrict to 0700", path))?;
    }
    Ok(created)
}

/// The identity of this writer: `<host>-<pid>-<start>`, where `host` is a
/// hash of the host name and `start` the process's start time in clock
/// ticks since boot (so a reused pid is another writer).
pub fn writer_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        let pid = std::process::id();
        format!("{}-{pid}-{}", host_tag(), start_time(pid).unwrap_or(0))
    })
}

fn host_tag() -> String {
    let host = fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{:08x}", crc32c::crc32c(host.trim().as_bytes()))
}

/// A process's start time (field 22 of `/proc/<pid>/stat`), if it runs.
fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: fields resume after ')'.
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the writer `id` (as [`writer_id`] makes them) is alive: `Some`
/// for a writer of this host, `None` when it cannot be told (another host).
pub fn writer_alive(id: &str) -> Option<bool> {
    let mut parts = id.splitn(3, '-');
    let (host, pid, start) = (parts.next()?, parts.next()?, parts.next()?);
    if host != host_tag() {
        return None;
    }
    let pid: u32 = pid.parse().ok()?;
    let start: u64 = start.parse().ok()?;
    Some(start_time(pid) == Some(start))
}

/// Whether a temporary file `name` (`<stem>.<writer>.<nonce>.tmp`) with
/// metadata `m` may be removed: it must be a regular file of that form,
/// and its writer dead, or (writer of another host) older than
/// [`STALE_TMP_AGE`].
pub fn stale_tmp(name: &str, m: &fs::Metadata) -> bool {
    if !m.file_type().is_file() {
        return false;
    }
    let Some(stem) = name.strip_suffix(".tmp") else {
        return false;
    };
    let parts: Vec<&str> = stem.split('.').collect();
    let [_, writer, nonce] = parts[..] else {
        return false;
    };
    if nonce.parse::<u64>().is_err() {
        return false;
    }
    match writer_alive(writer) {
        Some(alive) => !alive,
        None => m
            .modified()
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .is_some_and(|age| age > STALE_TMP_AGE),
    }
}

/// Reads the geometry marker: `None` when absent; an error when it is not
/// a regular file, or longer than [`MAX_MARKER_BYTES`].
pub fn read_marker(path: &Path) -> Result<Option<String>> {
    let f = match iofs::open_with(
        fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK),
        path,
    ) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(unsafe_path(path, "is a symbolic link"))
        }
        Err(e) => return Err(StoreError::fs("open", path)(e)),
    };
    let m = iofs::metadata_of(&f, path).map_err(StoreError::fs("inspect", path))?;
    if !m.is_file() {
        return Err(unsafe_path(path, "is not a regular file"));
    }
    if m.len() > MAX_MARKER_BYTES {
        return Err(unsafe_path(path, "is too large to be a geometry marker"));
    }
    let buf = iofs::read_up_to(f, path, MAX_MARKER_BYTES).map_err(StoreError::fs("read", path))?;
    Ok(Some(String::from_utf8_lossy(&buf).trim().to_string()))
}

/// A temporary file of this writer in `tmp_dir`: `<stem>.<writer>.<nonce>.tmp`,
/// the form [`stale_tmp`] reads back (so `stem` must hold no dot). Another
/// process removes it only once this writer is dead.
pub fn tmp_path(tmp_dir: &Path, stem: &str) -> PathBuf {
    tmp_dir.join(format!("{stem}.{}.{}.tmp", writer_id(), next_nonce()))
}

/// A number unique in this process, for temporary file names: with the
/// writer id in the name, two tiers of one process (two stores on one
/// directory) never share a temporary file, whatever they write at once.
pub fn next_nonce() -> u64 {
    static NONCE: AtomicU64 = AtomicU64::new(0);
    NONCE.fetch_add(1, Ordering::Relaxed)
}

/// Writes `text` (and a newline) to a new temporary file of this writer in
/// `tmp_dir`, named after `path`'s file name (cleared like any other if
/// this writer dies), and fsyncs it.
fn write_marker_tmp(path: &Path, tmp_dir: &Path, text: &str) -> std::io::Result<PathBuf> {
    // `<stem>.<writer>.<nonce>.tmp`: the stem holds no dot (see stale_tmp).
    let stem = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("marker")
        .replace('.', "_");
    let tmp = tmp_path(tmp_dir, &stem);
    let _ = iofs::remove_file(&tmp);
    let written = (|| -> std::io::Result<()> {
        let mut f = iofs::open_with(
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW),
            &tmp,
        )?;
        iofs::write_all(&mut f, &tmp, format!("{text}\n").as_bytes())?;
        iofs::sync(&f, &tmp)
    })();
    match written {
        Ok(()) => Ok(tmp),
        Err(e) => {
            let _ = iofs::remove_file(&tmp);
            Err(e)
        }
    }
}

fn sync_parent(path: &Path) {
    let _ = sync_dir(path.parent().unwrap_or(Path::new(".")));
}

/// Makes the entries of directory `path` durable (fsync of the directory,
/// opened without following a link in its place).
pub fn sync_dir(path: &Path) -> std::io::Result<()> {
    let d = iofs::open_with(
        fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW),
        path,
    )?;
    iofs::sync(&d, path)
}

/// Writes a marker file (the geometry, the GC lease) atomically: a
/// temporary file of this writer in `tmp_dir`, fsynced, then hard-linked
/// to `path` (which fails if another writer got there first: the caller
/// then reads theirs). Returns whether this call created it.
pub fn create_marker(path: &Path, tmp_dir: &Path, text: &str) -> Result<bool> {
    let linked = write_marker_tmp(path, tmp_dir, text).and_then(|tmp| {
        let r = iofs::hard_link(&tmp, path);
        let _ = iofs::remove_file(&tmp);
        r
    });
    match linked {
        Ok(()) => {
            sync_parent(path);
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(StoreError::fs("write", path)(e)),
    }
}

/// Replaces the marker at `path` atomically (a temporary file renamed over
/// it: whatever was there, a file or a link, is replaced, never followed).
pub fn replace_marker(path: &Path, tmp_dir: &Path, text: &str) -> Result<()> {
    let tmp = write_marker_tmp(path, tmp_dir, text).map_err(StoreError::fs("write", path))?;
    let renamed = iofs::rename(&tmp, path);
    if renamed.is_err() {
        let _ = iofs::remove_file(&tmp);
    }
    renamed.map_err(StoreError::fs("rename", path))?;
    sync_parent(path);
    Ok(())
}

/// Tests only: the writer identity of a process of this host that has
/// exited (a child that ran `true`), as cleanup must treat it.
#[doc(hidden)]
pub fn dead_writer() -> String {
    let host = writer_id().split('-').next().unwrap_or("0").to_string();
    let pid = std::process::Command::new("true")
        .spawn()
        .and_then(|mut c| c.wait().map(|_| c.id()))
        .unwrap_or(u32::MAX);
    format!("{host}-{pid}-1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain_identifiers() {
        for ok in ["mla", "csa_c16", "kda-perslot", "0x", "A"] {
            assert!(check_name("group", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "..",
            "/etc",
            "a/b",
            "-x",
            "_x",
            "a b",
            "a\0",
            "é",
            &"x".repeat(65),
        ] {
            assert!(check_name("group", bad).is_err(), "{bad:?}");
        }
        assert!(short(&"y".repeat(1000)).chars().count() <= 65);
    }

    #[test]
    fn this_writer_is_alive_and_a_dead_one_is_not() {
        assert_eq!(writer_alive(writer_id()), Some(true));
        assert_eq!(writer_alive(&dead_writer()), Some(false));
        let host = writer_id().split('-').next().unwrap();
        if host != "deadbeef" {
            assert_eq!(writer_alive("deadbeef-1-1"), None, "another host's writer");
        }
    }
}

//! `IoDir`: a directory held open, for presence checks by relative name.
//!
//! A store answers "is this block on disk?" thousands of times per request.
//! Asking by absolute path walks every component of the store's root each
//! time and allocates the path; asking relative to a directory descriptor
//! walks only the components beneath it, from a name built on the stack.
//! The directory itself is opened with `O_DIRECTORY | O_NOFOLLOW` (a link in
//! its place is refused), and the last component of every name is looked at
//! without following a link (`AT_SYMLINK_NOFOLLOW`).

use std::ffi::CStr;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::error::{DeviceError, Result};

/// What `stat` says of a name (the last component never followed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// A regular file (not a link, directory, FIFO, socket or device).
    pub regular: bool,
    /// Its length in bytes.
    pub len: u64,
}

/// A directory opened for lookups beneath it.
#[derive(Debug)]
pub struct IoDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl IoDir {
    /// Opens `path`, which must be a directory and not a symbolic link.
    pub fn open(path: impl AsRef<Path>) -> Result<IoDir> {
        let path = path.as_ref().to_path_buf();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|source| DeviceError::Io {
                op: "open directory",
                path: Some(path.clone()),
                source,
            })?;
        Ok(IoDir {
            fd: OwnedFd::from(f),
            path,
        })
    }

    /// The path it was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The entry `name` (relative; an absolute name is refused) names
    /// beneath this directory, without following a link in its last
    /// component; `None` when it does not exist or cannot be looked at.
    pub fn stat(&self, name: &CStr) -> Option<Entry> {
        if name.to_bytes().first().is_none_or(|&b| b == b'/') {
            return None;
        }
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: the descriptor is open for the lifetime of `self`, `name`
        // is NUL-terminated, and `st` is a writable `stat` the call fills in
        // completely when it returns 0 (only then is it read).
        let rc = unsafe {
            libc::fstatat(
                self.fd.as_raw_fd(),
                name.as_ptr(),
                st.as_mut_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if rc != 0 {
            return None;
        }
        // SAFETY: fstatat returned 0, so it initialised `st`.
        let st = unsafe { st.assume_init() };
        Some(Entry {
            regular: st.st_mode & libc::S_IFMT == libc::S_IFREG,
            len: st.st_size as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_beneath_a_directory_are_seen_without_following_links() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("ab")).unwrap();
        std::fs::write(d.path().join("ab/f"), b"12345").unwrap();
        std::os::unix::fs::symlink(d.path().join("ab/f"), d.path().join("ab/l")).unwrap();
        let dir = IoDir::open(d.path()).unwrap();
        assert_eq!(
            dir.stat(c"ab/f"),
            Some(Entry {
                regular: true,
                len: 5
            })
        );
        // A link is seen as a link (not regular), never as its target.
        assert!(!dir.stat(c"ab/l").unwrap().regular);
        // A directory is not regular; a missing name is `None`.
        assert!(!dir.stat(c"ab").unwrap().regular);
        assert_eq!(dir.stat(c"ab/none"), None);
        // Absolute and empty names are refused.
        assert_eq!(dir.stat(c"/etc/passwd"), None);
        assert_eq!(dir.stat(c""), None);
        // The directory itself may not be a link.
        std::os::unix::fs::symlink(d.path().join("ab"), d.path().join("lnk")).unwrap();
        assert!(IoDir::open(d.path().join("lnk")).is_err());
        assert!(IoDir::open(d.path().join("ab/f")).is_err());
    }
}

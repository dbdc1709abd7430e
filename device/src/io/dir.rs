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

    /// `syncfs(2)` on the file system holding this directory: returns once
    /// everything written to that file system before the call is durable
    /// (file data, and metadata such as new names), as if every file on it
    /// had been fsynced. Whether an error of any of it is reported depends
    /// on the kernel and the file system: see
    /// [`IoDir::syncfs_reports_all`]. Fail points treat it as an
    /// [`FaultOp::Fsync`](crate::io::faults::FaultOp::Fsync) of this
    /// directory.
    pub fn sync_filesystem(&self) -> Result<()> {
        if let Some(errno) =
            crate::io::faults::check_errno(crate::io::faults::FaultOp::Fsync, &self.path, 0)
        {
            return Err(DeviceError::os("syncfs", Some(self.path.clone()), errno));
        }
        // SAFETY: the descriptor is open for the lifetime of `self`.
        let rc = unsafe { libc::syncfs(self.fd.as_raw_fd()) };
        if rc != 0 {
            return Err(DeviceError::Io {
                op: "syncfs",
                path: Some(self.path.clone()),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Whether [`IoDir::sync_filesystem`] can stand in for an fsync of each
    /// file: the file system is one whose `syncfs` commits everything
    /// written before it and reports its errors (ext4, XFS, btrfs; tmpfs,
    /// which has nothing to commit), on a kernel of 5.8 or later (before
    /// it, `syncfs` reported no write-back error at all). False where
    /// either cannot be told: a network, FUSE or cluster file system may
    /// implement `syncfs` as a no-op.
    pub fn syncfs_reports_all(&self) -> bool {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        kernel_at_least(&kernel, (5, 8))
            && fs_magic(self.fd.as_raw_fd()).is_some_and(|m| SYNCFS_FILE_SYSTEMS.contains(&m))
    }
}

/// `f_type`s (linux/magic.h) whose `syncfs` stands for an fsync of every
/// file: ext4 (also ext2/3), XFS, btrfs, tmpfs.
const SYNCFS_FILE_SYSTEMS: [libc::c_long; 4] = [0xEF53, 0x5846_5342, 0x9123_683E, TMPFS_MAGIC];

/// tmpfs's `f_type` (linux/magic.h).
pub(crate) const TMPFS_MAGIC: libc::c_long = 0x0102_1994;

/// The `f_type` a `statfs`-family `call` reports into the buffer it is
/// given (`None` when it fails).
fn magic_from(call: impl FnOnce(*mut libc::statfs) -> libc::c_int) -> Option<libc::c_long> {
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    let rc = call(st.as_mut_ptr());
    // SAFETY: the call returned 0, so it filled in `st` completely.
    (rc == 0).then(|| unsafe { st.assume_init() }.f_type as libc::c_long)
}

/// The `f_type` of the file system holding `fd` (`None` if `fstatfs` fails).
pub(crate) fn fs_magic(fd: std::os::unix::io::RawFd) -> Option<libc::c_long> {
    // SAFETY: `fd` is an open descriptor and `st` a writable `statfs`.
    magic_from(|st| unsafe { libc::fstatfs(fd, st) })
}

/// True when `path`, or the nearest ancestor of it that exists (a store's
/// directory may not be made yet), lies on tmpfs; false when that cannot be
/// told. A relative path is taken from the working directory. `statfs`
/// opens nothing, so a FIFO in the way cannot block it.
pub(crate) fn path_on_tmpfs(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(abs) = std::path::absolute(path) else {
        return false;
    };
    // A path holding a NUL byte cannot be asked: false.
    abs.ancestors()
        .map_while(|a| std::ffi::CString::new(a.as_os_str().as_bytes()).ok())
        .find_map(|c| {
            // SAFETY: `c` is a NUL-terminated path and `st` a writable
            // `statfs`.
            magic_from(|st| unsafe { libc::statfs(c.as_ptr(), st) })
        })
        == Some(TMPFS_MAGIC)
}

/// True when a kernel release string (`6.1.0-18-amd64`) is `min` or later;
/// false when it cannot be read.
fn kernel_at_least(release: &str, min: (u32, u32)) -> bool {
    let mut parts = release.trim().split(['.', '-']);
    let mut num = || parts.next().and_then(|p| p.parse::<u32>().ok());
    match (num(), num()) {
        (Some(major), Some(minor)) => (major, minor) >= min,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_releases_are_compared_by_major_and_minor() {
        assert!(kernel_at_least("5.8.0", (5, 8)));
        assert!(kernel_at_least("6.18.44-fc-v1147\n", (5, 8)));
        assert!(kernel_at_least("5.10-rc1", (5, 8)));
        assert!(!kernel_at_least("5.7.19", (5, 8)));
        assert!(!kernel_at_least("4.19.0-27-amd64", (5, 8)));
        // 5.10 is after 5.8 (numbers, not strings).
        assert!(kernel_at_least("5.10.0", (5, 9)));
        assert!(!kernel_at_least("", (5, 8)));
        assert!(!kernel_at_least("linux", (5, 8)));
    }

    #[test]
    fn tmpfs_is_told_by_its_f_type() {
        // What /proc/mounts says of /dev/shm, against what fstatfs says.
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let shm_tmpfs = mounts.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(1) == Some(&"/dev/shm") && f.get(2) == Some(&"tmpfs")
        });
        if !shm_tmpfs {
            eprintln!("/dev/shm is not a tmpfs here: nothing to compare");
            return;
        }
        let shm = IoDir::open("/dev/shm").unwrap();
        assert_eq!(fs_magic(shm.fd.as_raw_fd()), Some(TMPFS_MAGIC));
        let proc = IoDir::open("/proc").unwrap();
        assert_ne!(fs_magic(proc.fd.as_raw_fd()), Some(TMPFS_MAGIC));
    }

    #[test]
    fn syncfs_is_trusted_on_local_file_systems_and_runs() {
        let d = tempfile::tempdir().unwrap();
        let dir = IoDir::open(d.path()).unwrap();
        dir.sync_filesystem().unwrap();
        let magic = fs_magic(dir.fd.as_raw_fd()).unwrap();
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        assert_eq!(
            dir.syncfs_reports_all(),
            SYNCFS_FILE_SYSTEMS.contains(&magic) && kernel_at_least(&kernel, (5, 8)),
            "f_type {magic:#x}, kernel {kernel}"
        );
        // /proc is none of them.
        assert!(!IoDir::open("/proc").unwrap().syncfs_reports_all());
    }

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

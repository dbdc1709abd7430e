//! `IoFile`: the file-system seam every I/O engine goes through.
//!
//! Opening tries O_DIRECT first; where the file system refuses it (EINVAL),
//! the file is reopened buffered and the fallback is logged once per
//! process. A file is opened with O_NOFOLLOW and O_NONBLOCK and must be a
//! regular file: a symbolic link, a FIFO, a device or a directory in its
//! place is an error. The seam is also where fail points hook in (feature
//! `failpoints`), so tests can inject EIO, ENOSPC and short transfers into
//! exactly the operation they name.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{DeviceError, Result};
use crate::io::faults::{self, FaultOp};

/// How to open an [`IoFile`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenOptions {
    /// Open for writing too (reads are always allowed).
    pub write: bool,
    /// Create the file if it does not exist (mode 0600).
    pub create: bool,
    /// Truncate it to zero length.
    pub truncate: bool,
    /// Try O_DIRECT (fall back to buffered I/O where refused).
    pub direct: bool,
}

impl OpenOptions {
    /// Read-only, O_DIRECT where allowed.
    pub fn read_only() -> Self {
        OpenOptions {
            write: false,
            create: false,
            truncate: false,
            direct: true,
        }
    }

    /// Read-write, created if missing (0600), O_DIRECT where allowed.
    pub fn read_write() -> Self {
        OpenOptions {
            write: true,
            create: true,
            truncate: false,
            direct: true,
        }
    }
}

/// An open file, shared by `Arc` between requests in flight.
#[derive(Debug)]
pub struct IoFile {
    fd: OwnedFd,
    path: PathBuf,
    writable: bool,
    direct: bool,
    /// Made by [`IoFile::create_unnamed`] and not yet given a name.
    unnamed: AtomicBool,
    /// Whether writes serialize, told on first ask (an `fstatfs`), so
    /// opening pays nothing for it.
    serial_writes: std::sync::OnceLock<bool>,
}

static FALLBACK_LOGGED: AtomicBool = AtomicBool::new(false);

/// True when `fd` lies on tmpfs (false when that cannot be told).
fn on_tmpfs(fd: RawFd) -> bool {
    crate::io::dir::fs_magic(fd) == Some(crate::io::dir::TMPFS_MAGIC)
}

fn open_raw(path: &Path, flags: libc::c_int) -> std::result::Result<OwnedFd, i32> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| libc::EINVAL)?;
    loop {
        // SAFETY: `c` is a valid NUL-terminated string; the mode argument is
        // read only with O_CREAT.
        let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, 0o600 as libc::c_uint) };
        if fd >= 0 {
            // SAFETY: `fd` was just returned by open(2) and is owned by nobody else.
            let owned = unsafe { OwnedFd::from_raw_fd(fd) };
            if flags & libc::O_NONBLOCK != 0 {
                // O_NONBLOCK only kept the open from blocking on a FIFO; I/O
                // on the file must block (io_uring answers EAGAIN otherwise).
                // SAFETY: `fd` is open; F_GETFL/F_SETFL take and return flags.
                let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
                // SAFETY: as above.
                if fl < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK) } < 0 {
                    return Err(std::io::Error::last_os_error()
                        .raw_os_error()
                        .unwrap_or(libc::EIO));
                }
            }
            return Ok(owned);
        }
        let errno = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        if errno != libc::EINTR {
            return Err(errno);
        }
    }
}

impl IoFile {
    /// Opens `path` as `opts` says.
    pub fn open(path: impl AsRef<Path>, opts: OpenOptions) -> Result<Self> {
        // Never through a symbolic link (the last component), and never
        // blocking on a FIFO: only regular files are accepted below.
        let mut flags = libc::O_NOFOLLOW
            | libc::O_NONBLOCK
            | if opts.write {
                libc::O_RDWR
            } else {
                libc::O_RDONLY
            };
        if opts.create {
            flags |= libc::O_CREAT;
        }
        if opts.truncate {
            flags |= libc::O_TRUNC;
        }
        Self::open_flags(path.as_ref(), flags, opts.direct, opts.write, false)
    }

    /// Creates a file with no name in directory `dir` (`O_TMPFILE`, mode
    /// 0600, read-write, O_DIRECT where allowed): it is freed when the last
    /// handle closes, or by the file system's recovery after a crash, unless
    /// [`IoFile::link_as`] gives it a name first. `dir` itself must not be a
    /// symbolic link. Errors are those of `open(2)`; a file system without
    /// `O_TMPFILE` answers `EOPNOTSUPP` (`EISDIR` on kernels older than
    /// 3.11). The file's [`path`](IoFile::path) is `dir`, which is also the
    /// path fault rules match its operations against.
    pub fn create_unnamed(dir: impl AsRef<Path>, direct: bool) -> Result<Self> {
        let flags = libc::O_TMPFILE | libc::O_RDWR | libc::O_NOFOLLOW;
        Self::open_flags(dir.as_ref(), flags, direct, true, true)
    }

    /// Gives a file made by [`IoFile::create_unnamed`] the name `dst`
    /// (`linkat`), on the same file system as its directory. An existing
    /// `dst` is never replaced: that is `EEXIST`. Once named, the file is
    /// an ordinary file (a second call is refused). The new name is durable
    /// only after an fsync of `dst`'s directory. [`IoFile::path`] stays the
    /// directory it was created in.
    pub fn link_as(&self, dst: impl AsRef<Path>) -> Result<()> {
        let dst = dst.as_ref();
        // Claimed before the call (two threads cannot both name it), given
        // back if the link fails.
        if !self.unnamed.swap(false, Ordering::AcqRel) {
            return Err(DeviceError::InvalidArgument(format!(
                "{} already has a name",
                self.path.display()
            )));
        }
        let r = self.link_unnamed(dst);
        if r.is_err() {
            self.unnamed.store(true, Ordering::Release);
        }
        r
    }

    fn link_unnamed(&self, dst: &Path) -> Result<()> {
        if let Some(errno) = faults::check_errno(FaultOp::Link, dst, 0) {
            return Err(DeviceError::os("link", Some(dst.to_path_buf()), errno));
        }
        let to = CString::new(dst.as_os_str().as_bytes()).map_err(|_| {
            DeviceError::InvalidArgument(format!("{} holds a NUL byte", dst.display()))
        })?;
        // Through /proc (no privilege needed); where /proc is not mounted,
        // AT_EMPTY_PATH on the descriptor (needs CAP_DAC_READ_SEARCH).
        let proc = CString::new(format!("/proc/self/fd/{}", self.raw_fd()))
            .map_err(|_| DeviceError::InvalidArgument("descriptor path".into()))?;
        // SAFETY: both strings are valid and NUL-terminated; AT_FDCWD with
        // absolute or cwd-relative paths; linkat reads them only.
        let mut rc = unsafe {
            libc::linkat(
                libc::AT_FDCWD,
                proc.as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        };
        let mut err = std::io::Error::last_os_error();
        if rc != 0 && err.raw_os_error() == Some(libc::ENOENT) && !Path::new("/proc/self").exists()
        {
            // SAFETY: the descriptor is open; the empty string is valid and
            // NUL-terminated; `to` as above.
            rc = unsafe {
                libc::linkat(
                    self.raw_fd(),
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    to.as_ptr(),
                    libc::AT_EMPTY_PATH,
                )
            };
            err = std::io::Error::last_os_error();
        }
        if rc != 0 {
            return Err(DeviceError::Io {
                op: "link",
                path: Some(dst.to_path_buf()),
                source: err,
            });
        }
        Ok(())
    }

    fn open_flags(
        path: &Path,
        flags: libc::c_int,
        want_direct: bool,
        writable: bool,
        unnamed: bool,
    ) -> Result<Self> {
        let path = path.to_path_buf();
        if let Some(errno) = faults::check_errno(FaultOp::Open, &path, 0) {
            return Err(DeviceError::os("open", Some(path), errno));
        }
        let mut direct = false;
        let fd = if want_direct {
            let attempt = match faults::check_errno(FaultOp::OpenDirect, &path, 0) {
                Some(errno) => Err(errno),
                None => open_raw(&path, flags | libc::O_DIRECT),
            };
            match attempt {
                Ok(fd) => {
                    direct = true;
                    Ok(fd)
                }
                Err(libc::EINVAL) => {
                    // EINVAL may have another cause than O_DIRECT (the
                    // same open fails again then): say "refused" only when
                    // the open without it works.
                    let buffered = open_raw(&path, flags);
                    if buffered.is_ok() && !FALLBACK_LOGGED.swap(true, Ordering::Relaxed) {
                        log::warn!(
                            "O_DIRECT refused for {}; falling back to buffered I/O \
                             (logged once per process)",
                            path.display()
                        );
                    }
                    buffered
                }
                Err(e) => Err(e),
            }
        } else {
            open_raw(&path, flags)
        };
        let fd = fd.map_err(|errno| DeviceError::os("open", Some(path.clone()), errno))?;
        let file = std::fs::File::from(fd);
        let regular = file.metadata().map(|m| m.is_file()).unwrap_or(false);
        if !regular {
            return Err(DeviceError::InvalidArgument(format!(
                "{} is not a regular file",
                path.display()
            )));
        }
        let fd = OwnedFd::from(file);
        Ok(IoFile {
            fd,
            path,
            writable,
            direct,
            unnamed: AtomicBool::new(unnamed),
            serial_writes: std::sync::OnceLock::new(),
        })
    }

    /// The path it was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True when opened for writing.
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// True when O_DIRECT is in effect (false after a fallback).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// True when the kernel runs this file's writes one at a time whatever
    /// the number of threads issuing them: buffered I/O (every buffered
    /// write takes the inode's lock) and tmpfs (which accepts O_DIRECT but
    /// copies through the page cache under that lock). An engine may keep
    /// such a file's writes on one thread: more threads only add lock
    /// hand-offs.
    pub fn writes_serialize(&self) -> bool {
        *self
            .serial_writes
            .get_or_init(|| !self.direct || on_tmpfs(self.raw_fd()))
    }

    /// The raw descriptor (valid while `self` lives).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Current file size.
    pub fn len(&self) -> Result<u64> {
        // SAFETY: an all-zero `stat` is a valid value to be overwritten.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: the descriptor is open and `st` is a valid out-pointer.
        let rc = unsafe { libc::fstat(self.raw_fd(), &mut st) };
        if rc != 0 {
            return Err(DeviceError::Io {
                op: "fstat",
                path: Some(self.path.clone()),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(st.st_size as u64)
    }

    /// True for an empty file.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Sets the file size (`ftruncate`), e.g. to lay out a file before
    /// O_DIRECT writes.
    pub fn set_len(&self, len: u64) -> Result<()> {
        if !self.writable {
            return Err(DeviceError::ReadOnly {
                path: self.path.clone(),
            });
        }
        let len = libc::off_t::try_from(len).map_err(|_| DeviceError::OutOfBounds {
            what: "file length",
            offset: len,
            len: 0,
            limit: i64::MAX as u64,
        })?;
        // SAFETY: the descriptor is open for writing.
        let rc = unsafe { libc::ftruncate(self.raw_fd(), len) };
        if rc != 0 {
            return Err(DeviceError::Io {
                op: "ftruncate",
                path: Some(self.path.clone()),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }
}

//! Why one item of a task failed, as a typed value that survives all the
//! way to the engine (through `ItemOutcome`, `Durability`, the adapter's
//! `LoadError` and its finished-save report): an I/O error keeps its errno
//! kind, the store keeps its reason. The text is for people; code matches
//! on [`FailureKind`] and [`Failure::errno`].

use std::fmt;

use ucm_device::DeviceError;

use crate::error::StoreError;

/// The reason class of a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// An I/O error other than the ones below (EIO and alike).
    Io,
    /// The file system is full (ENOSPC, EDQUOT).
    NoSpace,
    /// The store may not touch the file (EACCES, EPERM, EROFS).
    Permission,
    /// The bytes on the tier failed their checksum or header check.
    Corrupt,
    /// Every pool slot the key may use is pinned or loading.
    PoolFull,
    /// The store's task queue had no room; nothing was submitted.
    QueueFull,
    /// A device copy, stream or event failed.
    Device,
    /// Another rank's load of the same shard failed.
    OtherRank,
    /// The store refused the task (geometry, bounds, a key of another
    /// group): a caller bug, never a transient fault.
    Rejected,
    /// The caller could not even build the task (no store for the group,
    /// an unregistered layer, a missing state slot).
    NotSubmitted,
    /// The remote tier's servers failed, refused or did not answer in time.
    Remote,
    /// The store itself failed: a worker panicked while it ran the item (a
    /// bug in the store or in a device binding). The item is reported
    /// failed, never done; the worker goes on with the next task.
    Internal,
}

impl FailureKind {
    /// The kind of an errno.
    pub fn of_errno(errno: i32) -> FailureKind {
        match errno {
            libc::ENOSPC | libc::EDQUOT => FailureKind::NoSpace,
            libc::EACCES | libc::EPERM | libc::EROFS => FailureKind::Permission,
            _ => FailureKind::Io,
        }
    }
}

/// One failure: its kind, the errno behind it (when there is one) and a
/// short description.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Failure {
    /// The reason class.
    pub kind: FailureKind,
    /// The errno, for I/O failures.
    pub errno: Option<i32>,
    /// What was being done, in words.
    pub detail: String,
}

impl Failure {
    /// A failure of `kind` without an errno.
    pub fn new(kind: FailureKind, detail: impl Into<String>) -> Failure {
        Failure {
            kind,
            errno: None,
            detail: detail.into(),
        }
    }

    /// A failure from an errno (its kind follows the errno).
    pub fn errno(errno: i32, detail: impl Into<String>) -> Failure {
        Failure {
            kind: FailureKind::of_errno(errno),
            errno: Some(errno),
            detail: detail.into(),
        }
    }

    /// A failure from a store error, with `what` saying what was being done.
    pub fn from_store(e: &StoreError, what: &str) -> Failure {
        let detail = format!("{what}: {e}");
        match e {
            StoreError::Batch(inner) => Failure::from_store(inner, what),
            StoreError::Device(d) => Failure::from_device(d, what),
            StoreError::Fs { source, .. } => match source.raw_os_error() {
                Some(errno) => Failure::errno(errno, detail),
                None => Failure::new(FailureKind::Io, detail),
            },
            StoreError::QueueFull => Failure::new(FailureKind::QueueFull, detail),
            StoreError::PoolFull => Failure::new(FailureKind::PoolFull, detail),
            #[cfg(feature = "redis")]
            StoreError::Remote { .. } => Failure::new(FailureKind::Remote, detail),
            #[cfg(feature = "s3")]
            StoreError::ObjectStore { .. } => Failure::new(FailureKind::Remote, detail),
            StoreError::Timeout { .. } => Failure::new(FailureKind::Remote, detail),
            StoreError::Config(_)
            | StoreError::NotBuilt { .. }
            | StoreError::Unsafe { .. }
            | StoreError::GeometryMismatch { .. }
            | StoreError::WrongGroup { .. }
            | StoreError::DuplicateItem { .. }
            | StoreError::ShardOutOfRange { .. } => Failure::new(FailureKind::Rejected, detail),
        }
    }

    /// A failure from a HAL error.
    pub fn from_device(e: &DeviceError, what: &str) -> Failure {
        let detail = format!("{what}: {e}");
        match e.raw_os_error() {
            Some(errno) => Failure::errno(errno, detail),
            None => match e {
                DeviceError::Io { .. } | DeviceError::ShortWrite { .. } => {
                    Failure::new(FailureKind::Io, detail)
                }
                DeviceError::ReadOnly { .. } => Failure::new(FailureKind::Permission, detail),
                _ => Failure::new(FailureKind::Device, detail),
            },
        }
    }
}

/// The symbolic name of the errnos the store meets (`ENOSPC`, `EIO`, ...).
pub fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::EIO => "EIO",
        libc::ENOSPC => "ENOSPC",
        libc::EDQUOT => "EDQUOT",
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::EROFS => "EROFS",
        libc::ENOENT => "ENOENT",
        libc::ELOOP => "ELOOP",
        libc::EINVAL => "EINVAL",
        libc::ENOMEM => "ENOMEM",
        libc::EMFILE => "EMFILE",
        libc::ENFILE => "ENFILE",
        _ => "errno",
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.errno {
            Some(e) => write!(
                f,
                "{:?} ({} errno {e}): {}",
                self.kind,
                errno_name(e),
                self.detail
            ),
            None => write!(f, "{:?}: {}", self.kind, self.detail),
        }
    }
}

/// How often one kind of failure is logged at most.
pub const LOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// Logs `failure` as a warning at most once per kind per [`LOG_INTERVAL`],
/// with the count of those not logged since: a full disk says so once per
/// interval, not once per block. Returns whether this call logged.
pub fn warn_limited(what: &str, failure: &Failure) -> bool {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::time::Instant;
    static LAST: Mutex<Option<HashMap<FailureKind, (Instant, u64)>>> = Mutex::new(None);
    let mut g = LAST.lock().unwrap_or_else(|e| e.into_inner());
    let map = g.get_or_insert_with(HashMap::new);
    let now = Instant::now();
    match map.get_mut(&failure.kind) {
        Some((at, n)) if now.duration_since(*at) < LOG_INTERVAL => {
            *n += 1;
            false
        }
        entry => {
            let skipped = entry.map_or(0, |(_, n)| *n);
            map.insert(failure.kind, (now, 0));
            drop(g);
            if skipped > 0 {
                log::warn!("{what}: {failure} (and {skipped} more like it in the last interval)");
            } else {
                log::warn!("{what}: {failure}");
            }
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_logged_once_per_interval() {
        let f = Failure::errno(libc::EDQUOT, "disk write");
        let logged = (0..100_000).filter(|_| warn_limited("block", &f)).count();
        assert_eq!(logged, 1);
    }

    #[test]
    fn errno_kinds_survive_conversion() {
        let e = StoreError::Device(DeviceError::os("write", None, libc::ENOSPC));
        let f = Failure::from_store(&e, "disk write");
        assert_eq!(
            (f.kind, f.errno),
            (FailureKind::NoSpace, Some(libc::ENOSPC))
        );
        let e = StoreError::Device(DeviceError::os("open", None, libc::EACCES));
        assert_eq!(Failure::from_store(&e, "x").kind, FailureKind::Permission);
        let e = StoreError::Device(DeviceError::os("read", None, libc::EIO));
        assert_eq!(Failure::from_store(&e, "x").kind, FailureKind::Io);
        assert_eq!(
            Failure::from_store(&StoreError::QueueFull, "x").kind,
            FailureKind::QueueFull
        );
        assert!(Failure::errno(libc::EIO, "disk read")
            .to_string()
            .contains("EIO errno 5"));
        assert!(Failure::errno(libc::ENOSPC, "disk write")
            .to_string()
            .contains("ENOSPC"));
    }
}

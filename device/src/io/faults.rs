//! Fail points in the file-system seam (feature `failpoints`).
//!
//! A rule names a path (exact file, or a directory prefix), an operation and
//! optionally an offset, and what to inject: an errno (EIO, ENOSPC, ...) or
//! a short transfer. Engines consult the rules before each operation; a
//! matched operation completes with the injected outcome and the others are
//! untouched, so a test can check that a fault reaches exactly the
//! operation it names. Rules are keyed by path, so tests running in
//! parallel with their own directories do not disturb each other.
//!
//! Without the feature the checks compile to nothing.

use std::path::Path;
#[cfg(feature = "failpoints")]
use std::path::PathBuf;

/// The operation a rule applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultOp {
    /// `open(2)` through [`IoFile::open`](crate::io::IoFile::open) or
    /// [`fs::open_with`](crate::io::fs::open_with).
    Open,
    /// Only the O_DIRECT attempt of an open: inject `EINVAL` here to
    /// emulate a file system that refuses O_DIRECT.
    OpenDirect,
    /// A read.
    Read,
    /// A write.
    Write,
    /// An fsync.
    Fsync,
    /// Naming an unnamed file through [`IoFile::link_as`](crate::io::IoFile::link_as)
    /// (the rule's path is matched against the new name).
    Link,
    /// Renaming through [`fs::rename`](crate::io::fs::rename) (the rule's
    /// path is matched against the destination).
    Rename,
    /// Removing a file through [`fs::remove_file`](crate::io::fs::remove_file).
    Remove,
    /// Listing a directory through [`fs::read_dir`](crate::io::fs::read_dir).
    List,
    /// Making a directory through [`fs::create_dir_all`](crate::io::fs::create_dir_all).
    Mkdir,
    /// Setting a file's modification time through
    /// [`fs::set_modified`](crate::io::fs::set_modified).
    Touch,
    /// Inspecting a path or an open file through
    /// [`fs::symlink_metadata`](crate::io::fs::symlink_metadata) or
    /// [`fs::metadata_of`](crate::io::fs::metadata_of).
    Stat,
    /// Changing a mode through [`fs::set_mode`](crate::io::fs::set_mode).
    Chmod,
}

/// What a matched operation gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// Fail with this errno (e.g. `libc::EIO`, `libc::ENOSPC`).
    Errno(i32),
    /// Transfer only this many bytes (a short read or write), for real.
    Short(usize),
    /// Panic in the thread that issues the operation, before it is done:
    /// stands for a bug anywhere below the caller (a device binding, a
    /// store invariant), so that tests can check what survives one.
    Panic,
}

/// Decision for one operation.
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Injected {
    Errno(i32),
    Short(usize),
}

#[cfg(feature = "failpoints")]
pub use enabled::*;

#[cfg(feature = "failpoints")]
mod enabled {
    use super::*;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    /// One injection rule.
    #[derive(Clone, Debug)]
    pub struct FaultRule {
        /// A file path, or a directory: the rule matches the path itself and
        /// everything below it.
        pub path: PathBuf,
        /// The operation it applies to.
        pub op: FaultOp,
        /// Only the operation at this file offset: one that starts there, or
        /// a transfer whose byte range holds it (a vectored write of a whole
        /// block holds every shard's offset). Any offset when `None`.
        pub offset: Option<u64>,
        /// What to inject.
        pub action: FaultAction,
        /// Fire at most this many times (unbounded when `None`).
        pub times: Option<usize>,
        /// Let this many matching operations pass before the first firing.
        pub skip: usize,
    }

    impl FaultRule {
        /// A rule that fails `op` on `path` (and below) with `errno`, always.
        pub fn errno(path: impl Into<PathBuf>, op: FaultOp, errno: i32) -> Self {
            FaultRule {
                path: path.into(),
                op,
                offset: None,
                action: FaultAction::Errno(errno),
                times: None,
                skip: 0,
            }
        }

        /// A rule that truncates `op` on `path` (and below) to `bytes`.
        pub fn short(path: impl Into<PathBuf>, op: FaultOp, bytes: usize) -> Self {
            FaultRule {
                path: path.into(),
                op,
                offset: None,
                action: FaultAction::Short(bytes),
                times: None,
                skip: 0,
            }
        }

        /// A rule that makes `op` on `path` (and below) panic in the
        /// issuing thread.
        pub fn panic(path: impl Into<PathBuf>, op: FaultOp) -> Self {
            FaultRule {
                path: path.into(),
                op,
                offset: None,
                action: FaultAction::Panic,
                times: None,
                skip: 0,
            }
        }

        /// Restricts the rule to the operation at (or covering) `offset`.
        pub fn at_offset(mut self, offset: u64) -> Self {
            self.offset = Some(offset);
            self
        }

        /// Lets the first `n` matching operations pass untouched.
        pub fn after(mut self, n: usize) -> Self {
            self.skip = n;
            self
        }

        /// Lets the rule fire at most `n` times.
        pub fn times(mut self, n: usize) -> Self {
            self.times = Some(n);
            self
        }
    }

    struct Entry {
        id: u64,
        rule: FaultRule,
        fired: Arc<AtomicUsize>,
        /// Matching operations let pass so far (up to `rule.skip`).
        passed: usize,
    }

    static RULES: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
    static NEXT: AtomicU64 = AtomicU64::new(1);

    /// Keeps a rule active; dropping it removes the rule.
    #[must_use = "the rule is removed when the guard is dropped"]
    pub struct FaultGuard {
        id: u64,
        fired: Arc<AtomicUsize>,
    }

    impl FaultGuard {
        /// How many operations the rule has hit so far.
        pub fn fired(&self) -> usize {
            self.fired.load(Ordering::SeqCst)
        }
    }

    impl Drop for FaultGuard {
        fn drop(&mut self) {
            let mut rules = RULES.lock().unwrap_or_else(|e| e.into_inner());
            rules.retain(|e| e.id != self.id);
        }
    }

    /// Activates `rule` until the returned guard is dropped.
    pub fn inject(rule: FaultRule) -> FaultGuard {
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let fired = Arc::new(AtomicUsize::new(0));
        RULES.lock().unwrap_or_else(|e| e.into_inner()).push(Entry {
            id,
            rule,
            fired: Arc::clone(&fired),
            passed: 0,
        });
        FaultGuard { id, fired }
    }

    pub(crate) fn check(op: FaultOp, path: &Path, offset: u64, len: u64) -> Option<Injected> {
        let mut rules = RULES.lock().unwrap_or_else(|e| e.into_inner());
        // The newest matching rule wins, so a test can narrow an older one.
        for e in rules.iter_mut().rev() {
            let r = &e.rule;
            if r.op != op || !path.starts_with(&r.path) {
                continue;
            }
            let covers = |o: u64| o == offset || (o > offset && o - offset < len);
            if r.offset.is_some_and(|o| !covers(o)) {
                continue;
            }
            if e.passed < r.skip {
                e.passed += 1;
                continue;
            }
            let n = e.fired.fetch_add(1, Ordering::SeqCst);
            if r.times.is_some_and(|t| n >= t) {
                e.fired.fetch_sub(1, Ordering::SeqCst);
                continue;
            }
            let action = r.action;
            return match action {
                FaultAction::Errno(x) => Some(Injected::Errno(x)),
                FaultAction::Short(x) => Some(Injected::Short(x)),
                FaultAction::Panic => {
                    // Not while holding the rules: other tests go on.
                    drop(rules);
                    panic!("injected panic: {op:?} on {}", path.display())
                }
            };
        }
        None
    }
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn check(_op: FaultOp, _path: &Path, _offset: u64, _len: u64) -> Option<Injected> {
    None
}

/// Only errno outcomes (used where a short transfer means nothing, like open).
pub(crate) fn check_errno(op: FaultOp, path: &Path, offset: u64) -> Option<i32> {
    match check(op, path, offset, 0) {
        Some(Injected::Errno(e)) => Some(e),
        _ => None,
    }
}

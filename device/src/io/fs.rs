//! The file-system calls of a store that are not reads and writes of a
//! file's bytes: renaming, removing, listing, making directories and
//! setting modification times. They go through here, not `std::fs`, so
//! that fail points reach them as they reach every read, write, open and
//! fsync ([`FaultOp::Rename`], [`FaultOp::Remove`], [`FaultOp::List`],
//! [`FaultOp::Mkdir`], [`FaultOp::Touch`]); without the `failpoints`
//! feature each is the `std::fs` call and nothing more.

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::time::SystemTime;

use crate::io::faults::{check_errno, FaultOp};

fn injected(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

/// `rename(2)` of `from` to `to` (replacing `to` atomically).
pub fn rename(from: &Path, to: &Path) -> io::Result<()> {
    if let Some(errno) = check_errno(FaultOp::Rename, to, 0) {
        return Err(injected(errno));
    }
    std::fs::rename(from, to)
}

/// `unlink(2)` of `path`.
pub fn remove_file(path: &Path) -> io::Result<()> {
    if let Some(errno) = check_errno(FaultOp::Remove, path, 0) {
        return Err(injected(errno));
    }
    std::fs::remove_file(path)
}

/// The entries of the directory `path`.
pub fn read_dir(path: &Path) -> io::Result<std::fs::ReadDir> {
    if let Some(errno) = check_errno(FaultOp::List, path, 0) {
        return Err(injected(errno));
    }
    std::fs::read_dir(path)
}

/// Makes `path` and its missing parents, each with `mode`.
pub fn create_dir_all(path: &Path, mode: u32) -> io::Result<()> {
    if let Some(errno) = check_errno(FaultOp::Mkdir, path, 0) {
        return Err(injected(errno));
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
}

/// Sets the modification time of the file `path` to `when` (the file is
/// opened read-only for it).
pub fn set_modified(path: &Path, when: SystemTime) -> io::Result<()> {
    if let Some(errno) = check_errno(FaultOp::Touch, path, 0) {
        return Err(injected(errno));
    }
    std::fs::File::open(path)?.set_modified(when)
}

#[cfg(all(test, feature = "failpoints"))]
mod tests {
    use super::*;
    use crate::io::faults::{self, FaultRule};

    #[test]
    fn each_call_fails_where_a_rule_says_and_only_there() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        std::fs::write(&a, b"x").unwrap();
        {
            let _g = faults::inject(FaultRule::errno(&b, FaultOp::Rename, libc::EIO));
            assert_eq!(rename(&a, &b).unwrap_err().raw_os_error(), Some(libc::EIO));
            assert!(a.exists() && !b.exists());
        }
        rename(&a, &b).unwrap();
        {
            let _g = faults::inject(FaultRule::errno(&b, FaultOp::Remove, libc::EACCES));
            assert_eq!(
                remove_file(&b).unwrap_err().raw_os_error(),
                Some(libc::EACCES)
            );
            assert!(b.exists());
        }
        {
            let _g = faults::inject(FaultRule::errno(d.path(), FaultOp::List, libc::EIO));
            assert_eq!(
                read_dir(d.path()).err().unwrap().raw_os_error(),
                Some(libc::EIO)
            );
        }
        assert_eq!(read_dir(d.path()).unwrap().count(), 1);
        let old = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1 << 30);
        {
            let _g = faults::inject(FaultRule::errno(&b, FaultOp::Touch, libc::EROFS));
            assert_eq!(
                set_modified(&b, old).unwrap_err().raw_os_error(),
                Some(libc::EROFS)
            );
        }
        set_modified(&b, old).unwrap();
        assert_eq!(std::fs::metadata(&b).unwrap().modified().unwrap(), old);
        let sub = d.path().join("x/y");
        {
            let _g = faults::inject(FaultRule::errno(&sub, FaultOp::Mkdir, libc::ENOSPC));
            assert_eq!(
                create_dir_all(&sub, 0o700).unwrap_err().raw_os_error(),
                Some(libc::ENOSPC)
            );
            assert!(!sub.exists());
        }
        create_dir_all(&sub, 0o700).unwrap();
        assert!(sub.is_dir());
        remove_file(&b).unwrap();
        assert!(!b.exists());
    }
}

//! The file-system calls of a store outside the I/O engines' reads and
//! writes of block files: renaming, removing, listing, inspecting, making
//! directories, setting modification times and modes, and the small
//! marker files (opened, read, written, linked and fsynced whole). They go
//! through here, not `std::fs`, so that fail points reach them as they
//! reach every engine read, write, open and fsync ([`FaultOp::Rename`],
//! [`FaultOp::Remove`], [`FaultOp::List`], [`FaultOp::Mkdir`],
//! [`FaultOp::Touch`], [`FaultOp::Stat`], [`FaultOp::Chmod`], and
//! [`FaultOp::Open`], [`FaultOp::Read`], [`FaultOp::Write`],
//! [`FaultOp::Link`], [`FaultOp::Fsync`] for markers); without the
//! `failpoints` feature each is the `std::fs` call and nothing more.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
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

/// Makes the directory `path` (its parent must exist) with `mode`.
pub fn create_dir(path: &Path, mode: u32) -> io::Result<()> {
    if let Some(errno) = check_errno(FaultOp::Mkdir, path, 0) {
        return Err(injected(errno));
    }
    std::fs::DirBuilder::new().mode(mode).create(path)
}

/// `lstat(2)` of `path`: what is there, a link not followed.
pub fn symlink_metadata(path: &Path) -> io::Result<Metadata> {
    if let Some(errno) = check_errno(FaultOp::Stat, path, 0) {
        return Err(injected(errno));
    }
    std::fs::symlink_metadata(path)
}

/// `fstat(2)` of the open file `f`, which is `path`.
pub fn metadata_of(f: &File, path: &Path) -> io::Result<Metadata> {
    if let Some(errno) = check_errno(FaultOp::Stat, path, 0) {
        return Err(injected(errno));
    }
    f.metadata()
}

/// Opens `path` with `opts` (a marker file or a directory; block files go
/// through an I/O engine).
pub fn open_with(opts: &OpenOptions, path: &Path) -> io::Result<File> {
    if let Some(errno) = check_errno(FaultOp::Open, path, 0) {
        return Err(injected(errno));
    }
    opts.open(path)
}

/// Reads at most `max` bytes of the open file `f`, which is `path`.
pub fn read_up_to(f: File, path: &Path, max: u64) -> io::Result<Vec<u8>> {
    if let Some(errno) = check_errno(FaultOp::Read, path, 0) {
        return Err(injected(errno));
    }
    let mut buf = Vec::new();
    f.take(max).read_to_end(&mut buf)?;
    Ok(buf)
}

/// Writes all of `bytes` to the open file `f`, which is `path`.
pub fn write_all(f: &mut File, path: &Path, bytes: &[u8]) -> io::Result<()> {
    if let Some(errno) = check_errno(FaultOp::Write, path, 0) {
        return Err(injected(errno));
    }
    f.write_all(bytes)
}

/// `fsync(2)` of the open file or directory `f`, which is `path`.
pub fn sync(f: &File, path: &Path) -> io::Result<()> {
    if let Some(errno) = check_errno(FaultOp::Fsync, path, 0) {
        return Err(injected(errno));
    }
    f.sync_all()
}

/// `fchmod(2)` of the open file or directory `f`, which is `path`.
pub fn set_mode(f: &File, path: &Path, mode: u32) -> io::Result<()> {
    if let Some(errno) = check_errno(FaultOp::Chmod, path, 0) {
        return Err(injected(errno));
    }
    f.set_permissions(std::fs::Permissions::from_mode(mode))
}

/// `link(2)`: names the file `from` also `to` (fails if `to` exists).
pub fn hard_link(from: &Path, to: &Path) -> io::Result<()> {
    if let Some(errno) = check_errno(FaultOp::Link, to, 0) {
        return Err(injected(errno));
    }
    std::fs::hard_link(from, to)
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
        let m = d.path().join("m");
        {
            let _g = faults::inject(FaultRule::errno(&m, FaultOp::Mkdir, libc::EIO));
            assert!(create_dir(&m, 0o700).is_err());
        }
        {
            let _g = faults::inject(FaultRule::errno(&b, FaultOp::Stat, libc::EIO));
            assert_eq!(
                symlink_metadata(&b).unwrap_err().raw_os_error(),
                Some(libc::EIO)
            );
            let f = File::open(&b).unwrap();
            assert!(metadata_of(&f, &b).is_err());
        }
        assert!(symlink_metadata(&b).unwrap().is_file());
        let mut o = OpenOptions::new();
        o.read(true).write(true);
        for op in [
            FaultOp::Open,
            FaultOp::Read,
            FaultOp::Write,
            FaultOp::Fsync,
            FaultOp::Chmod,
        ] {
            let _g = faults::inject(FaultRule::errno(&b, op, libc::EIO));
            let r = match op {
                FaultOp::Open => open_with(&o, &b).map(drop),
                FaultOp::Read => read_up_to(File::open(&b).unwrap(), &b, 9).map(drop),
                FaultOp::Write => write_all(&mut open_with(&o, &b).unwrap(), &b, b"y"),
                FaultOp::Fsync => sync(&File::open(&b).unwrap(), &b),
                _ => set_mode(&File::open(&b).unwrap(), &b, 0o600),
            };
            assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EIO), "{op:?}");
        }
        assert_eq!(read_up_to(File::open(&b).unwrap(), &b, 9).unwrap(), b"x");
        let c = d.path().join("c");
        {
            let _g = faults::inject(FaultRule::errno(&c, FaultOp::Link, libc::EIO));
            assert!(hard_link(&b, &c).is_err() && !c.exists());
        }
        hard_link(&b, &c).unwrap();
        remove_file(&b).unwrap();
        assert!(!b.exists());
    }
}

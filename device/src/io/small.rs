//! Reading small files a user names (spec tables, scenarios, configs):
//! only regular files, and never more than a bound, so that a path such as
//! `/dev/zero`, a FIFO or a huge file gives a clear error instead of
//! taking the machine's memory or blocking for good.

use std::fmt;
use std::io::Read;
use std::path::Path;

/// The most bytes [`read_small_file`] callers allow for a spec table or a
/// scenario: far above any real one (a 96-layer spec is a few KiB).
pub const SMALL_FILE_LIMIT: u64 = 16 << 20;

/// Why a small file could not be read.
#[derive(Debug)]
pub enum SmallFileError {
    /// Opening, inspecting or reading it failed.
    Io(std::io::Error),
    /// It is not a regular file (a device, a FIFO, a socket, a directory).
    NotRegular {
        /// What it is.
        kind: &'static str,
    },
    /// It holds more than the bound.
    TooLarge {
        /// The bound, in bytes.
        limit: u64,
    },
    /// It is not UTF-8 text.
    NotText,
}

impl fmt::Display for SmallFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SmallFileError::Io(e) => write!(f, "{e}"),
            SmallFileError::NotRegular { kind } => {
                write!(f, "not a regular file (a {kind}); give a file")
            }
            SmallFileError::TooLarge { limit } => {
                write!(f, "larger than {limit} bytes, the most this reads")
            }
            SmallFileError::NotText => write!(f, "not UTF-8 text"),
        }
    }
}

impl std::error::Error for SmallFileError {}

fn kind_of(ft: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        "directory"
    } else if ft.is_char_device() {
        "character device"
    } else if ft.is_block_device() {
        "block device"
    } else if ft.is_fifo() {
        "FIFO"
    } else if ft.is_socket() {
        "socket"
    } else {
        "special file"
    }
}

/// The text of the regular file at `path`, at most `limit` bytes. The file
/// is opened without blocking (a FIFO would otherwise wait for a writer),
/// checked to be a regular file through the open handle, then read up to
/// one byte past the bound.
pub fn read_small_file(path: &Path, limit: u64) -> Result<String, SmallFileError> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(SmallFileError::Io)?;
    let ft = f.metadata().map_err(SmallFileError::Io)?.file_type();
    if !ft.is_file() {
        return Err(SmallFileError::NotRegular { kind: kind_of(ft) });
    }
    let mut bytes = Vec::new();
    f.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(SmallFileError::Io)?;
    if bytes.len() as u64 > limit {
        return Err(SmallFileError::TooLarge { limit });
    }
    String::from_utf8(bytes).map_err(|_| SmallFileError::NotText)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_fifos_and_directories_are_refused() {
        for (p, kind) in [
            ("/dev/zero", "character device"),
            ("/dev/null", "character device"),
        ] {
            match read_small_file(Path::new(p), 1024) {
                Err(SmallFileError::NotRegular { kind: k }) => assert_eq!(k, kind),
                other => panic!("{p}: {other:?}"),
            }
        }
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            read_small_file(dir.path(), 1024),
            Err(SmallFileError::NotRegular { kind: "directory" })
        ));
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(
            read_small_file(&fifo, 1024),
            Err(SmallFileError::NotRegular { kind: "FIFO" })
        ));
    }

    #[test]
    fn a_file_past_the_bound_is_refused_and_one_at_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![b'a'; 100]).unwrap();
        assert_eq!(read_small_file(&p, 100).unwrap().len(), 100);
        assert!(matches!(
            read_small_file(&p, 99),
            Err(SmallFileError::TooLarge { limit: 99 })
        ));
        std::fs::write(&p, [0xff, 0xfe]).unwrap();
        assert!(matches!(
            read_small_file(&p, 99),
            Err(SmallFileError::NotText)
        ));
    }
}

//! The one error type of the `device` crate.

use std::io;
use std::path::PathBuf;

/// Everything the HAL can report: accelerator runtimes and block I/O alike.
///
/// Errors are values, never panics: a misaligned buffer, a bad offset or a
/// write to a read-only file is rejected before anything reaches the kernel
/// or the device runtime.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// An operating-system call failed. `raw_os_error()` of `source` keeps
    /// the errno (EIO, ENOSPC, ...), so callers can tell faults apart.
    #[error("{op} failed on {path:?}: {source}")]
    Io {
        /// What was attempted (`"read"`, `"write"`, `"fsync"`, `"open"`, ...).
        op: &'static str,
        /// The file involved, when there is one.
        path: Option<PathBuf>,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// An address, length or offset breaks an alignment rule (O_DIRECT's
    /// block alignment, ACL's 64-byte rule for async copies).
    #[error("misaligned {what}: {value:#x} is not a multiple of {align}")]
    Misaligned {
        /// Which quantity is misaligned (`"buffer address"`, `"offset"`, ...).
        what: &'static str,
        /// The offending value.
        value: u64,
        /// The alignment that was required.
        align: u64,
    },
    /// A range reaches outside the memory or file it refers to.
    #[error("out of bounds: {what} [{offset:#x}, +{len:#x}) exceeds {limit:#x}")]
    OutOfBounds {
        /// Which object was indexed.
        what: &'static str,
        /// Start of the requested range.
        offset: u64,
        /// Length of the requested range.
        len: u64,
        /// Size of the object.
        limit: u64,
    },
    /// A write or fsync on a file that was opened read-only.
    #[error("file {path:?} was opened read-only and cannot be written")]
    ReadOnly {
        /// The file.
        path: PathBuf,
    },
    /// A write completed with fewer bytes than asked for.
    #[error("short write on {path:?} at offset {offset:#x}: {done} of {expected} bytes")]
    ShortWrite {
        /// The file.
        path: PathBuf,
        /// Offset of the write.
        offset: u64,
        /// Bytes that were written.
        done: usize,
        /// Bytes that were asked for.
        expected: usize,
    },
    /// This backend cannot run here (feature not built, kernel refuses it,
    /// runtime library missing). `reason` says why in words.
    #[error("{backend} is unsupported here: {reason}")]
    Unsupported {
        /// The backend (`"io_uring"`, `"cuda"`, ...).
        backend: &'static str,
        /// Why it cannot run.
        reason: String,
    },
    /// An argument is invalid (zero length, wrong memory kind, a handle of
    /// another device, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An accelerator runtime call failed.
    #[error("{api} failed with code {code}: {message}")]
    Driver {
        /// The runtime API that failed.
        api: &'static str,
        /// The runtime's error code.
        code: i64,
        /// The runtime's message, when it gives one.
        message: String,
    },
    /// Work queued on a stream failed; the stream is poisoned and the error
    /// surfaces at every later synchronisation point.
    #[error("stream operation failed: {0}")]
    Stream(String),
    /// The engine or stream has shut down and takes no more work.
    #[error("{0} is shut down")]
    Closed(&'static str),
}

impl DeviceError {
    /// The errno behind an I/O error, if any.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            DeviceError::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// Builds an [`DeviceError::Io`] from an errno.
    pub fn os(op: &'static str, path: Option<PathBuf>, errno: i32) -> Self {
        DeviceError::Io {
            op,
            path,
            source: io::Error::from_raw_os_error(errno),
        }
    }
}

impl Clone for DeviceError {
    fn clone(&self) -> Self {
        match self {
            DeviceError::Io { op, path, source } => DeviceError::Io {
                op,
                path: path.clone(),
                source: match source.raw_os_error() {
                    Some(code) => io::Error::from_raw_os_error(code),
                    None => io::Error::new(source.kind(), source.to_string()),
                },
            },
            DeviceError::Misaligned { what, value, align } => DeviceError::Misaligned {
                what,
                value: *value,
                align: *align,
            },
            DeviceError::OutOfBounds {
                what,
                offset,
                len,
                limit,
            } => DeviceError::OutOfBounds {
                what,
                offset: *offset,
                len: *len,
                limit: *limit,
            },
            DeviceError::ReadOnly { path } => DeviceError::ReadOnly { path: path.clone() },
            DeviceError::ShortWrite {
                path,
                offset,
                done,
                expected,
            } => DeviceError::ShortWrite {
                path: path.clone(),
                offset: *offset,
                done: *done,
                expected: *expected,
            },
            DeviceError::Unsupported { backend, reason } => DeviceError::Unsupported {
                backend,
                reason: reason.clone(),
            },
            DeviceError::InvalidArgument(s) => DeviceError::InvalidArgument(s.clone()),
            DeviceError::Driver { api, code, message } => DeviceError::Driver {
                api,
                code: *code,
                message: message.clone(),
            },
            DeviceError::Stream(s) => DeviceError::Stream(s.clone()),
            DeviceError::Closed(s) => DeviceError::Closed(s),
        }
    }
}

/// Result alias of the `device` crate.
pub type Result<T, E = DeviceError> = std::result::Result<T, E>;

/// The message of a caught panic (`panic!` carries a `&str` or a
/// `String`), cut to 200 characters, for an error that reports it.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message");
    text.chars().take(200).collect()
}

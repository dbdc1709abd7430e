//! The foreign interfaces' error type and the status codes it maps to.

use thiserror::Error;

use crate::status;
use ucm_coordinator::CoordError;

/// Everything a call through the C ABI or the Python module can refuse or
/// fail at.
#[derive(Debug, Error)]
pub enum FfiError {
    /// A bad argument of a C ABI call, named, and what is wrong with it.
    #[error("invalid argument: `{name}` {problem}")]
    Argument {
        /// The parameter (or field: `opts.sync_mode`, `groups[2].blocks`).
        name: String,
        /// What is wrong with it.
        problem: ArgProblem,
    },
    /// Step metadata that does not decode for this spec table.
    #[error("invalid argument: step metadata: {0}")]
    Wire(WireError),
    /// Another bad argument (the message says which and why).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The request needs something this build or machine lacks.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The coordinator refused or failed.
    #[error(transparent)]
    Coord(CoordError),
    /// The device refused or failed.
    #[error(transparent)]
    Device(#[from] ucm_device::DeviceError),
    /// An output buffer is too small (the needed size was written).
    #[error("buffer too small: {0}")]
    Buffer(String),
    /// A panic was caught at the boundary (a bug in UCM).
    #[error("internal error (caught panic): {0}")]
    Panic(String),
}

impl FfiError {
    /// The C status code of this error (see `ucm_status_t`).
    pub fn status(&self) -> i32 {
        match self {
            FfiError::Invalid(_) | FfiError::Argument { .. } | FfiError::Wire(_) => {
                status::UCM_ERR_INVALID
            }
            FfiError::Unsupported(_) => status::UCM_ERR_UNSUPPORTED,
            FfiError::Coord(
                CoordError::Spec(_) | CoordError::SpecFile { .. } | CoordError::Identity { .. },
            ) => status::UCM_ERR_SPEC,
            FfiError::Coord(CoordError::BadRequest(_)) => status::UCM_ERR_REQUEST,
            FfiError::Coord(CoordError::Store(_)) => status::UCM_ERR_STORE,
            FfiError::Device(_) => status::UCM_ERR_DEVICE,
            FfiError::Buffer(_) => status::UCM_ERR_BUFFER,
            FfiError::Panic(_) => status::UCM_ERR_PANIC,
        }
    }
}

impl From<ucm_coordinator::store::StoreError> for FfiError {
    fn from(e: ucm_coordinator::store::StoreError) -> Self {
        FfiError::Coord(CoordError::Store(e))
    }
}

/// What is wrong with an argument ([`FfiError::Argument`]).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ArgProblem {
    /// NULL where a value is needed.
    #[error("is NULL")]
    Null,
    /// An array pointer that is NULL with a length.
    #[error("is NULL with a length of {len}")]
    NullWithLength {
        /// The length given.
        len: usize,
    },
    /// Not valid UTF-8.
    #[error("is not UTF-8")]
    NotUtf8,
    /// Not aligned for its type.
    #[error("is misaligned")]
    Misaligned,
    /// Not a handle of this library (misaligned).
    #[error("is not a handle (misaligned)")]
    NotAHandle,
    /// An array whose byte size overflows the address space.
    #[error("has a length of {len} that overflows")]
    LengthOverflows {
        /// The length given.
        len: usize,
    },
    /// A value outside what the parameter takes.
    #[error("{value} (expected {expected})")]
    OutOfRange {
        /// The value, as text.
        value: String,
        /// What the parameter takes.
        expected: &'static str,
    },
}

/// Why step metadata does not decode ([`FfiError::Wire`]).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum WireError {
    /// The bytes end before the metadata does.
    #[error("truncated at byte {at}")]
    Truncated {
        /// Where.
        at: usize,
    },
    /// A count larger than the bytes left could hold.
    #[error("a count of {count} exceeds the {left} bytes left")]
    CountExceeds {
        /// The count.
        count: usize,
        /// Bytes left.
        left: usize,
    },
    /// A group index the spec table does not have.
    #[error("group {group} is not in the spec table")]
    UnknownGroup {
        /// The index.
        group: usize,
    },
    /// Not UCM step metadata at all.
    #[error("not UCM step metadata (bad magic)")]
    BadMagic,
    /// Another format version.
    #[error("version {found}, this build reads {reads}")]
    Version {
        /// The version found.
        found: u32,
        /// The version this build reads.
        reads: u32,
    },
    /// A request id that is not UTF-8.
    #[error("a request id is not UTF-8")]
    IdNotUtf8,
    /// Hashes or seeds for another number of groups.
    #[error("{what} of {got} groups for a spec of {groups}")]
    GroupCount {
        /// `hashes` or `seeds`.
        what: &'static str,
        /// Groups in the metadata.
        got: usize,
        /// Groups of the spec table.
        groups: usize,
    },
    /// A flag byte of no meaning.
    #[error("{what} {value}")]
    Flag {
        /// `load flag` or `state priority`.
        what: &'static str,
        /// The byte.
        value: u8,
    },
    /// Saved blocks out of order or past the request.
    #[error("save range {start}..{end} of request `{request}`")]
    SaveRange {
        /// The request.
        request: String,
        /// First block.
        start: usize,
        /// One past the last.
        end: usize,
    },
    /// A state saved past the request's tokens.
    #[error("save position {position} past request `{request}`")]
    SavePosition {
        /// The request.
        request: String,
        /// The position.
        position: u64,
    },
    /// A request whose metadata does not fit it (load, ids, groups).
    #[error("{0}")]
    Request(ucm_coordinator::RequestError),
    /// Bytes after the metadata.
    #[error("{bytes} trailing bytes")]
    Trailing {
        /// How many.
        bytes: usize,
    },
}

/// The foreign interfaces' result type.
pub type Result<T> = std::result::Result<T, FfiError>;

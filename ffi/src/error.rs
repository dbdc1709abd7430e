//! The foreign interfaces' error type and the status codes it maps to.

use thiserror::Error;

use crate::status;
use ucm_coordinator::CoordError;
use ucm_device::{DeviceNameError, DeviceSpec};

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
    /// A device name that does not parse.
    #[error("invalid argument: {0}")]
    DeviceName(DeviceNameError),
    /// A task id that is unknown or was already waited for.
    #[error("invalid argument: task {task}: unknown or already waited for")]
    UnknownTask {
        /// The id given.
        task: u64,
    },
    /// A worker call made before `register_kv_caches`.
    #[error("invalid call: register_kv_caches first")]
    NotRegistered,
    /// A worker on another device than the cache's first worker.
    #[error(
        "invalid argument: this cache's workers use {have}; a worker on {want} needs its own cache"
    )]
    BackendMismatch {
        /// The device of the cache's workers.
        have: DeviceSpec,
        /// The device asked for.
        want: DeviceSpec,
    },
    /// The request needs something this build or machine lacks.
    #[error("unsupported: {0}")]
    Unsupported(Unsupported),
    /// The coordinator refused or failed.
    #[error(transparent)]
    Coord(CoordError),
    /// The device refused or failed.
    #[error(transparent)]
    Device(#[from] ucm_device::DeviceError),
    /// An output buffer is too small (the needed size was written).
    #[error("buffer too small: {capacity} {unit} for {needed}")]
    Buffer {
        /// What the buffer holds.
        capacity: usize,
        /// What the answer needs.
        needed: usize,
        /// `ids` or `bytes`.
        unit: &'static str,
    },
    /// A panic was caught at the boundary (a bug in UCM).
    #[error("internal error (caught panic): {0}")]
    Panic(String),
}

impl FfiError {
    /// The C status code of this error (see `ucm_status_t`).
    pub fn status(&self) -> i32 {
        match self {
            FfiError::Argument { .. }
            | FfiError::Wire(_)
            | FfiError::DeviceName(_)
            | FfiError::UnknownTask { .. }
            | FfiError::NotRegistered
            | FfiError::BackendMismatch { .. } => status::UCM_ERR_INVALID,
            FfiError::Unsupported(_) => status::UCM_ERR_UNSUPPORTED,
            FfiError::Coord(
                CoordError::Spec(_) | CoordError::SpecFile { .. } | CoordError::Identity { .. },
            ) => status::UCM_ERR_SPEC,
            FfiError::Coord(CoordError::BadRequest(_)) => status::UCM_ERR_REQUEST,
            FfiError::Coord(CoordError::Store(_)) => status::UCM_ERR_STORE,
            FfiError::Device(_) => status::UCM_ERR_DEVICE,
            FfiError::Buffer { .. } => status::UCM_ERR_BUFFER,
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
    /// An empty path or text.
    #[error("is empty")]
    Empty,
    /// A group of kind `none`: it is never reused and has no ids.
    #[error("`{group}` is never reused: it has no ids")]
    NeverReused {
        /// The group's name.
        group: String,
    },
    /// A group that is not a snapshot group.
    #[error("`{group}` is not a snapshot group")]
    NotSnapshot {
        /// The group's name.
        group: String,
    },
    /// A memory region that wraps past the end of the address space.
    #[error("of {len} bytes at {addr:#x} wraps past the end of memory")]
    Wraps {
        /// Its start.
        addr: u64,
        /// Its length.
        len: usize,
    },
    /// A memory region shorter than its stride, or of stride 0.
    #[error("of {len} bytes has a stride of {stride}")]
    Stride {
        /// Its length.
        len: usize,
        /// Its stride.
        stride: usize,
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

/// What this build or machine lacks ([`FfiError::Unsupported`]).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Unsupported {
    /// A device kind whose import path is not built (Ascend today).
    #[error("device `{0}`: this build moves host (`cpu`) and `cuda` memory only")]
    Device(DeviceSpec),
    /// A device kind no backend has (perhaps one this code does not know).
    #[error("{0}")]
    UnknownDevice(DeviceNameError),
    /// A CUDA device in a build without the `cuda` feature.
    #[error("this build has no CUDA backend (feature `cuda`)")]
    NoCuda,
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
    /// A speculative share above 1.
    #[error("a speculative share of {ppm} millionths is above 1")]
    Share {
        /// The share word found.
        ppm: u32,
    },
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

//! The foreign interfaces' error type and the status codes it maps to.

use thiserror::Error;

use crate::status;
use ucm_coordinator::CoordError;

/// Everything a call through the C ABI or the Python module can refuse or
/// fail at.
#[derive(Debug, Error)]
pub enum FfiError {
    /// A bad argument: NULL, out of range, misaligned, not UTF-8, ...
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
            FfiError::Invalid(_) => status::UCM_ERR_INVALID,
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

/// The foreign interfaces' result type.
pub type Result<T> = std::result::Result<T, FfiError>;

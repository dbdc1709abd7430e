//! The C ABI's status codes, defined once: [`crate::error`] maps each
//! error to one, and [`crate::c_api`] returns them (and re-exports them for
//! the header).

/// Success.
pub const UCM_OK: i32 = 0;
/// A bad argument: NULL, misaligned, overflowing, out of range, not UTF-8.
pub const UCM_ERR_INVALID: i32 = 1;
/// Not supported by this build or machine (a device backend, ...).
pub const UCM_ERR_UNSUPPORTED: i32 = 2;
/// The spec table is malformed or could not be read.
pub const UCM_ERR_SPEC: i32 = 3;
/// The coordinator refused a request (unknown request, wrong call order,
/// geometry).
pub const UCM_ERR_REQUEST: i32 = 4;
/// A store operation failed.
pub const UCM_ERR_STORE: i32 = 5;
/// The device failed.
pub const UCM_ERR_DEVICE: i32 = 6;
/// A panic was caught at the boundary (a bug in UCM).
pub const UCM_ERR_PANIC: i32 = 7;
/// An output buffer is too small; the needed size was written.
pub const UCM_ERR_BUFFER: i32 = 8;

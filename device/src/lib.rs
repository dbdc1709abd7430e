//! # ucm-device: the hardware abstraction layer of UCM
//!
//! Two traits, each with run-time selectable backends:
//!
//! - [`Device`] (module [`accel`]): accelerator memory, pinned host memory,
//!   streams, events, async and batched scatter-gather copies, and the
//!   graph-safe stream-wait-event. [`HostDevice`] implements it on plain
//!   memory and is the test double for every layer above.
//! - [`IoEngine`] (module [`io`]): batched aligned reads, writes and fsyncs
//!   with per-operation completion, over io_uring, kernel AIO or POSIX.
//!
//! Red line: the HAL never knows keys, blocks, tokens or models. It moves
//! bytes where it is told. Unsafe code of the project lives here (and in
//! the store's shared-memory pool), each block with its `// SAFETY:` line.
//!
//! Feature flags: `io-uring` (default) builds the io_uring engine;
//! `failpoints` enables [`io::faults`] injection in the file-system seam.

#![deny(missing_docs)]

pub mod accel;
pub mod conformance;
pub mod error;
pub mod io;

pub use accel::handle::{DeviceHandle, DeviceVisitor};
pub use accel::host::HostDevice;
pub use accel::spec::{DeviceNameError, DeviceNameProblem, DeviceSpec};
pub use accel::{
    probe_devices, BackendStatus, CopyKind, CopyRun, Device, DeviceId, MemKind, Memory,
};
pub use error::{panic_message, DeviceError, Result};
pub use io::{
    IoBuf, IoEngine, IoEngineConfig, IoEngineKind, IoFile, IoRequest, IoTicket, OpenOptions,
};

//! # UCM: a KV-cache storage engine for hybrid LLMs
//!
//! This facade re-exports the layers, bottom to top:
//!
//! - [`device`]: the HAL: the `Device` trait (host, CUDA, Ascend) and the
//!   `IoEngine` trait (io_uring, libaio, POSIX);
//! - [`store`]: the store kernel and the BlockStore / SnapshotStore
//!   primitives;
//! - [`coordinator`]: the spec table, hashing, `resolve_hit`, checkpoints
//!   and the layerwise adapter;
//! - [`harness`]: the engine harness (simulated engine, layout, content
//!   oracle) that the tests and `ucm replay` drive the adapter with;
//! - [`ffi`]: the C ABI and the Python module.
//!
//! and holds what the `ucm` command line reports, explains and measures
//! ([`info`], [`explain`](mod@explain), [`bench`](mod@bench)).

#![deny(missing_docs)]

pub mod bench;
pub mod explain;
pub mod identities;
pub mod info;
pub mod replay;
pub mod scratch;

pub use ucm_coordinator as coordinator;
pub use ucm_device as device;
pub use ucm_ffi as ffi;
pub use ucm_harness as harness;
pub use ucm_store as store;

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
//! - [`ffi`]: the C ABI and the Python module;
//! - [`replay`]: workloads and public traces through the harness, with the
//!   engines' own caches as peers (crate `ucm-replay`);
//! - [`bench`]: the benchmarks, each figure a ratio against a baseline of
//!   the same run (crate `ucm-benches`).
//!
//! It holds only what the `ucm` command line reports and explains itself
//! ([`info`], [`explain`](mod@explain), [`identities`]); the binary
//! (`src/main.rs`) is a thin command line over all of them.

#![deny(missing_docs)]

pub mod explain;
pub mod identities;
pub mod info;

pub use ucm_benches as bench;
pub use ucm_coordinator as coordinator;
pub use ucm_device as device;
pub use ucm_ffi as ffi;
pub use ucm_harness as harness;
pub use ucm_harness::scratch;
pub use ucm_replay as replay;
pub use ucm_store as store;

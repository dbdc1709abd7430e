//! # ucm-ffi: foreign interfaces of UCM
//!
//! How inference engines embed UCM: the C ABI ([`c_api`], header
//! `ffi/include/ucm.h`) and the Python module `ucm` (feature `python`,
//! built by maturin from `python/`). Both are thin shims over [`runtime`],
//! which ties a spec table, its stores and checkpoint directory to the
//! adapter's scheduler and worker sides; engine types never cross into the
//! Rust API.

#![deny(missing_docs)]

pub mod blockstore;
pub mod c_api;
pub mod error;
pub mod hashing;
pub mod metrics;
#[cfg(feature = "python")]
pub mod python;
#[cfg(feature = "python")]
pub mod python_store;
pub mod runtime;
pub mod status;
pub mod wire;

pub use blockstore::{ItemProblem, ItemReport, RawItem, RawStore, RawStoreOptions};
pub use error::{ArgProblem, FfiError, Result, Unsupported, WireError};
pub use runtime::{Backend, Cache, CacheOptions, RawRegion, SchedulerSide, WorkerSide};
pub use ucm_coordinator as coordinator;

/// Version of the C ABI. Bumped on every incompatible change.
pub const ABI_VERSION: u32 = 4;

#[cfg(test)]
mod tests {
    #[test]
    fn abi_version_is_exported() {
        assert_eq!(super::c_api::ucm_abi_version(), super::ABI_VERSION);
    }
}

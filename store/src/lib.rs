//! # ucm-store: the store kernel and the two storage primitives
//!
//! - [`disk::DiskTier`]: one crash-safe file per block, checksummed, with
//!   precise GC; presence always asked of the file system.
//! - [`pool::ClockPool`]: the memory tier, private or in POSIX shared memory
//!   for several rank processes, with lock-free hits and CLOCK eviction.
//! - [`block::TieredBlockStore`]: the [`BlockStore`] over both, generic over
//!   the HAL's [`Device`](ucm_device::Device) and
//!   [`IoEngine`](ucm_device::IoEngine).
//!
//! - [`snapshot::TieredSnapshotStore`]: the [`SnapshotStore`] of
//!   position-keyed recurrent-state checkpoints (copy-on-write `get`,
//!   zero-copy `donate`, `enumerate` for warm restarts) on the same kernel.
//!
//! Red line: the store never sees tokens, models or sessions. It receives
//! `(block id, shard)` keys and device addresses.

#![deny(missing_docs)]

pub mod block;
pub mod disk;
pub mod error;
pub mod failure;
pub mod geometry;
mod header;
pub mod paths;
pub mod pool;
pub mod remote;
mod slot;
pub mod snapshot;

/// The atomics the slot state machine uses (loom swaps its own in).
mod sync {
    pub(crate) use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
}

pub use block::{
    BlockStore, BlockStoreConfig, Durability, ItemOutcome, Lease, Retain, TaskHandle, TaskItem,
    TieredBlockStore,
};
pub use disk::{DiskConfig, DiskTier, GcReport, ReadSession, SyncMode};
pub use error::{Result, StoreError};
pub use failure::{Failure, FailureKind};
pub use geometry::{BlockId, Geometry};
pub use pool::{Acquire, ClockPool, PoolConfig, PoolMode};
pub use remote::{Endpoint, RemoteConfig, RemoteRead, RemoteStats, RemoteTier, S3Location};
pub use snapshot::{SnapshotKey, SnapshotStore, StateItem, TieredSnapshotStore};
pub use ucm_device as device;

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
//!
//! Opening a store (a private memory tier over a disk tier), saving a
//! block's shards from device memory and reading them back:
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use ucm_device::{Device, HostDevice, IoEngineConfig, IoEngineKind};
//! use ucm_store::pool::PoolMode;
//! use ucm_store::{
//!     BlockStore, BlockStoreConfig, ClockPool, DiskConfig, DiskTier, Geometry, ItemOutcome,
//!     PoolConfig, TaskItem, TieredBlockStore,
//! };
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let geo = Geometry { shard_bytes: 4096, shards_per_block: 2 };
//! let dev = Arc::new(HostDevice::new());
//! let pool = ClockPool::open(PoolConfig {
//!     shard_bytes: geo.shard_bytes,
//!     slots: 64,
//!     ways: 64,
//!     mode: PoolMode::Private,
//!     load_timeout: Duration::from_secs(1),
//!     dirty_timeout: Duration::from_secs(60),
//! })?;
//! let io = Arc::from(IoEngineConfig::new(IoEngineKind::Auto).build()?);
//! let disk = DiskTier::open(DiskConfig::new(dir.path(), geo, 1024), io)?;
//! let store = TieredBlockStore::new(Arc::clone(&dev), pool, disk, BlockStoreConfig::default())?;
//!
//! // One block of two shards in device memory, under a 16-byte id.
//! let id = [7u8; 16];
//! let kv = dev.alloc_device(2 * geo.shard_bytes)?;
//! let items = |memory: &ucm_device::Memory| -> Vec<TaskItem> {
//!     (0..2u32)
//!         .map(|shard| TaskItem {
//!             block: id,
//!             shard,
//!             memory: memory.clone(),
//!             offset: shard as usize * geo.shard_bytes,
//!         })
//!         .collect()
//! };
//! let saved = store.dump(items(&kv), None)?;
//! assert!(saved.wait().iter().all(|(_, _, o)| *o == ItemOutcome::Ok));
//! assert_eq!(store.lookup_on_prefix(&[id, [8u8; 16]]), 1);
//!
//! let back = dev.alloc_device(2 * geo.shard_bytes)?;
//! let loaded = store.load(items(&back))?;
//! assert!(loaded.wait().iter().all(|(_, _, o)| *o == ItemOutcome::Ok));
//! # Ok(())
//! # }
//! ```

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
pub use disk::{
    ArrivedReads, DiskBudget, DiskConfig, DiskTier, GcReport, ReadSession, SubmittedReads, SyncMode,
};
pub use error::{ConfigError, NameError, Result, StoreError};
pub use failure::{Failure, FailureKind};
pub use geometry::{BlockId, Geometry};
pub use pool::{Acquire, ClockPool, PoolConfig, PoolMode};
pub use remote::{Endpoint, RemoteConfig, RemoteRead, RemoteStats, RemoteTier, S3Location};
pub use snapshot::{SnapshotKey, SnapshotStore, StateItem, TieredSnapshotStore};
pub use ucm_device as device;

//! # ucm-store: the store kernel and the two storage primitives
//!
//! This crate holds the store kernel: today the crash-safe disk tier
//! ([`disk::DiskTier`]) and the instance [`Geometry`]. The BlockStore
//! (content-addressed, prefix-chained K/V blocks), the SnapshotStore
//! (position-keyed recurrent-state checkpoints, copy-on-write) and the
//! shared-memory `ClockPool` build on it, generic over the HAL's
//! [`Device`](ucm_device::Device) and [`IoEngine`](ucm_device::IoEngine)
//! traits.
//!
//! Red line: the store never sees tokens, models or sessions. It receives
//! `(block id, shard)` keys and device addresses.

#![deny(missing_docs)]

pub mod block;
pub mod disk;
pub mod error;
pub mod geometry;
pub mod pool;

pub use block::{
    BlockStore, BlockStoreConfig, Durability, ItemOutcome, TaskHandle, TaskItem, TieredBlockStore,
};
pub use disk::{DiskConfig, DiskTier, GcReport};
pub use error::{Result, StoreError};
pub use geometry::{BlockId, Geometry};
pub use pool::{Acquire, ClockPool, PoolConfig, PoolMode};
pub use ucm_device as device;

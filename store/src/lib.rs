//! # ucm-store: the store kernel and the two storage primitives
//!
//! This crate will hold the BlockStore (content-addressed, prefix-chained
//! K/V blocks), the SnapshotStore (position-keyed recurrent-state
//! checkpoints, copy-on-write), the shared-memory `ClockPool` and the disk
//! tier with GC, all generic over the HAL's [`Device`](ucm_device::Device)
//! and [`IoEngine`](ucm_device::IoEngine) traits.
//!
//! Red line: the store never sees tokens, models or sessions. It receives
//! `(block id, shard)` keys and device addresses.
//!
//! Status: skeleton. The store-kernel issue fills it.

#![deny(missing_docs)]

pub use ucm_device as device;

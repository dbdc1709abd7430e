//! The SnapshotStore: position-keyed recurrent-state checkpoints.
//!
//! A checkpoint is keyed by `(group, position, H(position))`, where `H`
//! identifies the token prefix `[0, position)` and commits to the position
//! (the coordinator computes it; the store never sees tokens). One instance
//! serves one snapshot group: its geometry (state bytes per layer, layers
//! per checkpoint) comes from that group's spec row, and another geometry
//! is another instance. A checkpoint is stored as one block of the store
//! kernel, its id being `H(position)`, one shard per layer (or access unit),
//! so it inherits the kernel's crash-safe format, pool sharing and GC.
//!
//! - [`SnapshotStore::get`] is **copy-on-write**: it copies the state into
//!   the caller's memory; a stored checkpoint is never handed out mutable,
//!   so two requests resuming from it cannot corrupt it or each other.
//! - [`SnapshotStore::lease`] + [`SnapshotStore::donate`] are the
//!   **zero-copy hand-over**: the caller's state lives in a pool slot it
//!   owns, and donating publishes that slot under the key without a copy.
//! - [`SnapshotStore::enumerate`] lists the stored prefix hashes, for a warm
//!   restart of the coordinator's checkpoint directory.

use std::sync::Arc;

use ucm_device::{Device, Memory};

use crate::block::{BlockStore, Durability, Lease, Retain, TaskHandle, TaskItem, TieredBlockStore};
use crate::error::{Result, StoreError};
use crate::geometry::{BlockId, Geometry};

/// The key of a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SnapshotKey {
    /// The snapshot group (its index in the spec table).
    pub group: u32,
    /// The position `p` (tokens before the state).
    pub position: u64,
    /// `H(p)`: the prefix hash, which commits to `p`.
    pub hash: BlockId,
}

/// One layer's state of a checkpoint, in device memory.
#[derive(Clone, Debug)]
pub struct StateItem {
    /// The layer's shard index in the group's geometry.
    pub shard: u32,
    /// The device region.
    pub memory: Memory,
    /// Offset of the state in `memory`.
    pub offset: usize,
}

/// The SnapshotStore interface (tiered implementation:
/// [`TieredSnapshotStore`]).
pub trait SnapshotStore<D: Device> {
    /// Stores the state of `items` under `key`, after `after` completes
    /// (device-side wait). `wait` on the handle: in the pool;
    /// `wait_durable`: on disk.
    fn put(
        &self,
        key: &SnapshotKey,
        items: Vec<StateItem>,
        after: Option<Arc<D::Event>>,
    ) -> Result<TaskHandle> {
        self.put_retained(key, items, after, Retain::Normal)
    }
    /// [`SnapshotStore::put`], kept at `retain` ([`Retain::Low`]: a
    /// speculative checkpoint, evicted first until a `get` uses it).
    fn put_retained(
        &self,
        key: &SnapshotKey,
        items: Vec<StateItem>,
        after: Option<Arc<D::Event>>,
        retain: Retain,
    ) -> Result<TaskHandle>;
    /// Copies the checkpoint's layers into the caller's memory (a private
    /// copy). Layers that miss are reported as misses.
    fn get(&self, key: &SnapshotKey, items: Vec<StateItem>) -> Result<TaskHandle>;
    /// Leases a pool slot for layer `shard` of `key`, to fill in place and
    /// [`donate`](SnapshotStore::donate). `Ok(None)`: already stored.
    fn lease(&self, key: &SnapshotKey, shard: u32) -> Result<Option<Lease<'_>>>;
    /// Hands leased slots over without a copy, then writes them behind.
    fn donate(&self, leases: Vec<Lease<'_>>) -> Vec<(BlockId, Durability)>;
    /// Is every layer of the checkpoint present?
    fn exists(&self, key: &SnapshotKey) -> bool;
    /// The prefix hashes of the checkpoints on disk (none without a disk).
    fn enumerate(&self) -> Vec<BlockId>;
}

/// The SnapshotStore over the store kernel.
pub struct TieredSnapshotStore<D: Device> {
    group: u32,
    blocks: TieredBlockStore<D>,
}

impl<D: Device> TieredSnapshotStore<D> {
    /// Wraps a block store (whose geometry is the group's: state bytes per
    /// layer, layers per checkpoint) as the snapshot store of `group`.
    pub fn new(group: u32, blocks: TieredBlockStore<D>) -> Self {
        TieredSnapshotStore { group, blocks }
    }

    /// The group this instance serves.
    pub fn group(&self) -> u32 {
        self.group
    }

    /// The instance's geometry.
    pub fn geometry(&self) -> Geometry {
        self.blocks.geometry()
    }

    /// The underlying block store (counters, tiers).
    pub fn blocks(&self) -> &TieredBlockStore<D> {
        &self.blocks
    }

    fn check(&self, key: &SnapshotKey) -> Result<()> {
        if key.group == self.group {
            Ok(())
        } else {
            Err(StoreError::WrongGroup {
                got: key.group,
                expected: self.group,
            })
        }
    }

    fn items(key: &SnapshotKey, items: Vec<StateItem>) -> Vec<TaskItem> {
        items
            .into_iter()
            .map(|i| TaskItem {
                block: key.hash,
                shard: i.shard,
                memory: i.memory,
                offset: i.offset,
            })
            .collect()
    }
}

impl<D: Device> SnapshotStore<D> for TieredSnapshotStore<D> {
    fn put_retained(
        &self,
        key: &SnapshotKey,
        items: Vec<StateItem>,
        after: Option<Arc<D::Event>>,
        retain: Retain,
    ) -> Result<TaskHandle> {
        self.check(key)?;
        self.blocks
            .dump_retained(Self::items(key, items), after, retain)
    }

    fn get(&self, key: &SnapshotKey, items: Vec<StateItem>) -> Result<TaskHandle> {
        self.check(key)?;
        self.blocks.load(Self::items(key, items))
    }

    fn lease(&self, key: &SnapshotKey, shard: u32) -> Result<Option<Lease<'_>>> {
        self.check(key)?;
        self.blocks.lease(key.hash, shard)
    }

    fn donate(&self, leases: Vec<Lease<'_>>) -> Vec<(BlockId, Durability)> {
        self.blocks.donate(leases)
    }

    fn exists(&self, key: &SnapshotKey) -> bool {
        key.group == self.group && self.blocks.lookup(&[key.hash])[0]
    }

    fn enumerate(&self) -> Vec<BlockId> {
        // Without a disk, nothing to enumerate: the directory asks the
        // tiers for each candidate instead (its source).
        self.blocks
            .disk()
            .map(|d| d.enumerate())
            .unwrap_or_default()
    }
}

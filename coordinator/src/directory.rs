//! The checkpoint directory: which snapshot checkpoints exist, held in
//! memory by the coordinator, written from the engine side.
//!
//! - The adapter registers `(group, position, prefix hash)` when a put
//!   completes ([`CheckpointDirectory::register`]).
//! - Invalidation is lazy, with no notifications: `resolve_hit` considers
//!   only checkpoints `<= l`, so an evicted chain block can only shrink a
//!   hit; a checkpoint whose load misses is removed then
//!   ([`CheckpointDirectory::forget`]).
//! - Warm restart: [`CheckpointDirectory::rebuild`] refills a group from
//!   the SnapshotStore's `enumerate`. The prefix hash `H(p)` commits to `p`
//!   (it hashes `p as u64`), so the hash alone identifies a checkpoint; the
//!   position is kept when known, for display.

use std::collections::HashMap;
use std::sync::RwLock;

use crate::hash::Id;
use crate::resolve::Checkpoints;
use crate::spec::Group;

/// Checkpoints per group.
#[derive(Debug, Default)]
pub struct CheckpointDirectory {
    groups: RwLock<HashMap<String, HashMap<Id, Option<u64>>>>,
}

impl CheckpointDirectory {
    /// An empty directory.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a completed put.
    pub fn register(&self, group: &str, position: u64, hash: Id) {
        let mut g = self.groups.write().unwrap_or_else(|e| e.into_inner());
        g.entry(group.to_string())
            .or_default()
            .insert(hash, Some(position));
    }

    /// The completion callback of a put: registers the checkpoint when
    /// every layer of it was stored (`stored`), and leaves the directory
    /// alone otherwise (a partial checkpoint is never a candidate). Returns
    /// whether it registered.
    pub fn put_completed(&self, group: &str, position: u64, hash: Id, stored: bool) -> bool {
        if stored {
            self.register(group, position, hash);
        }
        stored
    }

    /// Removes an entry whose load missed (lazy invalidation). Returns
    /// whether it was there.
    pub fn forget(&self, group: &str, hash: &Id) -> bool {
        let mut g = self.groups.write().unwrap_or_else(|e| e.into_inner());
        g.get_mut(group).is_some_and(|m| m.remove(hash).is_some())
    }

    /// Refills `group` from a store's enumeration (warm restart). Entries
    /// already known keep their positions. Returns how many were added.
    pub fn rebuild(&self, group: &str, hashes: impl IntoIterator<Item = Id>) -> usize {
        let mut g = self.groups.write().unwrap_or_else(|e| e.into_inner());
        let m = g.entry(group.to_string()).or_default();
        let mut added = 0;
        for h in hashes {
            if let std::collections::hash_map::Entry::Vacant(v) = m.entry(h) {
                v.insert(None);
                added += 1;
            }
        }
        added
    }

    /// Is `(group, hash)` registered?
    pub fn contains(&self, group: &str, hash: &Id) -> bool {
        let g = self.groups.read().unwrap_or_else(|e| e.into_inner());
        g.get(group).is_some_and(|m| m.contains_key(hash))
    }

    /// Entries of `group`.
    pub fn len(&self, group: &str) -> usize {
        let g = self.groups.read().unwrap_or_else(|e| e.into_inner());
        g.get(group).map_or(0, HashMap::len)
    }

    /// True when no group has an entry.
    pub fn is_empty(&self) -> bool {
        let g = self.groups.read().unwrap_or_else(|e| e.into_inner());
        g.values().all(HashMap::is_empty)
    }

    /// Known positions of `group`'s entries, ascending (entries rebuilt
    /// from a store without a position are left out).
    pub fn positions(&self, group: &str) -> Vec<u64> {
        let g = self.groups.read().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<u64> = g
            .get(group)
            .map(|m| m.values().flatten().copied().collect())
            .unwrap_or_default();
        v.sort_unstable();
        v
    }
}

impl Checkpoints for CheckpointDirectory {
    fn has(&self, group: &Group, _position: u64, hash: &Id) -> bool {
        self.contains(&group.name, hash)
    }
}

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
//! - Other instances: engines sharing the tiers (a shared directory, a
//!   remote cluster) store checkpoints this directory never saw put. With a
//!   [`CheckpointSource`] ([`CheckpointDirectory::with_source`]) a
//!   checkpoint the directory does not know is asked of the snapshot
//!   stores, and registered when every layer of it is there. A miss is not
//!   remembered: another instance may store it the next moment.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use crate::hash::Id;
use crate::resolve::Checkpoints;
use crate::spec::Group;

/// Where the directory looks for checkpoints it does not know: the
/// snapshot stores, which other instances sharing the tiers write to.
pub trait CheckpointSource: Send + Sync {
    /// Is every layer of the checkpoint of `group` at `position` with
    /// prefix hash `hash` stored?
    fn exists(&self, group: &Group, position: u64, hash: &Id) -> bool;
}

/// Checkpoints per group.
#[derive(Default)]
pub struct CheckpointDirectory {
    groups: RwLock<HashMap<String, HashMap<Id, Option<u64>>>>,
    source: Option<Arc<dyn CheckpointSource>>,
}

impl std::fmt::Debug for CheckpointDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = self.groups.read().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("CheckpointDirectory")
            .field("groups", &*g)
            .field("source", &self.source.is_some())
            .finish()
    }
}

impl CheckpointDirectory {
    /// An empty directory that knows only what is registered or rebuilt.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty directory that asks `source` for a checkpoint it does not
    /// know (what other instances sharing the tiers stored since it was
    /// built).
    pub fn with_source(source: Arc<dyn CheckpointSource>) -> Self {
        CheckpointDirectory {
            groups: RwLock::default(),
            source: Some(source),
        }
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
    fn has(&self, group: &Group, position: u64, hash: &Id) -> bool {
        if self.contains(&group.name, hash) {
            return true;
        }
        match &self.source {
            Some(s) if s.exists(group, position, hash) => {
                self.register(&group.name, position, *hash);
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Src {
        held: Id,
        asked: AtomicUsize,
    }

    impl CheckpointSource for Src {
        fn exists(&self, _: &Group, _: u64, hash: &Id) -> bool {
            self.asked.fetch_add(1, Ordering::Relaxed);
            *hash == self.held
        }
    }

    fn group() -> Group {
        let t = crate::SpecTable::from_toml(
            r#"
model = "m"
[[group]]
name = "a"
kind = "chain"
block_size = 16
layers = "1"
bytes_per_token = 256
[[group]]
name = "s"
kind = "snapshot"
grid = 16
state_bytes = 4096
layers = "0"
"#,
        )
        .unwrap();
        t.group("s").unwrap().clone()
    }

    #[test]
    fn a_source_hit_is_registered_and_a_miss_is_asked_again() {
        let src = Arc::new(Src {
            held: [1; 16],
            asked: AtomicUsize::new(0),
        });
        let d = CheckpointDirectory::with_source(Arc::clone(&src) as _);
        let g = group();
        assert!(!d.has(&g, 32, &[2; 16]));
        assert!(!d.has(&g, 32, &[2; 16]));
        assert_eq!(
            src.asked.load(Ordering::Relaxed),
            2,
            "misses are not cached"
        );
        assert!(d.has(&g, 48, &[1; 16]));
        assert_eq!(d.positions("s"), vec![48]);
        assert!(d.has(&g, 48, &[1; 16]));
        assert_eq!(src.asked.load(Ordering::Relaxed), 3, "a hit is registered");
        // Without a source, only what was registered.
        assert!(!CheckpointDirectory::new().has(&g, 48, &[1; 16]));
    }
}

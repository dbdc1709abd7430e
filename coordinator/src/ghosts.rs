//! What the scheduler asked the workers to save, by priority, remembered
//! after the tiers may have evicted it: the evidence of retention's
//! [`SpeculativeBudget`](crate::retention::SpeculativeBudget) in the
//! running system.
//!
//! A request resolves as usual, then twice more with the saved-but-gone
//! keys counted as present: once the speculative checkpoints, once the
//! sure data (K/V blocks and sure checkpoints). How much further each
//! would have served the request is the bytes of recompute that kind of
//! data, kept longer, would have saved; the budget turns those into the
//! share of each tier that speculative data may keep
//! ([`ucm_store::TieredBlockStore::set_speculative_share`]). This is the
//! replay's ghost rule (`replay/src/sim/tiers.rs`), with the scheduler's
//! own record standing in for the tiers' eviction events, which it never
//! sees.
//!
//! Bounded by the bytes of the data it names, per kind (speculative
//! checkpoints; sure data), the oldest forgotten first: set to twice what
//! the tiers hold ([`SavedLog::set_bound`]), it remembers about as much
//! that is gone as the tiers hold, as the replay's ghosts do; and never
//! more than [`MAX_SAVED_KEYS`] keys of each kind. Keys only; no bytes
//! of data.

use std::collections::{HashMap, VecDeque};

use crate::hash::Id;
use crate::resolve::{Checkpoints, Presence};
use crate::spec::Group;

/// The most keys a [`SavedLog`] keeps of each kind (about 64 bytes of
/// memory each).
pub const MAX_SAVED_KEYS: usize = 1 << 20;

/// One saved key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Key {
    /// A chain or sidecar block: group, chain id.
    Block(usize, Id),
    /// A checkpoint: snapshot group, prefix hash.
    State(usize, Id),
}

/// Keys of one kind, with the bytes they name, oldest first. The queue
/// holds `(stamp, key)`; an entry whose stamp is no longer the key's is
/// stale and skipped.
#[derive(Debug, Default)]
struct Record {
    bytes: u64,
    clock: u64,
    keys: HashMap<Key, (u64, u64)>,
    order: VecDeque<(u64, Key)>,
}

impl Record {
    fn contains(&self, k: &Key) -> bool {
        self.keys.contains_key(k)
    }

    fn add(&mut self, k: Key, bytes: u64, bound: u64) {
        if self.keys.contains_key(&k) {
            return;
        }
        self.clock += 1;
        self.keys.insert(k, (self.clock, bytes));
        self.order.push_back((self.clock, k));
        self.bytes += bytes;
        while self.bytes > bound || self.keys.len() > MAX_SAVED_KEYS {
            let Some((stamp, old)) = self.order.pop_front() else {
                break;
            };
            if self.keys.get(&old).is_some_and(|e| e.0 == stamp) {
                if let Some((_, b)) = self.keys.remove(&old) {
                    self.bytes -= b;
                }
            }
        }
    }

    fn remove(&mut self, k: &Key) {
        if let Some((_, b)) = self.keys.remove(k) {
            self.bytes -= b;
            if self.order.len() > 2 * self.keys.len() + 1024 {
                let keys = &self.keys;
                self.order
                    .retain(|(stamp, k)| keys.get(k).is_some_and(|e| e.0 == *stamp));
            }
        }
    }
}

/// Keys saved, by kind: sure data (chain blocks, sure checkpoints) and
/// speculative checkpoints.
#[derive(Debug)]
pub struct SavedLog {
    bound: u64,
    sure: Record,
    speculative: Record,
}

impl Default for SavedLog {
    fn default() -> Self {
        Self::new(u64::MAX)
    }
}

impl SavedLog {
    /// A log of at most `bound` bytes of each kind.
    pub fn new(bound: u64) -> Self {
        SavedLog {
            bound,
            sure: Record::default(),
            speculative: Record::default(),
        }
    }

    /// Sets the bound: bytes of data of each kind (from then on).
    pub fn set_bound(&mut self, bound: u64) {
        self.bound = bound;
    }

    /// Records that the block `id` (of `bytes`) of chain or sidecar group
    /// `group` was saved.
    pub fn block(&mut self, group: usize, id: Id, bytes: u64) {
        self.sure.add(Key::Block(group, id), bytes, self.bound);
    }

    /// Records that the checkpoint (of `bytes`) of snapshot group `group`
    /// under prefix hash `hash` was saved, speculatively or not. A
    /// checkpoint saved both ways counts as sure.
    pub fn state(&mut self, group: usize, hash: Id, bytes: u64, speculative: bool) {
        let k = Key::State(group, hash);
        if speculative {
            if !self.sure.contains(&k) {
                self.speculative.add(k, bytes, self.bound);
            }
        } else {
            self.speculative.remove(&k);
            self.sure.add(k, bytes, self.bound);
        }
    }

    /// Was block `id` of `group` saved?
    pub fn has_block(&self, group: usize, id: &Id) -> bool {
        self.sure.contains(&Key::Block(group, *id))
    }

    /// Was the checkpoint saved, and at which priority (`Some(true)`:
    /// speculatively)?
    pub fn state_priority(&self, group: usize, hash: &Id) -> Option<bool> {
        let k = Key::State(group, *hash);
        if self.sure.contains(&k) {
            Some(false)
        } else if self.speculative.contains(&k) {
            Some(true)
        } else {
            None
        }
    }

    /// Nothing recorded?
    pub fn is_empty(&self) -> bool {
        self.sure.keys.is_empty() && self.speculative.keys.is_empty()
    }
}

/// The tiers as they are, plus the saved keys of the chosen kinds:
/// what they would hold had they kept that data.
pub struct WithSaved<'a> {
    /// The real presence of blocks.
    pub presence: &'a dyn Presence,
    /// The real checkpoints.
    pub checkpoints: &'a dyn Checkpoints,
    /// The record.
    pub log: &'a SavedLog,
    /// Count saved speculative checkpoints as present.
    pub speculative: bool,
    /// Count saved blocks and sure checkpoints as present.
    pub sure: bool,
}

impl Presence for WithSaved<'_> {
    fn lookup(&self, group: &Group, ids: &[Id]) -> Vec<bool> {
        let mut held = self.presence.lookup(group, ids);
        if self.sure {
            for (h, id) in held.iter_mut().zip(ids) {
                *h = *h || self.log.has_block(group.index, id);
            }
        }
        held
    }
}

impl Checkpoints for WithSaved<'_> {
    fn has(&self, group: &Group, position: u64, hash: &Id) -> bool {
        self.checkpoints.has(group, position, hash)
            || match self.log.state_priority(group.index, hash) {
                Some(true) => self.speculative,
                Some(false) => self.sure,
                None => false,
            }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_keys_go_past_the_byte_bound_and_a_sure_save_outranks_a_speculative_one() {
        let mut log = SavedLog::new(30);
        for i in 0..3u8 {
            log.block(0, [i; 16], 10);
        }
        assert!((0..3u8).all(|i| log.has_block(0, &[i; 16])));
        log.block(0, [3; 16], 10);
        assert!(!log.has_block(0, &[0; 16]), "past 30 bytes the oldest goes");
        assert!(log.has_block(0, &[3; 16]));
        // States: their own kind's bound.
        log.state(1, [9; 16], 20, true);
        log.state(1, [8; 16], 20, true);
        assert_eq!(log.state_priority(1, &[9; 16]), None, "40 > 30 bytes");
        assert_eq!(log.state_priority(1, &[8; 16]), Some(true));
        // Saved sure as well: sure, and it takes sure bytes.
        log.state(1, [8; 16], 20, false);
        assert_eq!(log.state_priority(1, &[8; 16]), Some(false));
        log.state(1, [8; 16], 20, true);
        assert_eq!(log.state_priority(1, &[8; 16]), Some(false));
        assert!(!log.has_block(0, &[1; 16]) && !log.has_block(0, &[2; 16]));
        assert!(log.has_block(0, &[3; 16]));
    }
}

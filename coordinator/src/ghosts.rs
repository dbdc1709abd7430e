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
//! Bounded: at most `capacity` keys of each kind, the oldest forgotten
//! first. Keys only; no bytes.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::hash::Id;
use crate::resolve::{Checkpoints, Presence};
use crate::spec::Group;

/// The default bound of a [`SavedLog`]: keys of each kind (about 40 bytes
/// each, a few tens of MiB in all).
pub const DEFAULT_SAVED_KEYS: usize = 1 << 18;

/// Keys saved, by kind: chain blocks and checkpoints with their priority.
#[derive(Debug)]
pub struct SavedLog {
    capacity: usize,
    blocks: HashSet<(usize, Id)>,
    block_order: VecDeque<(usize, Id)>,
    /// `(group, prefix hash)` to whether the checkpoint was speculative.
    states: HashMap<(usize, Id), bool>,
    state_order: VecDeque<(usize, Id)>,
}

impl SavedLog {
    /// A log of at most `capacity` block keys and as many checkpoint keys.
    pub fn new(capacity: usize) -> Self {
        SavedLog {
            capacity: capacity.max(1),
            blocks: HashSet::new(),
            block_order: VecDeque::new(),
            states: HashMap::new(),
            state_order: VecDeque::new(),
        }
    }

    /// Records that the block `id` of chain or sidecar group `group` was
    /// saved.
    pub fn block(&mut self, group: usize, id: Id) {
        if self.blocks.insert((group, id)) {
            self.block_order.push_back((group, id));
            while self.block_order.len() > self.capacity {
                if let Some(old) = self.block_order.pop_front() {
                    self.blocks.remove(&old);
                }
            }
        }
    }

    /// Records that the checkpoint of snapshot group `group` under prefix
    /// hash `hash` was saved, speculatively or not. A checkpoint saved
    /// both ways counts as sure.
    pub fn state(&mut self, group: usize, hash: Id, speculative: bool) {
        match self.states.get_mut(&(group, hash)) {
            Some(s) => *s &= speculative,
            None => {
                self.states.insert((group, hash), speculative);
                self.state_order.push_back((group, hash));
                while self.state_order.len() > self.capacity {
                    if let Some(old) = self.state_order.pop_front() {
                        self.states.remove(&old);
                    }
                }
            }
        }
    }

    /// Was block `id` of `group` saved?
    pub fn has_block(&self, group: usize, id: &Id) -> bool {
        self.blocks.contains(&(group, *id))
    }

    /// Was the checkpoint saved, and at which priority (`Some(true)`:
    /// speculatively)?
    pub fn state_priority(&self, group: usize, hash: &Id) -> Option<bool> {
        self.states.get(&(group, *hash)).copied()
    }

    /// Nothing recorded?
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty() && self.states.is_empty()
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

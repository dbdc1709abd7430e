//! An offload layer's tiers below the engine: a memory tier and a disk
//! tier, written through (a save goes to both), a disk hit read back into
//! memory. UCM's pool and disk tier, and LMCache's CPU and disk backends.
//!
//! Each tier keeps speculative checkpoints at a lower priority
//! ([`PriorityCache`]) within a share of its capacity: the scheduler's
//! ([`Scheduler::speculative_share`], from what it saved and the tiers no
//! longer hold, as the store's workers receive it), or one fixed by the
//! caller.

#[allow(unused_imports)] // named in docs
use ucm_coordinator::adapter::Scheduler;

use super::cache::{PriorityCache, Unit};
use super::units::Model;

/// Bytes a load took from each tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    /// From the memory tier.
    pub pool: u64,
    /// From the disk tier.
    pub disk: u64,
}

/// A memory tier over a disk tier.
#[derive(Debug)]
pub struct Tiers {
    /// The memory tier (LRU: CLOCK's order), speculative units first.
    pub pool: PriorityCache,
    /// The disk tier (oldest first, down to 90% of the capacity),
    /// speculative units first.
    pub disk: PriorityCache,
    /// The speculative share now.
    share: f64,
    /// A share fixed by the caller instead of the scheduler's.
    fixed: Option<f64>,
}

impl Tiers {
    /// Tiers of `pool` and `disk` bytes, whose speculative share is 1/2
    /// until [`Tiers::follow_share`] sets it.
    pub fn new(pool: u64, disk: u64) -> Self {
        Self::with_share(pool, disk, None)
    }

    /// Tiers of `pool` and `disk` bytes; `share`: the speculative share,
    /// fixed (clamped to 0-1; 0: speculative units are evicted before any
    /// sure unit), or `None` to follow [`Tiers::follow_share`].
    pub fn with_share(pool: u64, disk: u64, share: Option<f64>) -> Self {
        let mut t = Tiers {
            pool: PriorityCache::new(pool, 1.0),
            disk: PriorityCache::new(disk, 0.9),
            share: 0.5,
            fixed: share.map(|s| s.clamp(0.0, 1.0)),
        };
        t.apply_share();
        t
    }

    /// The larger tier's bytes.
    pub fn capacity(&self) -> u64 {
        self.pool.capacity().max(self.disk.capacity())
    }

    /// Gives both tiers the current speculative share.
    fn apply_share(&mut self) {
        let share = self.speculative_share();
        self.pool.set_speculative_share(share);
        self.disk.set_speculative_share(share);
    }

    /// Is `u` in either tier?
    pub fn contains(&self, u: &Unit) -> bool {
        self.pool.contains(u) || self.disk.contains(u)
    }

    /// The share of each tier speculative units may keep.
    pub fn speculative_share(&self) -> f64 {
        self.fixed.unwrap_or(self.share)
    }

    /// Gives the tiers the scheduler's share (clamped to 0-1), unless the
    /// caller fixed one.
    pub fn follow_share(&mut self, share: f64) {
        self.share = share.clamp(0.0, 1.0);
        self.apply_share();
    }

    /// Loads `units`: a memory hit refreshes it; a disk hit refreshes the
    /// file and fills the memory tier; a speculative unit loaded becomes
    /// sure in both. Units in neither tier are skipped.
    /// Units that left both tiers (the fill evicted them) go to `gone`.
    pub fn load(&mut self, m: &Model, units: &[Unit], mut gone: impl FnMut(Unit)) -> Loaded {
        let mut got = Loaded::default();
        let mut evicted = Vec::new();
        for u in units {
            if self.pool.touch(u) {
                got.pool += m.bytes(u);
                self.disk.touch(u);
            } else if self.disk.touch(u) {
                got.disk += m.bytes(u);
                self.pool
                    .insert(*u, m.bytes(u), None, |v, s| evicted.push((v, s)));
            }
        }
        self.settle(evicted, &mut gone);
        got
    }

    /// Saves `units` (each with its speculative level, `None` for sure) to
    /// both tiers, in order; units that left both tiers go to `gone`.
    pub fn store(&mut self, m: &Model, units: &[(Unit, Option<u8>)], mut gone: impl FnMut(Unit)) {
        let mut evicted = Vec::new();
        for &(u, level) in units {
            let b = m.bytes(&u);
            self.pool.insert(u, b, level, |v, s| evicted.push((v, s)));
            self.disk.insert(u, b, level, |v, s| evicted.push((v, s)));
        }
        self.settle(evicted, &mut gone);
    }

    /// Units evicted from a tier: those in neither tier now are gone.
    fn settle(&mut self, evicted: Vec<(Unit, bool)>, gone: &mut impl FnMut(Unit)) {
        for (v, _) in evicted {
            if !self.contains(&v) {
                gone(v);
            }
        }
    }
}

//! An offload layer's tiers below the engine: a memory tier and a disk
//! tier, written through (a save goes to both), a disk hit read back into
//! memory. UCM's pool and disk tier, and LMCache's CPU and disk backends.

use super::cache::{ByteLru, Unit};
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
    /// The memory tier (LRU: CLOCK's order).
    pub pool: ByteLru,
    /// The disk tier (oldest first, down to 90% of the capacity).
    pub disk: ByteLru,
}

impl Tiers {
    /// Tiers of `pool` and `disk` bytes.
    pub fn new(pool: u64, disk: u64) -> Self {
        Tiers {
            pool: ByteLru::new(pool, 1.0),
            disk: ByteLru::new(disk, 0.9),
        }
    }

    /// Is `u` in either tier?
    pub fn contains(&self, u: &Unit) -> bool {
        self.pool.contains(u) || self.disk.contains(u)
    }

    /// Loads `units`: a memory hit refreshes it; a disk hit refreshes the
    /// file and fills the memory tier. Units in neither tier are skipped.
    /// Units that left both tiers (the fill evicted them) go to `gone`.
    pub fn load(&mut self, m: &Model, units: &[Unit], mut gone: impl FnMut(Unit)) -> Loaded {
        let mut got = Loaded::default();
        let mut evicted = Vec::new();
        for u in units {
            if self.pool.touch(u) {
                got.pool += m.bytes(u);
            } else if self.disk.touch(u) {
                got.disk += m.bytes(u);
                self.pool.insert(*u, m.bytes(u), |v| evicted.push(v));
            }
        }
        for v in evicted {
            if !self.contains(&v) {
                gone(v);
            }
        }
        got
    }

    /// Saves `units` to both tiers, in order; units that left both tiers go
    /// to `gone`.
    pub fn store(&mut self, m: &Model, units: &[Unit], mut gone: impl FnMut(Unit)) {
        let mut evicted = Vec::new();
        for u in units {
            let b = m.bytes(u);
            self.pool.insert(*u, b, |v| evicted.push(v));
            self.disk.insert(*u, b, |v| evicted.push(v));
        }
        for v in evicted {
            if !self.contains(&v) {
                gone(v);
            }
        }
    }
}

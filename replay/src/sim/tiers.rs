//! An offload layer's tiers below the engine: a memory tier and a disk
//! tier, written through (a save goes to both), a disk hit read back into
//! memory. UCM's pool and disk tier, and LMCache's CPU and disk backends.
//!
//! Each tier keeps speculative checkpoints at a lower priority
//! ([`PriorityCache`]) within a share of its capacity: the scheduler's
//! ([`Scheduler::speculative_share`], from what it saved and the tiers no
//! longer hold, as the store's workers receive it), or one fixed by the
//! caller.
//!
//! How the bytes are split between groups ([`Split`]): one budget for
//! every group's units, or as the store keeps them, a pool per group and
//! the disk tiers one byte budget (D84), or a pool and a disk tier per
//! group (the store before D84).

#[allow(unused_imports)] // named in docs
use ucm_coordinator::adapter::Scheduler;

use serde::Serialize;

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

/// How a tier's bytes are split between the groups.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Split {
    /// One budget for every group's units, in memory and on disk.
    #[default]
    One,
    /// As the store keeps them (D84): a pool per group, each of the same
    /// bytes (`pool_bytes`), and one byte budget for every group's disk
    /// tier.
    Store,
    /// As the store kept them before D84: a pool per group of the same
    /// bytes and a disk tier per group of the same number of that group's
    /// files (`disk_blocks`, each group's bytes in proportion to its
    /// unit's).
    Groups,
}

impl Split {
    /// The name the CLI takes: `one`, `store` or `groups`.
    pub fn name(self) -> &'static str {
        match self {
            Split::One => "one",
            Split::Store => "store",
            Split::Groups => "groups",
        }
    }
}

/// A memory tier over a disk tier, each one cache or one per group.
#[derive(Debug)]
pub struct Tiers {
    /// The memory tiers (LRU: CLOCK's order), speculative units first.
    pools: Vec<PriorityCache>,
    /// The disk tiers (oldest first, down to 90% of the capacity),
    /// speculative units first.
    disks: Vec<PriorityCache>,
    /// Per group index, its pool (empty: every group in pool 0).
    pool_of: Vec<usize>,
    /// Per group index, its disk tier (empty: every group in disk 0).
    disk_of: Vec<usize>,
    /// The speculative share now.
    share: f64,
    /// A share fixed by the caller instead of the scheduler's.
    fixed: Option<f64>,
}

fn pool(bytes: u64) -> PriorityCache {
    PriorityCache::new(bytes, 1.0)
}

fn disk(bytes: u64) -> PriorityCache {
    PriorityCache::new(bytes, 0.9)
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
        Self::split(None, Split::One, pool, disk, share)
    }

    /// Tiers of `pool` and `disk` bytes in all, split between the groups
    /// of `m` as `split` says ([`Split::One`] ignores `m`).
    pub fn split(
        m: Option<&Model>,
        split: Split,
        pool_bytes: u64,
        disk_bytes: u64,
        share: Option<f64>,
    ) -> Self {
        let n = match (split, m) {
            (Split::One, _) | (_, None) => 0,
            (_, Some(m)) => m.spec.groups().len(),
        };
        let (pools, pool_of) = if n == 0 {
            (vec![pool(pool_bytes)], Vec::new())
        } else {
            let each = pool_bytes / n as u64;
            ((0..n).map(|_| pool(each)).collect(), (0..n).collect())
        };
        let (disks, disk_of) = match (split, m) {
            (Split::Groups, Some(m)) if n > 0 => {
                let unit: Vec<u64> = (0..n).map(|g| m.spec.unit_bytes(g)).collect();
                let total = unit.iter().sum::<u64>().max(1);
                let part =
                    |u: u64| (u128::from(disk_bytes) * u128::from(u) / u128::from(total)) as u64;
                (
                    unit.iter().map(|&u| disk(part(u))).collect(),
                    (0..n).collect(),
                )
            }
            _ => (vec![disk(disk_bytes)], Vec::new()),
        };
        let mut t = Tiers {
            pools,
            disks,
            pool_of,
            disk_of,
            share: 0.5,
            fixed: share.map(|s| s.clamp(0.0, 1.0)),
        };
        t.apply_share();
        t
    }

    /// The larger tier's bytes (summed over the groups').
    pub fn capacity(&self) -> u64 {
        let sum = |v: &[PriorityCache]| v.iter().map(PriorityCache::capacity).sum::<u64>();
        sum(&self.pools).max(sum(&self.disks))
    }

    /// Gives every tier the current speculative share.
    fn apply_share(&mut self) {
        let share = self.speculative_share();
        for t in self.pools.iter_mut().chain(self.disks.iter_mut()) {
            t.set_speculative_share(share);
        }
    }

    /// The pool and the disk tier of `u`'s group.
    fn of(&self, u: &Unit) -> (usize, usize) {
        let g = match u {
            Unit::Block { group, .. } | Unit::State { group, .. } => usize::from(*group),
        };
        (
            self.pool_of.get(g).copied().unwrap_or(0),
            self.disk_of.get(g).copied().unwrap_or(0),
        )
    }

    /// Is `u` in either tier?
    pub fn contains(&self, u: &Unit) -> bool {
        let (p, d) = self.of(u);
        self.pools[p].contains(u) || self.disks[d].contains(u)
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
            let (p, d) = self.of(u);
            if self.pools[p].touch(u) {
                got.pool += m.bytes(u);
                self.disks[d].touch(u);
            } else if self.disks[d].touch(u) {
                got.disk += m.bytes(u);
                self.pools[p].insert(*u, m.bytes(u), None, |v, s| evicted.push((v, s)));
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
            let (p, d) = self.of(&u);
            self.pools[p].insert(u, b, level, |v, s| evicted.push((v, s)));
            self.disks[d].insert(u, b, level, |v, s| evicted.push((v, s)));
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

//! The capacity model of one cache tier: units (a chain block of one
//! group, or one group's state at one position) with their sizes at full
//! scale, evicted least recently used first once the bytes held pass the
//! capacity, down to a low watermark.
//!
//! Used for every tier of the capacity-only replay: an engine's device
//! prefix cache (vLLM frees a finished request's blocks to an LRU free
//! queue; SGLang's radix cache evicts least recently used leaves), UCM's
//! memory pool (CLOCK, approximated by LRU: second chance over a set of
//! slots evicts in about recency order) and UCM's disk tier (its GC deletes
//! the oldest files by mtime, refreshed on hits, down to 90% of the
//! capacity), and LMCache's CPU and disk backends (LRU).

use std::collections::{HashMap, VecDeque};

use crate::coordinator::hash::Id;

/// One cached unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// The K/V block of chain or sidecar group `group` with chain id `id`.
    Block {
        /// Group index in the spec table.
        group: u16,
        /// Chain id (a function of the prefix up to the block's end).
        id: Id,
    },
    /// The state of snapshot group `group` whose prefix hash is `hash`
    /// (`H(p)` commits to its position).
    State {
        /// Group index in the spec table.
        group: u16,
        /// Prefix hash `H(p)`.
        hash: Id,
    },
}

/// A byte-bounded LRU of units. Recency is a stamp; the queue holds
/// `(stamp, unit)` in stamp order and entries whose stamp is stale are
/// skipped (and compacted away), so touching is O(1).
#[derive(Debug)]
pub struct ByteLru {
    capacity: u64,
    low: u64,
    held: u64,
    clock: u64,
    map: HashMap<Unit, (u64, u64)>,
    queue: VecDeque<(u64, Unit)>,
    /// Units evicted so far.
    pub evicted: u64,
}

impl ByteLru {
    /// Holds at most `capacity` bytes; once above it, evicts down to
    /// `low_fraction` of it (1.0: just below the capacity).
    pub fn new(capacity: u64, low_fraction: f64) -> Self {
        let low = (capacity as f64 * low_fraction.clamp(0.0, 1.0)) as u64;
        ByteLru {
            capacity,
            low: low.min(capacity),
            held: 0,
            clock: 0,
            map: HashMap::new(),
            queue: VecDeque::new(),
            evicted: 0,
        }
    }

    /// Bytes held.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// Is `u` held?
    pub fn contains(&self, u: &Unit) -> bool {
        self.map.contains_key(u)
    }

    /// Makes `u` the most recent, if held; returns whether it was.
    pub fn touch(&mut self, u: &Unit) -> bool {
        self.clock += 1;
        let c = self.clock;
        match self.map.get_mut(u) {
            Some(e) => {
                e.0 = c;
                self.queue.push_back((c, *u));
                self.compact();
                true
            }
            None => false,
        }
    }

    /// Inserts (or refreshes) `u` of `bytes` as the most recent; units
    /// evicted to make room are passed to `evicted`. A unit larger than the
    /// whole capacity is not kept.
    pub fn insert(&mut self, u: Unit, bytes: u64, mut evicted: impl FnMut(Unit)) {
        if bytes > self.capacity {
            return;
        }
        if self.touch(&u) {
            return;
        }
        let c = self.clock;
        self.map.insert(u, (c, bytes));
        self.queue.push_back((c, u));
        self.held += bytes;
        if self.held > self.capacity {
            while self.held > self.low {
                let Some((stamp, v)) = self.queue.pop_front() else {
                    break;
                };
                if self.map.get(&v).is_some_and(|e| e.0 == stamp) {
                    if let Some((_, b)) = self.map.remove(&v) {
                        self.held -= b;
                        self.evicted += 1;
                        evicted(v);
                    }
                }
            }
        }
    }

    /// Drops stale queue entries once they outnumber the live ones.
    fn compact(&mut self) {
        if self.queue.len() > 2 * self.map.len() + 1024 {
            let map = &self.map;
            self.queue
                .retain(|(stamp, u)| map.get(u).is_some_and(|e| e.0 == *stamp));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(n: u8) -> Unit {
        Unit::Block {
            group: 0,
            id: [n; 16],
        }
    }

    #[test]
    fn evicts_the_least_recent_first_and_touch_refreshes() {
        let mut c = ByteLru::new(30, 1.0);
        let mut gone = Vec::new();
        for n in 0..3 {
            c.insert(b(n), 10, |u| gone.push(u));
        }
        assert!(c.touch(&b(0)));
        c.insert(b(3), 10, |u| gone.push(u));
        assert_eq!(gone, vec![b(1)]);
        assert!(c.contains(&b(0)) && c.contains(&b(2)) && c.contains(&b(3)));
        assert_eq!(c.held(), 30);
    }

    #[test]
    fn a_low_watermark_evicts_below_the_capacity() {
        let mut c = ByteLru::new(100, 0.5);
        let mut gone = 0;
        for n in 0..11 {
            c.insert(b(n), 10, |_| gone += 1);
        }
        // 110 > 100: evict down to 50.
        assert_eq!(gone, 6);
        assert_eq!(c.held(), 50);
        assert!(!c.contains(&b(5)) && c.contains(&b(6)));
    }

    #[test]
    fn a_unit_larger_than_the_capacity_is_not_kept() {
        let mut c = ByteLru::new(10, 1.0);
        c.insert(b(1), 11, |_| panic!("nothing to evict"));
        assert!(!c.contains(&b(1)));
        assert_eq!(c.held(), 0);
    }

    #[test]
    fn stale_entries_are_compacted_without_losing_order() {
        let mut c = ByteLru::new(20, 1.0);
        c.insert(b(1), 10, |_| {});
        c.insert(b(2), 10, |_| {});
        for _ in 0..5000 {
            c.touch(&b(1));
        }
        assert!(c.queue.len() < 3000);
        let mut gone = Vec::new();
        c.insert(b(3), 10, |u| gone.push(u));
        assert_eq!(gone, vec![b(2)]);
    }
}

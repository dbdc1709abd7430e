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

use ucm_coordinator::hash::Id;
#[allow(unused_imports)] // named in docs
use ucm_coordinator::retention::SpeculativeBudget;
use ucm_coordinator::retention::MAX_LEVEL;

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

    /// Removes `u`; returns its bytes if it was held.
    pub fn remove(&mut self, u: &Unit) -> Option<u64> {
        let (_, b) = self.map.remove(u)?;
        self.held -= b;
        self.compact();
        Some(b)
    }

    /// The least recent unit, if any (stale queue entries at the front
    /// are dropped on the way).
    pub fn peek_oldest(&mut self) -> Option<Unit> {
        while let Some(&(stamp, v)) = self.queue.front() {
            if self.map.get(&v).is_some_and(|e| e.0 == stamp) {
                return Some(v);
            }
            self.queue.pop_front();
        }
        None
    }

    /// Removes and returns the least recent unit with its bytes.
    pub fn pop_oldest(&mut self) -> Option<(Unit, u64)> {
        while let Some((stamp, v)) = self.queue.pop_front() {
            if self.map.get(&v).is_some_and(|e| e.0 == stamp) {
                let (_, b) = self.map.remove(&v)?;
                self.held -= b;
                return Some((v, b));
            }
        }
        None
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

/// A byte-bounded cache of two priorities (retention's
/// [`Priority`](ucm_coordinator::retention::Priority)): sure units
/// (K/V blocks, sure checkpoints) and speculative checkpoints by level.
/// Once the bytes held pass the capacity, it evicts down to the low
/// watermark: while speculative units hold more than their share of the
/// capacity (the [`SpeculativeBudget`]), speculative units; otherwise
/// sure units, the least recent first (as ARC keeps each of its lists to
/// its target). A speculative unit that a request loads is promoted to
/// sure.
///
/// Speculative units go in the order of their age less `level` times the
/// span the sure units cover (the age of the least recent one, ages
/// counted in bytes written since): a level buys a unit one span of the
/// tier's sure data, so that under pressure the densest level goes first
/// among units of one time, while a unit that has outlived the K/V it
/// resumes over goes whatever its level (the disk tier's GC orders its
/// low files the same way, in time: D83).
#[derive(Debug)]
pub struct PriorityCache {
    capacity: u64,
    low: u64,
    sure: ByteLru,
    /// Speculative units, one recency list per level.
    spec: Vec<ByteLru>,
    spec_held: u64,
    /// Of the capacity, the share speculative units may keep before sure
    /// ones are evicted (retention's [`SpeculativeBudget`]); beyond it
    /// they go first.
    share: f64,
    /// Units evicted so far.
    pub evicted: u64,
    /// Speculative units promoted so far.
    pub promoted: u64,
    /// Bytes inserted so far: the clock of ages.
    clock: u64,
    /// Each held unit's clock at its insertion or last use.
    stamps: HashMap<Unit, u64>,
}

impl PriorityCache {
    /// Holds at most `capacity` bytes; once above it, evicts down to
    /// `low_fraction` of it.
    pub fn new(capacity: u64, low_fraction: f64) -> Self {
        let low = (capacity as f64 * low_fraction.clamp(0.0, 1.0)) as u64;
        PriorityCache {
            capacity,
            low: low.min(capacity),
            sure: ByteLru::new(u64::MAX, 1.0),
            spec: (0..=MAX_LEVEL)
                .map(|_| ByteLru::new(u64::MAX, 1.0))
                .collect(),
            spec_held: 0,
            share: 0.0,
            evicted: 0,
            promoted: 0,
            clock: 0,
            stamps: HashMap::new(),
        }
    }

    /// Sets the share of the capacity speculative units may keep (0: they
    /// are always evicted first; 1: sure units are, while any is left).
    pub fn set_speculative_share(&mut self, share: f64) {
        self.share = share.clamp(0.0, 1.0);
    }

    /// Bytes held.
    pub fn held(&self) -> u64 {
        self.sure.held() + self.spec_held
    }

    /// The capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes of speculative units held.
    pub fn speculative_held(&self) -> u64 {
        self.spec_held
    }

    fn spec_level(&self, u: &Unit) -> Option<usize> {
        self.spec.iter().position(|l| l.contains(u))
    }

    /// Is `u` held (at either priority)?
    pub fn contains(&self, u: &Unit) -> bool {
        self.sure.contains(u) || self.spec_level(u).is_some()
    }

    fn take_spec(&mut self, u: &Unit) -> Option<u64> {
        let level = self.spec_level(u)?;
        let b = self.spec[level].remove(u)?;
        self.spec_held -= b;
        self.stamps.remove(u);
        Some(b)
    }

    fn stamp(&mut self, u: Unit) {
        self.stamps.insert(u, self.clock);
    }

    /// A request used `u`: it becomes the most recent, and sure if it was
    /// speculative. Returns whether it was held.
    pub fn touch(&mut self, u: &Unit) -> bool {
        if self.sure.touch(u) {
            self.stamp(*u);
            return true;
        }
        match self.take_spec(u) {
            Some(b) => {
                self.promoted += 1;
                self.sure.insert(*u, b, |_| {});
                self.stamp(*u);
                true
            }
            None => false,
        }
    }

    /// Inserts (or refreshes) `u` of `bytes`, speculative at `level` or
    /// sure (`None`); units evicted to make room go to `evicted` with
    /// whether they were speculative. A held unit is refreshed (and raised
    /// to sure when inserted as sure). A unit larger than the whole
    /// capacity is not kept.
    pub fn insert(
        &mut self,
        u: Unit,
        bytes: u64,
        level: Option<u8>,
        mut evicted: impl FnMut(Unit, bool),
    ) {
        if bytes > self.capacity {
            return;
        }
        if self.sure.touch(&u) {
            self.stamp(u);
            return;
        }
        if let Some(held) = self.spec_level(&u) {
            match level {
                Some(_) => {
                    self.spec[held].touch(&u);
                }
                None => {
                    if let Some(b) = self.take_spec(&u) {
                        self.sure.insert(u, b, |_| {});
                    }
                }
            }
            self.stamp(u);
            return;
        }
        self.clock += bytes;
        match level {
            Some(l) => {
                let l = usize::from(l.min(MAX_LEVEL));
                self.spec[l].insert(u, bytes, |_| {});
                self.spec_held += bytes;
            }
            None => self.sure.insert(u, bytes, |_| {}),
        }
        self.stamp(u);
        if self.held() > self.capacity {
            let keep = (self.capacity as f64 * self.share) as u64;
            while self.held() > self.low {
                let gone = if self.spec_held > keep || self.sure.held() == 0 {
                    // Over their share: speculative units go, by age less
                    // their level's credit (`pop_spec`).
                    self.pop_spec().map(|v| (v, true))
                } else {
                    // Within it: sure units go, the least recent first.
                    self.sure.pop_oldest().map(|(v, _)| {
                        self.stamps.remove(&v);
                        (v, false)
                    })
                };
                let Some((v, was_speculative)) = gone else {
                    break;
                };
                self.evicted += 1;
                evicted(v, was_speculative);
            }
        }
    }

    /// Evicts the speculative unit whose age less its level's credit is
    /// the greatest: each level's least recent unit is a candidate, and a
    /// level is worth the span of the sure units (the age of the least
    /// recent one; 0 when none is held: then the oldest goes).
    fn pop_spec(&mut self) -> Option<Unit> {
        let span = self
            .sure
            .peek_oldest()
            .and_then(|v| self.stamps.get(&v))
            .map_or(0, |&t| self.clock - t);
        let mut best: Option<(u64, usize)> = None;
        for l in 0..self.spec.len() {
            let Some(v) = self.spec[l].peek_oldest() else {
                continue;
            };
            let t = self.stamps.get(&v).copied().unwrap_or(0);
            // Smaller is older: the stamp plus the level's credit.
            let key = t.saturating_add(span.saturating_mul(l as u64));
            if best.is_none_or(|(k, _)| key < k) {
                best = Some((key, l));
            }
        }
        let (_, l) = best?;
        let (v, b) = self.spec[l].pop_oldest()?;
        self.spec_held -= b;
        self.stamps.remove(&v);
        Some(v)
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

    #[test]
    fn speculative_units_go_first_lowest_level_first_and_a_use_promotes() {
        let mut c = PriorityCache::new(40, 1.0);
        let mut gone = Vec::new();
        c.insert(b(1), 10, None, |u, s| gone.push((u, s)));
        c.insert(b(2), 10, Some(3), |u, s| gone.push((u, s)));
        c.insert(b(3), 10, Some(0), |u, s| gone.push((u, s)));
        c.insert(b(4), 10, Some(0), |u, s| gone.push((u, s)));
        // A use promotes b(4) to sure.
        assert!(c.touch(&b(4)));
        assert_eq!(c.promoted, 1);
        // Share 0: speculative units go first, the lowest level first,
        // though b(1) is older.
        c.insert(b(5), 10, None, |u, s| gone.push((u, s)));
        assert_eq!(gone, vec![(b(3), true)]);
        c.insert(b(6), 10, None, |u, s| gone.push((u, s)));
        assert_eq!(gone[1], (b(2), true));
        // No speculative unit left: the least recent sure one.
        c.insert(b(7), 10, None, |u, s| gone.push((u, s)));
        assert_eq!(gone[2], (b(1), false));
        assert!(c.contains(&b(4)) && c.contains(&b(7)));
    }

    #[test]
    fn a_speculative_unit_that_outlived_the_sure_span_goes_before_a_lower_level() {
        let mut c = PriorityCache::new(50, 1.0);
        c.set_speculative_share(0.4);
        let mut gone = Vec::new();
        // b(2) at level 1 (clock 10), then sure units 11-17: the four
        // oldest go while b(2) is within the share.
        c.insert(b(2), 10, Some(1), |u, s| gone.push((u, s)));
        for n in 11..=17 {
            c.insert(b(n), 10, None, |u, s| gone.push((u, s)));
        }
        c.insert(b(3), 10, Some(0), |u, s| gone.push((u, s)));
        assert_eq!(gone.len(), 4);
        assert!(gone.iter().all(|&(_, s)| !s), "{gone:?}");
        // Over the share: the sure units span 40 bytes of writes (b(15)
        // at 60 to 100); b(2), written at 10, is 90 old, more than its one
        // level's credit over b(3) (written at 90, level 0).
        c.insert(b(4), 10, Some(0), |u, s| gone.push((u, s)));
        assert_eq!(gone[4], (b(2), true));
        assert!(c.contains(&b(3)) && c.contains(&b(4)));
    }

    #[test]
    fn within_their_share_speculative_units_stay_and_sure_ones_go() {
        let mut c = PriorityCache::new(40, 1.0);
        c.set_speculative_share(0.5);
        let mut gone = Vec::new();
        c.insert(b(1), 10, Some(0), |u, s| gone.push((u, s)));
        c.insert(b(2), 10, None, |u, s| gone.push((u, s)));
        c.insert(b(3), 10, None, |u, s| gone.push((u, s)));
        c.insert(b(4), 10, None, |u, s| gone.push((u, s)));
        c.insert(b(5), 10, None, |u, s| gone.push((u, s)));
        // 10 speculative bytes within a share of 20: the oldest sure goes.
        assert_eq!(gone, vec![(b(2), false)]);
        assert_eq!(c.speculative_held(), 10);
    }
}

//! Retention: where snapshot groups create checkpoints (DESIGN.md section 6).
//!
//! Three triggers, each position aligned down to the group's grid, and
//! further to the model's common grid (the LCM of the chain block sizes and
//! the snapshot grids): a checkpoint off the common grid could never be
//! servable (DESIGN.md section 5), so keeping one would only cost space.
//!
//! 1. **request end**, only when new computation produced new state: the
//!    end aligned down must lie beyond the position the request resumed
//!    from (a full hit with nothing new is skipped);
//! 2. the **second unserved occurrence** of the same prefix: the deepest
//!    hash-block boundary this request shares with an earlier unserved one
//!    ([`RecurrenceTracker`]); a request served from cache does not count;
//! 3. every `interval` tokens of input and output.
//!
//! Only positions beyond the resume point are planned: what was loaded is
//! already stored.

use std::collections::{HashMap, VecDeque};

use crate::hash::Id;
use crate::spec::{Group, Kind};

fn align_down(p: u64, grid: u64) -> u64 {
    p / grid.max(1) * grid.max(1)
}

/// Positions where `group` keeps checkpoints for a request that resumed at
/// `start` (its `p*`) and ended at `end` tokens (input and output), by the
/// request-end and interval triggers, aligned down to `lcm(group grid,
/// common_grid)`. Ascending, deduplicated.
pub fn plan(group: &Group, common_grid: u64, start: u64, end: u64) -> Vec<u64> {
    let grid = crate::spec::lcm(group.block.max(1), common_grid.max(1));
    let Some(policy) = (group.kind == Kind::Snapshot)
        .then_some(group.retention.as_ref())
        .flatten()
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if let Some(n) = policy.interval.filter(|&n| n > 0) {
        let mut k = start / n + 1;
        while k.saturating_mul(n) <= end {
            let p = align_down(k * n, grid);
            if p > start {
                out.push(p);
            }
            k += 1;
        }
    }
    if policy.request_end {
        let p = align_down(end, grid);
        if p > start {
            out.push(p);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Remembers prefixes of unserved requests to find the second unserved
/// occurrence of a prefix (retention trigger 2). Bounded: the oldest
/// requests are forgotten first.
#[derive(Debug)]
pub struct RecurrenceTracker {
    seen: HashMap<Id, u32>,
    order: VecDeque<Vec<Id>>,
    capacity: usize,
}

impl RecurrenceTracker {
    /// Remembers the prefixes of at most `capacity` unserved requests.
    pub fn new(capacity: usize) -> Self {
        RecurrenceTracker {
            seen: HashMap::new(),
            order: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// Observes a request of `group` whose hash-block chain ids (the
    /// group's own chain, hash block `group.hash_block`) are `ids` and that
    /// resumed at `p_star`. For an unserved request (`p_star == 0`) that
    /// shares a prefix with an earlier unserved one, returns the common
    /// boundary aligned down to `lcm(group grid, common_grid)`, when that is
    /// positive. Served requests are neither counted nor answered.
    pub fn observe(
        &mut self,
        group: &Group,
        common_grid: u64,
        ids: &[Id],
        p_star: u64,
    ) -> Option<u64> {
        if group.kind != Kind::Snapshot
            || p_star > 0
            || !group.retention.as_ref().is_some_and(|r| r.second_unserved)
        {
            return None;
        }
        let shared = ids
            .iter()
            .take_while(|id| self.seen.contains_key(*id))
            .count();
        let grid = crate::spec::lcm(group.block.max(1), common_grid.max(1));
        let boundary = align_down(shared as u64 * group.hash_block, grid);
        for id in ids {
            *self.seen.entry(*id).or_insert(0) += 1;
        }
        self.order.push_back(ids.to_vec());
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                for id in old {
                    if let std::collections::hash_map::Entry::Occupied(mut e) = self.seen.entry(id)
                    {
                        *e.get_mut() -= 1;
                        if *e.get() == 0 {
                            e.remove();
                        }
                    }
                }
            }
        }
        (boundary > 0).then_some(boundary)
    }
}

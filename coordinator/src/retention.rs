//! Retention: where snapshot groups create checkpoints (DESIGN.md section 6).
//!
//! Four triggers, each position aligned down to the group's grid, and
//! further to the model's common grid (the LCM of the chain block sizes and
//! the snapshot grids): a checkpoint off the common grid could never be
//! servable (DESIGN.md section 5), so keeping one would only cost space.
//!
//! Sure checkpoints ([`Priority::Sure`]): reuse is certain or observed.
//!
//! 1. **request end**, only when new computation produced new state: the
//!    end aligned down must lie beyond the position the request resumed
//!    from (a full hit with nothing new is skipped);
//! 2. the **junction of an unserved occurrence**: the deepest hash-block
//!    boundary this request shares with an earlier request, when the
//!    request was not served up to there ([`RecurrenceTracker`]); a prefix
//!    already served from cache does not count again;
//! 3. every `interval` tokens of input and output.
//!
//! Speculative checkpoints ([`Priority::Speculative`]):
//!
//! 4. points of the prompt at the **junction spacing**
//!    ([`speculative_plan`], [`JunctionLog`]), and the prompt's last
//!    servable point: the first occurrence of a prefix cannot know where a
//!    later request will diverge from it, so it keeps states along the way.
//!    The spacing follows observed reuse: the coarsest power-of-two
//!    multiple of the grid on which every recent junction (where requests
//!    were seen to diverge from earlier ones) lies; before any junction is
//!    seen, the grid itself, widened until a state costs no more than the
//!    K/V of the tokens it follows ([`speculative_spacing`]). The tiers
//!    keep these at a lower priority ([`Priority::Speculative`]): evicted
//!    first while they exceed their share of the capacity
//!    ([`SpeculativeBudget`]), the densest level first among checkpoints
//!    of one time, so that the spacing that survives follows the room
//!    there is, while one older than its level's credit (a level is worth
//!    the span the tier's sure data covers) goes whatever its level;
//!    promoted when a request resumes from one.
//!
//! Only positions beyond the resume point are planned: what was loaded is
//! already stored.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::group::{Group, Kind};
use crate::hash::Id;

fn align_down(p: u64, grid: u64) -> u64 {
    p / grid.max(1) * grid.max(1)
}

/// How sure retention is that a checkpoint will be reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Kept on speculation only (trigger 4), at a level: a checkpoint at
    /// an odd multiple of the spacing is level 0, one at an odd multiple of
    /// twice the spacing level 1, and so on (the prompt's last servable
    /// point is [`MAX_LEVEL`]). Tiers evict speculative checkpoints before
    /// sure data (within their share, [`SpeculativeBudget`]) and, among
    /// checkpoints of one time, lower levels first, so that under
    /// pressure the spacing that survives doubles, and halves again as
    /// room returns; each level is worth the span of the tier's sure data
    /// in age, so a checkpoint that outlived the K/V it resumes over goes
    /// whatever its level. A use promotes one to [`Priority::Sure`].
    Speculative(u8),
    /// Kept on certain or observed reuse (triggers 1-3).
    Sure,
}

/// The highest speculative level.
pub const MAX_LEVEL: u8 = 15;

/// The grid of `group`'s checkpoints: `lcm(group grid, common_grid)`.
pub fn checkpoint_grid(group: &Group, common_grid: u64) -> u64 {
    crate::spec::lcm(group.block.max(1), common_grid.max(1))
}

/// Speculative positions (trigger 4) of `group` for a request that resumed
/// at `start` and whose prompt has `prompt_len` tokens: the multiples of
/// `spacing` (rounded up to the group's checkpoint grid; `None`: none)
/// strictly between them, and the prompt's last servable point (its last
/// grid point before the last token: where a repeat of the same prompt
/// resumes, since the last token is always computed). Ascending; empty
/// for groups without the trigger.
pub fn speculative_plan(
    group: &Group,
    common_grid: u64,
    start: u64,
    prompt_len: u64,
    spacing: Option<u64>,
) -> Vec<(u64, u8)> {
    let on =
        group.kind == Kind::Snapshot && group.retention.as_ref().is_some_and(|r| r.speculative);
    if !on {
        return Vec::new();
    }
    let grid = checkpoint_grid(group, common_grid);
    let mut out = Vec::new();
    if let Some(spacing) = spacing {
        let step = spacing.max(1).div_ceil(grid).saturating_mul(grid);
        let mut p = (start / step + 1).saturating_mul(step);
        while p < prompt_len {
            let level = ((p / step).trailing_zeros() as u8).min(MAX_LEVEL - 1);
            out.push((p, level));
            p = p.saturating_add(step);
        }
    }
    let last = align_down(prompt_len.saturating_sub(1), grid);
    if last > start {
        match out.last_mut() {
            Some(q) if q.0 == last => q.1 = MAX_LEVEL,
            Some(q) if q.0 > last => {}
            _ => out.push((last, MAX_LEVEL)),
        }
    }
    out
}

/// The recent junctions of a group: positions where a request was seen to
/// diverge from an earlier one (its shared boundary, when the request goes
/// on past it). They set the spacing of speculative checkpoints
/// ([`JunctionLog::spacing`]): every junction seen lies on it, and no
/// coarser one would hold them all. Bounded: the oldest are forgotten.
#[derive(Debug)]
pub struct JunctionLog {
    recent: VecDeque<u64>,
    capacity: usize,
    gcd: u64,
}

impl JunctionLog {
    /// Remembers the last `capacity` junctions.
    pub fn new(capacity: usize) -> Self {
        JunctionLog {
            recent: VecDeque::new(),
            capacity: capacity.max(1),
            gcd: 0,
        }
    }

    /// Records a junction at `position` (0 is ignored).
    pub fn observe(&mut self, position: u64) {
        if position == 0 {
            return;
        }
        self.recent.push_back(position);
        let mut recompute = false;
        while self.recent.len() > self.capacity {
            self.recent.pop_front();
            recompute = true;
        }
        self.gcd = if recompute {
            self.recent.iter().fold(0, |a, &b| crate::spec::gcd(a, b))
        } else {
            crate::spec::gcd(self.gcd, position)
        };
    }

    /// Junctions remembered.
    pub fn len(&self) -> usize {
        self.recent.len()
    }

    /// Whether no junction was seen yet.
    pub fn is_empty(&self) -> bool {
        self.recent.is_empty()
    }

    /// The spacing of speculative checkpoints on `grid`: `grid` times the
    /// largest power of two that divides every recent junction over the
    /// grid (junctions lie on the grid), or `grid` before any junction was
    /// seen. Powers of two, not the junctions' own common divisor: one
    /// junction at 29 x 512 tokens says that junctions fall on 512-token
    /// boundaries (the blocks of whatever built the prompts), not that the
    /// next one will fall on a multiple of 14,848.
    pub fn spacing(&self, grid: u64) -> u64 {
        let grid = grid.max(1);
        if self.gcd == 0 || self.gcd % grid != 0 {
            return grid;
        }
        let k = (self.gcd / grid).trailing_zeros();
        grid.saturating_mul(1u64 << k.min(62))
    }
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

/// One plan for every snapshot group (`plans`: each group's positions
/// with their priorities). A checkpoint serves only where every snapshot
/// group holds a state at its position (DESIGN.md section 5), so a state
/// kept where another group keeps none, or kept longer than another
/// group's at the same position, costs bytes and serves nothing. Each
/// position any group plans is planned for all of them, at the lowest
/// priority any group gives it: a position's states are then kept and
/// evicted together. (X-Hybrid-96: KDA's interval makes every 1024th token
/// sure while Mamba2 keeps the same position only speculatively; before
/// this rule the tiers evicted the Mamba2 state first and kept the KDA
/// state, which no hit could use, as long as sure data.)
pub fn joint_plan(plans: &mut HashMap<usize, BTreeMap<u64, Priority>>) {
    if plans.len() < 2 {
        return;
    }
    let mut joint: BTreeMap<u64, Priority> = BTreeMap::new();
    for ps in plans.values() {
        for (&p, &pr) in ps {
            joint
                .entry(p)
                .and_modify(|q| *q = (*q).min(pr))
                .or_insert(pr);
        }
    }
    for ps in plans.values_mut() {
        ps.clone_from(&joint);
    }
}

/// The spacing of speculative checkpoints: the junction spacing
/// ([`JunctionLog::spacing`]), widened by powers of two (so that it stays
/// on the junctions) until a state costs no more than the K/V of the
/// tokens it follows: at least `state_bytes / kv_bytes_per_token` tokens
/// apart. Denser than that, a prompt's speculative states would cost more
/// than the prompt's K/V. Tiers thin them further under pressure
/// ([`Priority::Speculative`] levels).
pub fn speculative_spacing(
    junction_spacing: u64,
    state_bytes: u64,
    kv_bytes_per_token: u64,
) -> u64 {
    let need = state_bytes.div_ceil(kv_bytes_per_token.max(1));
    let mut s = junction_spacing.max(1);
    while s < need {
        match s.checked_mul(2) {
            Some(x) => s = x,
            None => break,
        }
    }
    s
}

/// The share of a tier's capacity that speculative checkpoints may keep
/// before sure data (K/V blocks, sure checkpoints) is evicted ahead of
/// them, following observed reuse. The tiers remember what they recently
/// evicted (ghosts, as ARC does: Megiddo and Modha, FAST 2003); each
/// request tells how many bytes of recompute a speculative ghost, and a
/// sure ghost, would have saved it had it stayed (a gain that needed both
/// counts for both). The share is the speculative part of those savings:
/// near 0 while mostly sure data is missed (speculative checkpoints then
/// go first), near 1 while mostly speculative checkpoints are (sure data
/// then goes first). Before any evidence it is 1/2.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SpeculativeBudget {
    speculative: f64,
    sure: f64,
}

impl SpeculativeBudget {
    /// A budget with no evidence (share 1/2).
    pub fn new() -> Self {
        Self::default()
    }

    /// The share of the capacity (0 to 1); 1/2 before any evidence.
    pub fn share(&self) -> f64 {
        let total = self.speculative + self.sure;
        if total > 0.0 {
            self.speculative / total
        } else {
            0.5
        }
    }

    /// One request's evidence: `speculative_gain` bytes of recompute a
    /// speculative ghost would have saved it, `sure_gain` bytes a sure
    /// ghost would have.
    pub fn observe(&mut self, speculative_gain: u64, sure_gain: u64) {
        self.speculative += speculative_gain as f64;
        self.sure += sure_gain as f64;
    }
}

/// What a request shares with the earlier ones a [`RecurrenceTracker`]
/// remembers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shared {
    /// The deepest boundary shared with an earlier request, aligned down to
    /// the group's checkpoint grid (0: nothing shared).
    pub boundary: u64,
    /// Whether the request goes on past it with a different hash block: a
    /// junction, where requests diverge (not a repeat or an extension).
    pub diverges: bool,
}

/// Remembers the prefixes of recent requests, to find where a request
/// meets and leaves an earlier one (retention trigger 2, and the
/// junctions of trigger 4). Bounded: the oldest requests are forgotten
/// first.
#[derive(Debug)]
pub struct RecurrenceTracker {
    seen: HashMap<Id, u32>,
    order: VecDeque<Vec<Id>>,
    capacity: usize,
}

impl RecurrenceTracker {
    /// Remembers the prefixes of at most `capacity` requests.
    pub fn new(capacity: usize) -> Self {
        RecurrenceTracker {
            seen: HashMap::new(),
            order: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// Requests remembered.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Observes a request of `group` whose hash-block chain ids (the
    /// group's own chain, hash block `group.hash_block`) are `ids`: what it
    /// shares with the requests remembered, then remembers it.
    pub fn observe(&mut self, group: &Group, common_grid: u64, ids: &[Id]) -> Shared {
        let shared = ids
            .iter()
            .take_while(|id| self.seen.contains_key(*id))
            .count();
        let grid = checkpoint_grid(group, common_grid);
        let boundary = align_down(shared as u64 * group.hash_block, grid);
        let out = Shared {
            boundary,
            diverges: shared > 0 && shared < ids.len(),
        };
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
        out
    }
}

//! `marconi`: Marconi's admission and eviction (Pan et al., "Marconi:
//! Prefix Caching for the Era of Hybrid LLMs", MLSys 2025, arXiv
//! 2411.19379) below the engine's own prefix cache, with the memory and
//! disk capacities UCM gets.
//!
//! What is followed, from the paper's text:
//! - Section 4 (and Fig. 4): one radix tree over token sequences holds the
//!   K/V of every cached token and recurrent states only at chosen nodes;
//!   a hit must end where a state is held (the exact-match property of
//!   recurrent layers, section 2).
//! - Section 4.1, admission by reuse class: *purely-input* reuse (shared
//!   system prompts, documents): before its prefill a request is inserted
//!   speculatively into the tree; if that creates a branch (it shares a
//!   prefix with a cached sequence and then diverges), the state at the
//!   branch point is checkpointed during its prefill, because a prefix two
//!   sequences share is likely to be shared again. *Input-and-output*
//!   reuse (conversations): the state after the last decoded token is
//!   checkpointed, because the next turn extends the whole sequence. No
//!   other state is kept.
//! - Section 4.2, eviction: candidates are entries whose removal leaves
//!   the tree consistent (leaves of the K/V tree, and states); each gets a
//!   utility `S = recency + alpha * flop_efficiency`, both min-max
//!   normalised over the candidates, where FLOP efficiency is the compute
//!   a hit on the entry saves over the memory it holds (Eq. 1-2); the
//!   lowest utility goes first. `alpha` is bootstrapped: the first
//!   requests are replayed with a grid of values and the best hit rate's
//!   value is kept (alpha = 0 is plain recency).
//!
//! Modelled here: the tree is the chain of block ids (a block's parent is
//! the block before it), so a leaf is a held block with no held child;
//! compute is the replay's own model (linear in tokens), so a block's
//! efficiency is its prefix's tokens over the prefix's K/V bytes and a
//! state's adds the state's bytes (a shallow state costs the most per
//! token it saves); the candidates scored per eviction are the 64 least
//! recent (sampled eviction, as in Redis), not all of them; a hit
//! resolves over what the tiers hold with the coordinator's `resolve`.

use std::collections::{HashMap, VecDeque};

use super::cache::Unit;
use super::tiers::Loaded;
use super::units::{Held, Model};
use super::{Saved, SimConfig, SimMode, SimRequest};
use crate::trace::TraceRequest;
use ucm_coordinator::hash::Id;
use ucm_coordinator::spec::Kind;
use ucm_coordinator::CoordError;

/// Candidates scored per eviction (the least recent ones).
const SAMPLE: usize = 64;

/// The `alpha` values the bootstrap tries (0: recency alone).
pub const ALPHAS: [f64; 6] = [0.0, 0.5, 1.0, 2.0, 4.0, 8.0];

#[derive(Debug)]
struct Entry {
    bytes: u64,
    stamp: u64,
    /// Compute saved per byte held (the replay's linear model: tokens).
    efficiency: f64,
    parent: Option<Unit>,
    children: u32,
}

/// One tier under Marconi's eviction.
#[derive(Debug)]
pub struct UtilityCache {
    capacity: u64,
    low: u64,
    held: u64,
    clock: u64,
    alpha: f64,
    map: HashMap<Unit, Entry>,
    /// Eviction candidates (states, blocks no held block extends) by
    /// recency; entries whose stamp is stale, or whose block gained a
    /// child, are skipped.
    queue: VecDeque<(u64, Unit)>,
}

fn candidate(u: &Unit, e: &Entry) -> bool {
    matches!(u, Unit::State { .. }) || e.children == 0
}

impl UtilityCache {
    /// Holds at most `capacity` bytes; once above, evicts down to
    /// `low_fraction` of it.
    pub fn new(capacity: u64, low_fraction: f64, alpha: f64) -> Self {
        let low = (capacity as f64 * low_fraction.clamp(0.0, 1.0)) as u64;
        UtilityCache {
            capacity,
            low: low.min(capacity),
            held: 0,
            clock: 0,
            alpha,
            map: HashMap::new(),
            queue: VecDeque::new(),
        }
    }

    /// Is `u` held?
    pub fn contains(&self, u: &Unit) -> bool {
        self.map.contains_key(u)
    }

    /// Makes `u` the most recent; returns whether it was held.
    pub fn touch(&mut self, u: &Unit) -> bool {
        self.clock += 1;
        let c = self.clock;
        match self.map.get_mut(u) {
            Some(e) => {
                e.stamp = c;
                if candidate(u, e) {
                    self.queue.push_back((c, *u));
                    self.compact();
                }
                true
            }
            None => false,
        }
    }

    /// Inserts `u` (its parent block `parent`, its `efficiency`), evicting
    /// by utility once over capacity; evicted units go to `gone`.
    pub fn insert(
        &mut self,
        u: Unit,
        bytes: u64,
        efficiency: f64,
        parent: Option<Unit>,
        mut gone: impl FnMut(Unit),
    ) {
        if bytes > self.capacity || self.touch(&u) {
            return;
        }
        let c = self.clock;
        let parent = parent.filter(|p| self.map.contains_key(p));
        if let Some(p) = parent.and_then(|p| self.map.get_mut(&p)) {
            // No longer a leaf: its queue entries go stale.
            p.children += 1;
        }
        self.map.insert(
            u,
            Entry {
                bytes,
                stamp: c,
                efficiency,
                parent,
                children: 0,
            },
        );
        self.queue.push_back((c, u));
        self.held += bytes;
        if self.held > self.capacity {
            while self.held > self.low {
                let Some(v) = self.victim() else {
                    break;
                };
                self.remove(&v);
                gone(v);
            }
        }
    }

    fn remove(&mut self, v: &Unit) {
        if let Some(e) = self.map.remove(v) {
            self.held -= e.bytes;
            if let Some(parent) = e.parent {
                if let Some(p) = self.map.get_mut(&parent) {
                    p.children = p.children.saturating_sub(1);
                    if p.children == 0 {
                        // A leaf again: a candidate, at its own recency.
                        self.queue.push_back((p.stamp, parent));
                    }
                }
            }
        }
    }

    /// The candidate of least utility among the least recent ones: a
    /// state, or a block no held block extends.
    fn victim(&mut self) -> Option<Unit> {
        let valid = |map: &HashMap<Unit, Entry>, stamp: u64, v: &Unit| {
            map.get(v)
                .is_some_and(|e| e.stamp == stamp && candidate(v, e))
        };
        // Drop entries no longer candidates at the front first.
        while let Some((stamp, v)) = self.queue.front() {
            if valid(&self.map, *stamp, v) {
                break;
            }
            self.queue.pop_front();
        }
        let want = if self.alpha == 0.0 { 1 } else { SAMPLE };
        let mut cands: Vec<(Unit, u64, f64)> = Vec::with_capacity(want);
        let mut seen = std::collections::HashSet::new();
        let mut skipped = 0usize;
        for (stamp, v) in self.queue.iter() {
            if !valid(&self.map, *stamp, v) || !seen.insert(*v) {
                skipped += 1;
                continue;
            }
            if let Some(e) = self.map.get(v) {
                cands.push((*v, e.stamp, e.efficiency));
            }
            if cands.len() == want {
                break;
            }
        }
        if skipped > 4 * SAMPLE {
            // Entries that are no longer candidates pile up between the
            // sampled ones: drop them once, not on every eviction.
            let map = &self.map;
            let mut kept = std::collections::HashSet::new();
            self.queue
                .retain(|(stamp, u)| valid(map, *stamp, u) && kept.insert(*u));
        }
        if cands.len() <= 1 {
            return cands.first().map(|c| c.0);
        }
        let (smin, smax) = cands
            .iter()
            .fold((u64::MAX, 0), |(a, b), c| (a.min(c.1), b.max(c.1)));
        let (emin, emax) = cands
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), c| (a.min(c.2), b.max(c.2)));
        let norm = |v: f64, lo: f64, hi: f64| {
            if hi > lo {
                (v - lo) / (hi - lo)
            } else {
                0.0
            }
        };
        cands
            .iter()
            .map(|c| {
                let s =
                    norm(c.1 as f64, smin as f64, smax as f64) + self.alpha * norm(c.2, emin, emax);
                (c.0, s)
            })
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|c| c.0)
    }

    fn compact(&mut self) {
        if self.queue.len() > 2 * self.map.len() + 1024 {
            let map = &self.map;
            self.queue.retain(|(stamp, u)| {
                map.get(u)
                    .is_some_and(|e| e.stamp == *stamp && candidate(u, e))
            });
        }
    }
}

/// Marconi's tiers below the engine.
#[derive(Debug)]
pub struct Marconi {
    pool: UtilityCache,
    disk: UtilityCache,
    grid: u64,
    state_bytes: u64,
}

impl Marconi {
    /// Tiers of `pool` and `disk` bytes, eviction weight `alpha`.
    pub fn new(m: &Model, pool: u64, disk: u64, alpha: f64) -> Self {
        let state_bytes = m
            .spec
            .snapshot_groups()
            .map(|g| {
                m.bytes(&Unit::State {
                    group: g.index as u16,
                    hash: [0; 16],
                })
            })
            .sum();
        Marconi {
            pool: UtilityCache::new(pool, 1.0, alpha),
            disk: UtilityCache::new(disk, 0.9, alpha),
            grid: m.spec.common_grid().max(1),
            state_bytes,
        }
    }

    fn contains(&self, u: &Unit) -> bool {
        self.pool.contains(u) || self.disk.contains(u)
    }

    /// The tokens Marconi can serve.
    pub fn hit(&mut self, m: &Model, r: &SimRequest) -> Result<u64, CoordError> {
        let held = Held(|u: &Unit| self.contains(u));
        m.resolve(r.prompt(), &r.hashes, &held)
    }

    /// Loads `[from, to)` (the engine holds what is below `from`).
    pub fn load(&mut self, m: &Model, r: &SimRequest, from: u64, to: u64) -> Loaded {
        let mut got = Loaded::default();
        for u in m.hit_units(&r.hashes, &r.seq, from, to) {
            let b = m.bytes(&u);
            if self.pool.touch(&u) {
                got.pool += b;
                self.disk.touch(&u);
            } else if self.disk.touch(&u) {
                got.disk += b;
                let eff = self.efficiency_of(m, &u, to);
                self.pool.insert(u, b, eff, None, |_| {});
            }
        }
        got
    }

    /// Compute saved per byte for a unit ending at `end`: the prefix's
    /// tokens over its K/V bytes, and the state's for a state.
    fn efficiency_of(&self, m: &Model, u: &Unit, end: u64) -> f64 {
        let kv = end.max(1) as f64 * m.kv_bytes_per_token as f64;
        let extra = match u {
            Unit::State { .. } => self.state_bytes as f64,
            Unit::Block { .. } => 0.0,
        };
        end.max(1) as f64 / (kv + extra)
    }

    /// The longest prefix of the request the tree holds (its chain blocks,
    /// every chain group), on the grid: the branch point of its
    /// speculative insertion (section 4.1).
    fn branch_point(&self, m: &Model, r: &SimRequest) -> u64 {
        let mut l = r.prompt_len;
        for g in m.spec.groups().iter().filter(|g| g.kind == Kind::Chain) {
            let b = m.spec.block_of(g.index).max(1);
            let Some(ids) = r.hashes.chains[g.index].first() else {
                continue;
            };
            let held = ids
                .iter()
                .take_while(|id| {
                    self.contains(&Unit::Block {
                        group: g.index as u16,
                        id: **id,
                    })
                })
                .count() as u64;
            l = l.min(held * b);
        }
        l / self.grid * self.grid
    }

    /// The request ended (it resumed at `hit`, served up to `served`): the
    /// K/V of prompt and output beyond the hit; the state at the branch
    /// point, if its insertion branched the tree; the state after the last
    /// decoded token. Returns the bytes saved.
    pub fn finish(
        &mut self,
        m: &Model,
        r: &SimRequest,
        hit: u64,
        served: u64,
    ) -> Result<Saved, CoordError> {
        let end = r.seq.len() as u64;
        let branch = self.branch_point(m, r);
        let mut units: Vec<(u64, Unit)> = m.blocks(&r.hashes, hit, end, false);
        if branch > served && branch < r.prompt_len {
            units.extend(m.states(&r.hashes, &r.seq, branch));
        }
        let last = end / self.grid * self.grid;
        if last > served {
            units.extend(m.states(&r.hashes, &r.seq, last));
        }
        units.sort_by_key(|u| u.0);
        let parents = parents_of(m, r);
        for (pos, u) in &units {
            let b = m.bytes(u);
            let eff = self.efficiency_of(m, u, *pos);
            let parent = match u {
                Unit::Block { id, .. } => parents.get(id).copied(),
                Unit::State { .. } => None,
            };
            self.pool.insert(*u, b, eff, parent, |_| {});
            self.disk.insert(*u, b, eff, parent, |_| {});
        }
        Ok(Saved::of(m, units.iter().map(|u| &u.1)))
    }
}

/// Each block id of the request's chains with the block before it.
fn parents_of(m: &Model, r: &SimRequest) -> HashMap<Id, Unit> {
    let mut out = HashMap::new();
    for g in m.spec.groups() {
        if !matches!(g.kind, Kind::Chain | Kind::Sidecar) {
            continue;
        }
        let Some(ids) = r.hashes.chains[g.index].first() else {
            continue;
        };
        for w in ids.windows(2) {
            out.insert(
                w[1],
                Unit::Block {
                    group: g.index as u16,
                    id: w[0],
                },
            );
        }
    }
    out
}

/// Marconi's bootstrap of `alpha` (section 4.2): the first tenth of the
/// trace (at least one request) replayed with each of [`ALPHAS`]; the
/// value with the most tokens served wins (ties: the smaller).
pub fn bootstrap_alpha(
    trace: &[TraceRequest],
    m: &Model,
    engine_tokens: u64,
    cfg: &SimConfig,
) -> Result<f64, CoordError> {
    let head = &trace[..trace.len().div_ceil(10).min(trace.len())];
    let mut best = (0.0, 0u64);
    for (i, &alpha) in ALPHAS.iter().enumerate() {
        let c = SimConfig {
            marconi_alpha: Some(alpha),
            ..cfg.clone()
        };
        let mut sim = super::Sim::new(m, SimMode::Marconi, engine_tokens, &c);
        let mut served = 0;
        for (k, t) in head.iter().enumerate() {
            served += sim.step(m, &SimRequest::new(m, c.seed, k, t)?)?.served;
        }
        if i == 0 || served > best.1 {
            best = (alpha, served);
        }
    }
    Ok(best.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blk(n: u8) -> Unit {
        Unit::Block {
            group: 0,
            id: [n; 16],
        }
    }

    #[test]
    fn only_leaves_and_states_are_evicted_and_alpha_weighs_efficiency() {
        // A chain 1 <- 2 <- 3: only its leaf (3) may go; then 2.
        let mut c = UtilityCache::new(30, 1.0, 0.0);
        let mut gone = Vec::new();
        c.insert(blk(1), 10, 1.0, None, |u| gone.push(u));
        c.insert(blk(2), 10, 1.0, Some(blk(1)), |u| gone.push(u));
        c.insert(blk(3), 10, 1.0, Some(blk(2)), |u| gone.push(u));
        c.insert(blk(9), 10, 1.0, None, |u| gone.push(u));
        assert_eq!(gone, vec![blk(3)], "the oldest candidate is the leaf");
        // With alpha, FLOP efficiency outweighs recency: the least
        // efficient candidate goes although it is the most recent.
        let mut c = UtilityCache::new(30, 1.0, 8.0);
        let mut gone = Vec::new();
        c.insert(blk(1), 10, 5.0, None, |u| gone.push(u));
        c.insert(blk(2), 10, 5.0, None, |u| gone.push(u));
        c.insert(blk(3), 10, 0.1, None, |u| gone.push(u));
        c.insert(blk(4), 10, 5.0, None, |u| gone.push(u));
        assert_eq!(gone, vec![blk(3)]);
    }
}

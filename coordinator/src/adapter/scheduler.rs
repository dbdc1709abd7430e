//! The scheduler side of the adapter: how many tokens an engine may skip,
//! and the per-step metadata its workers act on.
//!
//! Call order (vLLM's `KVConnectorBase_V1` contract): for a new request,
//! [`Scheduler::get_num_new_matched_tokens`] (may be called more than once;
//! it has no effect a second call would see), then, once the engine has
//! allocated its blocks, [`Scheduler::update_state_after_alloc`]; every step,
//! [`Scheduler::build_meta`] with the chunks the step computes; at the end,
//! [`Scheduler::request_finished`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::sync::Arc;

use crate::ceiling::{HitCeiling, DEFAULT_BOUND};
use crate::directory::CheckpointDirectory;
use crate::error::{CoordError, MetaProblem, RequestError, Result};
use crate::ghosts::{SavedLog, WithSaved};
use crate::hash::{checkpoint_hash, Deployment, RequestHashes, RequestKeys};
use crate::resolve::{resolve_positions, Presence};
use crate::retention::{
    checkpoint_grid, joint_plan, plan, speculative_plan, speculative_spacing, JunctionLog,
    Priority, RecurrenceTracker, SpeculativeBudget,
};
use crate::spec::{Kind, SpecTable};

/// A request as the engine sees it.
#[derive(Clone, Debug)]
pub struct EngineRequest {
    /// The engine's request id.
    pub id: String,
    /// The prompt.
    pub tokens: Arc<Vec<u32>>,
    /// Salt and extra keys.
    pub keys: RequestKeys,
}

/// Where the engine placed a request's data.
#[derive(Clone, Debug, Default)]
pub struct Allocation {
    /// Per chain or sidecar group (spec index): the engine block holding
    /// each block index of the request.
    pub blocks: HashMap<usize, Vec<u32>>,
    /// Per snapshot group: the engine's state slot of the request.
    pub state_slots: HashMap<usize, u32>,
}

/// A chunk of a request computed in one step: tokens `[start, end)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scheduled {
    /// The request.
    pub req: String,
    /// First token computed this step.
    pub start: u64,
    /// One past the last.
    pub end: u64,
}

/// What the workers do for one request in one step.
#[derive(Clone, Debug)]
pub struct ReqMeta {
    /// The request.
    pub id: String,
    /// Its prompt.
    pub tokens: Arc<Vec<u32>>,
    /// Its ids, for every group and rank.
    pub hashes: Arc<RequestHashes>,
    /// Its engine blocks and state slots.
    pub alloc: Arc<Allocation>,
    /// In the request's first step after a hit: `Some((p*, tokens the
    /// engine already holds))`; the workers load what lies between (the
    /// window before `p*` for windowed groups, the state at `p*`).
    pub load: Option<(u64, u64)>,
    /// Per chain or sidecar group: block indices completed this step, to
    /// save.
    pub save_blocks: Vec<(usize, Range<usize>)>,
    /// Per snapshot group: the position whose state this step ends at, to
    /// save as a checkpoint.
    pub save_states: Vec<StateSave>,
}

impl ReqMeta {
    /// Checks that everything the request asks of the workers lies within
    /// its tokens: the load's `p*` and the tokens the engine holds (at most
    /// `p*`), every saved block range and state position, and its ids
    /// (every chain or sidecar group's at most one per block of its tokens,
    /// for each rank; none for other groups). A worker checks this before
    /// it allocates anything for the request, so that metadata from
    /// elsewhere (another process, the wire) cannot make it loop or
    /// allocate past what the request's own tokens bound.
    pub fn validate(&self, spec: &SpecTable) -> Result<()> {
        let n = self.tokens.len() as u64;
        let bad = |problem: MetaProblem| {
            Err(CoordError::BadRequest(RequestError::Meta {
                request: self.id.clone(),
                problem,
            }))
        };
        if let Some((p, have)) = self.load {
            if p > n || have > p {
                return bad(MetaProblem::LoadOutside { p, have, tokens: n });
            }
        }
        if self.hashes.chains.len() > spec.groups().len()
            || self.hashes.seeds.len() > spec.groups().len()
        {
            return bad(MetaProblem::IdsOfUnknownGroups);
        }
        for g in spec.groups() {
            // A snapshot group's chain is of its hash block, not its grid.
            let block = spec.block_of(g.index).min(g.hash_block).max(1);
            let blocks = n.div_ceil(block) as usize;
            let ranks = self
                .hashes
                .chains
                .get(g.index)
                .map_or(&[][..], Vec::as_slice);
            if ranks.iter().any(|ids| ids.len() > blocks) {
                return bad(MetaProblem::IdsPastBlocks {
                    group: g.name.clone(),
                    blocks,
                });
            }
        }
        for (g, range) in &self.save_blocks {
            let Some(group) = spec.groups().get(*g) else {
                return bad(MetaProblem::UnknownGroup { group: *g });
            };
            let blocks = n.div_ceil(spec.block_of(group.index).max(1)) as usize;
            if range.start > range.end || range.end > blocks {
                return bad(MetaProblem::SavesPastBlocks {
                    group: group.name.clone(),
                    start: range.start,
                    end: range.end,
                    blocks,
                });
            }
        }
        for st in &self.save_states {
            if spec
                .groups()
                .get(st.group)
                .is_none_or(|g| g.kind != Kind::Snapshot)
            {
                return bad(MetaProblem::NotASnapshotGroup { group: st.group });
            }
            if st.position > n {
                return bad(MetaProblem::StatePastTokens {
                    position: st.position,
                    tokens: n,
                });
            }
        }
        Ok(())
    }
}

/// A checkpoint a worker saves in a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateSave {
    /// The snapshot group (spec index).
    pub group: usize,
    /// The position (the step ends there).
    pub position: u64,
    /// How sure retention is of its reuse: a speculative checkpoint is
    /// stored to be evicted first.
    pub priority: Priority,
}

/// The metadata of one step.
#[derive(Clone, Debug, Default)]
pub struct ConnectorMeta {
    /// Step number.
    pub step: u64,
    /// Per scheduled request.
    pub requests: Vec<ReqMeta>,
    /// The speculative share the workers give their tiers
    /// ([`crate::adapter::StoreSet::set_speculative_share`]), from the
    /// scheduler's [`SpeculativeBudget`]; `None`: leave it as it is.
    pub speculative_share: Option<f64>,
}

struct ReqState {
    req: EngineRequest,
    hashes: Arc<RequestHashes>,
    l: u64,
    p_star: u64,
    num_computed: u64,
    alloc: Option<Arc<Allocation>>,
    load_pending: bool,
    saved_to: HashMap<usize, usize>,
    plan: HashMap<usize, BTreeMap<u64, Priority>>,
    ceiling: u64,
}

/// The position the second-unserved trigger keeps for a shared boundary
/// `b` of a prompt of `n` tokens: `b` itself, unless the whole prompt is
/// the shared prefix. A state at `n` can serve a continuation but never a
/// repeat of the same prompt (its last token is always computed), so the
/// repeat's servable boundary, the last grid point below `n`, is kept
/// instead (request end keeps `n` already).
fn servable_boundary(g: &crate::spec::Group, common: u64, b: u64, n: u64) -> u64 {
    if b < n {
        return b;
    }
    let grid = checkpoint_grid(g, common);
    n.saturating_sub(1) / grid * grid
}

/// Records as saved blocks `range` of chain or sidecar group `group` of a
/// request, every rank's.
fn record_blocks(
    saved: &mut SavedLog,
    spec: &SpecTable,
    hashes: &RequestHashes,
    group: usize,
    range: Range<usize>,
) {
    let bytes = spec.unit_bytes(group);
    for ids in &hashes.chains[group] {
        let end = range.end.min(ids.len());
        for id in ids.get(range.start..end).unwrap_or_default() {
            saved.block(group, *id, bytes);
        }
    }
}

/// Records as saved the checkpoint of snapshot group `group` at
/// `position` of a request of `tokens`, every rank's.
fn record_checkpoint(
    saved: &mut SavedLog,
    spec: &SpecTable,
    hashes: &RequestHashes,
    tokens: &[u32],
    group: usize,
    position: u64,
    priority: Priority,
) -> Result<()> {
    let g = &spec.groups()[group];
    let speculative = matches!(priority, Priority::Speculative(_));
    for (r, ids) in hashes.chains[group].iter().enumerate() {
        let key = checkpoint_hash(&hashes.seeds[group][r], ids, tokens, g.hash_block, position)?;
        saved.state(group, key, spec.unit_bytes(group), speculative);
    }
    Ok(())
}

/// The scheduler side.
pub struct Scheduler<P: Presence> {
    spec: Arc<SpecTable>,
    dep: Deployment,
    presence: Arc<P>,
    directory: Arc<CheckpointDirectory>,
    tracker: RecurrenceTracker,
    junctions: HashMap<usize, JunctionLog>,
    ceiling: HitCeiling,
    saved: SavedLog,
    budget: SpeculativeBudget,
    reqs: HashMap<String, ReqState>,
    step: u64,
    fold: bool,
}

impl<P: Presence> Scheduler<P> {
    /// A scheduler for `spec` on a deployment, asking `presence` and
    /// `directory`.
    pub fn new(
        spec: Arc<SpecTable>,
        dep: Deployment,
        presence: Arc<P>,
        directory: Arc<CheckpointDirectory>,
    ) -> Self {
        let ceiling = HitCeiling::new(&spec, DEFAULT_BOUND);
        Scheduler {
            spec,
            dep,
            presence,
            directory,
            tracker: RecurrenceTracker::new(4096),
            junctions: HashMap::new(),
            ceiling,
            saved: SavedLog::default(),
            budget: SpeculativeBudget::new(),
            reqs: HashMap::new(),
            step: 0,
            fold: false,
        }
    }

    /// Baseline only (`ucm replay --mode fold`): the predecessor's
    /// "hash-folding" retention. A state is kept only where a request's
    /// prompt ends on a chain-grid boundary; no interval, no second-unserved
    /// trigger, no alignment down to the grid.
    pub fn set_fold_retention(&mut self, on: bool) {
        self.fold = on;
    }

    /// The predecessor's plan (fold baseline): the prompt's end, where it
    /// lies on the chain grid.
    fn fold_plans(&self, n: u64, p_star: u64) -> HashMap<usize, BTreeMap<u64, Priority>> {
        let grid = self.spec.chain_grid();
        self.spec
            .snapshot_groups()
            .map(|g| {
                let mut ps = BTreeMap::new();
                if n % grid == 0 && n > p_star {
                    ps.insert(n, Priority::Sure);
                }
                (g.index, ps)
            })
            .collect()
    }

    /// Retention's plan for a new request of `n` prompt tokens that resumes
    /// at `p_star`, per snapshot group (module [`crate::retention`]): the
    /// sure positions (request end, interval, the junction with an earlier
    /// request when it was not served up to there) and the speculative ones
    /// at the junction spacing. Observes the request's junctions.
    fn plans(
        &mut self,
        hashes: &RequestHashes,
        n: u64,
        p_star: u64,
    ) -> HashMap<usize, BTreeMap<u64, Priority>> {
        let spec = Arc::clone(&self.spec);
        let common = spec.common_grid();
        let mut plans = HashMap::new();
        for g in spec.snapshot_groups() {
            let mut ps: BTreeMap<u64, Priority> = plan(g, common, p_star, n)
                .into_iter()
                .map(|p| (p, Priority::Sure))
                .collect();
            let Some(policy) = g.retention.as_ref() else {
                plans.insert(g.index, ps);
                continue;
            };
            let log = self
                .junctions
                .entry(g.index)
                .or_insert_with(|| JunctionLog::new(self.tracker.capacity()));
            if let Some(ids) = hashes.chains[g.index].first() {
                let shared = self.tracker.observe(g, common, ids);
                if shared.diverges {
                    log.observe(shared.boundary);
                }
                if policy.second_unserved && shared.boundary > p_star {
                    let b = servable_boundary(g, common, shared.boundary, n);
                    if b > p_star && b <= n {
                        ps.insert(b, Priority::Sure);
                    }
                }
            }
            let spacing = speculative_spacing(
                log.spacing(checkpoint_grid(g, common)),
                spec.state_bytes_per_position(),
                spec.kv_bytes_per_token(),
            );
            for (p, level) in speculative_plan(g, common, p_star, n, Some(spacing)) {
                ps.entry(p).or_insert(Priority::Speculative(level));
            }
            plans.insert(g.index, ps);
        }
        joint_plan(&mut plans);
        plans
    }

    /// Tokens of `req` beyond `num_computed` that the persistent tiers can
    /// serve, and whether they load asynchronously (never: they load layer
    /// by layer in the request's first step). A prompt too short to hit is
    /// 0; the last prompt token is never served (the engine must compute it
    /// to produce logits).
    pub fn get_num_new_matched_tokens(
        &mut self,
        req: &EngineRequest,
        num_computed: u64,
    ) -> Result<(u64, bool)> {
        let hashes = match self.reqs.get(&req.id) {
            Some(st) => Arc::clone(&st.hashes),
            None => Arc::new(RequestHashes::compute(
                &self.spec,
                self.dep,
                &req.tokens,
                &req.keys,
            )?),
        };
        let n = req.tokens.len();
        let visible = &req.tokens[..n.saturating_sub(1)];
        // A prompt too short for one block of the chain grid is a miss; any
        // other refusal (hashes of another spec table, an unknown group) is
        // a programming error and reaches the caller as one.
        let resolvable = visible.len() as u64 >= self.spec.chain_grid().max(1);
        let (l, p_star) = if !resolvable {
            (0, 0)
        } else {
            let r = resolve_positions(
                &self.spec,
                visible,
                &hashes,
                self.presence.as_ref(),
                self.directory.as_ref(),
            )?;
            (r.l, r.p_star)
        };
        if !self.reqs.contains_key(&req.id) {
            if resolvable && p_star < n as u64 && !self.saved.is_empty() {
                self.observe_ghosts(visible, &hashes, p_star.max(num_computed))?;
            }
            let plans = if self.fold {
                self.fold_plans(n as u64, p_star)
            } else {
                self.plans(&hashes, n as u64, p_star)
            };
            let ceiling = self.ceiling.observe(&hashes, n as u64);
            self.reqs.insert(
                req.id.clone(),
                ReqState {
                    req: req.clone(),
                    hashes,
                    l,
                    p_star,
                    num_computed,
                    alloc: None,
                    load_pending: false,
                    saved_to: HashMap::new(),
                    plan: plans,
                    ceiling,
                },
            );
        }
        let st = self.reqs.get_mut(&req.id).ok_or_else(|| {
            CoordError::BadRequest(RequestError::UnknownRequest {
                request: req.id.clone(),
            })
        })?;
        st.l = l;
        st.p_star = p_star;
        st.num_computed = num_computed;
        Ok((p_star.saturating_sub(num_computed), false))
    }

    /// Feeds the speculative budget (module [`crate::ghosts`]): how much
    /// further than `served` the saved-but-gone speculative checkpoints,
    /// and the saved-but-gone sure data, would have served the request
    /// (a gain that needs both counts for both), in bytes of K/V. The
    /// prompt must be resolvable (at least one chain-grid block).
    fn observe_ghosts(
        &mut self,
        visible: &[u32],
        hashes: &RequestHashes,
        served: u64,
    ) -> Result<()> {
        let probe = |speculative: bool, sure: bool| -> Result<u64> {
            let with = WithSaved {
                presence: self.presence.as_ref(),
                checkpoints: self.directory.as_ref(),
                log: &self.saved,
                speculative,
                sure,
            };
            let r = resolve_positions(&self.spec, visible, hashes, &with, &with)?;
            Ok(r.p_star.saturating_sub(served))
        };
        let (spec_only, sure_only) = (probe(true, false)?, probe(false, true)?);
        let both = probe(true, true)?.saturating_sub(spec_only.max(sure_only));
        let per_token = self.spec.kv_bytes_per_token();
        self.budget.observe(
            (spec_only + both) * per_token,
            (sure_only + both) * per_token,
        );
        Ok(())
    }

    /// Bounds the record of saved keys to twice the bytes of tiers that
    /// hold `disk_blocks` blocks (or states) of every group, as each
    /// group's disk tier does ([`crate::adapter::StoreSetConfig::disk_blocks`]).
    pub fn bound_saved_to_disk(&mut self, disk_blocks: u64) {
        let per_block: u64 = (0..self.spec.groups().len())
            .map(|g| self.spec.unit_bytes(g))
            .sum();
        self.saved
            .set_bound(disk_blocks.saturating_mul(per_block).saturating_mul(2));
    }

    /// Records as saved what a worker saves of `req_id` without step
    /// metadata (an engine model such as the replay's): every whole chain
    /// and sidecar block inside tokens `[blocks_from, to)` and every
    /// planned checkpoint at a position in `(states_after, to]`.
    pub fn record_saved(
        &mut self,
        req_id: &str,
        blocks_from: u64,
        states_after: u64,
        to: u64,
    ) -> Result<()> {
        let spec = Arc::clone(&self.spec);
        let st = self.reqs.get(req_id).ok_or_else(|| {
            CoordError::BadRequest(RequestError::UnknownRequest {
                request: req_id.to_string(),
            })
        })?;
        for g in spec.groups() {
            if !matches!(g.kind, Kind::Chain | Kind::Sidecar) {
                continue;
            }
            let b = spec.block_of(g.index).max(1);
            let blocks = blocks_from.div_ceil(b) as usize..(to / b) as usize;
            record_blocks(&mut self.saved, &spec, &st.hashes, g.index, blocks);
        }
        for (g, ps) in &st.plan {
            for (&p, &priority) in ps.range(states_after + 1..=to) {
                let (h, t) = (&st.hashes, &st.req.tokens);
                record_checkpoint(&mut self.saved, &spec, h, t, *g, p, priority)?;
            }
        }
        Ok(())
    }

    /// Bounds the record of saved keys (module [`crate::ghosts`]) to
    /// `bytes` of data of each kind; twice what the tiers hold remembers
    /// about as much lost data as they keep. Unbounded by default (up to
    /// [`crate::ghosts::MAX_SAVED_KEYS`] keys).
    pub fn set_saved_bound(&mut self, bytes: u64) {
        self.saved.set_bound(bytes);
    }

    /// The share of each tier that speculative checkpoints may keep, from
    /// the evidence so far ([`SpeculativeBudget::share`]; 1/2 before any).
    pub fn speculative_share(&self) -> f64 {
        self.budget.share()
    }

    /// Records where the engine placed the request's blocks and how many
    /// external tokens it will take (`0`: it recomputes everything beyond
    /// its own cache).
    ///
    /// The allocation must hold at least the blocks a load writes (those
    /// below `p*`) and the state slots; an engine that allocates the rest
    /// of the prompt later (chunked prefill, an asynchronous load) reports
    /// it through [`Scheduler::update_allocation`]. Saves never run past
    /// the blocks allocated so far: they resume when the allocation grows.
    pub fn update_state_after_alloc(
        &mut self,
        req_id: &str,
        alloc: Allocation,
        num_external_tokens: u64,
    ) -> Result<()> {
        let spec = Arc::clone(&self.spec);
        let st = self.state(req_id)?;
        if num_external_tokens > 0 && st.num_computed + num_external_tokens != st.p_star {
            return Err(CoordError::BadRequest(RequestError::NotTheMatchedPrefix {
                request: req_id.to_string(),
                computed: st.num_computed,
                external: num_external_tokens,
                matched: st.p_star,
            }));
        }
        for g in spec.groups() {
            let need = match g.kind {
                Kind::Chain | Kind::Sidecar if num_external_tokens > 0 => {
                    (st.p_star / spec.block_of(g.index).max(1)) as usize
                }
                _ => 0,
            };
            if need > 0 && alloc.blocks.get(&g.index).is_none_or(|b| b.len() < need) {
                return Err(CoordError::BadRequest(RequestError::TooFewEngineBlocks {
                    request: req_id.to_string(),
                    group: g.name.clone(),
                    need: need as u64,
                }));
            }
            if g.kind == Kind::Snapshot && !alloc.state_slots.contains_key(&g.index) {
                return Err(CoordError::BadRequest(RequestError::NoStateSlot {
                    request: req_id.to_string(),
                    group: g.name.clone(),
                }));
            }
        }
        st.load_pending = num_external_tokens > 0;
        if num_external_tokens == 0 {
            st.p_star = st.num_computed.min(st.p_star);
        }
        // Blocks below p* are stored already; saving starts above them.
        for g in spec.groups() {
            if matches!(g.kind, Kind::Chain | Kind::Sidecar) {
                let b = spec.block_of(g.index).max(1);
                st.saved_to.insert(g.index, (st.p_star / b) as usize);
            }
        }
        st.alloc = Some(Arc::new(alloc));
        Ok(())
    }

    /// The engine's placement of a request grew (or moved, after a
    /// preemption): later saves use `alloc`. The resolution and a pending
    /// load are kept.
    pub fn update_allocation(&mut self, req_id: &str, alloc: Allocation) -> Result<()> {
        let st = self.state(req_id)?;
        if st.alloc.is_none() {
            return Err(CoordError::BadRequest(RequestError::NotAllocated {
                request: req_id.to_string(),
            }));
        }
        st.alloc = Some(Arc::new(alloc));
        Ok(())
    }

    /// The request's tokens grew past its prompt (tokens decoding
    /// produced): `tokens` must begin with the tokens known so far. Its ids
    /// are extended (one md5 per new block), so blocks completed by decoding are saved like
    /// prompt blocks, and retention's plan extends over the new tokens.
    pub fn extend_tokens(&mut self, req_id: &str, tokens: Arc<Vec<u32>>) -> Result<()> {
        let spec = Arc::clone(&self.spec);
        let fold = self.fold;
        let st = self.state(req_id)?;
        let old = &st.req.tokens;
        if tokens.len() < old.len() || tokens[..old.len()] != old[..] {
            return Err(CoordError::BadRequest(RequestError::ExtensionDiverges {
                request: req_id.to_string(),
                known: old.len() as u64,
            }));
        }
        if tokens.len() == old.len() {
            return Ok(());
        }
        let mut hashes = (*st.hashes).clone();
        hashes.extend(&spec, &tokens, &st.req.keys);
        st.hashes = Arc::new(hashes);
        // Retention over the tokens decoding added: the request's end moved
        // (request_end), and intervals may fall in the new tokens. A state
        // is saved where a step ends on one of these positions.
        if !fold {
            let common = spec.common_grid();
            let (from, to) = (old.len() as u64, tokens.len() as u64);
            let mut added = false;
            for g in spec.snapshot_groups() {
                let add = plan(g, common, from, to);
                added |= !add.is_empty();
                let ps = st.plan.entry(g.index).or_default();
                for p in add {
                    ps.insert(p, Priority::Sure);
                }
            }
            // The plan was joint before; it changes only where positions
            // were added (not on most decode steps).
            if added {
                joint_plan(&mut st.plan);
            }
        }
        st.req.tokens = tokens;
        Ok(())
    }

    /// The metadata of one step that computes `chunks`.
    pub fn build_meta(&mut self, chunks: &[Scheduled]) -> Result<Arc<ConnectorMeta>> {
        self.step += 1;
        let spec = Arc::clone(&self.spec);
        let mut requests = Vec::new();
        for c in chunks {
            let st = self.reqs.get_mut(&c.req).ok_or_else(|| {
                CoordError::BadRequest(RequestError::UnknownRequest {
                    request: c.req.clone(),
                })
            })?;
            let n = st.req.tokens.len() as u64;
            if c.start > c.end || c.end > n {
                return Err(CoordError::BadRequest(RequestError::ChunkOutside {
                    request: c.req.clone(),
                    start: c.start,
                    end: c.end,
                    tokens: n,
                }));
            }
            let alloc = st.alloc.clone().ok_or_else(|| {
                CoordError::BadRequest(RequestError::NotAllocated {
                    request: c.req.clone(),
                })
            })?;
            let load = std::mem::take(&mut st.load_pending).then_some((st.p_star, st.num_computed));
            let mut save_blocks = Vec::new();
            for g in spec.groups() {
                if !matches!(g.kind, Kind::Chain | Kind::Sidecar) {
                    continue;
                }
                let b = spec.block_of(g.index).max(1);
                let from = st.saved_to.get(&g.index).copied().unwrap_or(0);
                let allocated = alloc.blocks.get(&g.index).map_or(0, Vec::len);
                let to = ((c.end / b) as usize).min(allocated);
                if to > from {
                    record_blocks(&mut self.saved, &spec, &st.hashes, g.index, from..to);
                    save_blocks.push((g.index, from..to));
                    st.saved_to.insert(g.index, to);
                }
            }
            let mut save_states: Vec<StateSave> = st
                .plan
                .iter()
                .filter_map(|(g, ps)| {
                    ps.get(&c.end).map(|&priority| StateSave {
                        group: *g,
                        position: c.end,
                        priority,
                    })
                })
                .collect();
            save_states.sort_by_key(|s| s.group);
            for save in &save_states {
                let (h, t) = (&st.hashes, &st.req.tokens);
                let (g, p) = (save.group, save.position);
                record_checkpoint(&mut self.saved, &spec, h, t, g, p, save.priority)?;
            }
            requests.push(ReqMeta {
                id: c.req.clone(),
                tokens: Arc::clone(&st.req.tokens),
                hashes: Arc::clone(&st.hashes),
                alloc,
                load,
                save_blocks,
                save_states,
            });
        }
        Ok(Arc::new(ConnectorMeta {
            step: self.step,
            requests,
            speculative_share: (!self.fold).then(|| self.budget.share()),
        }))
    }

    /// The hit ceiling of a request: the prompt tokens unlimited capacity
    /// would have served it (module [`crate::ceiling`]).
    pub fn ceiling(&self, req_id: &str) -> Option<u64> {
        self.reqs.get(req_id).map(|st| st.ceiling)
    }

    /// The last resolution of a request: `(l, p*)`.
    pub fn resolution(&self, req_id: &str) -> Option<(u64, u64)> {
        self.reqs.get(req_id).map(|st| (st.l, st.p_star))
    }

    /// Positions where the request should end a prefill chunk so that its
    /// states can be kept (retention's plan, ascending).
    pub fn checkpoint_positions(&self, req_id: &str) -> Vec<u64> {
        let mut all: BTreeSet<u64> = BTreeSet::new();
        if let Some(st) = self.reqs.get(req_id) {
            for ps in st.plan.values() {
                all.extend(ps.keys().copied());
            }
        }
        all.into_iter().collect()
    }

    /// Retention's plan of a request per snapshot group: `(group index,
    /// position, priority)`, ascending by group then position.
    pub fn checkpoint_plan(&self, req_id: &str) -> Vec<(usize, u64, Priority)> {
        let mut out: Vec<(usize, u64, Priority)> = self
            .reqs
            .get(req_id)
            .map(|st| {
                st.plan
                    .iter()
                    .flat_map(|(g, ps)| ps.iter().map(move |(p, pr)| (*g, *p, *pr)))
                    .collect()
            })
            .unwrap_or_default();
        out.sort_unstable();
        out
    }

    /// The request ended. Returns whether its blocks must stay allocated
    /// for an asynchronous save (never: `wait_for_save` finishes every copy
    /// out of the engine's blocks within the step).
    pub fn request_finished(&mut self, req_id: &str) -> bool {
        self.reqs.remove(req_id);
        false
    }

    fn state(&mut self, req_id: &str) -> Result<&mut ReqState> {
        self.reqs.get_mut(req_id).ok_or_else(|| {
            CoordError::BadRequest(RequestError::UnknownRequest {
                request: req_id.to_string(),
            })
        })
    }
}

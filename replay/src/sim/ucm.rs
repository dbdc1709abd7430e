//! `ucm` and `fold` below the engine's own prefix cache: the real
//! scheduler side of the adapter (`resolve`, the design's retention and its
//! recurrence tracker, or the predecessor's hash-folding retention) over
//! capacity-modelled tiers, with the real checkpoint directory.
//!
//! Per request the scheduler is asked as a connector is
//! (`get_num_new_matched_tokens` with the engine's own hit as the tokens
//! already computed); a hit beyond the engine's loads `[engine hit, p*)`
//! and the states at `p*`. At request end the adapter's saves are
//! applied: chain blocks from `p*` (the blocks below are stored already;
//! the worker saves from the engine's memory the ones the engine served),
//! and a state at each planned position the request computed through.
//! With decode retention (`ucm`) the request's output extends its tokens
//! (`extend_tokens`, as the connector does while decoding): its blocks and
//! the state at the end of the generated sequence are kept too. A state
//! that leaves both tiers leaves the directory.

use std::sync::{Arc, Mutex, MutexGuard};

use super::cache::Unit;
use super::tiers::{Loaded, Split, Tiers};
use super::units::Model;
use super::{Saved, SimRequest};
use ucm_coordinator::adapter::{EngineRequest, Scheduler};
use ucm_coordinator::resolve::Presence;
use ucm_coordinator::retention::Priority;
use ucm_coordinator::spec::Group;
use ucm_coordinator::{CheckpointDirectory, CoordError, Deployment, RequestKeys};

/// The scheduler's view of the tiers (chain blocks only: checkpoints come
/// from the directory).
#[derive(Debug)]
pub struct TierPresence(Arc<Mutex<Tiers>>);

fn locked(t: &Mutex<Tiers>) -> MutexGuard<'_, Tiers> {
    t.lock().unwrap_or_else(|e| e.into_inner())
}

impl Presence for TierPresence {
    fn lookup(&self, group: &Group, ids: &[ucm_coordinator::hash::Id]) -> Vec<bool> {
        let t = locked(&self.0);
        ids.iter()
            .map(|id| {
                t.contains(&Unit::Block {
                    group: group.index as u16,
                    id: *id,
                })
            })
            .collect()
    }
}

/// UCM (or the fold baseline) below the engine.
pub struct UcmTiers {
    tiers: Arc<Mutex<Tiers>>,
    sched: Scheduler<TierPresence>,
    dir: Arc<CheckpointDirectory>,
    decode: bool,
    names: Vec<String>,
}

impl UcmTiers {
    /// Tiers of `pool` and `disk` bytes; `fold` selects the predecessor's
    /// retention, `decode` keeps decode output (ignored with `fold`),
    /// `share` fixes the tiers' speculative share (`None`: the
    /// scheduler's, from what it saved and the tiers lost); `split` how
    /// the tiers' bytes are split between the groups ([`Split`]).
    pub fn new(
        m: &Model,
        pool: u64,
        disk: u64,
        fold: bool,
        decode: bool,
        share: Option<f64>,
        split: Split,
    ) -> Self {
        let tiers = Arc::new(Mutex::new(Tiers::split(Some(m), split, pool, disk, share)));
        let dir = Arc::new(CheckpointDirectory::new());
        let mut sched = Scheduler::new(
            Arc::new(m.spec.clone()),
            Deployment { tp_size: 1 },
            Arc::new(TierPresence(Arc::clone(&tiers))),
            Arc::clone(&dir),
        );
        sched.set_fold_retention(fold);
        // Twice what the tiers hold: the record remembers about as much
        // lost data as the tiers keep.
        sched.set_saved_bound(locked(&tiers).capacity().saturating_mul(2));
        UcmTiers {
            tiers,
            sched,
            dir,
            decode: decode && !fold,
            names: m.spec.groups().iter().map(|g| g.name.clone()).collect(),
        }
    }

    /// The tiers' speculative share now.
    pub fn speculative_share(&self) -> f64 {
        locked(&self.tiers).speculative_share()
    }

    fn id(k: usize) -> String {
        format!("r{k}")
    }

    /// `p*` for request number `k`, the engine holding `engine_hit` tokens.
    /// The scheduler's resolution also feeds its speculative budget, whose
    /// share the tiers then follow.
    pub fn hit(&mut self, r: &SimRequest, k: usize, engine_hit: u64) -> Result<u64, CoordError> {
        let req = EngineRequest {
            id: Self::id(k),
            tokens: Arc::new(r.prompt().to_vec()),
            keys: RequestKeys::default(),
        };
        self.sched.get_num_new_matched_tokens(&req, engine_hit)?;
        let p = self.sched.resolution(&req.id).map_or(0, |(_, p)| p);
        // The store's share: the scheduler's evidence (what it saved and
        // the tiers no longer hold), as workers give it to the tiers.
        locked(&self.tiers).follow_share(self.sched.speculative_share());
        Ok(p)
    }

    /// Loads `[from, to)` and the states at `to` (touched deepest first,
    /// as saves are).
    pub fn load(&mut self, m: &Model, r: &SimRequest, from: u64, to: u64) -> Loaded {
        let mut units = m.hit_units(&r.hashes, &r.seq, from, to);
        units.reverse();
        let (dir, names) = (&self.dir, &self.names);
        locked(&self.tiers).load(m, &units, |u| forget(dir, names, u))
    }

    /// Request number `k` ended; it resumed at `served` (the larger of the
    /// engine's hit and `p_star`, UCM's). Returns the bytes saved.
    pub fn finish(
        &mut self,
        m: &Model,
        r: &SimRequest,
        k: usize,
        p_star: u64,
        served: u64,
    ) -> Result<Saved, CoordError> {
        let id = Self::id(k);
        let mut end = r.prompt_len;
        if self.decode && r.seq.len() as u64 > r.prompt_len {
            self.sched.extend_tokens(&id, Arc::new(r.seq.clone()))?;
            end = r.seq.len() as u64;
        }
        self.sched.record_saved(&id, p_star, served, end)?;
        let mut units: Vec<(u64, Unit, Option<u8>)> = m
            .blocks(&r.hashes, p_star, end, false)
            .into_iter()
            .map(|(p, u)| (p, u, None))
            .collect();
        let mut states = Vec::new();
        // Each group's own plan: a state where a step ends on one of its
        // positions (steps end at every planned position), speculative
        // ones at their level.
        for (g, p, priority) in self.sched.checkpoint_plan(&id) {
            if p > served && p <= end {
                let level = match priority {
                    Priority::Speculative(l) => Some(l),
                    _ => None,
                };
                states.extend(m.state(g, &r.hashes, &r.seq, p).map(|u| (p, u, level)));
            }
        }
        units.extend(states.iter().copied());
        // Deepest first: a prefix's tail is then older than its head, so
        // recency evicts the tail first and never a head that would make
        // the rest of the chain unusable (as vLLM frees a request's blocks).
        units.sort_by_key(|u| std::cmp::Reverse(u.0));
        let units: Vec<(Unit, Option<u8>)> = units.into_iter().map(|u| (u.1, u.2)).collect();
        let saved = Saved::of(m, units.iter().map(|u| &u.0));
        {
            let (dir, names) = (&self.dir, &self.names);
            locked(&self.tiers).store(m, &units, |u| forget(dir, names, u));
        }
        let t = locked(&self.tiers);
        for (p, u, _) in states {
            if let Unit::State { group, hash } = u {
                if t.contains(&u) {
                    self.dir.register(&self.names[group as usize], p, hash);
                }
            }
        }
        drop(t);
        self.sched.request_finished(&id);
        Ok(saved)
    }
}

fn forget(dir: &CheckpointDirectory, names: &[String], u: Unit) {
    if let Unit::State { group, hash } = u {
        dir.forget(&names[group as usize], &hash);
    }
}

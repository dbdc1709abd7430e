//! Faults injected by `ucm replay --faults`, and the accounting of what
//! each caused, from what was observed (decisions D44).

use super::report::FaultKindReport;
use super::workload::mix;
use super::{ModeReport, ReplayConfig, Result};
use ucm_coordinator::{Deployment, Kind, Presence, RequestHashes, SpecTable};
use ucm_device::Device;
use ucm_harness::{Engine, Outcome, Request};

/// The kinds of injected faults, taken in turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FaultKind {
    /// A restart (cold memory tier), then EIO on the first chain group's
    /// disk reads: its loads fail and are recomputed.
    ReadEio,
    /// EIO on a group's disk writes (retried; may fail the save).
    WriteEio,
    /// ENOSPC on a group's disk writes.
    WriteEnospc,
    /// Every block file of a group removed through the store (another
    /// machine's GC); the memory tier may still hold some.
    Storm,
    /// A rank dies before it saves (TP > 1 only).
    DeadRank,
}

impl FaultKind {
    fn name(self) -> &'static str {
        match self {
            FaultKind::ReadEio => "read_eio",
            FaultKind::WriteEio => "write_eio",
            FaultKind::WriteEnospc => "write_enospc",
            FaultKind::Storm => "eviction_storm",
            FaultKind::DeadRank => "dead_rank",
        }
    }

    fn is_io(self) -> bool {
        matches!(
            self,
            FaultKind::ReadEio | FaultKind::WriteEio | FaultKind::WriteEnospc
        )
    }
}

/// One request's injected fault.
pub(super) struct Fault {
    kind: FaultKind,
    #[cfg(feature = "failpoints")]
    guard: Option<ucm_device::io::faults::FaultGuard>,
    /// Storms: the group, and its stored prefix of the request's ids
    /// before and right after the storm.
    storm: Option<(usize, usize, usize)>,
    fired: bool,
    /// Read faults: further requests it stays armed for when the request
    /// it was set for loaded nothing from disk.
    left: usize,
}

pub(super) struct Faults {
    rate: f64,
    seed: u64,
    groups: Vec<usize>,
    kinds: Vec<FaultKind>,
    next: usize,
    /// A read fault that has not fired yet, armed for the next request.
    pub(super) pending: Option<Fault>,
    stats: std::collections::BTreeMap<String, FaultKindReport>,
}

impl Faults {
    pub(super) fn new(cfg: &ReplayConfig, spec: &SpecTable) -> Faults {
        let mut kinds = vec![
            FaultKind::ReadEio,
            FaultKind::WriteEio,
            FaultKind::Storm,
            FaultKind::WriteEnospc,
        ];
        if cfg.tp > 1 {
            kinds.push(FaultKind::DeadRank);
        }

        Faults {
            rate: cfg.faults,
            seed: cfg.seed,
            groups: spec
                .groups()
                .iter()
                .filter(|g| matches!(g.kind, Kind::Chain | Kind::Snapshot))
                .map(|g| g.index)
                .collect(),
            kinds,
            next: 0,
            pending: None,
            stats: Default::default(),
        }
    }

    /// Whether request `k` gets a new fault (none while a read fault is
    /// still armed).
    pub(super) fn wants(&self, k: usize) -> bool {
        let x = mix(self.seed, 9, k as u64, 0);
        self.pending.is_none()
            && self.rate > 0.0
            && ((x % 1_000_000) as f64 / 1e6) < self.rate
            && !self.groups.is_empty()
    }

    /// The kind the next fault will be (kinds are taken in turn, so every
    /// kind occurs once faults are frequent enough).
    pub(super) fn kind_next(&self) -> FaultKind {
        self.kinds[self.next % self.kinds.len()]
    }

    /// Maybe injects a fault for request `k`.
    pub(super) fn before<D: Device>(
        &mut self,
        k: usize,
        engine: &Engine<D>,
        req: &mut Request,
    ) -> Result<Option<Fault>> {
        if let Some(f) = self.pending.take() {
            return Ok(Some(f));
        }
        if !self.wants(k) {
            return Ok(None);
        }
        let kind = self.kind_next();
        self.next += 1;
        let x = mix(self.seed, 13, k as u64, 0);
        let spec = engine.spec();
        // Read faults target the first chain group, which every hit loads.
        let group = match kind {
            FaultKind::ReadEio => spec
                .chain_groups()
                .next()
                .map_or(self.groups[0], |g| g.index),
            _ => self.groups[(x >> 20) as usize % self.groups.len()],
        };
        self.stats.entry(kind.name().into()).or_default().injected += 1;
        let mut f = Fault {
            kind,
            #[cfg(feature = "failpoints")]
            guard: None,
            storm: None,
            fired: false,
            left: 3,
        };
        // I/O faults name the group's block files and the files being
        // written: the data path. A store's own metadata (its GEOMETRY
        // marker, read when a restart reopens it) is not this fault's
        // target; an error there fails the open, as it must.
        let group_dir = engine.stores().dir().join(&spec.groups()[group].name);
        let path = match kind {
            FaultKind::ReadEio => group_dir.join("blocks"),
            _ => group_dir.join("tmp"),
        };
        match kind {
            FaultKind::ReadEio | FaultKind::WriteEio | FaultKind::WriteEnospc => {
                #[cfg(feature = "failpoints")]
                {
                    use ucm_device::io::faults::{inject, FaultOp, FaultRule};
                    let (op, errno) = match kind {
                        FaultKind::ReadEio => (FaultOp::Read, libc::EIO),
                        FaultKind::WriteEio => (FaultOp::Write, libc::EIO),
                        _ => (FaultOp::Write, libc::ENOSPC),
                    };
                    let mut r = FaultRule::errno(&path, op, errno);
                    r.times = Some(4);
                    f.guard = Some(inject(r));
                }
                #[cfg(not(feature = "failpoints"))]
                {
                    let _ = path;
                    return Err(super::ReplayError::NotBuilt {
                        flag: "--faults (I/O errors through fail points)",
                        feature: "failpoints",
                    });
                }
            }
            FaultKind::Storm => {
                let before = stored_prefix(engine, group, req)?;
                let removed = engine
                    .stores()
                    .tier(group)
                    .and_then(|t| t.disk())
                    .map_or(0, |d| d.evict_all());
                f.fired = removed > 0;
                f.storm = Some((group, before, stored_prefix(engine, group, req)?));
            }
            FaultKind::DeadRank => {
                req.dead_rank = Some(engine_tp(engine).saturating_sub(1));
                f.fired = true;
            }
        }
        Ok(Some(f))
    }

    /// Accounts for a request's fault from what was observed.
    pub(super) fn after(&mut self, f: Option<Fault>, out: &Outcome, retries: u64) {
        let Some(mut f) = f else {
            return;
        };
        #[cfg(feature = "failpoints")]
        let fired = f.fired || f.guard.as_ref().is_some_and(|g| g.fired() > 0);
        #[cfg(not(feature = "failpoints"))]
        let fired = f.fired;
        // A read fault whose request read nothing from disk (it missed, or
        // the memory tier served it) stays armed for the next requests.
        if f.kind == FaultKind::ReadEio && !fired && f.left > 0 {
            f.left -= 1;
            self.pending = Some(f);
            return;
        }
        let st = self.stats.entry(f.kind.name().into()).or_default();
        if !fired {
            return;
        }
        st.fired += 1;
        // A storm's miss: blocks of the request's prefix that no tier held
        // any more right after it (the memory tier did not cover them).
        let misses = match f.storm {
            Some((_, before, after)) if after < before => 1,
            _ => 0,
        };
        let failed_loads = out.load_errors.len() as u64;
        let failed_saves = out.save_failures.len() as u64;
        st.retries += retries;
        st.failed_loads += failed_loads;
        st.failed_saves += failed_saves;
        st.misses += misses;
        let effect = failed_loads + failed_saves + misses + out.dead_rank_missing > 0;
        if effect || retries > 0 {
            st.with_effect += 1;
        } else if f.kind.is_io() {
            st.unaccounted += 1;
        } else {
            st.absorbed += 1;
        }
    }

    pub(super) fn report(&self, rep: &mut ModeReport) {
        for s in self.stats.values() {
            rep.injected_faults += s.injected;
            rep.reported_faults += s.with_effect + s.absorbed;
            rep.unaccounted_faults += s.unaccounted;
        }
        rep.faults = self.stats.clone();
    }
}

/// Blocks of `req`'s prefix that group `group`'s store holds (rank 0's ids).
fn stored_prefix<D: Device>(engine: &Engine<D>, group: usize, req: &Request) -> Result<usize> {
    let spec = engine.spec();
    let g = &spec.groups()[group];
    let h = RequestHashes::compute(
        spec,
        Deployment {
            tp_size: engine_tp(engine),
        },
        &req.tokens,
        &req.keys,
    )?;
    let ids = h.chains[group].first().map(Vec::as_slice).unwrap_or(&[]);
    let full = (req.tokens.len() as u64 / g.hash_block.max(1)) as usize;
    Ok(match g.kind {
        Kind::Chain => engine
            .stores()
            .lookup_on_prefix(g, &ids[..full.min(ids.len())]),
        _ => 0,
    })
}

fn engine_tp<D: Device>(engine: &Engine<D>) -> u32 {
    engine.config().tp
}

//! What a request's units are and what they weigh, at full size: the K/V
//! blocks of a token range, a state at a position, and the resolution of a
//! hit over any set of held units (the coordinator's own `resolve`).

use ucm_coordinator::hash::Id;
use ucm_coordinator::hash::{checkpoint_hash, RequestHashes};
use ucm_coordinator::resolve::{resolve_positions, Checkpoints, Presence};
use ucm_coordinator::spec::{Group, Kind, SpecTable};
use ucm_coordinator::CoordError;

use super::cache::Unit;

/// The spec at full size and what its units weigh.
#[derive(Debug)]
pub struct Model {
    /// The spec table (full sizes).
    pub spec: SpecTable,
    /// K/V bytes per token over every chain and sidecar layer.
    pub kv_bytes_per_token: u64,
    /// Per group index: bytes of one block (all layers) or one state.
    unit_bytes: Vec<u64>,
}

impl Model {
    /// The model of `spec`.
    pub fn new(spec: SpecTable) -> Self {
        let unit_bytes = (0..spec.groups().len())
            .map(|g| spec.unit_bytes(g))
            .collect();
        let per_token = spec.kv_bytes_per_token();
        Model {
            spec,
            kv_bytes_per_token: per_token.max(1),
            unit_bytes,
        }
    }

    /// Bytes of a unit.
    pub fn bytes(&self, u: &Unit) -> u64 {
        let g = match u {
            Unit::Block { group, .. } | Unit::State { group, .. } => *group as usize,
        };
        self.unit_bytes.get(g).copied().unwrap_or(0)
    }

    /// The K/V units (with the token each ends at) of tokens `[from, to)` (whole blocks inside it) of
    /// every chain and sidecar group; windowed groups (and their sidecars)
    /// only the blocks of the window before `to` when `window_only`.
    pub fn blocks(
        &self,
        h: &RequestHashes,
        from: u64,
        to: u64,
        window_only: bool,
    ) -> Vec<(u64, Unit)> {
        let mut out = Vec::new();
        for g in self.spec.groups() {
            if !matches!(g.kind, Kind::Chain | Kind::Sidecar) {
                continue;
            }
            let b = self.spec.block_of(g.index).max(1);
            let mut start = from;
            if window_only {
                if let Some(w) = self.spec.window_of(g.index) {
                    start = start.max(to.saturating_sub(w));
                }
            }
            let Some(ids) = h.chains[g.index].first() else {
                continue;
            };
            let (a, z) = (
                start.div_ceil(b) as usize,
                ((to / b) as usize).min(ids.len()),
            );
            for (i, id) in ids.iter().enumerate().take(z).skip(a) {
                let unit = Unit::Block {
                    group: g.index as u16,
                    id: *id,
                };
                out.push(((i as u64 + 1) * b, unit));
            }
        }
        out
    }

    /// The state units of every snapshot group at `p` (`tokens` reach at
    /// least `p`), each with `p`.
    pub fn states(&self, h: &RequestHashes, tokens: &[u32], p: u64) -> Vec<(u64, Unit)> {
        self.spec
            .snapshot_groups()
            .filter_map(|g| state_hash(g, h, tokens, p).map(|hash| (g, hash)))
            .map(|(g, hash)| {
                let unit = Unit::State {
                    group: g.index as u16,
                    hash,
                };
                (p, unit)
            })
            .collect()
    }

    /// What a hit at `to` loads beyond `from` (the engine holds what lies
    /// below): the K/V of `[from, to)` (windowed groups only their window
    /// before `to`) and every group's state at `to`.
    pub fn hit_units(&self, h: &RequestHashes, tokens: &[u32], from: u64, to: u64) -> Vec<Unit> {
        let blocks = self.blocks(h, from, to, true).into_iter();
        let states = self.states(h, tokens, to).into_iter();
        blocks.chain(states).map(|u| u.1).collect()
    }

    /// The state unit of snapshot group `group` (its index) at `p`.
    pub fn state(&self, group: usize, h: &RequestHashes, tokens: &[u32], p: u64) -> Option<Unit> {
        let g = self.spec.groups().get(group)?;
        (g.kind == Kind::Snapshot).then_some(())?;
        state_hash(g, h, tokens, p).map(|hash| Unit::State {
            group: group as u16,
            hash,
        })
    }

    /// `p*` of a prompt over what `held` holds, the last token never
    /// served (the coordinator's `resolve`, over the prompt less its last
    /// token); 0 for prompts too short to hit.
    pub fn resolve(
        &self,
        prompt: &[u32],
        h: &RequestHashes,
        held: &(impl Presence + Checkpoints),
    ) -> Result<u64, CoordError> {
        let visible = &prompt[..prompt.len().saturating_sub(1)];
        if (visible.len() as u64) < self.spec.chain_grid().max(1) {
            return Ok(0);
        }
        Ok(resolve_positions(&self.spec, visible, h, held, held)?.p_star)
    }
}

/// `H(p)` of snapshot group `g` (rank 0).
fn state_hash(g: &Group, h: &RequestHashes, tokens: &[u32], p: u64) -> Option<Id> {
    let seed = h.seeds.get(g.index)?.first()?;
    let ids = h.chains.get(g.index)?.first()?;
    checkpoint_hash(seed, ids, tokens, g.hash_block, p).ok()
}

/// A view of held units as the coordinator's presence and checkpoints.
pub struct Held<F: Fn(&Unit) -> bool>(pub F);

impl<F: Fn(&Unit) -> bool> Presence for Held<F> {
    fn lookup(&self, group: &Group, ids: &[Id]) -> Vec<bool> {
        ids.iter()
            .map(|id| {
                (self.0)(&Unit::Block {
                    group: group.index as u16,
                    id: *id,
                })
            })
            .collect()
    }
    fn lookup_on_prefix(&self, group: &Group, ids: &[Id]) -> usize {
        ids.iter()
            .take_while(|id| {
                (self.0)(&Unit::Block {
                    group: group.index as u16,
                    id: **id,
                })
            })
            .count()
    }
}

impl<F: Fn(&Unit) -> bool> Checkpoints for Held<F> {
    fn has(&self, group: &Group, _position: u64, hash: &Id) -> bool {
        (self.0)(&Unit::State {
            group: group.index as u16,
            hash: *hash,
        })
    }
}

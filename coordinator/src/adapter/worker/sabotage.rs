//! Deliberate bugs of the worker (feature `sabotage`, test only): each
//! must make the engine harness's content oracle fail a run, which proves
//! the oracle can fail. No production build compiles this file.

use super::*;

/// Deliberate bugs of the worker, one per way a load or save can go wrong
/// silently. Only the mutation tests set one: each must make the engine
/// harness's oracle fail the run.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sabotage {
    /// Every chain load task leaves out its first block, unreported.
    SkipLoad,
    /// Every chain load lands one engine block too far.
    WrongEngineBlock,
    /// A state is loaded from the deepest other checkpoint of the same
    /// prefix that the directory holds, instead of from `p*`.
    StateFromOtherPosition,
    /// Blocks the previous request also loaded are skipped ("the engine
    /// still holds them"), unreported.
    StalePrefix,
    /// The first block of every chain save is left out, unreported.
    SkipSave,
}

impl<D: Device> Worker<D> {
    /// Applies a load sabotage (tests only; a no-op without one).
    pub(super) fn sabotage_load(
        &mut self,
        group: usize,
        items: &mut Vec<TaskItem>,
        blocks: &mut Vec<u32>,
        stride: usize,
    ) {
        match self.cfg.sabotage {
            Some(Sabotage::SkipLoad) if !items.is_empty() => {
                items.remove(0);
                blocks.remove(0);
            }
            Some(Sabotage::WrongEngineBlock) => {
                for it in items.iter_mut() {
                    if it.offset + 2 * stride <= it.memory.len() {
                        it.offset += stride;
                    }
                }
            }
            Some(Sabotage::StalePrefix) => {
                let keep: Vec<bool> = items
                    .iter()
                    .map(|it| !self.last_loaded.contains(&(group, it.block, it.shard)))
                    .collect();
                for it in items.iter() {
                    self.last_loaded.insert((group, it.block, it.shard));
                }
                let mut k = keep.iter();
                items.retain(|_| *k.next().unwrap_or(&true));
                let mut k = keep.iter();
                blocks.retain(|_| *k.next().unwrap_or(&true));
            }
            _ => {}
        }
    }

    /// The position a state is loaded from: `p`, unless the
    /// StateFromOtherPosition sabotage (tests only) picks the deepest other
    /// checkpoint of the same prefix in the directory.
    pub(super) fn sabotage_state_position(&self, u: &Unit, r: &ReqMeta, p: u64) -> u64 {
        if self.cfg.sabotage != Some(Sabotage::StateFromOtherPosition) {
            return p;
        }
        let g = &self.spec.groups()[u.group];
        let rank = self.id_rank(u.group);
        let Some(seed) = r.hashes.seeds[u.group].get(rank) else {
            return p;
        };
        let mut q = p.saturating_sub(g.block.max(1));
        while q > 0 {
            if let Ok(h) = checkpoint_hash(seed, self.ids(r, u.group), &r.tokens, g.hash_block, q) {
                if self.directory.contains(&g.name, &h) {
                    return q;
                }
            }
            q = q.saturating_sub(g.block.max(1));
        }
        p
    }
}

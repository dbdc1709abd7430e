//! `vllm`: the engine's own prefix cache, as vLLM keeps it for hybrid
//! models (the hybrid KV-cache allocator with `--mamba-cache-mode align`,
//! its defaults).
//!
//! Sources:
//! - vLLM docs, "Automatic Prefix Caching", section "Hybrid Mamba models"
//!   (docs.vllm.ai/en/latest/features/automatic_prefix_caching/): under
//!   align mode the Mamba state is stored only on the Mamba block grid, so
//!   a hit resumes only at a block boundary; the shared-prefix-junction
//!   checkpoint (`--enable-mamba-shared-prefix-checkpoint`) is off by
//!   default and needs EAGLE/MTP speculative decoding, so it is not
//!   modelled here.
//! - vLLM docs, "Automatic Prefix Caching" design (docs.vllm.ai, design/
//!   prefix_caching): blocks are keyed by the hash of their tokens and
//!   prefix; only full blocks are cached; a finished request's blocks go
//!   to the free queue in reverse order, so a prefix's tail is evicted
//!   before its head; eviction takes the least recently used free block.
//! - vLLM issue #40696: the attention block is raised so that its page is
//!   at least the Mamba page (528 tokens for Qwen3.5), and prefix caching
//!   works in whole blocks of that size.
//! - vLLM PR #45845: Mamba/linear-attention state snapshots share the KV
//!   pool with attention blocks (dense snapshots "occupy ~80% of the
//!   blocks" at block size 128), so states and K/V share one capacity.
//!
//! The model: block `B` = the spec's common grid (the engine block raised
//! to the LCM of the groups); at request end the K/V of every full block
//! of prompt and output is kept, and the states at `floor((P-1)/B)*B` and
//! `floor(P/B)*B` of the prompt (none in decode); a hit is the largest
//! multiple of `B` at most `min(match, P-1)` with a state exactly there
//! (the coordinator's `resolve` over what the cache holds).

use super::cache::{ByteLru, Unit};
use super::units::{Held, Model};
use super::SimRequest;
use ucm_coordinator::CoordError;

/// vLLM's device prefix cache.
#[derive(Debug)]
pub struct VllmCache {
    lru: ByteLru,
}

impl VllmCache {
    /// A cache of `bytes`.
    pub fn new(bytes: u64) -> Self {
        VllmCache {
            lru: ByteLru::new(bytes, 1.0),
        }
    }

    /// The tokens a request skips.
    pub fn hit(&mut self, m: &Model, r: &SimRequest) -> Result<u64, CoordError> {
        let lru = &self.lru;
        m.resolve(r.prompt(), &r.hashes, &Held(|u: &Unit| lru.contains(u)))
    }

    /// The request ended (it resumed at `hit`): its blocks and states are
    /// freed into the cache, the tail first.
    pub fn finish(&mut self, m: &Model, r: &SimRequest, hit: u64) {
        let b = m.spec.common_grid().max(1);
        let p = r.prompt_len;
        let mut units = m.blocks(&r.hashes, 0, r.seq.len() as u64, false);
        for pos in [hit, (p - 1) / b * b, p / b * b] {
            if pos > 0 {
                units.extend(m.states(&r.hashes, &r.seq, pos));
            }
        }
        // Reverse order: the deepest units become the least recent.
        insert_tail_first(&mut self.lru, m, &mut units);
    }
}

/// Frees `units` (each with the token it ends at) into `lru`, deepest
/// first, so that the tail is evicted first.
pub(super) fn insert_tail_first(lru: &mut ByteLru, m: &Model, units: &mut [(u64, Unit)]) {
    units.sort_by_key(|(pos, _)| std::cmp::Reverse(*pos));
    for (_, u) in units.iter() {
        lru.insert(*u, m.bytes(u), |_| {});
    }
}

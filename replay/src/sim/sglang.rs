//! `sglang`: the engine's own prefix cache, as SGLang keeps it for hybrid
//! models (the radix cache with `--mamba-radix-cache-strategy no_buffer`,
//! its default for Mamba/KDA models).
//!
//! Sources (the `sglang` 0.5.23 package from PyPI):
//! - `sglang/srt/mem_cache/mamba_checkpoint_pool.py`: the radix cache
//!   stores one cached state per node; under `no_buffer` the live state is
//!   donated when the request's node is inserted (so a state exists at the
//!   exact end of what was inserted);
//! - `sglang/srt/managers/scheduler_components/batch_result_processor.py`:
//!   "no_buffer donates the live state, which cannot be shortened with the
//!   key" (the state stays at the end of the sequence);
//! - chunked prefill caches each chunk's prefix with its state; the chunk
//!   size defaults to 8192 tokens on H20/H200-class GPUs
//!   (`sglang/srt/arg_groups/memory_hook.py`, `_handle_gpu_memory_settings`);
//! - the radix cache inserts the K/V of prompt and output when a request
//!   finishes and evicts least recently used leaves first.
//!
//! The model: at request end the K/V of prompt and output (whole blocks of
//! the spec's grid: a hit inside a block needs a state there, and no state
//! lies inside one except the sequence end, which a trace never re-sends)
//! and a state at the exact end of the sequence and at each chunk end
//! inside the prompt; a hit ends at the deepest held position with a state
//! and its K/V (the coordinator's `resolve` over the radix cache's units),
//! at most `P-1`.

use super::cache::{ByteLru, Unit};
use super::units::{Held, Model};
use super::vllm::insert_tail_first;
use super::SimRequest;
use ucm_coordinator::CoordError;

/// SGLang's default chunked-prefill size on H20/H200-class GPUs.
pub const CHUNK: u64 = 8192;

/// SGLang's radix cache.
#[derive(Debug)]
pub struct SglangCache {
    lru: ByteLru,
    chunk: u64,
}

impl SglangCache {
    /// A cache of `bytes` with prefill chunks of `chunk` tokens.
    pub fn new(bytes: u64, chunk: u64) -> Self {
        SglangCache {
            lru: ByteLru::new(bytes, 1.0),
            chunk: chunk.max(1),
        }
    }

    /// The tokens a request skips.
    pub fn hit(&mut self, m: &Model, r: &SimRequest) -> Result<u64, CoordError> {
        let lru = &self.lru;
        m.resolve(r.prompt(), &r.hashes, &Held(|u: &Unit| lru.contains(u)))
    }

    /// The request ended (it resumed at `hit`): its K/V and states go into
    /// the radix cache, leaves least recent.
    pub fn finish(&mut self, m: &Model, r: &SimRequest, hit: u64) {
        let end = r.seq.len() as u64;
        let mut units = m.blocks(&r.hashes, 0, end, false);
        let mut at: Vec<u64> = (1..)
            .map(|k| k * self.chunk)
            .take_while(|&c| c < r.prompt_len)
            .filter(|&c| c > hit)
            .collect();
        at.push(hit);
        at.push(end);
        for pos in at.into_iter().filter(|&p| p > 0) {
            units.extend(m.states(&r.hashes, &r.seq, pos));
        }
        insert_tail_first(&mut self.lru, m, &mut units);
    }
}

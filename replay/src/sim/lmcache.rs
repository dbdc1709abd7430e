//! `lmcache`: LMCache below the engine's own prefix cache, with the same
//! memory and disk capacities UCM gets.
//!
//! Sources (LMCache docs, "Configuring LMCache",
//! docs.lmcache.ai/api_reference/configurations.html):
//! - `chunk_size`: tokens per stored chunk, default 256; the engine's
//!   block divides it here, so chunks are whole engine blocks;
//! - `save_decode_cache`: default false: only the prompt is stored;
//! - `local_cpu` (on by default) and `local_disk` backends, evicted least
//!   recently used (`cache_policy` LRU);
//! - lookup counts the leading chunks present (a prefix lookup).
//!
//! The model: at request end every full chunk of the prompt beyond the
//! hit is stored (K/V) with a state at every chunk boundary of the prompt;
//! a hit is the deepest chunk boundary `<= P-1` whose K/V and state the
//! tiers hold (the coordinator's `resolve` over them).

use super::cache::Unit;
use super::tiers::{Loaded, Tiers};
use super::units::{Held, Model};
use super::{Saved, SimRequest};
use ucm_coordinator::CoordError;

/// LMCache's default chunk size (tokens).
pub const CHUNK: u64 = 256;

/// LMCache's tiers.
#[derive(Debug)]
pub struct LmCache {
    tiers: Tiers,
    chunk: u64,
}

impl LmCache {
    /// Tiers of `pool` and `disk` bytes, chunks of `chunk` tokens (raised to
    /// a multiple of the model's grid).
    pub fn new(m: &Model, pool: u64, disk: u64, chunk: u64) -> Self {
        let g = m.spec.common_grid().max(1);
        LmCache {
            tiers: Tiers::new(pool, disk),
            chunk: chunk.max(1).div_ceil(g) * g,
        }
    }

    /// The tokens LMCache can serve.
    pub fn hit(&mut self, m: &Model, r: &SimRequest) -> Result<u64, CoordError> {
        let t = &self.tiers;
        m.resolve(r.prompt(), &r.hashes, &Held(|u: &Unit| t.contains(u)))
    }

    /// Loads `[from, to)` (the engine holds what is below `from`).
    pub fn load(&mut self, m: &Model, r: &SimRequest, from: u64, to: u64) -> Loaded {
        let units = m.hit_units(&r.hashes, &r.seq, from, to);
        self.tiers.load(m, &units, |_| {})
    }

    /// The request ended: the prompt's chunks beyond `hit`, with a state at
    /// each chunk boundary. Returns the bytes saved.
    pub fn finish(&mut self, m: &Model, r: &SimRequest, hit: u64) -> Saved {
        let end = r.prompt_len / self.chunk * self.chunk;
        let mut units: Vec<(u64, Unit)> = m.blocks(&r.hashes, hit, end, false);
        let mut c = hit / self.chunk * self.chunk + self.chunk;
        while c <= end {
            units.extend(m.states(&r.hashes, &r.seq, c));
            c += self.chunk;
        }
        units.sort_by_key(|u| u.0);
        let units: Vec<(Unit, Option<u8>)> = units.into_iter().map(|u| (u.1, None)).collect();
        self.tiers.store(m, &units, |_| {});
        Saved::of(m, units.iter().map(|u| &u.0))
    }
}

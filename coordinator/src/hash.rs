//! Block hashing: the scheme of DESIGN.md section 3, byte for byte.
//!
//! All integers are little-endian; `||` is concatenation; md5 is RFC 1321
//! (the `md-5` crate). For a spec table `S`, a deployment with `tp_size`
//! ranks, and a request:
//!
//! ```text
//! meta(r)       = UTF-8 of "{S.model}:{tp_size}:{S.dtype}:{r}{S.spec_info}{S.sparse_info}"
//!                 r = 0 for all_union groups, the rank for intersection groups
//! seed[g](r)    = md5(meta(r) || 0x00 || UTF-8 name of g || 0x00 || UTF-8 cache_salt
//!                     [|| 0x00 || identity digest])
//!                 (no salt: the empty string; sidecars use their source's name;
//!                 the identity digest, 16 bytes, only when the table has an
//!                 `[identity]`: see crate::identity for its canonical text)
//! extra         = for each extra key k, in order: (len(k) as u32) || k
//! id[g][0]      = md5(seed[g] || tokens[0 .. b) as u32 each || extra)
//! id[g][i]      = md5(id[g][i-1] || tokens[i*b .. (i+1)*b) as u32 each || extra)
//!                 b = the block size (chain) or hash block (snapshot); full
//!                 blocks only
//! H[s](p)       = md5(c || tokens[(p / hb) * hb .. p) as u32 each || p as u64)
//!                 c = id[s][p / hb - 1], or seed[s] when p < hb
//! ```
//!
//! Every id is 16 bytes. `coordinator/tests/golden/hash-vectors.json` holds
//! ids for a fixed token sequence so that any binding can check it computes
//! the same ones (`cargo test -p ucm-coordinator --test golden`).

use md5::{Digest, Md5};

use crate::error::{CoordError, RequestError, Result};
pub use crate::id::{hex, Id};
use crate::spec::{Group, Kind, RankRule, SpecTable};

/// What of a request determines its ids besides the tokens.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestKeys {
    /// Tenant isolation salt (none: the empty string).
    pub cache_salt: Option<String>,
    /// Extra keys (multimodal input hashes, LoRA id), in order.
    pub extra_keys: Vec<Vec<u8>>,
}

/// Where the hashes are computed: the deployment's TP size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deployment {
    /// Tensor-parallel ranks.
    pub tp_size: u32,
}

/// The hash meta string of `rank` (already resolved by the rank rule).
pub fn meta(spec: &SpecTable, dep: Deployment, rank: u32) -> String {
    format!(
        "{}:{}:{}:{}{}{}",
        spec.model, dep.tp_size, spec.dtype, rank, spec.spec_info, spec.sparse_info
    )
}

/// The rank that goes into `group`'s meta: 0 for `all_union`, `rank` for
/// `intersection`.
pub fn meta_rank(group: &Group, rank: u32) -> u32 {
    group.key_rank(rank)
}

/// The chain seed of `group` for `rank` (sidecars: their source's seed).
pub fn group_seed(
    spec: &SpecTable,
    dep: Deployment,
    group: &Group,
    rank: u32,
    keys: &RequestKeys,
) -> Id {
    let named = match group.source {
        Some(s) => &spec.groups()[s],
        None => group,
    };
    let mut h = Md5::new();
    h.update(meta(spec, dep, meta_rank(named, rank)).as_bytes());
    h.update([0u8]);
    h.update(named.name.as_bytes());
    h.update([0u8]);
    h.update(keys.cache_salt.as_deref().unwrap_or("").as_bytes());
    if let Some(id) = &spec.identity {
        h.update([0u8]);
        h.update(id.digest);
    }
    h.finalize().into()
}

fn extra_bytes(keys: &RequestKeys) -> Vec<u8> {
    let mut out = Vec::new();
    for k in &keys.extra_keys {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(k);
    }
    out
}

/// Blocks laid out per round of [`chain_ids`]: a small buffer that stays
/// in cache.
const LAYOUT_BLOCKS: usize = 32;

/// The prefix-chained ids of the full blocks of `tokens` (block size
/// `block`), from `seed`. Blocks are laid out (parent slot, token bytes,
/// extra keys) a few at a time in one small reused buffer; then each block
/// costs one 16-byte parent write and one md5 over contiguous bytes.
pub fn chain_ids(seed: &Id, tokens: &[u32], block: usize, keys: &RequestKeys) -> Vec<Id> {
    let extra = extra_bytes(keys);
    let n = tokens.len().checked_div(block).unwrap_or(0);
    let msg = 16 + 4 * block + extra.len();
    let mut buf = vec![0u8; LAYOUT_BLOCKS.min(n) * msg];
    let mut ids = Vec::with_capacity(n);
    let mut parent = *seed;
    for round in tokens[..n * block].chunks(LAYOUT_BLOCKS * block.max(1)) {
        let used = round.len() / block.max(1) * msg;
        for (m, chunk) in buf[..used]
            .chunks_exact_mut(msg)
            .zip(round.chunks_exact(block.max(1)))
        {
            for (dst, t) in m[16..16 + 4 * block].chunks_exact_mut(4).zip(chunk) {
                dst.copy_from_slice(&t.to_le_bytes());
            }
            m[16 + 4 * block..].copy_from_slice(&extra);
        }
        for m in buf[..used].chunks_exact_mut(msg) {
            m[..16].copy_from_slice(&parent);
            parent = Md5::digest(&*m).into();
            ids.push(parent);
        }
    }
    ids
}

/// `H[s](p)` from the snapshot group's chain ids (`ids[i]` covers
/// `[i*hb, (i+1)*hb)`), its seed, the tokens and the hash block `hb`.
/// `p` must not exceed the tokens or the chain.
pub fn checkpoint_hash(seed: &Id, ids: &[Id], tokens: &[u32], hb: u64, p: u64) -> Result<Id> {
    let hb = hb.max(1);
    let full = (p / hb) as usize;
    if p as usize > tokens.len() || full > ids.len() {
        return Err(CoordError::BadRequest(
            RequestError::CheckpointBeyondTokens {
                position: p,
                hashed: tokens.len().min(ids.len() * hb as usize + hb as usize - 1) as u64,
            },
        ));
    }
    let parent = if full == 0 { seed } else { &ids[full - 1] };
    let mut h = Md5::new();
    h.update(parent);
    for t in &tokens[full * hb as usize..p as usize] {
        h.update(t.to_le_bytes());
    }
    h.update(p.to_le_bytes());
    Ok(h.finalize().into())
}

/// The ids of one request for every hashed group and every rank that
/// matters: `all_union` groups have one chain (rank 0), `intersection`
/// groups one per rank.
#[derive(Clone, Debug)]
pub struct RequestHashes {
    /// Per group index: per rank (1 for all_union), the chain ids. Empty
    /// for `none` groups; sidecars hold their source's ids.
    pub chains: Vec<Vec<Vec<Id>>>,
    /// Per group index: per rank, the seed.
    pub seeds: Vec<Vec<Id>>,
}

impl RequestHashes {
    /// Hashes `tokens` for every group of `spec`.
    pub fn compute(
        spec: &SpecTable,
        dep: Deployment,
        tokens: &[u32],
        keys: &RequestKeys,
    ) -> Result<Self> {
        if dep.tp_size == 0 {
            return Err(CoordError::BadRequest(RequestError::ZeroTpSize));
        }
        let mut chains = Vec::new();
        let mut seeds = Vec::new();
        for g in spec.groups() {
            let (block, rule) = match g.kind {
                Kind::Chain | Kind::Snapshot => (g.hash_block, g.rank_rule),
                Kind::Sidecar => (0, g.rank_rule),
                Kind::None => {
                    chains.push(Vec::new());
                    seeds.push(Vec::new());
                    continue;
                }
            };
            let ranks = match rule {
                RankRule::AllUnion => 1,
                RankRule::Intersection => dep.tp_size,
            };
            let mut per_rank = Vec::new();
            let mut per_rank_seed = Vec::new();
            for r in 0..ranks {
                let seed = group_seed(spec, dep, g, r, keys);
                per_rank_seed.push(seed);
                if block > 0 {
                    per_rank.push(chain_ids(&seed, tokens, block as usize, keys));
                }
            }
            chains.push(per_rank);
            seeds.push(per_rank_seed);
        }
        // Sidecars carry their source's ids.
        for g in spec.groups() {
            if let Some(s) = g.source {
                chains[g.index] = chains[s].clone();
            }
        }
        Ok(RequestHashes { chains, seeds })
    }
}

impl RequestHashes {
    /// Extends the ids to `tokens`, which begin with the tokens these ids
    /// were computed from: only the blocks completed since are hashed (each
    /// chain continues from its last id), so a request growing by decoding
    /// costs one md5 per new block. Equal to [`RequestHashes::compute`]
    /// over `tokens`.
    pub fn extend(&mut self, spec: &SpecTable, tokens: &[u32], keys: &RequestKeys) {
        for g in spec.groups() {
            let block = match g.kind {
                Kind::Chain | Kind::Snapshot => g.hash_block as usize,
                Kind::Sidecar | Kind::None => continue,
            };
            if block == 0 {
                continue;
            }
            let (Some(chains), Some(seeds)) =
                (self.chains.get_mut(g.index), self.seeds.get(g.index))
            else {
                continue;
            };
            for (chain, seed) in chains.iter_mut().zip(seeds) {
                let done = chain.len() * block;
                if tokens.len() < done + block {
                    continue;
                }
                let parent = chain.last().copied().unwrap_or(*seed);
                let more = chain_ids(&parent, &tokens[done..], block, keys);
                chain.extend(more);
            }
        }
        for g in spec.groups() {
            if let Some(src) = g.source {
                self.chains[g.index] = self.chains[src].clone();
            }
        }
    }
}

/// Deterministic tokens for tests, examples and scenarios: splitmix64 of
/// `seed`, each below 2^17.
pub fn seeded_tokens(seed: u64, n: usize) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) % 131_072) as u32
        })
        .collect()
}

//! Block ids and checkpoint hashes of a token sequence, for bindings that
//! check they agree with the golden vectors (or hash on their own side).

use ucm_coordinator::hash::{checkpoint_hash, Id};
use ucm_coordinator::{Deployment, Kind, RequestHashes, RequestKeys, SpecTable};

use crate::error::{FfiError, Result};

fn hashes(
    spec: &SpecTable,
    tp_size: u32,
    keys: &RequestKeys,
    tokens: &[u32],
    group: &str,
    rank: u32,
) -> Result<(RequestHashes, usize, usize)> {
    if rank >= tp_size {
        return Err(FfiError::Invalid(format!(
            "rank {rank} of a TP size of {tp_size}"
        )));
    }
    let g = spec.group(group)?;
    if g.kind == Kind::None {
        return Err(FfiError::Invalid(format!(
            "group `{group}` is never reused: it has no ids"
        )));
    }
    let h = RequestHashes::compute(spec, Deployment { tp_size }, tokens, keys)?;
    let r = spec.key_rank(g.index, rank);
    Ok((h, g.index, r))
}

/// The chain ids of `tokens` in `group` for `rank` (a sidecar: its
/// source's; a snapshot group: its hash-block chain).
pub fn block_ids(
    spec: &SpecTable,
    tp_size: u32,
    keys: &RequestKeys,
    tokens: &[u32],
    group: &str,
    rank: u32,
) -> Result<Vec<Id>> {
    let (h, g, r) = hashes(spec, tp_size, keys, tokens, group, rank)?;
    Ok(h.chains[g].get(r).cloned().unwrap_or_default())
}

/// The checkpoint hash `H(p)` of snapshot group `group` at `position`.
pub fn checkpoint(
    spec: &SpecTable,
    tp_size: u32,
    keys: &RequestKeys,
    tokens: &[u32],
    group: &str,
    rank: u32,
    position: u64,
) -> Result<Id> {
    let (h, g, r) = hashes(spec, tp_size, keys, tokens, group, rank)?;
    let grp = &spec.groups()[g];
    if grp.kind != Kind::Snapshot {
        return Err(FfiError::Invalid(format!(
            "group `{group}` is not a snapshot group"
        )));
    }
    let seed = h.seeds[g]
        .get(r)
        .ok_or_else(|| FfiError::Invalid(format!("no seed for rank {r}")))?;
    let ids = h.chains[g].get(r).map(Vec::as_slice).unwrap_or(&[]);
    Ok(checkpoint_hash(
        seed,
        ids,
        tokens,
        grp.hash_block,
        position,
    )?)
}

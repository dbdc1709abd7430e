//! Block ids and checkpoint hashes of a token sequence, for bindings that
//! check they agree with the golden vectors (or hash on their own side).
//! Only the asked group is hashed, with the coordinator's own seed and
//! chain functions.

use ucm_coordinator::hash::{chain_ids, checkpoint_hash, group_seed, Id};
use ucm_coordinator::{Deployment, Group, Kind, RequestKeys, SpecTable};

use crate::error::{ArgProblem, FfiError, Result};

/// `group`'s seed for `rank` and the chain ids of `tokens` (a sidecar: its
/// source's chain), after checking the rank and the group.
fn chain<'s>(
    spec: &'s SpecTable,
    tp_size: u32,
    keys: &RequestKeys,
    tokens: &[u32],
    group: &str,
    rank: u32,
) -> Result<(&'s Group, Id, Vec<Id>)> {
    if rank >= tp_size {
        return Err(FfiError::Argument {
            name: "rank".into(),
            problem: ArgProblem::OutOfRange {
                value: format!("{rank} of a TP size of {tp_size}"),
                expected: "below the TP size",
            },
        });
    }
    let g = spec.group(group)?;
    if g.kind == Kind::None {
        return Err(FfiError::Argument {
            name: "group".into(),
            problem: ArgProblem::NeverReused {
                group: group.into(),
            },
        });
    }
    let chained = g.source.map_or(g, |s| &spec.groups()[s]);
    let seed = group_seed(spec, Deployment { tp_size }, g, rank, keys);
    let ids = chain_ids(&seed, tokens, chained.hash_block as usize, keys);
    Ok((g, seed, ids))
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
    Ok(chain(spec, tp_size, keys, tokens, group, rank)?.2)
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
    let (g, seed, ids) = chain(spec, tp_size, keys, tokens, group, rank)?;
    if g.kind != Kind::Snapshot {
        return Err(FfiError::Argument {
            name: "group".into(),
            problem: ArgProblem::NotSnapshot {
                group: group.into(),
            },
        });
    }
    Ok(checkpoint_hash(
        &seed,
        &ids,
        tokens,
        g.hash_block,
        position,
    )?)
}

//! The hit ceiling: how many tokens of a prompt unlimited capacity would
//! have served. Beside the hit rate, it tells an operator whether misses
//! come from capacity (buy more) or from policy (change it): the gap
//! between the two is what capacity alone could win.
//!
//! "Unlimited capacity" here is a prefix cache that kept every block ever
//! stored and a checkpoint at every grid point: a prompt is served up to
//! the longest prefix an earlier request had, on the common grid, and
//! never its last token (the engine computes it for the logits). It is
//! policy-independent, so every mode of a replay has the same ceiling on
//! the same requests.
//!
//! Memory is bounded: [`HitCeiling`] remembers the last `bound` block ids
//! (8-byte fingerprints of the chain ids); a prefix older than that
//! horizon no longer counts, so the ceiling undercounts only reuse older
//! than `bound` blocks of traffic.

use std::collections::{HashMap, VecDeque};

use crate::hash::{Id, RequestHashes};
use crate::spec::{Kind, SpecTable};

/// Block ids remembered by default: 2^22 blocks (about 64 MiB), 512M
/// tokens of traffic at 128-token blocks.
pub const DEFAULT_BOUND: usize = 1 << 22;

/// The chain the ceiling follows: the chain group with the smallest block
/// (its ids cover the prompt most finely), or, without chain groups, the
/// first snapshot group's hash-block chain.
fn ceiling_group(spec: &SpecTable) -> Option<(usize, u64)> {
    let chain = spec
        .groups()
        .iter()
        .filter(|g| g.kind == Kind::Chain)
        .min_by_key(|g| (spec.block_of(g.index), g.index))
        .map(|g| (g.index, spec.block_of(g.index)));
    chain.or_else(|| {
        spec.snapshot_groups()
            .next()
            .map(|g| (g.index, g.hash_block))
    })
}

fn fingerprint(id: &Id) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&id[..8]);
    u64::from_le_bytes(b)
}

/// The ceiling's memory of earlier prefixes.
#[derive(Debug)]
pub struct HitCeiling {
    group: Option<(usize, u64)>,
    grid: u64,
    seen: HashMap<u64, u32>,
    order: VecDeque<u64>,
    bound: usize,
}

impl HitCeiling {
    /// A ceiling for `spec`, remembering at most `bound` block ids.
    pub fn new(spec: &SpecTable, bound: usize) -> Self {
        HitCeiling {
            group: ceiling_group(spec),
            grid: spec.common_grid().max(1),
            seen: HashMap::new(),
            order: VecDeque::new(),
            bound: bound.max(1),
        }
    }

    /// The tokens unlimited capacity would have served of a prompt of
    /// `prompt_len` tokens whose ids are `hashes` (rank 0), then remembers
    /// its blocks.
    pub fn observe(&mut self, hashes: &RequestHashes, prompt_len: u64) -> u64 {
        let Some((g, block)) = self.group else {
            return 0;
        };
        let Some(ids) = hashes.chains.get(g).and_then(|r| r.first()) else {
            return 0;
        };
        let full = ((prompt_len / block.max(1)) as usize).min(ids.len());
        let ids = &ids[..full];
        let matched = ids
            .iter()
            .take_while(|id| self.seen.contains_key(&fingerprint(id)))
            .count() as u64;
        let servable = prompt_len.saturating_sub(1) / self.grid * self.grid;
        let ceiling = (matched * block / self.grid * self.grid).min(servable);
        for id in ids {
            let f = fingerprint(id);
            *self.seen.entry(f).or_insert(0) += 1;
            self.order.push_back(f);
        }
        while self.order.len() > self.bound {
            if let Some(f) = self.order.pop_front() {
                if let std::collections::hash_map::Entry::Occupied(mut e) = self.seen.entry(f) {
                    *e.get_mut() -= 1;
                    if *e.get() == 0 {
                        e.remove();
                    }
                }
            }
        }
        ceiling
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::{Deployment, RequestKeys};

    const SPEC: &str = r#"
model = "m"
dtype = "bf16"
num_layers = 2
[[group]]
name = "attn"
kind = "chain"
block_size = 16
layers = "0"
bytes_per_token = 64
[[group]]
name = "ssm"
kind = "snapshot"
grid = 32
state_bytes = 4096
layers = "1"
"#;

    fn ids(spec: &SpecTable, tokens: &[u32]) -> RequestHashes {
        RequestHashes::compute(
            spec,
            Deployment { tp_size: 1 },
            tokens,
            &RequestKeys::default(),
        )
        .unwrap()
    }

    #[test]
    fn a_prompt_is_served_up_to_the_longest_earlier_prefix_on_the_common_grid() {
        let spec = SpecTable::from_toml(SPEC).unwrap();
        let mut c = HitCeiling::new(&spec, DEFAULT_BOUND);
        let a: Vec<u32> = (0..100).collect();
        assert_eq!(c.observe(&ids(&spec, &a), 100), 0, "first sight");
        // Shares 80 tokens, then diverges: 5 blocks of 16 match, floored to
        // the common grid of 32.
        let mut b: Vec<u32> = (0..80).collect();
        b.extend(1000..1040);
        assert_eq!(c.observe(&ids(&spec, &b), 120), 64);
        // An exact repeat: never its last token (99 -> 96).
        assert_eq!(c.observe(&ids(&spec, &a), 100), 96);
    }

    #[test]
    fn the_bound_forgets_the_oldest_blocks() {
        let spec = SpecTable::from_toml(SPEC).unwrap();
        let mut c = HitCeiling::new(&spec, 4);
        let a: Vec<u32> = (0..64).collect();
        c.observe(&ids(&spec, &a), 64);
        let other: Vec<u32> = (500..564).collect();
        c.observe(&ids(&spec, &other), 64);
        assert_eq!(
            c.observe(&ids(&spec, &a), 64),
            0,
            "a's blocks were forgotten"
        );
    }
}

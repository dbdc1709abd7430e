//! `ucm bench hash`: block hashing against raw md5 in the same run.
//!
//! The limit is md5 over messages already laid out in memory (a 16-byte
//! parent followed by the block's token bytes), one digest per message: what
//! a hasher could do with no encoding work at all. The measured path is
//! [`chain_ids`](ucm_coordinator::hash::chain_ids) over the same tokens,
//! which also encodes the tokens and chains the parents. Goal: ratio >= 0.9
//! on 128-token blocks, on the medians of interleaved rounds.

use std::time::Instant;

use md5::{Digest, Md5};
use serde::Serialize;

use super::{Paired, Spread};
use ucm_coordinator::hash::{chain_ids, Id, RequestKeys};

/// One result.
#[derive(Clone, Debug, Serialize)]
pub struct HashRecord {
    /// `chain_ids`.
    pub path: String,
    /// Tokens per block.
    pub block_tokens: usize,
    /// Token bytes hashed per second, in GiB/s (median round).
    pub gib_s: f64,
    /// Raw md5 over the same messages, GiB/s of token bytes (median round).
    pub limit: f64,
    /// `gib_s / limit`: the ratio of the medians.
    pub ratio: f64,
    /// Ours over the baseline round by round, their median and quartiles.
    pub paired: Paired,
    /// `chain_ids` over the rounds: median, min, max.
    pub spread: Spread,
    /// Raw md5 over the rounds.
    pub limit_spread: Spread,
    /// The machine's 1-minute load average at the start of the bench.
    pub load_average: Option<f64>,
}

/// Runs `reps` interleaved rounds over `tokens` tokens for each block size
/// and compares the medians of the two sides.
pub fn run(
    block_sizes: &[usize],
    tokens: usize,
    reps: usize,
    mut progress: impl FnMut(&str),
) -> Vec<HashRecord> {
    let load = super::announce_load(&mut progress);
    let toks: Vec<u32> = (0..tokens as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) >> 15)
        .collect();
    let token_bytes = (tokens * 4) as f64 / (1u64 << 30) as f64;
    let mut out = Vec::new();
    for &bs in block_sizes {
        let blocks = tokens / bs;
        // Pre-laid messages for the raw limit.
        let msg = 16 + 4 * bs;
        let mut raw = vec![0u8; blocks * msg];
        for (b, m) in raw.chunks_exact_mut(msg).enumerate() {
            for (i, t) in toks[b * bs..(b + 1) * bs].iter().enumerate() {
                m[16 + 4 * i..20 + 4 * i].copy_from_slice(&t.to_le_bytes());
            }
        }
        let (mut raws, mut chains) = (Vec::new(), Vec::new());
        let mut sink = 0u8;
        for rep in 0..reps {
            let t = Instant::now();
            for m in raw.chunks_exact(msg) {
                let d: Id = Md5::digest(m).into();
                sink ^= d[0];
            }
            raws.push(token_bytes / t.elapsed().as_secs_f64());
            let t = Instant::now();
            let ids = chain_ids(&[7u8; 16], &toks, bs, &RequestKeys::default());
            chains.push(token_bytes / t.elapsed().as_secs_f64());
            sink ^= ids.last().map_or(0, |d| d[0]);
            progress(&format!("hash {bs}-token blocks: round {}/{reps}", rep + 1));
        }
        std::hint::black_box(sink);
        let (spread, limit_spread) = (Spread::of(&chains), Spread::of(&raws));
        let paired = Paired::of(&chains, &raws, 4);
        out.push(HashRecord {
            path: "chain_ids".into(),
            block_tokens: bs,
            gib_s: spread.median,
            limit: limit_spread.median,
            ratio: paired.median,
            paired,
            spread: spread.rounded(4),
            limit_spread: limit_spread.rounded(4),
            load_average: load,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::round_to;

    #[test]
    fn a_small_run_reports_medians_and_spreads() {
        let recs = run(&[16, 128], 4096, 3, |_| {});
        assert_eq!(recs.len(), 2);
        for r in &recs {
            assert_eq!((r.spread.rounds, r.limit_spread.rounds), (3, 3));
            assert_eq!(
                (r.spread.median, r.limit_spread.median),
                (round_to(r.gib_s, 4), round_to(r.limit, 4))
            );
            assert!(r.spread.min <= r.spread.median && r.spread.median <= r.spread.max);
            // The ratio is the median of the three rounds' own ratios.
            assert_eq!(r.paired.ratios.len(), 3);
            assert!(r.ratio > 0.0 && r.ratio == r.paired.median);
            assert!(r.paired.q1 <= r.ratio && r.ratio <= r.paired.q3);
        }
    }
}

//! The workloads of `ucm replay`: chat sessions over a shared system
//! prompt, questions over shared documents, random prompts.

use std::sync::Arc;

use serde::Serialize;

use super::ReplayConfig;
use ucm_coordinator::hash::seeded_tokens;

/// The workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Multi-turn chat: a shared system prompt, per-session history.
    Chat,
    /// Questions over shared long documents.
    Docqa,
    /// Random prompts with low reuse.
    Random,
}

/// One request of a workload.
#[derive(Clone, Debug)]
pub struct WorkRequest {
    /// Session (chat), document (docqa) or prompt (random) index.
    pub session: usize,
    /// Turn (chat) or question (docqa) index.
    pub turn: usize,
    /// The prompt.
    pub tokens: Arc<Vec<u32>>,
    /// The answer the engine generates (chat: the next turn re-sends it;
    /// empty for the other workloads).
    pub output: Arc<Vec<u32>>,
}

pub(super) fn mix(seed: u64, a: u64, b: u64, c: u64) -> u64 {
    let mut x =
        seed ^ a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ b.rotate_left(21) ^ c.rotate_left(42);
    x = (x ^ (x >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^ (x >> 29)
}

/// The requests of a workload, in arrival order (sessions interleaved).
pub fn workload(cfg: &ReplayConfig) -> Vec<WorkRequest> {
    let s = cfg.seed;
    let mut out = Vec::new();
    match cfg.workload {
        Workload::Chat => {
            let system = seeded_tokens(mix(s, 1, 0, 0), 3072);
            let mut history: Vec<Vec<u32>> = vec![system; cfg.sessions];
            for t in 0..cfg.turns {
                for (i, h) in history.iter_mut().enumerate() {
                    // Message and answer lengths vary, as in real chats.
                    let user = 256 + (mix(s, 10, i as u64, t as u64) % 512) as usize;
                    let answer = 64 + (mix(s, 11, i as u64, t as u64) % 384) as usize;
                    let mut prompt = h.clone();
                    prompt.extend(seeded_tokens(mix(s, 2, i as u64, t as u64), user));
                    let reply = seeded_tokens(mix(s, 3, i as u64, t as u64), answer);
                    let mut next = prompt.clone();
                    next.extend(&reply);
                    *h = next;
                    out.push(WorkRequest {
                        session: i,
                        turn: t,
                        tokens: Arc::new(prompt),
                        output: Arc::new(reply),
                    });
                }
            }
        }
        Workload::Docqa => {
            let docs: Vec<Vec<u32>> = (0..cfg.sessions)
                .map(|d| seeded_tokens(mix(s, 4, d as u64, 0), 4096))
                .collect();
            for q in 0..cfg.turns {
                for (d, doc) in docs.iter().enumerate() {
                    let mut prompt = doc.clone();
                    let len = 32 + (mix(s, 12, d as u64, q as u64) % 160) as usize;
                    prompt.extend(seeded_tokens(mix(s, 5, d as u64, q as u64), len));
                    out.push(WorkRequest {
                        session: d,
                        turn: q,
                        tokens: Arc::new(prompt),
                        output: Arc::new(Vec::new()),
                    });
                }
            }
        }
        Workload::Random => {
            for i in 0..cfg.sessions * cfg.turns {
                let len = 1024 + (mix(s, 6, i as u64, 0) % 3072) as usize;
                out.push(WorkRequest {
                    session: i,
                    turn: 0,
                    tokens: Arc::new(seeded_tokens(mix(s, 7, i as u64, 0), len)),
                    output: Arc::new(Vec::new()),
                });
            }
        }
    }
    out
}

/// Per request: the longest prefix shared with any earlier request's
/// sequence, prompt and answer (what a perfect cache that keeps answers
/// could serve, before the grid and the last-token rule).
pub(super) fn reusable(reqs: &[WorkRequest]) -> Vec<u64> {
    (0..reqs.len())
        .map(|i| {
            let t = &reqs[i].tokens;
            reqs[..i]
                .iter()
                .map(|e| {
                    let seq = e.tokens.iter().chain(e.output.iter());
                    t.iter().zip(seq).take_while(|(a, b)| a == b).count()
                })
                .max()
                .unwrap_or(0) as u64
        })
        .collect()
}

//! Public production traces in the Mooncake format (FAST'25 trace release;
//! `tests/data/mooncake/README.md`): one JSON object per line,
//! `{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids":
//! [...]}`, where `hash_ids` are the ids of the prompt's 512-token prefix
//! blocks (equal ids at equal positions: equal blocks, and so equal
//! prefixes up to there; the last block may be partial).
//!
//! - [`read_trace`] streams a file line by line with an error naming the
//!   line and the field for anything malformed, and bounds every size (a
//!   hostile file cannot make it allocate without limit).
//! - [`prompt_tokens`] and [`output_tokens`] derive token ids: a block's
//!   tokens are a pure function of its hash id (so equal ids give equal
//!   tokens, and the trace's sharing is the tokens' sharing); a request's
//!   output tokens a pure function of its index.
//! - [`ideal_hit`] and [`lru_hit`] are the trace's own prefix-hit figures
//!   over full blocks: with unlimited capacity, and with an LRU of block
//!   ids of a given capacity (what a plain prefix cache over prompt blocks
//!   can serve), so modes can be set against them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::io::{BufRead, Read};
use std::path::Path;

use serde::Deserialize;

use super::workload::mix;

/// Tokens per hash id of the Mooncake traces.
pub const TRACE_BLOCK: u64 = 512;
/// Longest prompt accepted (tokens): 10x the longest contexts served today.
pub const MAX_INPUT: u64 = 10_000_000;
/// Longest output accepted (tokens).
pub const MAX_OUTPUT: u64 = 1_000_000;
/// Most requests accepted from one file.
pub const MAX_REQUESTS: usize = 10_000_000;
/// Longest line accepted (bytes): a 10M-token prompt's ids fit easily.
pub const MAX_LINE: usize = 1 << 28;

/// One request of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceRequest {
    /// Arrival time, in milliseconds from the trace's start.
    pub timestamp_ms: u64,
    /// Prompt tokens.
    pub input_length: u64,
    /// Generated tokens.
    pub output_length: u64,
    /// Ids of the prompt's 512-token blocks, the last possibly partial.
    pub hash_ids: Vec<u64>,
}

impl TraceRequest {
    /// Prompt blocks that hold all 512 tokens.
    pub fn full_blocks(&self) -> usize {
        (self.input_length / TRACE_BLOCK) as usize
    }
}

/// What is wrong with a trace file.
#[derive(Debug)]
pub enum TraceError {
    /// The file cannot be read.
    Io(std::io::Error),
    /// Line `line` (1-based) is not a request of the format.
    Line {
        /// The line number.
        line: usize,
        /// What is wrong with it.
        why: LineError,
    },
    /// The file holds no request.
    Empty,
    /// More requests than [`MAX_REQUESTS`].
    TooMany,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceError::Io(e) => write!(f, "cannot read the trace: {e}"),
            TraceError::Line { line, why } => write!(f, "trace line {line}: {why}"),
            TraceError::Empty => write!(f, "the trace holds no request"),
            TraceError::TooMany => write!(f, "the trace holds more than {MAX_REQUESTS} requests"),
        }
    }
}

impl std::error::Error for TraceError {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRequest {
    timestamp: u64,
    input_length: u64,
    output_length: u64,
    hash_ids: Vec<u64>,
}

/// What is wrong with one line of a trace ([`TraceError::Line`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// Not a JSON object of the format (the parser's message, cut to 200
    /// bytes).
    #[error("{message}")]
    Json {
        /// The parser's message.
        message: String,
    },
    /// A line longer than [`MAX_LINE`] bytes.
    #[error("longer than {MAX_LINE} bytes")]
    TooLong,
    /// A line that is not UTF-8.
    #[error("not UTF-8")]
    NotUtf8,
    /// A timestamp before the previous request's.
    #[error("timestamp {timestamp} before the previous request's {previous}")]
    Backwards {
        /// This request's.
        timestamp: u64,
        /// The previous request's.
        previous: u64,
    },
    /// `input_length` of 0 or above [`MAX_INPUT`].
    #[error("input_length {value} is outside 1..={MAX_INPUT}")]
    InputLength {
        /// The value.
        value: u64,
    },
    /// `output_length` above [`MAX_OUTPUT`].
    #[error("output_length {value} is above {MAX_OUTPUT}")]
    OutputLength {
        /// The value.
        value: u64,
    },
    /// Another number of `hash_ids` than `input_length` has blocks.
    #[error(
        "{got} hash_ids for input_length {input_length} ({blocks} blocks of {TRACE_BLOCK} tokens)"
    )]
    HashIds {
        /// `hash_ids` given.
        got: usize,
        /// The request's `input_length`.
        input_length: u64,
        /// Its blocks.
        blocks: u64,
    },
}

/// Parses one line (no newline) as a request.
pub fn parse_line(text: &str) -> Result<TraceRequest, LineError> {
    let raw: RawRequest = serde_json::from_str(text).map_err(|e| {
        let mut message = e.to_string();
        let mut cut = message.len().min(200);
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        LineError::Json { message }
    })?;
    if raw.input_length == 0 || raw.input_length > MAX_INPUT {
        return Err(LineError::InputLength {
            value: raw.input_length,
        });
    }
    if raw.output_length > MAX_OUTPUT {
        return Err(LineError::OutputLength {
            value: raw.output_length,
        });
    }
    let blocks = raw.input_length.div_ceil(TRACE_BLOCK);
    if raw.hash_ids.len() as u64 != blocks {
        return Err(LineError::HashIds {
            got: raw.hash_ids.len(),
            input_length: raw.input_length,
            blocks,
        });
    }
    Ok(TraceRequest {
        timestamp_ms: raw.timestamp,
        input_length: raw.input_length,
        output_length: raw.output_length,
        hash_ids: raw.hash_ids,
    })
}

/// Reads a trace from `reader`. Blank lines are skipped; timestamps must not
/// decrease (a trace is in arrival order).
pub fn read_trace_from<R: BufRead>(mut reader: R) -> Result<Vec<TraceRequest>, TraceError> {
    let mut out = Vec::new();
    let mut last = 0u64;
    let mut line = Vec::new();
    let mut n = 0usize;
    loop {
        line.clear();
        let got = Read::take(&mut reader, MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(TraceError::Io)?;
        if got == 0 {
            break;
        }
        n += 1;
        if line.len() > MAX_LINE {
            return Err(TraceError::Line {
                line: n,
                why: LineError::TooLong,
            });
        }
        let text = std::str::from_utf8(&line).map_err(|_| TraceError::Line {
            line: n,
            why: LineError::NotUtf8,
        })?;
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        let r = parse_line(text).map_err(|why| TraceError::Line { line: n, why })?;
        if r.timestamp_ms < last {
            return Err(TraceError::Line {
                line: n,
                why: LineError::Backwards {
                    timestamp: r.timestamp_ms,
                    previous: last,
                },
            });
        }
        last = r.timestamp_ms;
        if out.len() == MAX_REQUESTS {
            return Err(TraceError::TooMany);
        }
        out.push(r);
    }
    if out.is_empty() {
        return Err(TraceError::Empty);
    }
    Ok(out)
}

/// Reads the trace file at `path`.
pub fn read_trace(path: &Path) -> Result<Vec<TraceRequest>, TraceError> {
    let f = std::fs::File::open(path).map_err(TraceError::Io)?;
    read_trace_from(std::io::BufReader::new(f))
}

/// The 512 tokens of the block with hash id `id` (`seed` varies them).
fn block_tokens(seed: u64, id: u64, out: &mut Vec<u32>, take: usize) {
    for j in 0..take as u64 {
        out.push((mix(seed, 0x0074_7261_6365, id, j) % 100_000) as u32);
    }
}

/// The prompt's token ids: block `i`'s tokens are a function of
/// `hash_ids[i]` only, the last block cut to the prompt's length.
pub fn prompt_tokens(seed: u64, r: &TraceRequest) -> Vec<u32> {
    let mut out = Vec::with_capacity(r.input_length as usize);
    let mut left = r.input_length as usize;
    for &id in &r.hash_ids {
        let take = left.min(TRACE_BLOCK as usize);
        block_tokens(seed, id, &mut out, take);
        left -= take;
    }
    out
}

/// The output tokens of request number `index` of the trace.
pub fn output_tokens(seed: u64, index: usize, r: &TraceRequest) -> Vec<u32> {
    (0..r.output_length)
        .map(|j| (mix(seed, 0x6f75_7470_7574, index as u64, j) % 100_000) as u32)
        .collect()
}

/// Prefix-hit figures of a trace over full 512-token prompt blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HitCount {
    /// Prompt tokens over the trace.
    pub input_tokens: u64,
    /// Tokens of the leading full blocks found.
    pub hit_tokens: u64,
}

impl HitCount {
    /// Hit tokens over input tokens.
    pub fn rate(&self) -> f64 {
        if self.input_tokens == 0 {
            0.0
        } else {
            self.hit_tokens as f64 / self.input_tokens as f64
        }
    }
}

/// With unlimited capacity: per request, the leading full blocks whose id
/// an earlier request's prompt held.
pub fn ideal_hit(trace: &[TraceRequest]) -> HitCount {
    ideal_and_blocks(trace).0
}

/// [`ideal_hit`], and the distinct full blocks of the trace (what it saw).
fn ideal_and_blocks(trace: &[TraceRequest]) -> (HitCount, HashSet<u64>) {
    let mut seen: HashSet<u64> = HashSet::new();
    let mut c = HitCount {
        input_tokens: 0,
        hit_tokens: 0,
    };
    for r in trace {
        let full = &r.hash_ids[..r.full_blocks()];
        let hit = full.iter().take_while(|id| seen.contains(id)).count();
        c.input_tokens += r.input_length;
        c.hit_tokens += hit as u64 * TRACE_BLOCK;
        seen.extend(full.iter().copied());
    }
    (c, seen)
}

/// A plain prefix cache of `capacity` full blocks with LRU eviction: per
/// request, the leading blocks it holds are hits (and become most recent),
/// then the prompt's full blocks are inserted in order.
pub fn lru_hit(trace: &[TraceRequest], capacity: usize) -> HitCount {
    // Recency by a counter; eviction takes the smallest stamp (an ordered
    // map from stamp to id keeps that O(log n)).
    let mut stamp_of: HashMap<u64, u64> = HashMap::new();
    let mut by_stamp: BTreeMap<u64, u64> = BTreeMap::new();
    let mut clock = 0u64;
    let mut c = HitCount {
        input_tokens: 0,
        hit_tokens: 0,
    };
    for r in trace {
        let full = &r.hash_ids[..r.full_blocks()];
        let hit = full
            .iter()
            .take_while(|id| stamp_of.contains_key(id))
            .count();
        c.input_tokens += r.input_length;
        c.hit_tokens += hit as u64 * TRACE_BLOCK;
        if capacity == 0 {
            continue;
        }
        for &id in full {
            clock += 1;
            if let Some(old) = stamp_of.insert(id, clock) {
                by_stamp.remove(&old);
            }
            by_stamp.insert(clock, id);
            while stamp_of.len() > capacity {
                if let Some((_, victim)) = by_stamp.pop_first() {
                    stamp_of.remove(&victim);
                }
            }
        }
    }
    c
}

/// Parses a capacity sweep: comma-separated token counts, plain or in
/// scientific notation (`1e4,1e5,2.5e6`), each a whole number of tokens
/// from 1 to 10^13; returned sorted, without repeats.
pub fn parse_capacities(s: &str) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let v: f64 = part
            .parse()
            .map_err(|_| format!("capacity `{part}` is not a number of tokens"))?;
        if !v.is_finite() || !(1.0..=1e13).contains(&v) || v.fract() != 0.0 {
            return Err(format!(
                "capacity `{part}` must be a whole number of tokens from 1 to 1e13"
            ));
        }
        out.push(v as u64);
    }
    if out.is_empty() {
        return Err("the sweep names no capacity".into());
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// What a trace allows by itself: its size, the ideal prefix hit rate and
/// a plain block-LRU's at each capacity (prompt blocks only, full blocks
/// of 512 tokens).
#[derive(Clone, Debug, serde::Serialize)]
pub struct TraceSummary {
    /// Requests read.
    pub requests: usize,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Distinct full prompt blocks.
    pub distinct_blocks: usize,
    /// Hit rate with unlimited capacity.
    pub ideal_hit_rate: f64,
    /// Per capacity (tokens): the block-LRU hit rate.
    pub lru: Vec<LruPoint>,
}

/// One capacity of the sweep.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct LruPoint {
    /// Capacity in tokens (whole 512-token blocks of it are held).
    pub capacity_tokens: u64,
    /// Prompt tokens found over prompt tokens.
    pub hit_rate: f64,
}

/// Summarises `trace` over the capacities (tokens), reporting each one's
/// progress to `progress`.
pub fn summarize(
    trace: &[TraceRequest],
    capacities: &[u64],
    mut progress: impl FnMut(&str),
) -> TraceSummary {
    let (ideal, distinct) = ideal_and_blocks(trace);
    let mut lru = Vec::with_capacity(capacities.len());
    for &cap in capacities {
        let t = std::time::Instant::now();
        let blocks = (cap / TRACE_BLOCK).min(usize::MAX as u64) as usize;
        let rate = lru_hit(trace, blocks).rate();
        progress(&format!(
            "capacity {cap} tokens ({blocks} blocks): LRU hit rate {rate:.4} ({:.1} s)",
            t.elapsed().as_secs_f64()
        ));
        lru.push(LruPoint {
            capacity_tokens: cap,
            hit_rate: rate,
        });
    }
    TraceSummary {
        requests: trace.len(),
        input_tokens: ideal.input_tokens,
        output_tokens: trace.iter().map(|r| r.output_length).sum(),
        distinct_blocks: distinct.len(),
        ideal_hit_rate: ideal.rate(),
        lru,
    }
}

/// The trace's working set: the tokens of its distinct full blocks (what a
/// cache holding every reusable block would hold).
pub fn working_set_tokens(trace: &[TraceRequest]) -> u64 {
    let (_, distinct) = ideal_and_blocks(trace);
    (distinct.len() as u64).saturating_mul(TRACE_BLOCK)
}

/// The summary as a table.
pub fn render_summary(path: &Path, s: &TraceSummary) -> String {
    let mut out = format!(
        "trace {}: {} requests, {} prompt tokens, {} output tokens, {} distinct full blocks\n\
         ideal prefix hit rate (unlimited capacity, full 512-token blocks): {:.4}\n\
         {:>18}  {:>18}\n",
        path.display(),
        s.requests,
        s.input_tokens,
        s.output_tokens,
        s.distinct_blocks,
        s.ideal_hit_rate,
        "capacity (tokens)",
        "block-LRU hit rate"
    );
    for p in &s.lru {
        out.push_str(&format!(
            "{:>18}  {:>18.4}\n",
            p.capacity_tokens, p.hit_rate
        ));
    }
    out
}

//! The report of `ucm replay`: per mode, the figures, as text and SVG.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// Faults of one kind, and what they caused.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FaultKindReport {
    /// Faults of this kind injected (chosen for a request).
    pub injected: u64,
    /// Those that hit a target (a fail point that fired, files removed, a
    /// rank that held saves).
    pub fired: u64,
    /// Disk writes a retry absorbed.
    pub retries: u64,
    /// Saves reported failed to the engine.
    pub failed_saves: u64,
    /// Load items reported failed to the engine (recomputed).
    pub failed_loads: u64,
    /// Requests whose hit shrank because of the fault (a miss, recomputed).
    pub misses: u64,
    /// Fired faults with an observed effect (any of the above).
    pub with_effect: u64,
    /// Fired faults whose effect was absorbed by design (a storm the
    /// memory tier covered, a dead rank whose shards other ranks hold).
    pub absorbed: u64,
    /// Fired I/O faults with neither an effect nor a retry: must be 0.
    pub unaccounted: u64,
}

/// The report of one mode.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ModeReport {
    /// Requests replayed.
    pub requests: usize,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Tokens served from the persistent tiers (`p*`, less failed loads).
    pub cached_tokens: u64,
    /// `cached_tokens` over the tokens reusable at all (each prompt's
    /// longest prefix shared with an earlier prompt, on the chain grid,
    /// without its last token).
    pub hit_rate: f64,
    /// Tokens the states let the engine skip over those the chain groups
    /// held: sum of `p*` over sum of `l`.
    pub state_hit_rate: f64,
    /// Simulated TTFT reduction against `recompute`, over requests with at
    /// least 4096 reusable tokens: the median over the runs (`--runs`).
    pub ttft_reduction_vs_recompute: Option<f64>,
    /// The same against `fold`.
    pub ttft_reduction_vs_fold: Option<f64>,
    /// Each run's reduction against `recompute` (its median is
    /// `ttft_reduction_vs_recompute`; their range is the spread).
    #[serde(default)]
    pub ttft_runs_vs_recompute: Vec<f64>,
    /// Each run's reduction against `fold`.
    #[serde(default)]
    pub ttft_runs_vs_fold: Vec<f64>,
    /// The load rate the TTFT model used (the first run's; GiB/s of
    /// scaled bytes, see `replay::ttft`).
    #[serde(default)]
    pub load_rate_gib_s: Option<f64>,
    /// The host copy rate the TTFT model used for the bytes the scaled
    /// run did not move (GiB/s, measured in the run).
    #[serde(default)]
    pub copy_rate_gib_s: f64,
    /// Loaded items that differed from the oracle, items never loaded yet
    /// not reported, and writes where the engine computes (must be 0).
    pub wrong_hits: u64,
    /// Saves reported good that no tier held (must be 0).
    pub lost_saves: u64,
    /// Items the oracle checked after loads.
    pub checked_items: u64,
    /// Faults injected.
    pub injected_faults: u64,
    /// Fired faults with an observed effect or absorbed by design.
    pub reported_faults: u64,
    /// Fired I/O faults with no observed effect (must be 0).
    pub unaccounted_faults: u64,
    /// Requests whose loads failed and which were recomputed.
    pub recomputed_after_failed_load: u64,
    /// Per fault kind.
    pub faults: std::collections::BTreeMap<String, FaultKindReport>,
    /// Bytes loaded into the engine (scaled).
    pub bytes_loaded: u64,
    /// Bytes saved.
    pub bytes_saved: u64,
    /// Bytes the stores served from the memory tier (scaled).
    pub bytes_from_pool: u64,
    /// Bytes the stores read from the disk tier (scaled).
    pub bytes_from_disk: u64,
    /// Load throughput, GiB/s (scaled bytes over load wall time).
    pub load_gib_s: f64,
    /// Per turn: (hit rate, mean simulated TTFT in ms).
    pub per_turn: Vec<(f64, f64)>,
    /// Simulated TTFT of each request, ms (for cross-mode ratios).
    #[serde(skip)]
    pub ttft_ms: Vec<f64>,
    /// The same for each further run of `--runs` (the first is `ttft_ms`).
    #[serde(skip)]
    pub ttft_ms_reruns: Vec<Vec<f64>>,
    /// The denominator of `hit_rate`.
    pub reusable_tokens: u64,
    /// Tokens served to each request.
    #[serde(skip)]
    pub served: Vec<u64>,
}

/// The full report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Per mode.
    pub modes: std::collections::BTreeMap<String, ModeReport>,
}

pub(super) fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        (a as f64 / b as f64 * 1e4).round() / 1e4
    }
}

pub(super) fn turns(m: &HashMap<usize, (f64, f64, f64, usize)>) -> Vec<(f64, f64)> {
    let mut keys: Vec<usize> = m.keys().copied().collect();
    keys.sort_unstable();
    keys.iter()
        .map(|k| {
            let (c, t, p, n) = m[k];
            (if p > 0.0 { c / p } else { 0.0 }, t / n.max(1) as f64)
        })
        .collect()
}

pub(super) fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

/// The report as text.
pub fn render_text(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<10} {:>8} {:>10} {:>10} {:>8} {:>8} {:>9} {:>9} {:>6} {:>9}",
        "mode",
        "requests",
        "prompt",
        "cached",
        "hit",
        "state",
        "ttft-rec",
        "ttft-fold",
        "wrong",
        "faults"
    );
    for (name, m) in &r.modes {
        let pct = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:.1}%", v * 100.0));
        let _ = writeln!(
            s,
            "{:<10} {:>8} {:>10} {:>10} {:>7.1}% {:>7.1}% {:>9} {:>9} {:>6} {:>4}/{:<4}",
            name,
            m.requests,
            m.prompt_tokens,
            m.cached_tokens,
            m.hit_rate * 100.0,
            m.state_hit_rate * 100.0,
            pct(m.ttft_reduction_vs_recompute),
            pct(m.ttft_reduction_vs_fold),
            m.wrong_hits,
            m.reported_faults,
            m.injected_faults
        );
    }
    for (name, m) in r.modes.iter().filter(|(_, m)| m.injected_faults > 0) {
        let _ = writeln!(
            s,
            "faults of {name}: {} requests recomputed after a failed load",
            m.recomputed_after_failed_load
        );
        for (kind, f) in &m.faults {
            let _ = writeln!(
                s,
                "  {kind:<14} injected {:>3}, fired {:>3}: retries {}, failed saves {}, \
                 failed loads {}, misses {}; with effect {}, absorbed {}, unaccounted {}",
                f.injected,
                f.fired,
                f.retries,
                f.failed_saves,
                f.failed_loads,
                f.misses,
                f.with_effect,
                f.absorbed,
                f.unaccounted
            );
        }
    }
    for (name, m) in r
        .modes
        .iter()
        .filter(|(_, m)| m.ttft_runs_vs_recompute.len() > 1)
    {
        let spread = |v: &[f64]| {
            let (lo, hi) = v
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &x| {
                    (l.min(x), h.max(x))
                });
            format!(
                "{:.1}% [{:.1}%..{:.1}%]",
                median(v) * 100.0,
                lo * 100.0,
                hi * 100.0
            )
        };
        let _ = write!(
            s,
            "ttft of {name} over {} runs: vs recompute {}",
            m.ttft_runs_vs_recompute.len(),
            spread(&m.ttft_runs_vs_recompute)
        );
        if !m.ttft_runs_vs_fold.is_empty() {
            let _ = write!(s, ", vs fold {}", spread(&m.ttft_runs_vs_fold));
        }
        let _ = writeln!(s);
    }
    s
}

/// The median of `v` (0 when empty).
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// An SVG of hit rate and mean TTFT per turn, one line per mode.
pub fn render_svg(r: &Report) -> String {
    let (w, h, pad) = (640.0, 240.0, 40.0);
    let colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
    let mut s = format!("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"11\">\n", w * 2.0, h);
    let max_ttft = r
        .modes
        .values()
        .flat_map(|m| m.per_turn.iter().map(|t| t.1))
        .fold(1.0, f64::max);
    for (panel, title) in [
        (0, "hit rate per turn"),
        (1, "mean simulated TTFT per turn (ms)"),
    ] {
        let x0 = panel as f64 * w;
        let _ = writeln!(s, "<text x=\"{}\" y=\"16\">{title}</text>", x0 + pad);
        let _ = writeln!(
            s,
            "<rect x=\"{}\" y=\"{pad}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999\"/>",
            x0 + pad,
            w - 2.0 * pad,
            h - 2.0 * pad
        );
        for (ci, (name, m)) in r.modes.iter().enumerate() {
            let n = m.per_turn.len().max(2) - 1;
            let pts: Vec<String> = m
                .per_turn
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let v = if panel == 0 {
                        t.0.min(1.0)
                    } else {
                        t.1 / max_ttft
                    };
                    format!(
                        "{:.1},{:.1}",
                        x0 + pad + (w - 2.0 * pad) * i as f64 / n as f64,
                        h - pad - (h - 2.0 * pad) * v
                    )
                })
                .collect();
            let c = colors[ci % colors.len()];
            let _ = writeln!(
                s,
                "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>",
                pts.join(" ")
            );
            let _ = writeln!(
                s,
                "<text x=\"{}\" y=\"{}\" fill=\"{c}\">{name}</text>",
                x0 + w - pad - 60.0,
                pad + 14.0 * (ci + 1) as f64
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

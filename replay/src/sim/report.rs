//! The report of a capacity-only trace replay: per engine capacity, every
//! mode's hit rate, what it loaded and its simulated TTFT, beside the
//! trace's own figures; as a table, JSON and an SVG of hit rate over
//! capacity.

use std::fmt::Write as _;

use serde::Serialize;

use super::{SimConfig, SimMode, SimPoint, SweepKind};
use crate::trace::TraceSummary;

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct SimReport {
    /// Labels the run: no bytes were moved.
    pub kind: &'static str,
    /// The trace file.
    pub trace: String,
    /// The spec table.
    pub spec: String,
    /// K/V bytes per token at full size (what a token of capacity holds).
    pub kv_bytes_per_token: u64,
    /// What the sweep's axis is.
    pub sweep: SweepKind,
    /// The engine cache in front of the offload modes of a capacity sweep
    /// (tokens; 0 for an engine sweep).
    pub engine_tokens: u64,
    /// The settings.
    pub config: SimConfig,
    /// The trace's own figures (ideal, block-LRU per capacity).
    pub summary: TraceSummary,
    /// Every point, in (capacity, mode) order; `recompute` once.
    pub points: Vec<SimPoint>,
}

impl SimReport {
    fn point(&self, mode: SimMode, cap: u64) -> Option<&SimPoint> {
        self.points
            .iter()
            .find(|p| p.mode == mode && (p.capacity_tokens == cap || mode == SimMode::Recompute))
    }

    fn capacities(&self) -> Vec<u64> {
        let mut c: Vec<u64> = self
            .points
            .iter()
            .filter(|p| p.mode != SimMode::Recompute)
            .map(|p| p.capacity_tokens)
            .collect();
        c.sort_unstable();
        c.dedup();
        c
    }

    fn modes(&self) -> Vec<SimMode> {
        let mut m: Vec<SimMode> = self.points.iter().map(|p| p.mode).collect();
        m.sort();
        m.dedup();
        m
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// The report as text.
pub fn render_text(r: &SimReport) -> String {
    let s = &r.summary;
    let c = &r.config;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "capacity-only replay (no bytes moved: the real resolve, retention and scheduler over \
         capacity-modelled tiers)\ntrace {}: {} requests, {} prompt tokens, {} output tokens\n\
         spec {}: {} B of K/V per token at full size\n\
         ideal prefix hit rate (unlimited, full 512-token blocks): {:.4}",
        r.trace,
        s.requests,
        s.input_tokens,
        s.output_tokens,
        r.spec,
        r.kv_bytes_per_token,
        s.ideal_hit_rate,
    );
    match r.sweep {
        SweepKind::Engine => {
            let _ = writeln!(
                out,
                "sweep of the engine's prefix cache; tiers below the engine (ucm, lmcache, \
                 marconi, fold): memory {} tokens ({:.0} GiB), disk {} tokens ({:.0} GiB)",
                c.pool_tokens,
                gib(c.pool_tokens.saturating_mul(r.kv_bytes_per_token)),
                c.disk_tokens,
                gib(c.disk_tokens.saturating_mul(r.kv_bytes_per_token)),
            );
        }
        SweepKind::Cache => {
            let _ = writeln!(
                out,
                "sweep of the cache's capacity C, the same for every mode: ucm, lmcache, marconi \
                 and fold keep C on disk (C/10 also in memory) below an engine cache of {} \
                 tokens; vllm and sglang get an engine cache of {} + C",
                r.engine_tokens, r.engine_tokens
            );
        }
    }
    let _ = writeln!(
        out,
        "loads at {} GiB/s (memory) and {} GiB/s (disk), assumed; compute {} us per token not \
         served; ucm decode retention {}, tiers split {}; ceiling: the rate unlimited \
         capacity would give",
        c.pool_gib_s,
        c.disk_gib_s,
        c.compute_us_per_token,
        if c.decode_retention { "on" } else { "off" },
        c.tier_split.name()
    );
    let base = r.point(SimMode::Recompute, 0).map(|p| p.ttft_mean_ms);
    for cap in r.capacities() {
        let lru = s
            .lru
            .iter()
            .find(|l| l.capacity_tokens == cap)
            .map_or(String::new(), |l| {
                format!("; block-LRU of the trace: {:.4}", l.hit_rate)
            });
        let ceiling = r
            .points
            .iter()
            .find(|p| p.capacity_tokens == cap)
            .map_or(0.0, |p| p.ceiling_hit_rate);
        let what = match r.sweep {
            SweepKind::Engine => "engine prefix cache",
            SweepKind::Cache => "cache capacity",
        };
        let _ = writeln!(
            out,
            "\n{what} {cap} tokens ({:.1} GiB); ceiling {ceiling:.4}{lru}",
            gib(cap.saturating_mul(r.kv_bytes_per_token))
        );
        let _ = writeln!(
            out,
            "  {:<10} {:>8} {:>10} {:>12} {:>12} {:>12} {:>11} {:>11} {:>13}",
            "mode",
            "hit",
            "of it: eng",
            "mem GiB",
            "disk GiB",
            "state GiB",
            "TTFT ms",
            "p90 ms",
            "vs recompute"
        );
        for mode in r.modes() {
            let Some(p) = r.point(mode, cap) else {
                continue;
            };
            let vs = base.filter(|b| *b > 0.0).map_or("-".to_string(), |b| {
                format!("{:+.1}%", 100.0 * (p.ttft_mean_ms / b - 1.0))
            });
            let _ = writeln!(
                out,
                "  {:<10} {:>8.4} {:>10.4} {:>12.1} {:>12.1} {:>12.1} {:>11.1} {:>11.1} {:>13}",
                mode.name(),
                p.hit_rate,
                p.engine_served as f64 / p.prompt_tokens.max(1) as f64,
                gib(p.bytes_from_pool),
                gib(p.bytes_from_disk),
                gib(p.state_bytes_saved),
                p.ttft_mean_ms,
                p.ttft_p90_ms,
                vs
            );
        }
    }
    out
}

/// An SVG of hit rate over the sweep's capacity (log scale), one line per
/// mode, with the trace's ideal and block-LRU figures.
pub fn render_svg(r: &SimReport) -> String {
    let (w, h, pad) = (720.0, 360.0, 50.0);
    let caps = r.capacities();
    let colors = [
        "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#7f7f7f", "#e377c2", "#bcbd22",
    ];
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         font-family=\"sans-serif\" font-size=\"11\">\n\
         <text x=\"{pad}\" y=\"18\">prefix hit rate over {} capacity (tokens, log \
         scale); capacity-only replay of {}</text>\n\
         <rect x=\"{pad}\" y=\"{pad}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999\"/>\n",
        match r.sweep {
            SweepKind::Engine => "engine cache",
            SweepKind::Cache => "cache",
        },
        xml(&r.trace),
        w - 2.0 * pad,
        h - 2.0 * pad
    );
    let (lo, hi) = (
        (caps.first().copied().unwrap_or(1).max(1) as f64).log10(),
        (caps.last().copied().unwrap_or(10).max(1) as f64).log10(),
    );
    let span = (hi - lo).max(1e-9);
    let x = |cap: u64| pad + (w - 2.0 * pad) * ((cap.max(1) as f64).log10() - lo) / span;
    let y = |v: f64| h - pad - (h - 2.0 * pad) * v.clamp(0.0, 1.0);
    for &cap in &caps {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{cap:.0e}</text>",
            x(cap),
            h - pad + 16.0
        );
    }
    for v in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{v:.2}</text>",
            pad - 4.0,
            y(v) + 4.0
        );
    }
    let mut series: Vec<Series> = Vec::new();
    series.push((
        "ideal".into(),
        caps.iter()
            .map(|&c| (c, r.summary.ideal_hit_rate))
            .collect(),
        true,
    ));
    series.push((
        "block-LRU".into(),
        r.summary
            .lru
            .iter()
            .map(|l| (l.capacity_tokens, l.hit_rate))
            .collect(),
        true,
    ));
    for mode in r.modes() {
        let pts = caps
            .iter()
            .filter_map(|&c| r.point(mode, c).map(|p| (c, p.hit_rate)))
            .collect();
        series.push((mode.name().into(), pts, false));
    }
    for (i, (name, pts, dashed)) in series.iter().enumerate() {
        let c = colors[i % colors.len()];
        let line: Vec<String> = pts
            .iter()
            .map(|&(cap, v)| format!("{:.1},{:.1}", x(cap), y(v)))
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\"{} points=\"{}\"/>",
            if *dashed {
                " stroke-dasharray=\"5,4\""
            } else {
                ""
            },
            line.join(" ")
        );
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" fill=\"{c}\">{}</text>",
            w - pad + 4.0 - 80.0,
            pad + 14.0 * (i + 1) as f64,
            xml(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// A line of the plot: its name, its points, dashed or not.
type Series = (String, Vec<(u64, f64)>, bool);

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

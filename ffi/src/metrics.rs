//! Counters and histograms of one cache, rendered in the Prometheus text
//! format: hits and misses per group, bytes per tier, load and save
//! latency, failed loads and saves, evictions. The adapter and the stores
//! count; this module adds what only the embedding sees (lookups, the time
//! a layer waits for its loads, the time of a whole step) and renders all.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use ucm_coordinator::adapter::{Finished, GroupCounters, LoadError};
use ucm_coordinator::{Kind, SpecTable};

/// Upper bounds of the latency buckets, in seconds.
pub const BUCKETS: [f64; 12] = [
    1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1.0, 5.0,
];

/// A latency histogram with the fixed [`BUCKETS`].
#[derive(Debug, Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|&b| s <= b) {
            self.counts[i].fetch_add(1, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_ns
            .fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cum = 0;
        for (b, c) in BUCKETS.iter().zip(&self.counts) {
            cum += c.load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cum}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count());
        let sum = self.sum_ns.load(Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {}", self.count());
    }
}

/// A store counter: its name, help and how to read it.
type StoreCounter = (&'static str, &'static str, fn(&GroupCounters) -> u64);

/// Per hashed group: tokens served and not served by lookups.
#[derive(Debug)]
struct GroupLookups {
    name: String,
    hit_tokens: AtomicU64,
    miss_tokens: AtomicU64,
}

/// The embedding's counters and histograms of one cache.
#[derive(Debug)]
pub struct Metrics {
    groups: Vec<GroupLookups>,
    /// Lookups answered.
    pub lookups: AtomicU64,
    /// Lookups that served at least one token.
    pub lookup_hits: AtomicU64,
    /// Servable prompt tokens looked up (every prompt token but the last).
    pub lookup_tokens: AtomicU64,
    /// Of those, served: held by the engine or loaded by UCM.
    pub served_tokens: AtomicU64,
    /// Of those, what unlimited capacity would have served (the hit
    /// ceiling, `ucm_coordinator::ceiling`).
    pub ceiling_tokens: AtomicU64,
    /// Requests whose loads started.
    pub loads: AtomicU64,
    /// Load items reported failed (the engine recomputes them).
    pub failed_loads: AtomicU64,
    /// Requests with a failed save.
    pub failed_saves: AtomicU64,
    /// Requests whose saves all ended.
    pub saved_requests: AtomicU64,
    /// Time a layer waited for its loads.
    pub load_wait: Histogram,
    /// Time from `start_load_kv` to the end of `wait_for_save`: a step's
    /// whole load-and-save work as the engine sees it.
    pub step: Histogram,
}

impl Metrics {
    /// Zeroed metrics for `spec`'s groups.
    pub fn new(spec: &SpecTable) -> Self {
        Metrics {
            groups: spec
                .groups()
                .iter()
                .filter(|g| g.kind != Kind::None)
                .map(|g| GroupLookups {
                    name: g.name.clone(),
                    hit_tokens: AtomicU64::new(0),
                    miss_tokens: AtomicU64::new(0),
                })
                .collect(),
            lookups: AtomicU64::new(0),
            lookup_hits: AtomicU64::new(0),
            lookup_tokens: AtomicU64::new(0),
            served_tokens: AtomicU64::new(0),
            ceiling_tokens: AtomicU64::new(0),
            loads: AtomicU64::new(0),
            failed_loads: AtomicU64::new(0),
            failed_saves: AtomicU64::new(0),
            saved_requests: AtomicU64::new(0),
            load_wait: Histogram::default(),
            step: Histogram::default(),
        }
    }

    /// A lookup of a prompt with `visible` servable tokens, of which the
    /// engine held `held` and UCM served `served` more, and unlimited
    /// capacity would have served `ceiling`.
    pub(crate) fn lookup(&self, visible: u64, held: u64, served: u64, ceiling: u64) {
        self.lookups.fetch_add(1, Relaxed);
        self.lookup_tokens.fetch_add(visible, Relaxed);
        self.served_tokens
            .fetch_add(held.saturating_add(served).min(visible), Relaxed);
        self.ceiling_tokens.fetch_add(
            ceiling.max(held.saturating_add(served)).min(visible),
            Relaxed,
        );
        if served > 0 {
            self.lookup_hits.fetch_add(1, Relaxed);
        }
        let missed = visible.saturating_sub(held).saturating_sub(served);
        for g in &self.groups {
            g.hit_tokens.fetch_add(served, Relaxed);
            g.miss_tokens.fetch_add(missed, Relaxed);
        }
    }

    pub(crate) fn loads_started(&self, n: u64) {
        self.loads.fetch_add(n, Relaxed);
    }

    pub(crate) fn load_wait(&self, d: Duration) {
        self.load_wait.observe(d);
    }

    pub(crate) fn step(&self, d: Duration) {
        self.step.observe(d);
    }

    pub(crate) fn finished(&self, f: &Finished) {
        self.saved_requests.fetch_add(f.saved.len() as u64, Relaxed);
        self.failed_saves
            .fetch_add(f.save_failed.len() as u64, Relaxed);
    }

    pub(crate) fn load_errors(&self, e: &[LoadError]) {
        self.failed_loads.fetch_add(e.len() as u64, Relaxed);
    }

    /// Tokens served and missed so far for group `name`.
    pub fn group_tokens(&self, name: &str) -> Option<(u64, u64)> {
        self.groups
            .iter()
            .find(|g| g.name == name)
            .map(|g| (g.hit_tokens.load(Relaxed), g.miss_tokens.load(Relaxed)))
    }

    /// The Prometheus text exposition of these metrics and of the stores'
    /// counters (`stores`: per group name, its instance's counters).
    pub fn render(&self, stores: &[(String, GroupCounters)]) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let _ = writeln!(out, "{name} {v}");
        };
        counter(
            &mut out,
            "ucm_lookups_total",
            "Prompts looked up.",
            self.lookups.load(Relaxed),
        );
        counter(
            &mut out,
            "ucm_lookup_hits_total",
            "Lookups that served at least one token.",
            self.lookup_hits.load(Relaxed),
        );
        counter(
            &mut out,
            "ucm_lookup_tokens_total",
            "Servable prompt tokens looked up (every prompt token but the last).",
            self.lookup_tokens.load(Relaxed),
        );
        counter(
            &mut out,
            "ucm_served_tokens_total",
            "Of the tokens looked up, those served: held by the engine or loaded by UCM.",
            self.served_tokens.load(Relaxed),
        );
        counter(
            &mut out,
            "ucm_hit_ceiling_tokens_total",
            "Of the tokens looked up, those unlimited capacity would have served (the hit \
             ceiling): served/looked up below ceiling/looked up means capacity, not policy, \
             limits the hit rate.",
            self.ceiling_tokens.load(Relaxed),
        );
        let _ = writeln!(
            out,
            "# HELP ucm_hit_tokens_total Prompt tokens served, per group."
        );
        let _ = writeln!(out, "# TYPE ucm_hit_tokens_total counter");
        for g in &self.groups {
            let _ = writeln!(
                out,
                "ucm_hit_tokens_total{{group=\"{}\"}} {}",
                g.name,
                g.hit_tokens.load(Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP ucm_miss_tokens_total Prompt tokens neither the engine nor UCM held, per group."
        );
        let _ = writeln!(out, "# TYPE ucm_miss_tokens_total counter");
        for g in &self.groups {
            let _ = writeln!(
                out,
                "ucm_miss_tokens_total{{group=\"{}\"}} {}",
                g.name,
                g.miss_tokens.load(Relaxed)
            );
        }
        counter(
            &mut out,
            "ucm_load_requests_total",
            "Requests whose loads started.",
            self.loads.load(Relaxed),
        );
        counter(
            &mut out,
            "ucm_failed_loads_total",
            "Load items reported failed to the engine (recomputed).",
            self.failed_loads.load(Relaxed),
        );
        counter(
            &mut out,
            "ucm_saved_requests_total",
            "Finished requests whose saves all ended.",
            self.saved_requests.load(Relaxed),
        );
        counter(
            &mut out,
            "ucm_failed_saves_total",
            "Requests with a failed save.",
            self.failed_saves.load(Relaxed),
        );
        let per_group: [StoreCounter; 9] = [
            (
                "ucm_pool_read_bytes_total",
                "Bytes loaded from the memory pool.",
                |c| c.pool_hits * c.shard_bytes,
            ),
            (
                "ucm_disk_read_bytes_total",
                "Bytes read from the disk tier.",
                |c| c.disk_reads * c.shard_bytes,
            ),
            ("ucm_store_misses_total", "Load items no tier held.", |c| {
                c.misses
            }),
            (
                "ucm_store_failed_items_total",
                "Store items that failed.",
                |c| c.failed_items,
            ),
            (
                "ucm_disk_blocks_written_total",
                "Blocks written to disk.",
                |c| c.blocks_written,
            ),
            (
                "ucm_disk_write_failures_total",
                "Block writes that failed for good.",
                |c| c.write_failures,
            ),
            (
                "ucm_evictions_total",
                "Block files deleted by the disk tier's GC.",
                |c| c.disk_evictions,
            ),
            (
                "ucm_store_worker_panics_total",
                "Store jobs whose worker panicked (a bug); their items failed.",
                |c| c.worker_panics,
            ),
            (
                "ucm_disk_fs_syncs_total",
                "syncfs calls that made batches of block writes durable (0 where each file is fsynced).",
                |c| c.fs_syncs,
            ),
        ];
        for (name, help, f) in per_group {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            for (g, c) in stores {
                let _ = writeln!(out, "{name}{{group=\"{g}\"}} {}", f(c));
            }
        }
        self.load_wait.render(
            &mut out,
            "ucm_layer_load_wait_seconds",
            "Time a layer waited for its loads.",
        );
        self.step.render(
            &mut out,
            "ucm_step_seconds",
            "Time from start_load_kv to the end of wait_for_save.",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_count_everything() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(3));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(60));
        let mut s = String::new();
        h.render(&mut s, "x", "help");
        assert!(s.contains("x_bucket{le=\"0.00001\"} 1"), "{s}");
        assert!(s.contains("x_bucket{le=\"0.005\"} 2"), "{s}");
        assert!(s.contains("x_bucket{le=\"5\"} 2"), "{s}");
        assert!(s.contains("x_bucket{le=\"+Inf\"} 3"), "{s}");
        assert!(s.contains("x_count 3"), "{s}");
    }

    #[test]
    fn store_counters_are_rendered_per_group() {
        let spec = SpecTable::from_toml(
            r#"
model = "m"
num_layers = 1
[[group]]
name = "attn"
kind = "chain"
block_size = 4
layers = "0"
bytes_per_token = 64
"#,
        )
        .unwrap();
        let c = GroupCounters {
            shard_bytes: 4096,
            disk_reads: 3,
            worker_panics: 2,
            fs_syncs: 5,
            ..GroupCounters::default()
        };
        let s = Metrics::new(&spec).render(&[("attn".into(), c)]);
        assert!(
            s.contains("ucm_disk_read_bytes_total{group=\"attn\"} 12288"),
            "{s}"
        );
        assert!(
            s.contains("# TYPE ucm_store_worker_panics_total counter"),
            "{s}"
        );
        assert!(
            s.contains("ucm_store_worker_panics_total{group=\"attn\"} 2"),
            "{s}"
        );
        assert!(
            s.contains("ucm_disk_fs_syncs_total{group=\"attn\"} 5"),
            "{s}"
        );
    }
}

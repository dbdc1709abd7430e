//! `ucm bench remote`: the remote tier on a Redis or Valkey cluster
//! against a raw pipelined client loop over the same values, in the same
//! run, interleaved round by round.
//!
//! - put / get: values of each size written and read in calls of `batch`
//!   values; UCM writes each value as a block of one shard plus its header
//!   (52 bytes more per block, the checksum) and checks every shard on
//!   reads; the raw loop pipelines plain `SET` / `GET` of the same values.
//!   GiB/s of value bytes. Goal: UCM >= 0.8x the raw loop (medians).
//! - lookup: `ids` published blocks looked up in one call (one pipeline: a
//!   round trip per master) against the raw loop pipelining `EXISTS` of the
//!   same keys, and against one `EXISTS` per id (a round trip per id).
//!
//! Each side is reported as median and min-max over the rounds, the ratio
//! on medians, with the machine's load average at the start.

use std::time::Instant;

use redis::cluster::{cluster_pipe, ClusterClient};
use serde::Serialize;

use super::{Paired, Spread};
use ucm_store::{BlockId, Geometry, RemoteConfig, RemoteTier, StoreError};

/// One result.
#[derive(Clone, Debug, Serialize)]
pub struct RemoteRecord {
    /// `put`, `get` or `lookup`.
    pub op: String,
    /// Bytes per value (0 for lookups).
    pub value_bytes: usize,
    /// Values (or ids) per round.
    pub count: usize,
    /// UCM: GiB/s (put, get) or ids per second (lookup).
    pub ucm: Spread,
    /// The raw pipelined loop, same unit.
    pub raw: Spread,
    /// UCM over the raw loop: the median of the per-round ratios.
    pub ratio: f64,
    /// UCM over the raw loop round by round, their median and quartiles.
    pub paired: Paired,
    /// Lookups only: one `EXISTS` per id (a round trip each), ids/s.
    pub per_id: Option<Spread>,
    /// The machine's 1-minute load average at the start (none without
    /// `/proc/loadavg`).
    pub load_average: Option<f64>,
}

/// What to run.
#[derive(Clone, Debug)]
pub struct RemoteBenchConfig {
    /// `redis://host:port,...`
    pub url: String,
    /// Value sizes.
    pub value_sizes: Vec<usize>,
    /// Value bytes per round per size.
    pub total_bytes: u64,
    /// Values per call.
    pub batch: usize,
    /// Rounds.
    pub rounds: usize,
    /// Ids of the lookup case.
    pub lookup_ids: usize,
}

fn id(n: u64) -> BlockId {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&n.to_le_bytes());
    b[8..12].copy_from_slice(b"bnch");
    b
}

fn remote_err(op: &'static str) -> impl FnOnce(redis::RedisError) -> StoreError {
    move |source| StoreError::Remote { op, source }
}

/// Why the remote-tier bench stopped.
#[derive(Debug, thiserror::Error)]
pub enum RemoteBenchError {
    /// The tier or the raw client failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No round, batch or value size to run.
    #[error("rounds, batch and value sizes must be positive")]
    Empty,
    /// The URL is not a Redis or Valkey cluster.
    #[error("ucm bench remote measures a Redis or Valkey cluster (redis://...)")]
    NotRedis,
    /// A block written in this run was missing when `when` looked for it.
    #[error("a block written in this run was not found by {when} (server eviction?)")]
    Lost {
        /// `read` or `lookup`.
        when: &'static str,
    },
}

/// Runs every case, reporting progress.
pub fn run(
    cfg: &RemoteBenchConfig,
    progress: impl Fn(&str),
) -> Result<Vec<RemoteRecord>, RemoteBenchError> {
    if cfg.rounds == 0 || cfg.batch == 0 || cfg.value_sizes.is_empty() {
        return Err(RemoteBenchError::Empty);
    }
    let load = super::load_average();
    let ns = format!("bench-{}", std::process::id());
    let probe = RemoteConfig::from_url(
        &cfg.url,
        &ns,
        Geometry {
            shard_bytes: 4096,
            shards_per_block: 1,
        },
    )?;
    let ucm_store::Endpoint::Redis(nodes) = &probe.endpoint else {
        return Err(RemoteBenchError::NotRedis);
    };
    let client = ClusterClient::new(nodes.clone()).map_err(remote_err("configure"))?;
    let mut raw = client.get_connection().map_err(remote_err("connect"))?;
    let mut out = Vec::new();
    let gib = (1u64 << 30) as f64;
    for &size in &cfg.value_sizes {
        let geo = Geometry {
            shard_bytes: size,
            shards_per_block: 1,
        };
        let mut rc = RemoteConfig::from_url(&cfg.url, &ns, geo)?;
        rc.timeout = std::time::Duration::from_secs(10);
        let tier = RemoteTier::new(rc)?;
        let count = ((cfg.total_bytes / size as u64) as usize).max(cfg.batch);
        let value: Vec<u8> = (0..size).map(|i| (i * 131 % 251) as u8).collect();
        let raw_key = |n: usize| format!("rawbench:{ns}:{size}:{{{n}}}");
        let (mut up, mut rp, mut ug, mut rg) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for round in 0..cfg.rounds {
            // UCM put.
            let t = Instant::now();
            for chunk in (0..count).collect::<Vec<_>>().chunks(cfg.batch) {
                let blocks: Vec<(BlockId, Vec<&[u8]>)> = chunk
                    .iter()
                    .map(|&n| (id(n as u64), vec![&value[..]]))
                    .collect();
                for (_, r) in tier.write_blocks(&blocks) {
                    r?;
                }
            }
            up.push(count as f64 * size as f64 / gib / t.elapsed().as_secs_f64());
            // Raw put.
            let t = Instant::now();
            for chunk in (0..count).collect::<Vec<_>>().chunks(cfg.batch) {
                let mut p = cluster_pipe();
                for &n in chunk {
                    p.cmd("SET").arg(raw_key(n)).arg(&value[..]).ignore();
                }
                p.query::<()>(&mut raw).map_err(remote_err("raw put"))?;
            }
            rp.push(count as f64 * size as f64 / gib / t.elapsed().as_secs_f64());
            // UCM get (checked).
            let t = Instant::now();
            for chunk in (0..count).collect::<Vec<_>>().chunks(cfg.batch) {
                let reqs: Vec<(BlockId, Vec<u32>)> =
                    chunk.iter().map(|&n| (id(n as u64), vec![0])).collect();
                for r in tier.read_many(&reqs) {
                    if r?.is_none() {
                        return Err(RemoteBenchError::Lost { when: "read" });
                    }
                }
            }
            ug.push(count as f64 * size as f64 / gib / t.elapsed().as_secs_f64());
            // Raw get.
            let t = Instant::now();
            for chunk in (0..count).collect::<Vec<_>>().chunks(cfg.batch) {
                let mut p = cluster_pipe();
                for &n in chunk {
                    p.cmd("GET").arg(raw_key(n));
                }
                let got: Vec<Option<Vec<u8>>> = p.query(&mut raw).map_err(remote_err("raw get"))?;
                std::hint::black_box(got);
            }
            rg.push(count as f64 * size as f64 / gib / t.elapsed().as_secs_f64());
            progress(&format!(
                "remote {size}-byte values: round {}/{}",
                round + 1,
                cfg.rounds
            ));
        }
        for (op, u, r) in [("put", &up, &rp), ("get", &ug, &rg)] {
            let paired = Paired::of(u, r, 3);
            let (u, r) = (Spread::of(u), Spread::of(r));
            out.push(RemoteRecord {
                op: op.into(),
                value_bytes: size,
                count,
                ucm: u,
                raw: r,
                ratio: paired.median,
                paired,
                per_id: None,
                load_average: load,
            });
        }
        // Clean up both sides' keys.
        let ids: Vec<BlockId> = (0..count as u64).map(id).collect();
        for chunk in ids.chunks(512) {
            tier.delete(chunk)?;
        }
        for chunk in (0..count).collect::<Vec<_>>().chunks(512) {
            let mut p = cluster_pipe();
            for &n in chunk {
                p.cmd("DEL").arg(raw_key(n)).ignore();
            }
            p.query::<()>(&mut raw).map_err(remote_err("raw delete"))?;
        }
    }
    // Lookups: published blocks of one small shard.
    let geo = Geometry {
        shard_bytes: 4096,
        shards_per_block: 1,
    };
    let tier = RemoteTier::new(RemoteConfig::from_url(&cfg.url, &ns, geo)?)?;
    let n = cfg.lookup_ids.max(1);
    let ids: Vec<BlockId> = (0..n as u64).map(id).collect();
    let value = vec![7u8; 4096];
    for chunk in ids.chunks(512) {
        let blocks: Vec<(BlockId, Vec<&[u8]>)> =
            chunk.iter().map(|b| (*b, vec![&value[..]])).collect();
        for (_, r) in tier.write_blocks(&blocks) {
            r?;
        }
    }
    let keys: Vec<String> = ids
        .iter()
        .map(|b| {
            let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
            format!("ucm:{ns}:4096x1:{{{hex}}}:pub")
        })
        .collect();
    let (mut u, mut r, mut one) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..cfg.rounds {
        let t = Instant::now();
        let found = tier.lookup(&ids);
        let secs = t.elapsed().as_secs_f64();
        if found.iter().any(|f| !f) {
            return Err(RemoteBenchError::Lost { when: "lookup" });
        }
        u.push(n as f64 / secs);
        let t = Instant::now();
        let mut p = cluster_pipe();
        for k in &keys {
            p.cmd("EXISTS").arg(k);
        }
        let got: Vec<i64> = p.query(&mut raw).map_err(remote_err("raw lookup"))?;
        std::hint::black_box(got);
        r.push(n as f64 / t.elapsed().as_secs_f64());
        // One round trip per id: a sample of 1,000 (the rate is per id).
        let sample = keys.len().min(1000);
        let t = Instant::now();
        for k in &keys[..sample] {
            let e: i64 = redis::cmd("EXISTS")
                .arg(k)
                .query(&mut raw)
                .map_err(remote_err("raw exists"))?;
            std::hint::black_box(e);
        }
        one.push(sample as f64 / t.elapsed().as_secs_f64());
        progress(&format!(
            "remote lookup of {n} ids: round {}/{}",
            round + 1,
            cfg.rounds
        ));
    }
    for chunk in ids.chunks(512) {
        tier.delete(chunk)?;
    }
    let paired = Paired::of(&u, &r, 3);
    let (u, r) = (Spread::of(&u), Spread::of(&r));
    out.push(RemoteRecord {
        op: "lookup".into(),
        value_bytes: 0,
        count: n,
        ucm: u,
        raw: r,
        ratio: paired.median,
        paired,
        per_id: Some(Spread::of(&one)),
        load_average: load,
    });
    Ok(out)
}

/// The records as a table.
pub fn render(records: &[RemoteRecord]) -> String {
    let mut s = format!(
        "{:<7} {:>10} {:>8} {:>28} {:>28} {:>7} {:>16}\n",
        "op",
        "value",
        "count",
        "ucm median [min-max]",
        "raw median [min-max]",
        "ratio",
        "per-id median"
    );
    for r in records {
        let unit = if r.op == "lookup" { "ids/s" } else { "GiB/s" };
        let f = |x: &Spread| {
            if r.op == "lookup" {
                format!("{:.0} [{:.0}-{:.0}]", x.median, x.min, x.max)
            } else {
                format!("{:.2} [{:.2}-{:.2}]", x.median, x.min, x.max)
            }
        };
        s.push_str(&format!(
            "{:<7} {:>10} {:>8} {:>28} {:>28} {:>7.2} {:>16}  {unit}\n",
            r.op,
            r.value_bytes,
            r.count,
            f(&r.ucm),
            f(&r.raw),
            r.ratio,
            r.per_id
                .as_ref()
                .map_or("-".to_string(), |p| format!("{:.0}", p.median)),
        ));
    }
    if let Some(l) = records.first().and_then(|r| r.load_average) {
        s.push_str(&format!("load average at start: {l:.2}\n"));
    }
    s
}

//! `ucm explain`: "why did (or didn't) this prompt hit?"
//!
//! A scenario names a prompt (`tokens` deterministic tokens from `seed`),
//! which token ranges each chain group holds and where each snapshot group
//! has checkpoints. [`explain`] materialises it in a **real** store on the
//! host device (one BlockStore instance per chain group, one SnapshotStore
//! per snapshot group, under one directory): the blocks lying wholly inside
//! the held ranges are dumped, the checkpoints are put and registered in the
//! checkpoint directory as each put completes. It then adds what the
//! snapshot stores `enumerate` (a warm restart, for checkpoints an earlier
//! process stored) and runs the real [`resolve_hit`] through the stores'
//! presence.
//!
//! With a kept store directory ([`ExplainOptions::store`]) a second run with
//! [`ExplainOptions::resolve_only`] reopens the stores without writing
//! anything: a restarted process gets the same answer.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::coordinator::adapter::{StoreSet, StoreSetConfig, UnitMap};
use crate::coordinator::hash::{checkpoint_hash, Id};
use crate::coordinator::resolve::GroupVote;
use crate::coordinator::{
    resolve_hit, CheckpointDirectory, CoordError, Deployment, Group, Kind, RequestHashes,
    RequestKeys, SpecTable,
};
use crate::device::{Device, HostDevice, Memory};
use crate::store::{
    BlockStore, Durability, Geometry, SnapshotKey, SnapshotStore, StateItem, StoreError, TaskItem,
};

/// What can go wrong in `ucm explain`.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// The scenario file is unreadable or malformed.
    #[error("scenario: {0}")]
    Scenario(String),
    /// The coordinator refused (spec, request).
    #[error(transparent)]
    Coord(#[from] CoordError),
    /// A store failed or refused (e.g. a directory of another geometry).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The host device failed.
    #[error(transparent)]
    Device(#[from] crate::device::DeviceError),
}

type Result<T> = std::result::Result<T, ExplainError>;

/// Longest prompt a scenario may name.
pub const MAX_TOKENS: u64 = 1 << 24;
/// Largest `tp_size` of a scenario.
pub const MAX_TP: u32 = 1024;
/// Most held ranges plus checkpoints a scenario may list.
pub const MAX_LISTED: usize = 1 << 20;

/// A scenario, as read from JSON.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Prompt length in tokens.
    pub tokens: u64,
    /// Seed of the deterministic tokens.
    pub seed: u64,
    /// Per chain group: held token ranges `[start, end)`.
    #[serde(default)]
    pub held: BTreeMap<String, Vec<[u64; 2]>>,
    /// Per snapshot group: checkpoint positions.
    #[serde(default)]
    pub checkpoints: BTreeMap<String, Vec<u64>>,
    /// Tensor-parallel ranks (default 1); `intersection` groups store one
    /// copy per rank.
    #[serde(default = "one")]
    pub tp_size: u32,
    /// Tenant salt.
    #[serde(default)]
    pub cache_salt: Option<String>,
}

fn one() -> u32 {
    1
}

impl Scenario {
    /// Reads a scenario file (a regular file of at most 16 MiB).
    pub fn load(path: &Path) -> Result<Self> {
        let text = ucm_device::io::read_small_file(path, ucm_device::io::SMALL_FILE_LIMIT)
            .map_err(|e| ExplainError::Scenario(format!("{}: {e}", path.display())))?;
        serde_json::from_str(&text)
            .map_err(|e| ExplainError::Scenario(format!("{}: {e}", path.display())))
    }

    /// Checks the scenario against the spec: known groups of the right
    /// kind, ranges inside the prompt, checkpoints on their group's grid.
    pub fn validate(&self, spec: &SpecTable) -> Result<()> {
        let bad = |m: String| Err(ExplainError::Scenario(m));
        if self.tokens == 0 {
            return bad("`tokens` must be positive (an empty prompt never hits)".into());
        }
        if self.tokens > MAX_TOKENS {
            return bad(format!(
                "`tokens` = {} exceeds {MAX_TOKENS} (a prompt of 16M tokens)",
                self.tokens
            ));
        }
        if self.tp_size == 0 || self.tp_size > MAX_TP {
            return bad(format!("`tp_size` must lie in 1..={MAX_TP}"));
        }
        let listed: usize = self.held.values().map(Vec::len).sum::<usize>()
            + self.checkpoints.values().map(Vec::len).sum::<usize>();
        if listed > MAX_LISTED {
            return bad(format!(
                "{listed} held ranges and checkpoints exceed {MAX_LISTED}"
            ));
        }
        for (g, ranges) in &self.held {
            let grp = spec
                .group(g)
                .map_err(|_| ExplainError::Scenario(format!("`held` names unknown group `{g}`")))?;
            if grp.kind != Kind::Chain {
                return bad(format!(
                    "`held` names `{g}`, a {:?} group; only chain groups hold blocks",
                    grp.kind
                ));
            }
            for &[a, b] in ranges {
                if a > b || b > self.tokens {
                    return bad(format!(
                        "held range [{a}, {b}) of `{g}` lies outside the prompt [0, {})",
                        self.tokens
                    ));
                }
            }
        }
        for (g, ps) in &self.checkpoints {
            let grp = spec.group(g).map_err(|_| {
                ExplainError::Scenario(format!("`checkpoints` names unknown group `{g}`"))
            })?;
            if grp.kind != Kind::Snapshot {
                return bad(format!(
                    "`checkpoints` names `{g}`, a {:?} group; only snapshot groups keep checkpoints",
                    grp.kind
                ));
            }
            for &p in ps {
                if p == 0 || p > self.tokens {
                    return bad(format!(
                        "checkpoint {p} of `{g}` lies outside the prompt (0, {}]",
                        self.tokens
                    ));
                }
                if p % grp.block != 0 {
                    return bad(format!(
                        "checkpoint {p} of `{g}` is not on its grid of {}",
                        grp.block
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The answer: `{"l", "p_star", "groups": {name: {"vote", "reason"}}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Explanation {
    /// Longest prefix the chain groups jointly hold.
    pub l: u64,
    /// Tokens the engine skips.
    pub p_star: u64,
    /// Per group: vote and reason.
    pub groups: BTreeMap<String, GroupVote>,
}

impl Explanation {
    /// A human-readable rendering.
    pub fn render_text(&self, spec: &SpecTable) -> String {
        let mut s = format!("l = {}  p* = {}\n", self.l, self.p_star);
        for g in spec.groups() {
            if let Some(v) = self.groups.get(&g.name) {
                let vote = v.vote.map_or("-".to_string(), |x| x.to_string());
                s += &format!("  {:<14} {:>7}  {}\n", g.name, vote, v.reason);
            }
        }
        s
    }
}

/// How [`explain`] runs.
#[derive(Clone, Debug, Default)]
pub struct ExplainOptions {
    /// Keep the store here (default: a temporary directory, removed after).
    pub store: Option<PathBuf>,
    /// Only reopen the store and resolve; dump and put nothing (needs
    /// `store`).
    pub resolve_only: bool,
}

/// Dumps the blocks of chain group `g` with ids `ids` (durably).
fn dump(stores: &StoreSet<HostDevice>, dev: &HostDevice, g: &Group, ids: &[Id]) -> Result<()> {
    let store = stores
        .blocks(g.index)
        .ok_or_else(|| ExplainError::Scenario(format!("`{}` has no block store", g.name)))?;
    let geo = store.geometry();
    let mem = buffer(dev, geo, g.index as u64)?;
    let missing: Vec<Id> = ids
        .iter()
        .zip(store.lookup(ids))
        .filter(|(_, here)| !here)
        .map(|(id, _)| *id)
        .collect();
    // As many blocks per task as half the pool holds (the write-behind
    // needs every shard of a block in the pool): one task and one durable
    // wait per batch, the fsyncs grouped by the disk tier.
    let per_batch = (store.pool().slots() / 2 / geo.shards_per_block as usize).max(1);
    for batch in missing.chunks(per_batch) {
        let items = batch
            .iter()
            .flat_map(|id| {
                let mem = &mem;
                (0..geo.shards_per_block).map(move |s| TaskItem {
                    block: *id,
                    shard: s,
                    memory: mem.clone(),
                    offset: s as usize * geo.shard_bytes,
                })
            })
            .collect();
        let t = store.dump(items, None)?;
        for (_, d) in t.wait_durable() {
            if d != Durability::Durable {
                return Err(ExplainError::Scenario(format!(
                    "dumping a block of `{}`: {d:?}",
                    g.name
                )));
            }
        }
    }
    Ok(())
}

/// Puts a checkpoint of snapshot group `g` (durably); on completion it is
/// registered in `directory`.
fn put(
    stores: &StoreSet<HostDevice>,
    dev: &HostDevice,
    g: &Group,
    key: &SnapshotKey,
    directory: &CheckpointDirectory,
) -> Result<()> {
    let store = stores
        .snapshots(g.index)
        .ok_or_else(|| ExplainError::Scenario(format!("`{}` has no snapshot store", g.name)))?;
    if store.exists(key) {
        directory.put_completed(&g.name, key.position, key.hash, true);
        return Ok(());
    }
    let geo = store.geometry();
    let mem = buffer(dev, geo, key.position)?;
    let items = (0..geo.shards_per_block)
        .map(|s| StateItem {
            shard: s,
            memory: mem.clone(),
            offset: s as usize * geo.shard_bytes,
        })
        .collect();
    let t = store.put(key, items, None)?;
    let durable = t.wait_durable();
    let stored = durable.iter().all(|(_, d)| *d == Durability::Durable);
    directory.put_completed(&g.name, key.position, key.hash, stored);
    match durable.into_iter().find(|(_, d)| *d != Durability::Durable) {
        Some((_, d)) => Err(ExplainError::Scenario(format!(
            "putting a checkpoint of `{}`: {d:?}",
            g.name
        ))),
        None => Ok(()),
    }
}

/// A device buffer of one block or checkpoint, filled deterministically.
fn buffer(dev: &HostDevice, geo: Geometry, seed: u64) -> Result<Memory> {
    let len = geo.shard_bytes * geo.shards_per_block as usize;
    let mem = dev.alloc_device(len)?;
    crate::device::conformance::upload(
        dev,
        &mem,
        0,
        &crate::device::conformance::pattern(seed, len),
    )?;
    Ok(mem)
}

/// Materialises `sc` (unless `resolve_only`) and resolves it.
pub fn explain(spec: &SpecTable, sc: &Scenario, opts: &ExplainOptions) -> Result<Explanation> {
    sc.validate(spec)?;
    let tmp;
    let dir = match &opts.store {
        Some(d) => d.clone(),
        None if opts.resolve_only => {
            return Err(ExplainError::Scenario(
                "--resolve-only needs --store (the store to reopen)".into(),
            ))
        }
        None => {
            let base = Path::new("/dev/shm");
            let base = if base.is_dir() {
                base.to_path_buf()
            } else {
                std::env::temp_dir()
            };
            tmp = crate::scratch::Scratch::new(&base, "explain")
                .map_err(|e| ExplainError::Scenario(format!("temporary store: {e}")))?;
            tmp.path().to_path_buf()
        }
    };
    let n = usize::try_from(sc.tokens)
        .map_err(|_| ExplainError::Scenario(format!("{} tokens is too many", sc.tokens)))?;
    let tokens = crate::coordinator::hash::seeded_tokens(sc.seed, n);
    let keys = RequestKeys {
        cache_salt: sc.cache_salt.clone(),
        extra_keys: Vec::new(),
    };
    let hashes = RequestHashes::compute(
        spec,
        Deployment {
            tp_size: sc.tp_size,
        },
        &tokens,
        &keys,
    )?;
    let dev = Arc::new(HostDevice::new());
    let units = UnitMap::new(spec);
    // 48 MiB of pool per group: dumps go in batches that fit it.
    let cfg = StoreSetConfig {
        pool_bytes: Some(48 << 20),
        workers: 2,
        ..StoreSetConfig::default()
    };
    if opts.resolve_only && !dir.is_dir() {
        return Err(ExplainError::Scenario(format!(
            "--resolve-only: no store at {} (nothing to reopen)",
            dir.display()
        )));
    }
    let stores = StoreSet::open(spec, &units, &dir, Arc::clone(&dev), &cfg)?;
    let directory = CheckpointDirectory::new();
    if !opts.resolve_only {
        for (name, ranges) in &sc.held {
            let g = spec.group(name)?;
            for ids in &hashes.chains[g.index] {
                let inside: Vec<Id> = ids
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| {
                        let (a, b) = (*i as u64 * g.block, (*i as u64 + 1) * g.block);
                        ranges.iter().any(|&[s, e]| s <= a && b <= e)
                    })
                    .map(|(_, id)| *id)
                    .collect();
                dump(&stores, &dev, g, &inside)?;
            }
        }
        for (name, ps) in &sc.checkpoints {
            let g = spec.group(name)?;
            for &p in ps {
                for (r, ids) in hashes.chains[g.index].iter().enumerate() {
                    let seed = &hashes.seeds[g.index][r];
                    let hash = checkpoint_hash(seed, ids, &tokens, g.hash_block, p)?;
                    let key = SnapshotKey {
                        group: g.index as u32,
                        position: p,
                        hash,
                    };
                    put(&stores, &dev, g, &key, &directory)?;
                }
            }
        }
    }
    // What an earlier process stored (a warm restart; a no-op on entries the
    // puts above registered).
    stores.rebuild_directory(spec, &directory);
    let r = resolve_hit(spec, &tokens, &hashes, &stores, &directory)?;
    Ok(Explanation {
        l: r.l,
        p_star: r.p_star,
        groups: r.groups.into_iter().collect(),
    })
}

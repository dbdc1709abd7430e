//! The store instances of one model: a BlockStore per chain group and per
//! sidecar group, a SnapshotStore per snapshot group, each with the
//! geometry its spec row gives (one shard per access unit of the group),
//! under one directory (`<dir>/<group name>`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ucm_device::io::DIRECT_IO_ALIGN;
use ucm_device::{Device, IoEngine, IoEngineConfig, IoEngineKind};
use ucm_store::{
    BlockStore, BlockStoreConfig, ClockPool, DiskBudget, DiskConfig, DiskTier, Geometry,
    PoolConfig, PoolMode, RemoteConfig, RemoteTier, SyncMode, TieredBlockStore,
    TieredSnapshotStore,
};

use super::units::UnitMap;
use crate::error::Result;
use crate::hash::Id;
use crate::resolve::Presence;
use crate::spec::{AccessUnit, Group, Kind, SpecTable};

/// How the store instances are built.
#[derive(Clone, Debug)]
pub struct StoreSetConfig {
    /// Pool slots per group (at least twice the shards of a block).
    pub pool_slots: usize,
    /// When set, the pool of each group holds this many bytes instead
    /// (`pool_slots` is then ignored; still at least two blocks).
    pub pool_bytes: Option<usize>,
    /// Pool ways (set associativity); `0`: fully associative.
    pub ways: usize,
    /// `Some(prefix)`: pools in shared memory named `<prefix>-<group>`, so
    /// rank processes share them; `None`: private pools.
    pub shared: Option<String>,
    /// The disk capacity, in blocks of each group: the groups' disk tiers
    /// share one byte budget of `disk_blocks` files of every group
    /// ([`DiskBudget`], D84), so one group may hold more than
    /// `disk_blocks` while another holds fewer.
    pub disk_blocks: u64,
    /// Store worker threads per group.
    pub workers: usize,
    /// I/O engine.
    pub engine: IoEngineKind,
    /// A Redis or Valkey cluster below every group's disk tier
    /// (`redis://host:port,...`), shared with other instances; each group
    /// uses the namespace of its name.
    pub remote: Option<String>,
    /// An S3-compatible bucket below that (or below the disk tier when
    /// there is no cluster): the cold tier (`s3://bucket[/prefix]?...`).
    pub cold: Option<String>,
    /// No local disk tier: `remote` and/or `cold` are the persistent tiers
    /// (diskless nodes). A dump is durable once the nearest of them holds
    /// it; capacity is the servers' own.
    pub no_disk: bool,
    /// How each disk tier makes its writes durable: one `syncfs` per batch
    /// where the file system allows ([`SyncMode::Auto`]), or an fsync per
    /// file and directory ([`SyncMode::Files`], for a store on a busy
    /// shared file system, where a `syncfs` would also write back what
    /// other programs left dirty).
    pub sync: SyncMode,
    /// Identities of the directory not used for longer than this are
    /// removed when stores open (`None`: never); see
    /// [`super::identities`].
    pub identity_max_idle: Option<Duration>,
}

/// The default of [`StoreSetConfig::identity_max_idle`]: 14 days.
pub const IDENTITY_MAX_IDLE: Duration = Duration::from_secs(14 * 24 * 3600);

impl Default for StoreSetConfig {
    fn default() -> Self {
        StoreSetConfig {
            pool_slots: 256,
            pool_bytes: None,
            ways: 0,
            shared: None,
            disk_blocks: 1 << 20,
            workers: 2,
            engine: IoEngineKind::Auto,
            remote: None,
            cold: None,
            no_disk: false,
            sync: SyncMode::Auto,
            identity_max_idle: Some(IDENTITY_MAX_IDLE),
        }
    }
}

impl StoreSetConfig {
    /// Checks what can be checked before any store opens: the tier URLs'
    /// syntax (nothing is contacted).
    pub fn validate(&self) -> Result<()> {
        let probe = Geometry {
            shard_bytes: DIRECT_IO_ALIGN,
            shards_per_block: 1,
        };
        for url in self.remote.iter().chain(&self.cold) {
            RemoteConfig::from_url(url, "check", probe)?;
        }
        if self.no_disk && self.remote.is_none() && self.cold.is_none() {
            return Err(ucm_store::StoreError::Config(ucm_store::ConfigError::NoTierForSet).into());
        }
        Ok(())
    }
}

/// Bytes of one shard of `group` (one access unit of one block or one
/// checkpoint), padded to the O_DIRECT alignment; 0 for `none` groups.
pub fn shard_bytes(spec: &SpecTable, group: &Group) -> usize {
    let per_layer = group.bytes_per_layer_block(spec.block_of(group.index));
    let layers = match group.access_unit {
        AccessUnit::Row => group.layers.len() as u64,
        _ => 1,
    };
    let bytes = per_layer * layers;
    let a = DIRECT_IO_ALIGN as u64;
    (bytes.div_ceil(a) * a) as usize
}

/// A snapshot of one group instance's store counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupCounters {
    /// Bytes of one shard of the instance.
    pub shard_bytes: u64,
    /// Shards loaded from the memory pool.
    pub pool_hits: u64,
    /// Shards read from disk.
    pub disk_reads: u64,
    /// Load items that no tier held.
    pub misses: u64,
    /// Items that failed (I/O, checksum, device).
    pub failed_items: u64,
    /// Blocks written to disk.
    pub blocks_written: u64,
    /// Blocks whose disk write failed for good.
    pub write_failures: u64,
    /// Block files deleted by GC.
    pub disk_evictions: u64,
    /// Shards that failed their checksum.
    pub corrupt_shards: u64,
    /// Store jobs whose worker panicked (a bug): their unfinished items
    /// were reported failed.
    pub worker_panics: u64,
    /// `syncfs` calls that made batches of disk writes durable (0 with
    /// [`SyncMode::Files`], or where the file system's `syncfs` does not
    /// stand for an fsync of each file).
    pub fs_syncs: u64,
}

/// A group's namespace on the remote tier: its name, characters outside
/// `[A-Za-z0-9_.-]` as `_`, at most 64 (block ids already commit to the
/// model and group, so the namespace only sorts keys).
fn remote_namespace(group: &str) -> String {
    let s: String = group
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if s.is_empty() {
        "group".into()
    } else {
        s
    }
}

/// The stores of one model on device `D`.
pub struct StoreSet<D: Device> {
    dir: PathBuf,
    used: Option<super::identities::UseMark>,
    chain: HashMap<usize, TieredBlockStore<D>>,
    snap: HashMap<usize, TieredSnapshotStore<D>>,
    shard_bytes: HashMap<usize, usize>,
}

impl<D: Device> StoreSet<D> {
    /// Opens (or creates) every group's store under `dir/<group name>`, or
    /// `dir/id-<digest>/<group name>` for a table with an identity (which
    /// is recorded there and marked as used; identities idle longer than
    /// [`StoreSetConfig::identity_max_idle`] are removed). A directory or
    /// shared pool of another geometry is an error.
    pub fn open(
        spec: &SpecTable,
        units: &UnitMap,
        dir: &Path,
        dev: Arc<D>,
        cfg: &StoreSetConfig,
    ) -> Result<Self> {
        cfg.validate()?;
        if let Some(p) = &cfg.shared {
            ucm_store::paths::check_name("shared pool prefix", p)
                .map_err(|e| ucm_store::StoreError::Config(e.into()))?;
        }
        let engine: Arc<dyn IoEngine> = Arc::from(
            IoEngineConfig::for_dir(cfg.engine, dir)
                .build()
                .map_err(ucm_store::StoreError::from)?,
        );
        let mut used = None;
        let root = super::identities::store_root(dir, spec);
        if let (Some(id), false) = (&spec.identity, cfg.no_disk) {
            super::identities::record(dir, id)?;
            used = Some(super::identities::UseMark::new(&root));
            if let Some(idle) = cfg.identity_max_idle {
                // Ageing out is housekeeping: it never fails an open.
                match super::identities::expire(dir, idle, Some(&id.hex())) {
                    Ok(gone) => {
                        for (hex, bytes) in gone {
                            log::info!(
                                "ucm: removed identity {hex} ({bytes} bytes), unused for over {} days",
                                idle.as_secs() / 86_400
                            );
                        }
                    }
                    Err(e) => log::warn!("ucm: idle identities were not removed: {e}"),
                }
            }
        }
        let mut chain = HashMap::new();
        let mut snap = HashMap::new();
        let mut sizes = HashMap::new();
        for g in spec.groups() {
            if g.kind == Kind::None {
                continue;
            }
            let shard = shard_bytes(spec, g);
            let shards = units.units_of_group(g.index);
            let geo = Geometry {
                shard_bytes: shard,
                shards_per_block: shards,
            };
            let slots = match cfg.pool_bytes {
                Some(b) => b / shard.max(1),
                None => cfg.pool_slots,
            }
            .max(2 * shards as usize);
            let ways = if cfg.ways == 0 {
                slots
            } else {
                cfg.ways.min(slots)
            };
            let pool = ClockPool::open(PoolConfig {
                shard_bytes: shard,
                slots: slots.div_ceil(ways) * ways,
                ways,
                mode: match &cfg.shared {
                    None => PoolMode::Private,
                    Some(p) => PoolMode::Shared {
                        instance: format!("{p}-{}", g.name),
                    },
                },
                load_timeout: Duration::from_secs(5),
                dirty_timeout: Duration::from_secs(60),
            })?;
            let bcfg = BlockStoreConfig {
                workers: cfg.workers.max(1),
                ..BlockStoreConfig::default()
            };
            let mut below = Vec::new();
            for url in cfg.remote.iter().chain(&cfg.cold) {
                below.push(RemoteTier::new(RemoteConfig::from_url(
                    url,
                    &remote_namespace(&g.name),
                    geo,
                )?)?);
            }
            let blocks = if cfg.no_disk {
                TieredBlockStore::without_disk(Arc::clone(&dev), pool, below, bcfg)?
            } else {
                let mut dcfg = DiskConfig::new(root.join(&g.name), geo, cfg.disk_blocks);
                dcfg.sync = cfg.sync;
                let disk = DiskTier::open(dcfg, Arc::clone(&engine))?;
                TieredBlockStore::with_tiers(Arc::clone(&dev), pool, disk, below, bcfg)?
            };
            sizes.insert(g.index, shard);
            if g.kind == Kind::Snapshot {
                snap.insert(g.index, TieredSnapshotStore::new(g.index as u32, blocks));
            } else {
                chain.insert(g.index, blocks);
            }
        }
        // One byte budget for every group's disk tier (D84): the bytes of
        // `disk_blocks` files of each group, collected as one, so the room
        // of K/V and of states follows what is used.
        let disks: Vec<&DiskTier> = chain
            .values()
            .chain(snap.values().map(|s| s.blocks()))
            .filter_map(|s| s.disk())
            .collect();
        let budget = DiskBudget::summed();
        for d in disks {
            d.join_budget(&budget);
        }
        Ok(StoreSet {
            dir: dir.to_path_buf(),
            used,
            chain,
            snap,
            shard_bytes: sizes,
        })
    }

    /// The BlockStore of a chain or sidecar group.
    pub fn blocks(&self, group: usize) -> Option<&TieredBlockStore<D>> {
        self.chain.get(&group)
    }

    /// The store directory (the stores live under `<dir>/<group name>`,
    /// or `<dir>/id-<digest>/<group name>`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Sets the speculative share of every group's pool and disk tier
    /// ([`TieredBlockStore::set_speculative_share`]): the fraction of each
    /// that speculative checkpoints may keep before they are evicted
    /// first.
    pub fn set_speculative_share(&self, share: f64) {
        for s in self.chain.values() {
            s.set_speculative_share(share);
        }
        for s in self.snap.values() {
            s.blocks().set_speculative_share(share);
        }
    }

    /// Marks this deployment's identity as used (at most every
    /// [`super::identities::TOUCH_EVERY`]; a no-op without one).
    pub fn note_use(&self) {
        if let Some(u) = &self.used {
            u.used();
        }
    }

    /// The block store under any group's instance: a chain or sidecar
    /// group's BlockStore, or the one under a snapshot group's
    /// SnapshotStore (tiers, counters, eviction).
    pub fn tier(&self, group: usize) -> Option<&TieredBlockStore<D>> {
        self.chain
            .get(&group)
            .or_else(|| self.snap.get(&group).map(TieredSnapshotStore::blocks))
    }

    /// The SnapshotStore of a snapshot group.
    pub fn snapshots(&self, group: usize) -> Option<&TieredSnapshotStore<D>> {
        self.snap.get(&group)
    }

    /// Shard bytes of a group's instance.
    pub fn shard_bytes(&self, group: usize) -> usize {
        self.shard_bytes.get(&group).copied().unwrap_or(0)
    }

    /// Disk writes retried so far, over every instance (a write fault that
    /// a retry absorbed is counted here).
    pub fn write_retries(&self) -> u64 {
        use std::sync::atomic::Ordering::Relaxed;
        self.chain
            .values()
            .map(|b| b.stats().write_retries.load(Relaxed))
            .chain(
                self.snap
                    .values()
                    .map(|s| s.blocks().stats().write_retries.load(Relaxed)),
            )
            .sum()
    }

    /// Bytes loaded so far from each tier, over every instance: `(pool
    /// hits, disk reads)`, each shard counted at its instance's shard size.
    pub fn tier_bytes(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let mut pool = 0;
        let mut disk = 0;
        let stats = self
            .chain
            .iter()
            .map(|(g, b)| (*g, b.stats()))
            .chain(self.snap.iter().map(|(g, s)| (*g, s.blocks().stats())));
        for (g, st) in stats {
            let shard = self.shard_bytes(g) as u64;
            pool += st.pool_hits.load(Relaxed) * shard;
            disk += st.disk_reads.load(Relaxed) * shard;
        }
        (pool, disk)
    }

    /// The store counters of one group's instance (`None` for `none`
    /// groups): what its tiers served, wrote and evicted.
    pub fn group_counters(&self, group: usize) -> Option<GroupCounters> {
        use std::sync::atomic::Ordering::Relaxed;
        let t = self.tier(group)?;
        let st = t.stats();
        let (disk_evictions, corrupt_shards, fs_syncs) = t.disk().map_or((0, 0, 0), |d| {
            let ds = d.stats();
            (
                ds.gc_deleted.load(Relaxed),
                ds.corrupt_shards.load(Relaxed),
                ds.fs_syncs.load(Relaxed),
            )
        });
        Some(GroupCounters {
            shard_bytes: self.shard_bytes(group) as u64,
            pool_hits: st.pool_hits.load(Relaxed),
            disk_reads: st.disk_reads.load(Relaxed),
            misses: st.misses.load(Relaxed),
            failed_items: st.failed_items.load(Relaxed),
            blocks_written: st.blocks_written.load(Relaxed),
            write_failures: st.write_failures.load(Relaxed),
            disk_evictions,
            corrupt_shards,
            worker_panics: st.worker_panics.load(Relaxed),
            fs_syncs,
        })
    }

    /// Refills a checkpoint directory from every snapshot store's
    /// `enumerate` (a warm restart).
    pub fn rebuild_directory(&self, spec: &SpecTable, dir: &crate::CheckpointDirectory) {
        for g in spec.snapshot_groups() {
            if let Some(s) = self.snap.get(&g.index) {
                use ucm_store::SnapshotStore;
                dir.rebuild(&g.name, s.enumerate());
            }
        }
    }
}

impl<D: Device> crate::CheckpointSource for StoreSet<D> {
    fn exists(&self, group: &Group, position: u64, hash: &Id) -> bool {
        use ucm_store::{SnapshotKey, SnapshotStore};
        self.snap.get(&group.index).is_some_and(|s| {
            s.exists(&SnapshotKey {
                group: group.index as u32,
                position,
                hash: *hash,
            })
        })
    }
}

impl<D: Device> Presence for StoreSet<D> {
    fn lookup(&self, group: &Group, ids: &[Id]) -> Vec<bool> {
        match self.chain.get(&group.index) {
            Some(s) => s.lookup(ids),
            None => vec![false; ids.len()],
        }
    }
    fn lookup_on_prefix(&self, group: &Group, ids: &[Id]) -> usize {
        match self.chain.get(&group.index) {
            Some(s) => s.lookup_on_prefix(ids),
            None => 0,
        }
    }
}

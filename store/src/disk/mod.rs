//! The disk tier: one fixed-size file per block, written crash-safely.
//!
//! Layout under the store directory (0700; files 0600):
//!
//! ```text
//! GEOMETRY                 the instance's geometry; another one is refused
//! tmp/                     files being written (unnamed where the file
//!                          system allows); named ones of dead writers are
//!                          cleared at open, never read
//! blocks/ab/cd/<id>.blk    finished blocks (hex fan-out on the first 2 bytes)
//! ```
//!
//! A block file is a header followed by the shards: shard `i` lies at
//! `header_bytes + i * shard_bytes`. The header (little-endian) holds the
//! magic `UCMBLK\0\x01`, the format version, the geometry, the block id, a
//! CRC32C per shard and a CRC32C of the header itself, padded to 4 KiB.
//!
//! A block is written to a file in `tmp/` through the I/O engine with
//! O_DIRECT (its header and shards as one vectored write, handed to the
//! engine as soon as the block is checksummed), fsynced, given its name in
//! `blocks/` and the directory fsynced, only when **all** its shards were
//! written. The file is unnamed (`O_TMPFILE`, then `linkat`) where the file
//! system allows: a crash leaves nothing in `tmp/`, and a block costs one
//! directory operation instead of a create and a rename; elsewhere it is a
//! named file, renamed into place. Blocks go in batches; the next
//! batch's writes are in flight while a batch waits on its fsyncs and
//! names, and the directories of
//! the batch before are fsynced with them. A reader never sees a
//! partial file; a crash leaves the old state or the whole new block. A
//! shard whose checksum fails is a miss, never data, and its file is
//! removed.
//!
//! Presence is asked of the file system (a regular file of the full block
//! length, never through a link), and remembered: ids this process wrote
//! or found are answered from an in-memory summary without a `stat`. The
//! summary is lazily invalidated: another process's or machine's GC can
//! make an entry stale, and then the read finds the file gone (a miss,
//! reported) and forgets it, so a stale entry is only ever a miss at load,
//! never data. GC is global and precise: it gathers every block's mtime,
//! selects the oldest with `select_nth_unstable` and deletes whole files
//! until the count is at the low watermark. `touch` refreshes mtimes,
//! throttled per block.
//!
//! Several tiers (a deployment's groups) may share one byte budget
//! ([`DiskBudget`], [`DiskTier::join_budget`]): their GC is then one pass
//! over all of them, oldest first whatever the group.
//!
//! Files: this one holds the configuration, the tier and its opening
//! (geometry marker, clearing dead writers' temporary files); `write` the
//! write path, `read` presence and the read path, `gc` recency, GC and
//! enumeration; `budget` the byte budget several tiers share.

mod budget;
mod gc;
mod read;
mod write;

pub use budget::DiskBudget;
pub use read::{ArrivedReads, ReadSession, SubmittedReads};
use write::add_dir;

use std::collections::HashMap;
use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use ucm_device::io::fs as iofs;
use ucm_device::io::IoDir;
use ucm_device::io::DIRECT_IO_ALIGN;
use ucm_device::{IoBuf, IoEngine, IoFile, IoRequest, IoTicket, OpenOptions};

use crate::error::{bad_value, ConfigError, Result, StoreError};
use crate::geometry::{hex, hex_digits, BlockId, Geometry};
use crate::{header, paths};

/// How far into the past [`DiskTier::cool`] sets a block's mtime: far
/// enough that every block written or touched since is younger (2^30 s,
/// about 34 years).
pub const COLD_BACKDATE: Duration = Duration::from_secs(1 << 30);

/// How the disk tier is set up.
#[derive(Clone, Debug)]
pub struct DiskConfig {
    /// The instance's directory.
    pub dir: PathBuf,
    /// The geometry of every block.
    pub geometry: Geometry,
    /// GC starts when more block files than this exist (high watermark).
    pub high_watermark: u64,
    /// GC deletes the oldest blocks until this many remain (low watermark).
    pub low_watermark: u64,
    /// A block touched more recently than this is not touched again.
    pub touch_interval: Duration,
    /// Block writes of this tier between two counts of the directory's
    /// files (a walk), each followed by a GC pass when above the high
    /// watermark; 0: GC runs only when [`DiskTier::gc`] is called. The count
    /// is also taken as soon as the files last counted plus this tier's
    /// writes since exceed the high watermark.
    pub gc_every: u64,
    /// How long a GC lease holds before another tier may take it over
    /// (see [`DiskTier::gc`]).
    pub gc_lease: Duration,
    /// Write blocks to unnamed temporary files (`O_TMPFILE`, linked into
    /// `blocks/` once durable) where the file system has them; false, or a
    /// file system that refuses them: named files in `tmp/`, renamed.
    pub unnamed_tmp: bool,
    /// How a batch of block writes is made durable.
    pub sync: SyncMode,
}

/// How the disk tier makes a batch of block writes durable. Either way a
/// block is reported written only once its data and its name are durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SyncMode {
    /// One `syncfs` per batch (instead of an fsync per file and per
    /// directory) where it stands for them: ext4, XFS, btrfs or tmpfs on
    /// Linux 5.8 or later ([`IoDir::syncfs_reports_all`]); elsewhere
    /// [`SyncMode::Files`]. A `syncfs` also writes back whatever other
    /// programs left dirty on the same file system, so a store that shares
    /// a busy file system may prefer `Files`.
    #[default]
    Auto,
    /// An fsync of every block file, and of every directory that got a new
    /// entry.
    Files,
}

impl SyncMode {
    /// The name [`FromStr`](std::str::FromStr) takes: `auto` or `files`.
    pub fn name(self) -> &'static str {
        match self {
            SyncMode::Auto => "auto",
            SyncMode::Files => "files",
        }
    }
}

impl std::fmt::Display for SyncMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for SyncMode {
    type Err = StoreError;

    /// `auto` or `files`; anything else is a [`StoreError::Config`] that
    /// names what was given (cut short) and what is taken.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(SyncMode::Auto),
            "files" => Ok(SyncMode::Files),
            other => Err(bad_value(
                "sync mode",
                format!("{:?}", paths::short(other)),
                "auto or files",
            )),
        }
    }
}

impl DiskConfig {
    /// A config with watermarks from a capacity in blocks (low = 90%).
    pub fn new(dir: impl Into<PathBuf>, geometry: Geometry, capacity_blocks: u64) -> Self {
        DiskConfig {
            dir: dir.into(),
            geometry,
            high_watermark: capacity_blocks,
            low_watermark: capacity_blocks - capacity_blocks / 10,
            touch_interval: Duration::from_secs(1),
            gc_every: (capacity_blocks / 16).clamp(1, 65_536),
            gc_lease: Duration::from_secs(60),
            unnamed_tmp: true,
            sync: SyncMode::Auto,
        }
    }
}

/// Counters of the disk tier.
#[derive(Debug, Default)]
pub struct DiskStats {
    /// Blocks written and renamed into place.
    pub blocks_written: AtomicU64,
    /// Block writes that failed (nothing became visible).
    pub write_failures: AtomicU64,
    /// Shards that failed their checksum (their files were removed).
    pub corrupt_shards: AtomicU64,
    /// Block files deleted by GC.
    pub gc_deleted: AtomicU64,
    /// `syncfs` calls that made batches of writes durable ([`SyncMode`]).
    pub fs_syncs: AtomicU64,
}

/// What one GC pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Block files found.
    pub found: u64,
    /// Block files deleted.
    pub deleted: u64,
    /// Above the high watermark, but another tier on the directory holds
    /// the GC lease: it collects, this pass deleted nothing.
    pub leased_elsewhere: bool,
}

/// The disk tier of one store instance.
pub struct DiskTier {
    cfg: DiskConfig,
    engine: Arc<dyn IoEngine>,
    header_bytes: usize,
    stats: Arc<DiskStats>,
    touched: Mutex<HashMap<BlockId, Instant>>,
    gc_lock: Mutex<()>,
    /// Files found by the last walk, and this tier's writes since.
    last_found: AtomicU64,
    writes_since: AtomicU64,
    /// Ids this process saw on disk (wrote, or found by a lookup): a
    /// lookup answers them without a `stat`. Lazily invalidated: a read
    /// that finds the file gone or corrupt forgets the id, GC and
    /// `evict_all` forget all, so a stale entry (another process's or
    /// another machine's GC) is only ever a miss at load, never data.
    known: Arc<std::sync::RwLock<std::collections::HashSet<BlockId>>>,
    /// Blocks are written to unnamed files (`O_TMPFILE`) until the file
    /// system refuses one; then to named temporary files.
    unnamed: std::sync::atomic::AtomicBool,
    /// `tmp/`, held open for one `syncfs` per batch when the tier makes
    /// its writes durable that way ([`SyncMode`]); `None`: an fsync per
    /// file and directory.
    fs_sync: Option<IoDir>,
    /// The speculative share ([`DiskTier::set_speculative_share`]), in
    /// millionths of the high watermark.
    share_ppm: AtomicU32,
    /// The byte budget this tier collects with, once joined
    /// ([`DiskTier::join_budget`]); its own watermarks are then unused.
    budget: std::sync::OnceLock<Arc<DiskBudget>>,
}

/// Lookups of at least this many unknown ids stat them on two threads.
const PARALLEL_LOOKUP: usize = 512;

/// Blocks written per batch of [`DiskTier::write_blocks`]: at most three
/// times as many temporary files are open at once per writer (a batch
/// being fsynced, the one after it writing, and, while the batch before is
/// named, the one after that; a batch's files are closed once named).
pub const WRITE_BATCH_BLOCKS: usize = 64;

fn mkdir(path: &Path) -> Result<()> {
    iofs::create_dir_all(path, 0o700).map_err(StoreError::fs("create directory", path))
}

impl DiskTier {
    /// Opens (or creates) the tier in `cfg.dir`: checks or writes the
    /// geometry marker and clears leftover temporary files.
    pub fn open(cfg: DiskConfig, engine: Arc<dyn IoEngine>) -> Result<Self> {
        cfg.geometry.validate()?;
        if cfg.low_watermark > cfg.high_watermark || cfg.high_watermark == 0 {
            return Err(bad_value(
                "watermarks (low, high)",
                format!("({}, {})", cfg.low_watermark, cfg.high_watermark),
                "0 <= low <= high, high > 0",
            ));
        }
        let tmp = cfg.dir.join("tmp");
        // The root may be made with its parents; beneath it, nothing is
        // followed through a link.
        if iofs::symlink_metadata(&cfg.dir).is_err() {
            mkdir(&cfg.dir)?;
        }
        paths::ensure_dir(&cfg.dir)?;
        let mut made = false;
        for d in [cfg.dir.join("blocks"), tmp.clone()] {
            made |= paths::ensure_dir(&d)?;
        }
        // The directories made here are durable once the root is fsynced.
        if made {
            paths::sync_dir(&cfg.dir).map_err(StoreError::fs("fsync directory", &cfg.dir))?;
        }
        let marker = cfg.dir.join("GEOMETRY");
        let expected = cfg.geometry.describe();
        let found = match paths::read_marker(&marker)? {
            Some(found) => found,
            None if paths::create_marker(&marker, &tmp, &expected)? => expected.clone(),
            // Another process created it first: theirs must match.
            None => paths::read_marker(&marker)?.unwrap_or_default(),
        };
        if found != expected {
            return Err(StoreError::GeometryMismatch {
                path: marker,
                found: paths::short(&found),
                expected,
            });
        }
        // Temporary files of writers that are dead (or, from another host,
        // old) are never read: clear them. Live writers' files, and
        // anything the store did not name, stay.
        let mut cleared = 0;
        for entry in iofs::read_dir(&tmp).map_err(StoreError::fs("list", &tmp))? {
            let entry = entry.map_err(StoreError::fs("list", &tmp))?;
            let (Ok(m), Some(name)) = (
                iofs::symlink_metadata(&entry.path()),
                entry.file_name().to_str().map(String::from),
            ) else {
                continue;
            };
            if paths::stale_tmp(&name, &m) && iofs::remove_file(&entry.path()).is_ok() {
                cleared += 1;
            }
        }
        if cleared > 0 {
            log::info!(
                "disk tier {}: cleared {cleared} temporary files of dead writers",
                cfg.dir.display()
            );
        }
        let header_bytes =
            header::header_len(cfg.geometry).div_ceil(DIRECT_IO_ALIGN) * DIRECT_IO_ALIGN;
        let fs_sync = match cfg.sync {
            SyncMode::Files => None,
            SyncMode::Auto => IoDir::open(&tmp).ok().filter(IoDir::syncfs_reports_all),
        };
        log::debug!(
            "disk tier {}: writes made durable by {}",
            cfg.dir.display(),
            if fs_sync.is_some() {
                "one syncfs per batch"
            } else {
                "an fsync per file and directory"
            }
        );
        Ok(DiskTier {
            fs_sync,
            share_ppm: AtomicU32::new(0),
            unnamed: std::sync::atomic::AtomicBool::new(cfg.unnamed_tmp),
            cfg,
            engine,
            header_bytes,
            stats: Arc::default(),
            touched: Mutex::new(HashMap::new()),
            gc_lock: Mutex::new(()),
            last_found: AtomicU64::new(0),
            writes_since: AtomicU64::new(0),
            known: Default::default(),
            budget: std::sync::OnceLock::new(),
        })
    }

    /// Makes this tier collect with `budget` (one byte capacity for every
    /// tier that joins it, e.g. a deployment's groups): its writes count
    /// towards the budget and its GC ([`DiskTier::gc`]) is the budget's,
    /// over every member. Its own watermarks are then unused. Returns
    /// false (and changes nothing) when it already joined one.
    pub fn join_budget(&self, budget: &Arc<DiskBudget>) -> bool {
        self.join(budget, None)
    }

    /// As [`DiskTier::join_budget`], for a tier that holds one part of
    /// each block and the other members joined with the same `link` the
    /// other parts, under the same ids (a block's components of several
    /// sizes, one tier per size): the budget's GC takes or keeps a
    /// block's files in all of them together, so it never keeps a part
    /// whose block lost another.
    pub fn join_budget_linked(&self, budget: &Arc<DiskBudget>, link: u64) -> bool {
        self.join(budget, Some(link))
    }

    fn join(&self, budget: &Arc<DiskBudget>, link: Option<u64>) -> bool {
        if self.budget.set(Arc::clone(budget)).is_err() {
            return false;
        }
        budget.join(self, link);
        budget.set_speculative_share(self.speculative_share());
        true
    }

    /// The budget this tier joined, if any.
    pub fn budget(&self) -> Option<&Arc<DiskBudget>> {
        self.budget.get()
    }

    /// The geometry.
    pub fn geometry(&self) -> Geometry {
        self.cfg.geometry
    }

    /// True when batches of writes are made durable by one `syncfs` each
    /// rather than an fsync per file and directory ([`SyncMode`]).
    pub fn syncs_filesystem(&self) -> bool {
        self.fs_sync.is_some()
    }

    /// The name of the I/O engine the tier runs on (`io_uring`, `libaio`
    /// or `posix`).
    pub fn engine_name(&self) -> &'static str {
        self.engine.name()
    }

    /// Counters.
    pub fn stats(&self) -> &DiskStats {
        &self.stats
    }

    /// Bytes of a block file.
    pub fn file_bytes(&self) -> u64 {
        self.header_bytes as u64
            + self.cfg.geometry.shard_bytes as u64 * u64::from(self.cfg.geometry.shards_per_block)
    }

    /// Where block `id` lives.
    pub fn path_of(&self, id: &BlockId) -> PathBuf {
        let h = hex(id);
        let mut p = self.cfg.dir.join("blocks");
        p.push(format!("{}/{}/{h}.blk", &h[0..2], &h[2..4]));
        p
    }

    /// True when block `id` is on disk (asked of the file system): its
    /// file is a regular file (not a link) of the full block length. An
    /// empty, truncated or foreign file is absent; no read is needed.
    pub fn exists(&self, id: &BlockId) -> bool {
        self.lookup_on_prefix(std::slice::from_ref(id)) == 1
    }
}

#[cfg(test)]
mod tests {
    use super::gc::parse_hex;
    use super::read::rel_name;
    use super::*;

    #[test]
    fn a_sync_mode_is_named_and_parsed_back() {
        for m in [SyncMode::Auto, SyncMode::Files] {
            assert_eq!(m.to_string().parse::<SyncMode>().unwrap(), m);
        }
        assert_eq!(SyncMode::default(), SyncMode::Auto);
        for bad in ["", "Files", "fsync", "auto "] {
            let e = bad.parse::<SyncMode>().unwrap_err();
            assert!(matches!(e, StoreError::Config(_)), "{bad:?}: {e}");
            assert!(e.to_string().contains("expected auto or files"), "{e}");
        }
        // A long or hostile value is cut short in the message.
        let e = "x\n".repeat(1000).parse::<SyncMode>().unwrap_err();
        assert!(e.to_string().len() < 200, "{e}");
    }

    #[test]
    fn the_relative_name_is_the_path_beneath_blocks() {
        let tier_dir = Path::new("/s");
        for n in [0u8, 7, 0xab, 0xff] {
            let mut id = [0u8; 16];
            for (i, b) in id.iter_mut().enumerate() {
                *b = n.wrapping_mul(i as u8 + 1) ^ (i as u8);
            }
            let name = rel_name(&id);
            let rel = CStr::from_bytes_with_nul(&name).unwrap().to_str().unwrap();
            let h = hex(&id);
            let full = tier_dir
                .join("blocks")
                .join(format!("{}/{}/{h}.blk", &h[0..2], &h[2..4]));
            assert_eq!(tier_dir.join("blocks").join(rel), full);
            assert_eq!(parse_hex(&rel[6..38]), Some(id));
        }
    }

    #[test]
    fn a_new_fan_out_directory_has_its_parent_fsynced() {
        let dir = tempfile::tempdir().unwrap();
        let g = Geometry {
            shard_bytes: 4096,
            shards_per_block: 2,
        };
        let engine = Arc::from(
            ucm_device::IoEngineConfig::new(ucm_device::IoEngineKind::Posix)
                .build()
                .unwrap(),
        );
        // The directories a batch fsyncs itself (a `syncfs` covers them all).
        let mut cfg = DiskConfig::new(dir.path(), g, 100);
        cfg.sync = SyncMode::Files;
        let t = DiskTier::open(cfg, engine).unwrap();
        let dirs_of = |id: BlockId| {
            let shards = (0..2).map(|_| IoBuf::new(4096)).collect();
            let (synced, done) = t.sync(t.start_writes(vec![(id, shards)]), None);
            assert!(done.is_empty());
            let r = t.rename(synced);
            let dirs = r.dirs.clone();
            assert!(t.publish(r, None).iter().all(|(_, r)| r.is_ok()));
            dirs
        };
        let blocks = dir.path().join("blocks");
        let (a, b) = (
            [0xabu8, 0xcd, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            [0xab, 0xcd, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        );
        let mut first = dirs_of(a);
        first.sort();
        let mut want = vec![blocks.clone(), blocks.join("ab"), blocks.join("ab/cd")];
        want.sort();
        assert_eq!(first, want, "both new directories' parents and the leaf");
        assert_eq!(
            dirs_of(b),
            vec![blocks.join("ab/cd")],
            "nothing new: the leaf only"
        );
    }
}

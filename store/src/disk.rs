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

use std::collections::HashMap;
use std::ffi::CStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use ucm_device::io::fs as iofs;
use ucm_device::io::IoDir;
use ucm_device::io::DIRECT_IO_ALIGN;
use ucm_device::{IoBuf, IoEngine, IoFile, IoRequest, IoTicket, OpenOptions};

use crate::error::{Result, StoreError};
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
            other => Err(StoreError::Config(format!(
                "unknown sync mode {:?} (expected auto or files)",
                paths::short(other)
            ))),
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
    stats: DiskStats,
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
    known: std::sync::RwLock<std::collections::HashSet<BlockId>>,
    /// Blocks are written to unnamed files (`O_TMPFILE`) until the file
    /// system refuses one; then to named temporary files.
    unnamed: std::sync::atomic::AtomicBool,
    /// `tmp/`, held open for one `syncfs` per batch when the tier makes
    /// its writes durable that way ([`SyncMode`]); `None`: an fsync per
    /// file and directory.
    fs_sync: Option<IoDir>,
}

/// Lookups of at least this many unknown ids stat them on two threads.
const PARALLEL_LOOKUP: usize = 512;

/// Blocks written per batch of [`DiskTier::write_blocks`]: at most three
/// times as many temporary files are open at once per writer (a batch
/// being fsynced, the one after it writing, and, while the batch before is
/// named, the one after that; a batch's files are closed once named).
pub const WRITE_BATCH_BLOCKS: usize = 64;

/// A block on its way to disk.
struct Pending {
    id: BlockId,
    /// The temporary file's name in `tmp/`; `None` for an unnamed file
    /// (`O_TMPFILE`), which is linked into `blocks/` instead of renamed.
    tmp: Option<PathBuf>,
    file: Option<Arc<IoFile>>,
    err: Option<StoreError>,
}

/// A batch whose writes are in flight: the blocks, and each write's
/// ticket with the index of its block.
struct Writing {
    pending: Vec<Pending>,
    writes: Vec<(IoTicket, usize)>,
}

/// A batch whose files are fsynced and renamed into `blocks/`, waiting on
/// the fsyncs of the directories it touched (`dirs`) to be durable.
struct Renamed {
    pending: Vec<Pending>,
    dirs: Vec<PathBuf>,
}

/// Fails each block of `pending` not failed yet: the `syncfs` through
/// `dir` meant to make it durable failed with `errno`.
fn fail_unsynced(pending: &mut [Pending], dir: &IoDir, errno: i32) {
    for p in pending.iter_mut().filter(|p| p.err.is_none()) {
        p.err = Some(StoreError::Device(ucm_device::DeviceError::os(
            "syncfs",
            Some(dir.path().to_path_buf()),
            errno,
        )));
    }
}

/// Adds `d` to the directories a batch fsyncs, once.
fn add_dir(dirs: &mut Vec<PathBuf>, d: &Path) {
    if !dirs.iter().any(|x| x == d) {
        dirs.push(d.to_path_buf());
    }
}

/// One block's reads as they completed: (bytes, buffer), header first.
type Parts = Vec<(usize, Option<IoBuf>)>;

/// Block `id`'s file name relative to `blocks/` (`ab/cd/<hex>.blk`),
/// NUL-terminated, built on the stack.
fn rel_name(id: &BlockId) -> [u8; 43] {
    let hex = hex_digits(id);
    let mut n = [0u8; 43];
    n[0..2].copy_from_slice(&hex[0..2]);
    n[2] = b'/';
    n[3..5].copy_from_slice(&hex[2..4]);
    n[5] = b'/';
    n[6..38].copy_from_slice(&hex);
    n[38..42].copy_from_slice(b".blk");
    n
}

fn mkdir(path: &Path) -> Result<()> {
    iofs::create_dir_all(path, 0o700).map_err(StoreError::fs("create directory", path))
}

impl DiskTier {
    /// Opens (or creates) the tier in `cfg.dir`: checks or writes the
    /// geometry marker and clears leftover temporary files.
    pub fn open(cfg: DiskConfig, engine: Arc<dyn IoEngine>) -> Result<Self> {
        cfg.geometry.validate()?;
        if cfg.low_watermark > cfg.high_watermark || cfg.high_watermark == 0 {
            return Err(StoreError::Config(format!(
                "watermarks must satisfy 0 <= low ({}) <= high ({}), high > 0",
                cfg.low_watermark, cfg.high_watermark
            )));
        }
        let tmp = cfg.dir.join("tmp");
        // The root may be made with its parents; beneath it, nothing is
        // followed through a link.
        if fs::symlink_metadata(&cfg.dir).is_err() {
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
                entry.metadata(),
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
            unnamed: std::sync::atomic::AtomicBool::new(cfg.unnamed_tmp),
            cfg,
            engine,
            header_bytes,
            stats: DiskStats::default(),
            touched: Mutex::new(HashMap::new()),
            gc_lock: Mutex::new(()),
            last_found: AtomicU64::new(0),
            writes_since: AtomicU64::new(0),
            known: Default::default(),
        })
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

    fn is_known(&self, id: &BlockId) -> bool {
        self.known
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(id)
    }

    /// `blocks/`, opened for lookups by relative name (`None` when it is
    /// missing or not a directory: then nothing is present). Opened per
    /// batch, so a directory removed and made again is never a stale
    /// handle.
    fn blocks_dir(&self) -> Option<IoDir> {
        IoDir::open(self.cfg.dir.join("blocks")).ok()
    }

    /// Presence of `id` beneath `blocks`: a regular file (its last
    /// component not a link) of the full block length.
    fn stat_in(&self, blocks: &IoDir, id: &BlockId) -> bool {
        let name = rel_name(id);
        CStr::from_bytes_with_nul(&name)
            .ok()
            .and_then(|n| blocks.stat(n))
            .is_some_and(|e| e.regular && e.len == self.file_bytes())
    }

    fn remember(&self, ids: impl IntoIterator<Item = BlockId>) {
        let mut k = self.known.write().unwrap_or_else(|e| e.into_inner());
        // Bounded: past twice the capacity the summary starts over.
        if k.len() as u64 > self.cfg.high_watermark.saturating_mul(2) {
            k.clear();
        }
        k.extend(ids);
    }

    fn forget(&self, id: &BlockId) {
        self.known
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }

    fn forget_all(&self) {
        self.known
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Presence of each id: known ids at once, the others asked of the
    /// file system (on two threads for a large batch).
    pub fn lookup(&self, ids: &[BlockId]) -> Vec<bool> {
        let mut out: Vec<bool> = {
            let k = self.known.read().unwrap_or_else(|e| e.into_inner());
            ids.iter().map(|id| k.contains(id)).collect()
        };
        let unknown: Vec<usize> = (0..ids.len()).filter(|&i| !out[i]).collect();
        if unknown.is_empty() {
            return out;
        }
        let Some(blocks) = self.blocks_dir() else {
            return out;
        };
        let stat_all = |part: &[usize]| -> Vec<(usize, bool)> {
            part.iter()
                .map(|&i| (i, self.stat_in(&blocks, &ids[i])))
                .collect()
        };
        let found: Vec<(usize, bool)> = if unknown.len() < PARALLEL_LOOKUP {
            stat_all(&unknown)
        } else {
            let (a, b) = unknown.split_at(unknown.len() / 2);
            std::thread::scope(|s| {
                let other = s.spawn(|| stat_all(b));
                let mut mine = stat_all(a);
                mine.extend(other.join().unwrap_or_default());
                mine
            })
        };
        // One write for every id found.
        self.remember(found.iter().filter(|(_, h)| *h).map(|&(i, _)| ids[i]));
        for (i, here) in found {
            out[i] = here;
        }
        out
    }

    /// Number of leading ids present (stops at the first miss).
    pub fn lookup_on_prefix(&self, ids: &[BlockId]) -> usize {
        let mut blocks = None;
        let mut n = 0;
        for id in ids {
            let here = self.is_known(id)
                || blocks
                    .get_or_insert_with(|| self.blocks_dir())
                    .as_ref()
                    .is_some_and(|d| self.stat_in(d, id));
            if !here {
                break;
            }
            n += 1;
        }
        // What the file system was asked and found is remembered (one
        // write).
        if n > 0 && blocks.is_some() {
            self.remember(ids[..n].iter().copied());
        }
        n
    }

    fn header(&self, id: &BlockId, shards: &[IoBuf]) -> IoBuf {
        let mut h = IoBuf::new(self.header_bytes);
        let crcs: Vec<u32> = shards
            .iter()
            .map(|s| crc32c::crc32c(s.as_slice()))
            .collect();
        header::write_header(self.cfg.geometry, id, &crcs, h.as_mut_slice());
        h
    }

    /// Parses and checks a header; returns the shard checksums.
    fn parse_header(&self, id: &BlockId, b: &[u8]) -> Option<Vec<u32>> {
        header::parse_header(self.cfg.geometry, id, b)
    }

    /// Writes block `id` with all its shards (in shard order), crash-safely:
    /// temporary file, fsync, link or rename, directory fsync. On any failure
    /// nothing becomes visible and the error says why.
    pub fn write_block(&self, id: &BlockId, shards: Vec<IoBuf>) -> Result<()> {
        let mut r = self.write_blocks(vec![(*id, shards)]);
        match r.pop() {
            Some((_, r)) => r,
            // One outcome per block is the contract; none is never success.
            None => Err(StoreError::fs("write block", self.path_of(id))(
                std::io::Error::other("no outcome was reported for the block"),
            )),
        }
    }

    /// Writes many blocks at once, in batches of [`WRITE_BATCH_BLOCKS`]
    /// (bounding the temporary files open at once): each block's write goes
    /// to the engine as soon as its file is open and its header made, then
    /// the batch's fsyncs go in one submission, then the files are named
    /// (linked or renamed), then one fsync per directory touched.
    /// Batches overlap: batch N's file fsyncs are in flight with batch
    /// N-1's directory fsyncs (one journal commit serves both) and batch
    /// N+1's writes, and batch N+2's writes are handed to the engine before
    /// batch N is named. A batch is reported only after its directory
    /// fsyncs. Each block succeeds or fails alone, with the guarantees of
    /// [`DiskTier::write_block`].
    pub fn write_blocks(&self, blocks: Vec<(BlockId, Vec<IoBuf>)>) -> Vec<(BlockId, Result<()>)> {
        let mut out = Vec::with_capacity(blocks.len());
        let mut blocks = blocks.into_iter().peekable();
        let mut next = || {
            blocks.peek().is_some().then(|| {
                let batch: Vec<_> = blocks.by_ref().take(WRITE_BATCH_BLOCKS).collect();
                self.start_writes(batch)
            })
        };
        let (mut current, mut ahead) = (next(), next());
        let mut renamed: Option<Renamed> = None;
        while let Some(w) = current {
            let (synced, done) = self.sync(w, renamed.take());
            out.extend(done);
            let after = next();
            renamed = Some(self.rename(synced));
            (current, ahead) = (ahead, after);
        }
        if let Some(r) = renamed {
            out.extend(self.publish(r, None));
        }
        out
    }

    /// Opens each block's temporary file and hands its writes to the
    /// engine; a block refused here carries its error.
    fn start_writes(&self, blocks: Vec<(BlockId, Vec<IoBuf>)>) -> Writing {
        let g = self.cfg.geometry;
        let mut pending: Vec<Pending> = Vec::with_capacity(blocks.len());
        // One vectored write per block (header, then its shards in order):
        // a block costs one operation however many shards it has.
        let mut writes: Vec<(IoTicket, usize)> = Vec::new();
        for (id, shards) in blocks {
            let mut p = Pending {
                id,
                tmp: None,
                file: None,
                err: None,
            };
            if shards.len() != g.shards_per_block as usize
                || shards.iter().any(|s| s.len() != g.shard_bytes)
            {
                p.err = Some(StoreError::Config(format!(
                    "a block needs {} shards of {} bytes",
                    g.shards_per_block, g.shard_bytes
                )));
                pending.push(p);
                continue;
            }
            match self.create_tmp(&id) {
                Err(e) => p.err = Some(e),
                Ok((f, tmp)) => {
                    p.tmp = tmp;
                    let f = Arc::new(f);
                    let mut bufs = Vec::with_capacity(1 + shards.len());
                    bufs.push(self.header(&id, &shards));
                    bufs.extend(shards);
                    // Submitted at once: the disk starts on this block
                    // while the next ones are opened and checksummed.
                    let reqs = IoRequest::writes_vectored(&f, 0, bufs);
                    let i = pending.len();
                    writes.extend(self.engine.submit(reqs).into_iter().map(|t| (t, i)));
                    p.file = Some(f);
                }
            }
            pending.push(p);
        }
        Writing { pending, writes }
    }

    /// Creates block `id`'s temporary file in `tmp/`: unnamed where the
    /// file system can (nothing to clean up after a crash, and one link
    /// instead of a create and a rename), else named with the writer's
    /// identity. Returns the file and, when named, its path.
    fn create_tmp(&self, id: &BlockId) -> Result<(IoFile, Option<PathBuf>)> {
        let dir = self.cfg.dir.join("tmp");
        if self.unnamed.load(Ordering::Relaxed) {
            match IoFile::create_unnamed(&dir, true) {
                Ok(f) => return Ok((f, None)),
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
                    ) =>
                {
                    if self.unnamed.swap(false, Ordering::Relaxed) {
                        log::info!(
                            "disk tier {}: unnamed temporary files refused ({e}); \
                             writing named ones",
                            self.cfg.dir.display()
                        );
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        // The writer's identity is in the name: another process opening
        // this store removes it only once this writer is dead.
        let tmp = paths::tmp_path(&dir, &hex(id));
        let opts = OpenOptions {
            write: true,
            create: true,
            truncate: true,
            direct: true,
        };
        let f = IoFile::open(&tmp, opts)?;
        Ok((f, Some(tmp)))
    }

    /// Gives a synced block file its name in `blocks/`: a link of an
    /// unnamed file, a rename of a named one. A link never replaces a file;
    /// where one is there already (a rewrite), the file is linked to a
    /// fresh name in `tmp/` and renamed over it, which replaces it
    /// atomically as a rename does.
    fn place(&self, p: &mut Pending, dst: &Path) -> Result<()> {
        let file = match (&p.tmp, &p.file) {
            (Some(tmp), _) => {
                return iofs::rename(tmp, dst).map_err(StoreError::fs("rename", dst));
            }
            (None, Some(f)) => f,
            (None, None) => {
                return Err(StoreError::fs("link", dst)(std::io::Error::other(
                    "the unnamed file was closed before it was named",
                )))
            }
        };
        match file.link_as(dst) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                let tmp = paths::tmp_path(&self.cfg.dir.join("tmp"), &hex(&p.id));
                file.link_as(&tmp)?;
                p.tmp = Some(tmp.clone());
                iofs::rename(&tmp, dst).map_err(StoreError::fs("rename", dst))
            }
            r => r.map_err(Into::into),
        }
    }

    /// Waits for a batch's writes and fsyncs its files (closing them). The
    /// batch before it (`before`, renamed) has its directories fsynced
    /// while these fsyncs are in flight, and its results are returned.
    fn sync(
        &self,
        w: Writing,
        before: Option<Renamed>,
    ) -> (Vec<Pending>, Vec<(BlockId, Result<()>)>) {
        let Writing {
            mut pending,
            writes,
        } = w;
        // Every write must succeed; the first error of a block wins.
        for (t, i) in writes {
            if let Err(e) = t.wait_blocking().result {
                pending[i].err.get_or_insert(e.into());
            }
        }
        let done = match &self.fs_sync {
            Some(dir) => self.sync_by_fs(dir, &mut pending, before),
            None => self.sync_by_files(&mut pending, before),
        };
        // Named files are closed; unnamed ones stay open until linked.
        for p in pending.iter_mut().filter(|p| p.tmp.is_some()) {
            p.file = None;
        }
        (pending, done)
    }

    /// One syncfs: this batch's files, and the names the batch before was
    /// given (linked before this call), are durable once it returns; then
    /// the batch before is reported.
    fn sync_by_fs(
        &self,
        dir: &IoDir,
        pending: &mut [Pending],
        before: Option<Renamed>,
    ) -> Vec<(BlockId, Result<()>)> {
        let wanted = pending.iter().any(|p| p.err.is_none())
            || before
                .as_ref()
                .is_some_and(|r| r.pending.iter().any(|p| p.err.is_none()));
        let synced = if wanted { self.sync_fs(dir) } else { Ok(()) };
        if let Err(errno) = synced {
            fail_unsynced(pending, dir, errno);
        }
        before
            .map(|r| self.publish(r, Some(synced)))
            .unwrap_or_default()
    }

    /// An fsync of each of this batch's files, with the batch before's
    /// directory fsyncs (and its report) while they are in flight.
    fn sync_by_files(
        &self,
        pending: &mut [Pending],
        before: Option<Renamed>,
    ) -> Vec<(BlockId, Result<()>)> {
        let syncs: Vec<(usize, IoRequest)> = pending
            .iter()
            .enumerate()
            .filter(|(_, p)| p.err.is_none())
            .filter_map(|(i, p)| {
                p.file
                    .as_ref()
                    .map(|f| (i, IoRequest::fsync(Arc::clone(f))))
            })
            .collect();
        let (idx, reqs): (Vec<usize>, Vec<IoRequest>) = syncs.into_iter().unzip();
        let tickets = self.engine.submit(reqs);
        let done = before.map(|r| self.publish(r, None)).unwrap_or_default();
        for (t, i) in tickets.into_iter().zip(idx) {
            if let Err(e) = t.wait_blocking().result {
                pending[i].err.get_or_insert(e.into());
            }
        }
        done
    }

    /// One `syncfs` through `dir`, counted: `Err(errno)` when it failed
    /// (EIO where the error carries none).
    fn sync_fs(&self, dir: &IoDir) -> std::result::Result<(), i32> {
        self.stats.fs_syncs.fetch_add(1, Ordering::Relaxed);
        dir.sync_filesystem()
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
    }

    /// Names a synced batch's files in `blocks/` (making the fan-out
    /// directories they need); their directories are not yet fsynced.
    fn rename(&self, mut pending: Vec<Pending>) -> Renamed {
        let mut dirs: Vec<PathBuf> = Vec::new();
        for p in pending.iter_mut().filter(|p| p.err.is_none()) {
            let dst = self.path_of(&p.id);
            let parent = dst.parent().unwrap_or(&self.cfg.dir).to_path_buf();
            let moved = self
                .fanout(&parent, &mut dirs)
                .and_then(|_| self.place(p, &dst));
            // Closing an unnamed file that was not linked frees it.
            p.file = None;
            match moved {
                Ok(()) => add_dir(&mut dirs, &parent),
                Err(e) => p.err = Some(e),
            }
        }
        Renamed { pending, dirs }
    }

    /// Makes a renamed batch's names durable (one fsync per directory it
    /// touched, or a `syncfs`) and reports each block: written, or failed
    /// with its error (its temporary file removed). `covered`: the outcome of a `syncfs` made after the batch's names
    /// were given (by the next batch's [`DiskTier::sync`]), which stands
    /// for its directories' fsyncs; `None`: this call makes them durable
    /// itself (a `syncfs`, or an fsync per directory).
    fn publish(
        &self,
        r: Renamed,
        covered: Option<std::result::Result<(), i32>>,
    ) -> Vec<(BlockId, Result<()>)> {
        let Renamed { mut pending, dirs } = r;
        let synced = match (covered, &self.fs_sync) {
            (Some(synced), _) => Some(synced),
            (None, Some(dir)) if pending.iter().any(|p| p.err.is_none()) => Some(self.sync_fs(dir)),
            (None, Some(_)) => Some(Ok(())),
            (None, None) => None,
        };
        if let (Some(Err(errno)), Some(dir)) = (synced, &self.fs_sync) {
            fail_unsynced(&mut pending, dir, errno);
        }
        for d in dirs.iter().filter(|_| synced.is_none()) {
            if let Err(e) = paths::sync_dir(d) {
                // The files are complete and valid; their durability is not
                // (a directory above theirs holds a new fan-out entry).
                for p in pending.iter_mut().filter(|p| p.err.is_none()) {
                    if self.path_of(&p.id).starts_with(d) {
                        p.err = Some(StoreError::fs("fsync directory", d)(std::io::Error::new(
                            e.kind(),
                            e.to_string(),
                        )));
                    }
                }
            }
        }
        let written: Vec<BlockId> = pending
            .iter()
            .filter(|p| p.err.is_none())
            .map(|p| p.id)
            .collect();
        let n = written.len() as u64;
        self.remember(written);
        self.after_writes(n);
        pending
            .into_iter()
            .map(|p| {
                let r = match p.err {
                    None => {
                        self.stats.blocks_written.fetch_add(1, Ordering::Relaxed);
                        Ok(())
                    }
                    Some(e) => {
                        if let Some(tmp) = &p.tmp {
                            let _ = iofs::remove_file(tmp);
                        }
                        self.stats.write_failures.fetch_add(1, Ordering::Relaxed);
                        let _ = crate::failure::warn_limited(
                            &format!("block {} not written", hex(&p.id)),
                            &crate::failure::Failure::from_store(&e, "disk write"),
                        );
                        Err(e)
                    }
                };
                (p.id, r)
            })
            .collect()
    }

    /// Reads `shards` of block `id`. `Ok(None)` is a miss: the block is
    /// absent, or a checksum failed (then its file is removed). An I/O
    /// error is an error: the caller reports the block as failed.
    pub fn read_shards(&self, id: &BlockId, shards: &[u32]) -> Result<Option<Vec<IoBuf>>> {
        let sb = self.cfg.geometry.shard_bytes;
        let bufs = shards.iter().map(|&s| (s, IoBuf::new(sb))).collect();
        let mut r = self.read_many(vec![(*id, bufs)]);
        r.pop().unwrap_or(Ok(None))
    }

    /// Reads the given shards of many blocks in one engine batch, into the
    /// buffers given with them (of one shard each; e.g. pool slots); one
    /// outcome per request, as [`DiskTier::read_shards`].
    pub fn read_many(
        &self,
        reqs: Vec<(BlockId, Vec<(u32, IoBuf)>)>,
    ) -> Vec<Result<Option<Vec<IoBuf>>>> {
        self.read_many_in(&mut ReadSession::default(), reqs)
    }

    /// As [`DiskTier::read_many`], reusing the open files and verified
    /// headers that `session` remembers from earlier calls (a task that
    /// reads one shard index at a time opens each file and reads its header
    /// once). A remembered file stays readable even if GC unlinks it
    /// meanwhile, and its bytes are the block's: blocks are content-addressed.
    pub fn read_many_in(
        &self,
        session: &mut ReadSession,
        reqs: Vec<(BlockId, Vec<(u32, IoBuf)>)>,
    ) -> Vec<Result<Option<Vec<IoBuf>>>> {
        let sb = self.cfg.geometry.shard_bytes;
        let mut out: Vec<Option<Result<Option<Vec<IoBuf>>>>> = Vec::with_capacity(reqs.len());
        let mut ios = Vec::new();
        let mut owner = Vec::new();
        // Per request: block, shards, and the file and checksums when the
        // header was already verified (None: it is read with this batch).
        let mut shard_lists = Vec::with_capacity(reqs.len());
        for (i, (id, shards)) in reqs.into_iter().enumerate() {
            let known = session.files.get(&id).cloned();
            shard_lists.push((
                id,
                shards.iter().map(|(s, _)| *s).collect::<Vec<u32>>(),
                known.clone(),
            ));
            let bad = shards.iter().find_map(|(s, b)| {
                self.cfg.geometry.check_shard(*s).err().or_else(|| {
                    (b.len() != sb)
                        .then(|| StoreError::Config(format!("a shard buffer must hold {sb} bytes")))
                })
            });
            if let Some(bad) = bad {
                out.push(Some(Err(bad)));
                continue;
            }
            let f = match known {
                Some((f, _)) => f,
                None => {
                    let path = self.path_of(&id);
                    match IoFile::open(&path, OpenOptions::read_only()) {
                        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                            self.forget(&id);
                            out.push(Some(Ok(None)));
                            continue;
                        }
                        Err(e) => {
                            out.push(Some(Err(e.into())));
                            continue;
                        }
                        Ok(f) => {
                            let f = Arc::new(f);
                            ios.push(IoRequest::read(
                                Arc::clone(&f),
                                0,
                                IoBuf::new(self.header_bytes),
                            ));
                            owner.push(i);
                            f
                        }
                    }
                }
            };
            for (s, buf) in shards {
                ios.push(IoRequest::read(
                    Arc::clone(&f),
                    self.header_bytes as u64 + u64::from(s) * sb as u64,
                    buf,
                ));
                owner.push(i);
            }
            if !session.files.contains_key(&id) {
                session.opened.push((id, f));
            }
            out.push(None);
        }
        // Outcomes per request: (bytes, buffer) in submission order, or the error.
        let mut got: Vec<Result<Parts>> = (0..shard_lists.len()).map(|_| Ok(Vec::new())).collect();
        for (t, &i) in self.engine.submit(ios).into_iter().zip(&owner) {
            let o = t.wait_blocking();
            if let Ok(v) = &mut got[i] {
                match o.result {
                    Ok(n) => v.push((n, o.buf)),
                    Err(e) => got[i] = Err(e.into()),
                }
            }
        }
        let opened: HashMap<BlockId, Arc<IoFile>> = session.opened.drain(..).collect();
        out.into_iter()
            .zip(got)
            .zip(shard_lists)
            .map(|((done, got), (id, shards, known))| match done {
                Some(r) => r,
                None => got.and_then(|parts| {
                    let (crcs, parts) = match known {
                        Some((_, crcs)) => (Some(crcs), parts),
                        None => {
                            let mut it = parts.into_iter();
                            let crcs = it.next().and_then(|(n, b)| {
                                let b = b?;
                                (n == self.header_bytes)
                                    .then(|| self.parse_header(&id, b.as_slice()))?
                            });
                            (crcs.map(Arc::new), it.collect())
                        }
                    };
                    let r = self.verify(&id, &shards, crcs.as_deref().map(Vec::as_slice), parts);
                    match (&r, crcs, opened.get(&id)) {
                        // Remember a good header (bounded: the oldest go).
                        (Ok(Some(_)), Some(c), Some(f)) => session.remember(id, Arc::clone(f), c),
                        (Ok(Some(_)), _, _) => {}
                        _ => {
                            session.files.remove(&id);
                        }
                    }
                    r
                }),
            })
            .collect()
    }

    /// Checks one block's shards as read against its header's checksums
    /// (`None`: the header failed its own check).
    fn verify(
        &self,
        id: &BlockId,
        shards: &[u32],
        crcs: Option<&[u32]>,
        parts: Parts,
    ) -> Result<Option<Vec<IoBuf>>> {
        let sb = self.cfg.geometry.shard_bytes;
        let path = self.path_of(id);
        let Some(crcs) = crcs else {
            return self.corrupt(id, &path, "header");
        };
        let mut bufs = Vec::with_capacity(shards.len());
        for (&s, (n, b)) in shards.iter().zip(parts) {
            let Some(b) = b else {
                return self.corrupt(id, &path, "missing buffer");
            };
            if n != sb || crc32c::crc32c(b.as_slice()) != crcs[s as usize] {
                return self.corrupt(id, &path, "shard checksum");
            }
            bufs.push(b);
        }
        Ok(Some(bufs))
    }

    fn corrupt(&self, id: &BlockId, path: &Path, what: &str) -> Result<Option<Vec<IoBuf>>> {
        self.forget(id);
        self.stats.corrupt_shards.fetch_add(1, Ordering::Relaxed);
        log::warn!(
            "block {} failed its {what} check: treated as a miss and removed",
            hex(id)
        );
        let _ = iofs::remove_file(path);
        Ok(None)
    }

    /// A hotness pulse: refreshes the mtime of the blocks present, at most
    /// once per `touch_interval` each. Never a pin.
    pub fn touch(&self, ids: &[BlockId]) {
        let now = Instant::now();
        let mut seen = self.touched.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() > 1 << 16 {
            seen.retain(|_, t| now.duration_since(*t) < self.cfg.touch_interval);
        }
        for id in ids {
            if seen
                .get(id)
                .is_some_and(|t| now.duration_since(*t) < self.cfg.touch_interval)
            {
                continue;
            }
            let path = self.path_of(id);
            if iofs::set_modified(&path, SystemTime::now()).is_ok() {
                seen.insert(*id, now);
            }
        }
    }

    /// The opposite of [`DiskTier::touch`]: sets the mtime of the blocks
    /// present into the past, [`COLD_BACKDATE`] for `level` 0 and one
    /// sixteenth less per level above (levels above 15 count as 15), so
    /// that GC (oldest first) deletes them before any block written or
    /// touched within that span, lower levels first, each level in the
    /// order its blocks were written. A later `touch` (a hit) makes a
    /// block current again.
    pub fn cool(&self, ids: &[BlockId], level: u8) {
        let back = COLD_BACKDATE / 16 * (16 - u32::from(level.min(15)));
        let when = SystemTime::now()
            .checked_sub(back)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let mut seen = self.touched.lock().unwrap_or_else(|e| e.into_inner());
        for id in ids {
            let _ = iofs::set_modified(&self.path_of(id), when);
            seen.remove(id);
        }
    }

    /// The fan-out directories `blocks/ab/cd` of `parent`, made 0700 and
    /// never through a link. Adds to `dirs` each directory whose entries
    /// this call changed (the parent of a directory it created).
    fn fanout(&self, parent: &Path, dirs: &mut Vec<PathBuf>) -> Result<()> {
        for d in [parent.parent(), Some(parent)].into_iter().flatten() {
            if paths::ensure_dir(d)? {
                if let Some(above) = d.parent() {
                    add_dir(dirs, above);
                }
            }
        }
        Ok(())
    }

    /// Every block file with its mtime and length (a global walk of
    /// `blocks/`). Only what the store names is seen: real directories of
    /// two hex digits, regular files `<32 hex>.blk` in the directory their
    /// name belongs in; links are never followed.
    fn gather(&self) -> Vec<(SystemTime, PathBuf, u64)> {
        let mut out = Vec::new();
        let dirs = |p: &Path| {
            iofs::read_dir(p)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter_map(|e| {
                    let n = e.file_name().to_str()?.to_string();
                    (n.len() == 2 && n.bytes().all(|b| b.is_ascii_hexdigit()))
                        .then_some((n, e.path()))
                })
                .collect::<Vec<_>>()
        };
        for (a, ap) in dirs(&self.cfg.dir.join("blocks")) {
            for (b, bp) in dirs(&ap) {
                for f in iofs::read_dir(&bp).into_iter().flatten().flatten() {
                    let Some(name) = f.file_name().to_str().map(String::from) else {
                        continue;
                    };
                    let well_named = name.len() == 36
                        && name.ends_with(".blk")
                        && name[..4] == format!("{a}{b}")
                        && parse_hex(&name[..32]).is_some();
                    if !well_named {
                        continue;
                    }
                    if let Ok(m) = f.metadata() {
                        if m.file_type().is_file() {
                            if let Ok(t) = m.modified() {
                                out.push((t, f.path(), m.len()));
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// Every block id on disk, from the file names (for warm restarts).
    /// Files whose names are not block ids are skipped.
    pub fn enumerate(&self) -> Vec<BlockId> {
        let full = self.file_bytes();
        self.gather()
            .into_iter()
            .filter(|(_, _, len)| *len == full)
            .filter_map(|(_, p, _)| {
                let stem = p.file_stem()?.to_str()?;
                parse_hex(stem)
            })
            .collect()
    }

    /// Deletes every block file (an eviction storm: another machine's GC,
    /// an operator clearing the tier). Returns how many files it removed;
    /// a file already gone is not counted. Readers then miss, never read a
    /// partial block.
    pub fn evict_all(&self) -> u64 {
        let _one = self.gc_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.forget_all();
        let mut deleted = 0;
        for (_, p, _) in self.gather() {
            if iofs::remove_file(&p).is_ok() {
                deleted += 1;
            }
        }
        self.stats.gc_deleted.fetch_add(deleted, Ordering::Relaxed);
        deleted
    }

    /// Counts the directory's files after enough writes (see
    /// [`DiskConfig::gc_every`]) and collects when they are too many. Runs
    /// on the writing thread (a store worker), never on the engine's.
    fn after_writes(&self, n: u64) {
        if self.cfg.gc_every == 0 || n == 0 {
            return;
        }
        let since = self.writes_since.fetch_add(n, Ordering::Relaxed) + n;
        let estimate = self.last_found.load(Ordering::Relaxed) + since;
        if since < self.cfg.gc_every && estimate <= self.cfg.high_watermark {
            return;
        }
        let r = self.gc();
        if r.deleted > 0 || r.leased_elsewhere {
            log::debug!(
                "disk tier {}: {} block files, {} deleted{}",
                self.cfg.dir.display(),
                r.found,
                r.deleted,
                if r.leased_elsewhere {
                    " (another tier holds the GC lease)"
                } else {
                    ""
                }
            );
        }
    }

    /// One GC pass over the directory (every tier that shares it, of this
    /// process or others): when more than the high watermark of blocks
    /// exist, deletes the oldest (by mtime) until the low watermark remains.
    ///
    /// Tiers sharing a directory (instances on a shared file system) enforce
    /// its one capacity without a server: a pass that finds too many files
    /// first takes the lease `gc.lease` in the directory (created by a hard
    /// link, so one tier gets it; another may take it over only once it has
    /// expired, [`DiskConfig::gc_lease`], or its writer on this host is
    /// dead). A pass that cannot get it deletes nothing
    /// ([`GcReport::leased_elsewhere`]): the holder collects. Readers never
    /// lock: a file unlinked under a reader stays readable to it (and is
    /// the block's bytes: blocks are content-addressed); a later open misses.
    pub fn gc(&self) -> GcReport {
        let _one = self.gc_lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut files = self.gather();
        let found = files.len() as u64;
        self.last_found.store(found, Ordering::Relaxed);
        self.writes_since.store(0, Ordering::Relaxed);
        if found <= self.cfg.high_watermark {
            return GcReport {
                found,
                ..GcReport::default()
            };
        }
        let Some(lease) = self.take_lease() else {
            // The holder collects down to the low watermark: count again
            // only after this tier's next writes.
            self.last_found
                .store(self.cfg.low_watermark, Ordering::Relaxed);
            return GcReport {
                found,
                deleted: 0,
                leased_elsewhere: true,
            };
        };
        self.forget_all();
        let k = (found - self.cfg.low_watermark) as usize;
        if k < files.len() {
            files.select_nth_unstable_by_key(k, |(t, _, _)| *t);
        }
        let mut deleted = 0;
        for (_, p, _) in files.iter().take(k) {
            // A file already gone (another GC, another machine) is fine.
            if iofs::remove_file(p).is_ok() {
                deleted += 1;
            }
        }
        self.release_lease(&lease);
        self.stats.gc_deleted.fetch_add(deleted, Ordering::Relaxed);
        self.last_found.store(found - deleted, Ordering::Relaxed);
        GcReport {
            found,
            deleted,
            leased_elsewhere: false,
        }
    }

    fn lease_path(&self) -> PathBuf {
        self.cfg.dir.join("gc.lease")
    }

    /// Takes the GC lease of the directory; returns its text (ours) or
    /// `None` when another live, unexpired holder has it.
    fn take_lease(&self) -> Option<String> {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let until = now + self.cfg.gc_lease;
        let text = format!(
            "{} {} {}",
            paths::writer_id(),
            until.as_millis(),
            paths::next_nonce()
        );
        let (path, tmp) = (self.lease_path(), self.cfg.dir.join("tmp"));
        let held = match paths::create_marker(&path, &tmp, &text) {
            Ok(true) => true,
            // Held: taken over only when expired or its writer is dead, by
            // an atomic replace; re-read, since a racing taker may have
            // replaced it after us.
            Ok(false) => {
                let theirs = paths::read_marker(&path).ok().flatten().unwrap_or_default();
                lease_expired(&theirs, now)
                    && paths::replace_marker(&path, &tmp, &text).is_ok()
                    && paths::read_marker(&path).ok().flatten().as_deref() == Some(text.as_str())
            }
            Err(_) => false,
        };
        held.then_some(text)
    }

    /// Gives the lease back if it is still ours.
    fn release_lease(&self, text: &str) {
        let path = self.lease_path();
        if paths::read_marker(&path).ok().flatten().as_deref() == Some(text) {
            let _ = iofs::remove_file(&path);
        }
    }
}

/// Whether a lease's text (`<writer> <until, ms since the epoch> <n>`)
/// no longer holds at `now`: past its time, its writer (of this host)
/// dead, or not a lease at all (a damaged file must not block GC).
fn lease_expired(text: &str, now: Duration) -> bool {
    let mut parts = text.split_whitespace();
    let (Some(writer), Some(until)) = (parts.next(), parts.next()) else {
        return true;
    };
    let Ok(until) = until.parse::<u128>() else {
        return true;
    };
    until <= now.as_millis() || paths::writer_alive(writer) == Some(false)
}

fn parse_hex(s: &str) -> Option<BlockId> {
    if s.len() != 32 {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(id)
}

/// Open files and verified headers kept across the reads of one task (see
/// [`DiskTier::read_many_in`]). Bounded; dropping it closes the files.
#[derive(Default)]
pub struct ReadSession {
    files: HashMap<BlockId, (Arc<IoFile>, Arc<Vec<u32>>)>,
    order: std::collections::VecDeque<BlockId>,
    opened: Vec<(BlockId, Arc<IoFile>)>,
}

/// Files a [`ReadSession`] keeps open at most.
const SESSION_FILES: usize = 256;

impl ReadSession {
    fn remember(&mut self, id: BlockId, f: Arc<IoFile>, crcs: Arc<Vec<u32>>) {
        if self.files.insert(id, (f, crcs)).is_none() {
            self.order.push_back(id);
            while self.order.len() > SESSION_FILES {
                if let Some(old) = self.order.pop_front() {
                    self.files.remove(&old);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
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

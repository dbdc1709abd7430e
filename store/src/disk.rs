//! The disk tier: one fixed-size file per block, written crash-safely.
//!
//! Layout under the store directory (0700; files 0600):
//!
//! ```text
//! GEOMETRY                 the instance's geometry; another one is refused
//! tmp/                     files being written; cleared at open, never read
//! blocks/ab/cd/<id>.blk    finished blocks (hex fan-out on the first 2 bytes)
//! ```
//!
//! A block file is a header followed by the shards: shard `i` lies at
//! `header_bytes + i * shard_bytes`. The header (little-endian) holds the
//! magic `UCMBLK\0\x01`, the format version, the geometry, the block id, a
//! CRC32C per shard and a CRC32C of the header itself, padded to 4 KiB.
//!
//! A block is written to `tmp/` through the I/O engine with O_DIRECT,
//! fsynced, renamed into `blocks/` and the directory fsynced, only when
//! **all** its shards were written. A reader never sees a partial file; a
//! crash leaves the old state or the whole new block. A shard whose checksum
//! fails is a miss, never data, and its file is removed.
//!
//! Presence is always asked of the file system: there is no in-memory
//! "what is on disk" set that another machine's GC on a shared disk could
//! falsify. GC is global and precise: it gathers every block's mtime,
//! selects the oldest with `select_nth_unstable` and deletes whole files
//! until the count is at the low watermark. `touch` refreshes mtimes,
//! throttled per block.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use ucm_device::io::DIRECT_IO_ALIGN;
use ucm_device::{IoBuf, IoEngine, IoFile, IoRequest, OpenOptions};

use crate::error::{Result, StoreError};
use crate::geometry::{BlockId, Geometry};

const MAGIC: [u8; 8] = *b"UCMBLK\x00\x01";
const FORMAT_VERSION: u32 = 1;
/// Bytes of the fixed header part before the shard checksums.
const FIXED: usize = 8 + 4 + 4 + 8 + 16;

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
}

/// What one GC pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Block files found.
    pub found: u64,
    /// Block files deleted.
    pub deleted: u64,
}

/// The disk tier of one store instance.
pub struct DiskTier {
    cfg: DiskConfig,
    engine: Arc<dyn IoEngine>,
    header_bytes: usize,
    stats: DiskStats,
    nonce: AtomicU64,
    touched: Mutex<HashMap<BlockId, Instant>>,
    gc_lock: Mutex<()>,
}

/// One block's reads as they completed: (bytes, buffer), header first.
type Parts = Vec<(usize, Option<IoBuf>)>;

fn hex(id: &BlockId) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

fn mkdir(path: &Path) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(StoreError::fs("create directory", path))
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
        for d in [cfg.dir.clone(), cfg.dir.join("blocks"), tmp.clone()] {
            mkdir(&d)?;
            // An existing directory may be more open than the store wants.
            fs::set_permissions(&d, fs::Permissions::from_mode(0o700))
                .map_err(StoreError::fs("restrict to 0700", &d))?;
        }
        let marker = cfg.dir.join("GEOMETRY");
        let expected = cfg.geometry.describe();
        match fs::read_to_string(&marker) {
            Ok(found) if found.trim() == expected => {}
            Ok(found) => {
                return Err(StoreError::GeometryMismatch {
                    path: marker,
                    found: found.trim().to_string(),
                    expected,
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut f = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&marker)
                    .map_err(StoreError::fs("create", &marker))?;
                std::io::Write::write_all(&mut f, format!("{expected}\n").as_bytes())
                    .and_then(|_| f.sync_all())
                    .map_err(StoreError::fs("write", &marker))?;
            }
            Err(e) => return Err(StoreError::fs("read", &marker)(e)),
        }
        // Temporary files of a crashed writer are never read: clear them.
        let mut cleared = 0;
        for entry in fs::read_dir(&tmp).map_err(StoreError::fs("list", &tmp))? {
            let entry = entry.map_err(StoreError::fs("list", &tmp))?;
            if fs::remove_file(entry.path()).is_ok() {
                cleared += 1;
            }
        }
        if cleared > 0 {
            log::info!(
                "disk tier {}: cleared {cleared} temporary files",
                cfg.dir.display()
            );
        }
        let shards = cfg.geometry.shards_per_block as usize;
        let header_bytes = (FIXED + 4 * shards + 4).div_ceil(DIRECT_IO_ALIGN) * DIRECT_IO_ALIGN;
        Ok(DiskTier {
            cfg,
            engine,
            header_bytes,
            stats: DiskStats::default(),
            nonce: AtomicU64::new(0),
            touched: Mutex::new(HashMap::new()),
            gc_lock: Mutex::new(()),
        })
    }

    /// The geometry.
    pub fn geometry(&self) -> Geometry {
        self.cfg.geometry
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
        self.cfg
            .dir
            .join("blocks")
            .join(&h[0..2])
            .join(&h[2..4])
            .join(format!("{h}.blk"))
    }

    /// True when block `id` is on disk (asked of the file system).
    pub fn exists(&self, id: &BlockId) -> bool {
        self.path_of(id).is_file()
    }

    /// Presence of each id.
    pub fn lookup(&self, ids: &[BlockId]) -> Vec<bool> {
        ids.iter().map(|id| self.exists(id)).collect()
    }

    /// Number of leading ids present.
    pub fn lookup_on_prefix(&self, ids: &[BlockId]) -> usize {
        ids.iter().take_while(|id| self.exists(id)).count()
    }

    fn header(&self, id: &BlockId, shards: &[IoBuf]) -> IoBuf {
        let g = self.cfg.geometry;
        let mut h = IoBuf::new(self.header_bytes);
        let b = h.as_mut_slice();
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&g.shards_per_block.to_le_bytes());
        b[16..24].copy_from_slice(&(g.shard_bytes as u64).to_le_bytes());
        b[24..40].copy_from_slice(id);
        for (i, s) in shards.iter().enumerate() {
            let at = FIXED + 4 * i;
            b[at..at + 4].copy_from_slice(&crc32c::crc32c(s.as_slice()).to_le_bytes());
        }
        let end = FIXED + 4 * shards.len();
        let crc = crc32c::crc32c(&b[..end]);
        b[end..end + 4].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// Parses and checks a header; returns the shard checksums.
    fn parse_header(&self, id: &BlockId, b: &[u8]) -> Option<Vec<u32>> {
        let g = self.cfg.geometry;
        let n = g.shards_per_block as usize;
        let end = FIXED + 4 * n;
        let le32 = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let ok = b.len() >= end + 4
            && b[0..8] == MAGIC
            && le32(8) == FORMAT_VERSION
            && le32(12) == g.shards_per_block
            && b[16..24] == (g.shard_bytes as u64).to_le_bytes()
            && b[24..40] == id[..]
            && crc32c::crc32c(&b[..end]) == le32(end);
        ok.then(|| (0..n).map(|i| le32(FIXED + 4 * i)).collect())
    }

    /// Writes block `id` with all its shards (in shard order), crash-safely:
    /// temporary file, fsync, rename, directory fsync. On any failure
    /// nothing becomes visible and the error says why.
    pub fn write_block(&self, id: &BlockId, shards: Vec<IoBuf>) -> Result<()> {
        let mut r = self.write_blocks(vec![(*id, shards)]);
        r.pop().map_or(Ok(()), |(_, r)| r)
    }

    /// Writes many blocks at once: every block's writes go to the engine in
    /// one batch, then their fsyncs in one batch, then the renames, then one
    /// fsync per directory touched. Each block succeeds or fails alone, with
    /// the guarantees of [`DiskTier::write_block`].
    pub fn write_blocks(&self, blocks: Vec<(BlockId, Vec<IoBuf>)>) -> Vec<(BlockId, Result<()>)> {
        let g = self.cfg.geometry;
        let sb = g.shard_bytes as u64;
        struct Pending {
            id: BlockId,
            tmp: PathBuf,
            file: Option<Arc<IoFile>>,
            err: Option<StoreError>,
        }
        let mut pending: Vec<Pending> = Vec::with_capacity(blocks.len());
        // Per block: its write requests (header first).
        let mut per_block: Vec<(usize, Vec<IoRequest>)> = Vec::new();
        for (id, shards) in blocks {
            let tmp = self.cfg.dir.join("tmp").join(format!(
                "{}.{}.{}.tmp",
                hex(&id),
                std::process::id(),
                self.nonce.fetch_add(1, Ordering::Relaxed)
            ));
            let mut p = Pending {
                id,
                tmp,
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
            let opts = OpenOptions {
                write: true,
                create: true,
                truncate: true,
                direct: true,
            };
            match IoFile::open(&p.tmp, opts) {
                Err(e) => p.err = Some(e.into()),
                Ok(f) => {
                    let f = Arc::new(f);
                    let mut mine = vec![IoRequest::write(
                        Arc::clone(&f),
                        0,
                        self.header(&id, &shards),
                    )];
                    for (k, s) in shards.into_iter().enumerate() {
                        mine.push(IoRequest::write(
                            Arc::clone(&f),
                            self.header_bytes as u64 + k as u64 * sb,
                            s,
                        ));
                    }
                    per_block.push((pending.len(), mine));
                    p.file = Some(f);
                }
            }
            pending.push(p);
        }
        // Interleave the blocks' requests (shard k of every block, then
        // shard k + 1, ...): concurrent writes then go to different files
        // instead of queueing on one file's inode lock.
        let mut reqs = Vec::new();
        let mut owner = Vec::new(); // request -> pending index
        let mut iters: Vec<(usize, std::vec::IntoIter<IoRequest>)> = per_block
            .into_iter()
            .map(|(i, v)| (i, v.into_iter()))
            .collect();
        loop {
            let before = reqs.len();
            for (i, it) in iters.iter_mut() {
                if let Some(r) = it.next() {
                    reqs.push(r);
                    owner.push(*i);
                }
            }
            if reqs.len() == before {
                break;
            }
        }
        // Every write must succeed; the first error of a block wins.
        for (t, &i) in self.engine.submit(reqs).into_iter().zip(&owner) {
            if let Err(e) = t.wait_blocking().result {
                pending[i].err.get_or_insert(e.into());
            }
        }
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
        for (t, i) in self.engine.submit(reqs).into_iter().zip(idx) {
            if let Err(e) = t.wait_blocking().result {
                pending[i].err.get_or_insert(e.into());
            }
        }
        let mut dirs: Vec<PathBuf> = Vec::new();
        for p in pending.iter_mut().filter(|p| p.err.is_none()) {
            p.file = None;
            let dst = self.path_of(&p.id);
            let parent = dst.parent().unwrap_or(&self.cfg.dir).to_path_buf();
            let moved = mkdir(&parent)
                .and_then(|_| fs::rename(&p.tmp, &dst).map_err(StoreError::fs("rename", &dst)));
            match moved {
                Ok(()) if !dirs.contains(&parent) => dirs.push(parent),
                Ok(()) => {}
                Err(e) => p.err = Some(e),
            }
        }
        for d in &dirs {
            if let Err(e) = fs::File::open(d).and_then(|f| f.sync_all()) {
                // The files are complete and valid; their durability is not.
                for p in pending.iter_mut().filter(|p| p.err.is_none()) {
                    if self.path_of(&p.id).parent() == Some(d.as_path()) {
                        p.err = Some(StoreError::fs("fsync directory", d)(std::io::Error::new(
                            e.kind(),
                            e.to_string(),
                        )));
                    }
                }
            }
        }
        pending
            .into_iter()
            .map(|p| {
                let r = match p.err {
                    None => {
                        self.stats.blocks_written.fetch_add(1, Ordering::Relaxed);
                        Ok(())
                    }
                    Some(e) => {
                        let _ = fs::remove_file(&p.tmp);
                        self.stats.write_failures.fetch_add(1, Ordering::Relaxed);
                        log::warn!("block {} not written: {e}", hex(&p.id));
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
        self.stats.corrupt_shards.fetch_add(1, Ordering::Relaxed);
        log::warn!(
            "block {} failed its {what} check: treated as a miss and removed",
            hex(id)
        );
        let _ = fs::remove_file(path);
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
            if let Ok(f) = fs::File::open(&path) {
                if f.set_modified(SystemTime::now()).is_ok() {
                    seen.insert(*id, now);
                }
            }
        }
    }

    /// Every block file with its mtime (a global walk of `blocks/`).
    fn gather(&self) -> Vec<(SystemTime, PathBuf)> {
        let mut out = Vec::new();
        let walk = |p: &Path| fs::read_dir(p).into_iter().flatten().flatten();
        for a in walk(&self.cfg.dir.join("blocks")) {
            for b in walk(&a.path()) {
                for f in walk(&b.path()) {
                    let p = f.path();
                    if p.extension().is_some_and(|e| e == "blk") {
                        if let Ok(m) = f.metadata().and_then(|m| m.modified()) {
                            out.push((m, p));
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
        self.gather()
            .into_iter()
            .filter_map(|(_, p)| {
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
        let mut deleted = 0;
        for (_, p) in self.gather() {
            if fs::remove_file(&p).is_ok() {
                deleted += 1;
            }
        }
        self.stats.gc_deleted.fetch_add(deleted, Ordering::Relaxed);
        deleted
    }

    /// One GC pass: when more than the high watermark of blocks exist,
    /// deletes the oldest (by mtime) until the low watermark remains.
    pub fn gc(&self) -> GcReport {
        let _one = self.gc_lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut files = self.gather();
        let found = files.len() as u64;
        if found <= self.cfg.high_watermark {
            return GcReport { found, deleted: 0 };
        }
        let k = (found - self.cfg.low_watermark) as usize;
        if k < files.len() {
            files.select_nth_unstable_by_key(k, |(t, _)| *t);
        }
        let mut deleted = 0;
        for (_, p) in files.iter().take(k) {
            // A file already gone (another GC, another machine) is fine.
            if fs::remove_file(p).is_ok() {
                deleted += 1;
            }
        }
        self.stats.gc_deleted.fetch_add(deleted, Ordering::Relaxed);
        GcReport { found, deleted }
    }
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

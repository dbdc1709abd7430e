//! `ClockPool`: the memory tier. Fixed slots of one shard each, shareable
//! by several rank processes through POSIX shared memory.
//!
//! **Addressing.** A `(block id, shard)` key hashes to a bucket of `ways`
//! slots and lives in one of them (a set-associative, content-addressed
//! pool: data never moves). `data_at(i) = data_offset + i * shard_bytes`.
//!
//! **Slot state.** One atomic control word per slot packs the state
//! (EMPTY / LOADING / READY / FAILED) and the reference count, so a reader
//! never sees the two half-updated; an error code sits beside it. A slot
//! with references is never a victim; a FAILED slot is taken over once its
//! references are gone.
//!
//! **Hits take no lock**: a CAS adds a reference to a READY slot, the key is
//! re-checked under that reference, and the access bit is set. **Misses**
//! take the bucket's claim lock (a word in shared memory; a dead holder's
//! lock is stolen), look again, and claim a victim by **CLOCK** over the
//! bucket: from the bucket's hand, a set access bit is cleared (second
//! chance) and the first clear, unreferenced slot is taken. The claimant
//! owns the load; others for the same key sleep on a **futex** over the
//! slot's version word (recorded before sleeping, so no wake-up is lost),
//! with a timeout: if the owner died they take the load over.
//!
//! Red line: the pool knows keys, slots and bytes; never what a block means.

use crate::sync::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use memmap2::MmapRaw;
use std::ptr::NonNull;
use ucm_device::IoBuf;

use crate::error::{bad_value, ConfigError, Result, StoreError};
use crate::geometry::BlockId;

use crate::slot::{self, state_of, Claim, EMPTY, FAILED, LOADING, READY, REFS};

const MAGIC: [u8; 8] = *b"UCMPOOL1";
const VERSION: u32 = 3;
const HEADER_BYTES: usize = 4096;
const BUCKET_BYTES: usize = 8;
const META_BYTES: usize = 64;

/// Per-slot metadata in the mapping (one cache line).
#[repr(C, align(64))]
struct SlotMeta {
    ctl: AtomicU32,
    version: AtomicU32,
    access: AtomicU32,
    err: AtomicI32,
    owner: AtomicU32,
    shard: AtomicU32,
    key_lo: AtomicU64,
    key_hi: AtomicU64,
    claimed_ms: AtomicU64,
    /// Dumped but not yet on disk: CLOCK passes it over until it is clean
    /// or older than the dirty timeout.
    dirty: AtomicU32,
    /// 1 while the slot is held at low priority ([`SlotRef::cool`]) and
    /// counted in [`Header::low_slots`].
    low: AtomicU32,
}

/// Per-bucket claim lock (holder pid, 0 when free) and CLOCK hand.
#[repr(C)]
struct Bucket {
    lock: AtomicU32,
    hand: AtomicU32,
}

#[repr(C)]
struct Header {
    magic: [u8; 8],
    version: u32,
    ready: AtomicU32,
    shard_bytes: u64,
    slots: u64,
    ways: u64,
    creator: u32,
    /// Slots held at low priority now (every process's).
    low_slots: AtomicU64,
    /// The speculative share ([`ClockPool::set_speculative_share`]), in
    /// millionths of the slots; shared by every process of the pool.
    share_ppm: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<SlotMeta>() == META_BYTES);
const _: () = assert!(std::mem::size_of::<Bucket>() == BUCKET_BYTES);

/// Where the pool lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolMode {
    /// Private to this process (one rank).
    Private,
    /// In POSIX shared memory `/dev/shm/ucm-<uid>-<instance>`, shared by
    /// every process that opens the same instance with the same geometry.
    Shared {
        /// The instance id (letters, digits, `-`, `_`).
        instance: String,
    },
}

/// How a pool is built.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Bytes per slot (one shard); a multiple of 4 KiB.
    pub shard_bytes: usize,
    /// Number of slots (capacity / shard size).
    pub slots: usize,
    /// Slots per bucket: a key can live in one of them. `slots` when the
    /// whole pool is one CLOCK.
    pub ways: usize,
    /// Private or shared.
    pub mode: PoolMode,
    /// How long a waiter trusts a loading owner before checking that it is
    /// alive and taking the load over.
    pub load_timeout: Duration,
    /// How long a dirty slot (dumped, not yet on disk) is protected from
    /// eviction while the rest of its block is awaited.
    pub dirty_timeout: Duration,
}

/// A `(block, shard)` key.
pub type Key = (BlockId, u32);

fn hash(key: &Key) -> u64 {
    // Block ids are md5 digests already; a multiply-xorshift mix of the
    // two halves and the shard spreads structured ids (tests) as well.
    let lo = u64::from_le_bytes(key.0[..8].try_into().unwrap_or([0; 8]));
    let hi = u64::from_le_bytes(key.0[8..].try_into().unwrap_or([0; 8]));
    let mut h = (lo ^ 0x9e37_79b9_7f4a_7c15).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ hi ^ (h >> 31)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h = (h ^ u64::from(key.1) ^ (h >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^ (h >> 32)
}

/// A slot's fingerprint: one byte of the key's hash (never 0, which marks
/// a slot never claimed). Kept per slot beside the metadata so that a
/// lookup reads one byte per way (8 per word) and checks the metadata of
/// the few slots whose fingerprint matches, instead of every way's.
fn fingerprint(h: u64) -> u8 {
    ((h.rotate_left(17) >> 56) as u8) | 1
}

/// Hint entries per slot: a direct-mapped table from a key's hash to the
/// slot that last held it (0 = none), checked before any scan.
const HINTS_PER_SLOT: usize = 4;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn my_pid() -> u32 {
    std::process::id()
}

/// True when process `pid` exists and is not a zombie (a killed owner
/// whose parent has not reaped it yet is dead for our purposes).
fn alive(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks that the process exists.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    // /proc/<pid>/stat: "pid (comm) S ..."; the state follows the last ')'.
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_none_or(|state| state != 'Z' && state != 'X'),
        Err(_) => rc == 0,
    }
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned u32 (in shared memory when shared:
    // hence FUTEX_WAIT without the private flag); the kernel only reads it.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: as in `futex_wait`; waking has no memory effects.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// The memory tier.
pub struct ClockPool {
    map: MmapRaw,
    cfg: PoolConfig,
    buckets: usize,
    meta_off: usize,
    fp_off: usize,
    hint_off: usize,
    data_off: usize,
    path: Option<PathBuf>,
}

/// The outcome of [`ClockPool::acquire`].
pub enum Acquire<'a> {
    /// The shard is in the pool; it stays pinned while the guard lives.
    Hit(SlotRef<'a>),
    /// The caller owns the load: fill the slot, then `complete` (or `fail`).
    Load(LoadGuard<'a>),
    /// The load of this shard failed with this code (owner's report).
    Failed(i32),
}

/// A pinned READY slot.
pub struct SlotRef<'a> {
    pool: &'a ClockPool,
    slot: usize,
}

/// The owner's hold on a LOADING slot.
pub struct LoadGuard<'a> {
    pool: &'a ClockPool,
    slot: usize,
    done: bool,
}

impl ClockPool {
    /// Creates the pool, or attaches to a shared one and validates it.
    pub fn open(cfg: PoolConfig) -> Result<Self> {
        if cfg.shard_bytes == 0 || cfg.shard_bytes % 4096 != 0 {
            return Err(bad_value(
                "pool slot size",
                cfg.shard_bytes,
                "a positive multiple of 4096",
            ));
        }
        if cfg.slots == 0 || cfg.ways == 0 || cfg.slots % cfg.ways != 0 || cfg.slots > REFS as usize
        {
            return Err(bad_value(
                "pool slots and ways",
                format!("{} and {}", cfg.slots, cfg.ways),
                "both positive, slots a multiple of ways",
            ));
        }
        let buckets = cfg.slots / cfg.ways;
        let meta_off = HEADER_BYTES + (buckets * BUCKET_BYTES).div_ceil(META_BYTES) * META_BYTES;
        let fp_off = meta_off + cfg.slots * META_BYTES;
        let hint_off = (fp_off + cfg.slots.div_ceil(8) * 8).div_ceil(64) * 64;
        let data_off = (hint_off + cfg.slots * HINTS_PER_SLOT * 4).div_ceil(4096) * 4096;
        let total = cfg
            .slots
            .checked_mul(cfg.shard_bytes)
            .and_then(|d| d.checked_add(data_off))
            .ok_or_else(|| {
                bad_value(
                    "pool size",
                    format!("{} slots of {} bytes", cfg.slots, cfg.shard_bytes),
                    "within the address space",
                )
            })?;
        let (map, path, created) = match &cfg.mode {
            PoolMode::Private => {
                let map = MmapRaw::from(
                    memmap2::MmapOptions::new()
                        .len(total)
                        .populate()
                        .map_anon()
                        .map_err(StoreError::fs("map anonymous pool", "<anonymous>"))?,
                );
                (map, None, true)
            }
            PoolMode::Shared { instance } => {
                let (map, path, created) = Self::map_shared(instance, total)?;
                (map, Some(path), created)
            }
        };
        let pool = ClockPool {
            map,
            cfg,
            buckets,
            meta_off,
            fp_off,
            hint_off,
            data_off,
            path,
        };
        if created {
            pool.init_header();
        } else {
            pool.validate_header()?;
        }
        Ok(pool)
    }

    fn map_shared(instance: &str, total: usize) -> Result<(MmapRaw, PathBuf, bool)> {
        if instance.is_empty()
            || !instance
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(bad_value(
                "pool instance",
                format!("{:?}", crate::paths::short(instance)),
                "letters, digits, '-' and '_'",
            ));
        }
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        let path = PathBuf::from(format!("/dev/shm/ucm-{uid}-{instance}"));
        let created_file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path);
        let (file, created) = match created_file {
            Ok(f) => {
                let free = shm_free_bytes();
                if free.is_some_and(|free| free < total as u64) {
                    let _ = fs::remove_file(&path);
                    return Err(StoreError::Config(ConfigError::ShmFull {
                        free_mib: free.unwrap_or(0) >> 20,
                        needed_mib: total as u64 >> 20,
                    }));
                }
                f.set_len(total as u64)
                    .map_err(StoreError::fs("size shared pool", &path))?;
                (f, true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let f = fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .map_err(StoreError::fs("open shared pool", &path))?;
                // The creator sizes the file right after creating it.
                let deadline = Instant::now() + Duration::from_secs(5);
                loop {
                    let len = f
                        .metadata()
                        .map_err(StoreError::fs("stat shared pool", &path))?
                        .len();
                    if len == total as u64 {
                        break;
                    }
                    if len != 0 || Instant::now() > deadline {
                        return Err(StoreError::Config(ConfigError::SegmentSize {
                            path,
                            len,
                            needed: total as u64,
                        }));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                (f, false)
            }
            Err(e) => return Err(StoreError::fs("create shared pool", &path)(e)),
        };
        // Populated up front: first-touch page faults stay off the data path.
        let map = memmap2::MmapOptions::new()
            .populate()
            .map_raw(&file)
            .map_err(StoreError::fs("map shared pool", &path))?;
        Ok((map, path, created))
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping is at least HEADER_BYTES long, page-aligned,
        // and lives as long as `self`; Header is plain data and atomics.
        unsafe { &*(self.map.as_ptr() as *const Header) }
    }

    fn init_header(&self) {
        // SAFETY: the creator is the only one touching the header until
        // `ready` is published below; the mapping is writable.
        unsafe {
            let h = self.map.as_mut_ptr() as *mut Header;
            (*h).magic = MAGIC;
            (*h).version = VERSION;
            (*h).shard_bytes = self.cfg.shard_bytes as u64;
            (*h).slots = self.cfg.slots as u64;
            (*h).ways = self.cfg.ways as u64;
            (*h).creator = my_pid();
        }
        // Slots and buckets start zeroed (EMPTY, no refs, unlocked).
        self.header().ready.store(1, Ordering::Release);
    }

    fn validate_header(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.header().ready.load(Ordering::Acquire) != 1 {
            if Instant::now() > deadline {
                return Err(StoreError::Config(ConfigError::SegmentNotReady {
                    path: self.path.clone().unwrap_or_default(),
                }));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let h = self.header();
        if h.magic == MAGIC && h.version != VERSION {
            return Err(StoreError::Config(ConfigError::PoolVersion {
                path: self.path.clone().unwrap_or_default(),
                found: h.version,
                wanted: VERSION,
            }));
        }
        let ok = h.magic == MAGIC
            && h.version == VERSION
            && h.shard_bytes == self.cfg.shard_bytes as u64
            && h.slots == self.cfg.slots as u64
            && h.ways == self.cfg.ways as u64;
        if ok {
            Ok(())
        } else {
            Err(StoreError::Config(ConfigError::PoolGeometry {
                path: self.path.clone().unwrap_or_default(),
                found: format!(
                    "slot {} B x {} in ways of {}",
                    h.shard_bytes, h.slots, h.ways
                ),
                wanted: format!(
                    "slot {} B x {} in ways of {}",
                    self.cfg.shard_bytes, self.cfg.slots, self.cfg.ways
                ),
            }))
        }
    }

    fn bucket(&self, b: usize) -> &Bucket {
        // SAFETY: `b < buckets`; the bucket array lies inside the mapping
        // right after the header, 8-byte aligned, zero-initialised.
        unsafe { &*(self.map.as_ptr().add(HEADER_BYTES + b * BUCKET_BYTES) as *const Bucket) }
    }

    fn meta(&self, slot: usize) -> &SlotMeta {
        // SAFETY: `slot < slots`; metadata lies inside the mapping at a
        // 64-byte aligned offset, zero-initialised.
        unsafe { &*(self.map.as_ptr().add(self.meta_off + slot * META_BYTES) as *const SlotMeta) }
    }

    fn fp_word(&self, word: usize) -> &AtomicU64 {
        // SAFETY: `word < slots.div_ceil(8)`; the fingerprint area lies
        // inside the mapping at a 64-byte aligned offset, zero-initialised.
        unsafe { &*(self.map.as_ptr().add(self.fp_off + word * 8) as *const AtomicU64) }
    }

    /// Sets slot `slot`'s fingerprint (under its bucket's lock).
    fn set_fingerprint(&self, slot: usize, fp: u8) {
        let shift = (slot % 8) * 8;
        let w = self.fp_word(slot / 8);
        let _ = w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
            Some((v & !(0xff << shift)) | (u64::from(fp) << shift))
        });
    }

    fn hint(&self, h: u64) -> &AtomicU32 {
        let i = (h.rotate_left(32) % (self.cfg.slots * HINTS_PER_SLOT) as u64) as usize;
        // SAFETY: `i < slots * HINTS_PER_SLOT`; the hint area lies inside
        // the mapping at a 64-byte aligned offset, zero-initialised.
        unsafe { &*(self.map.as_ptr().add(self.hint_off + i * 4) as *const AtomicU32) }
    }

    /// The slot the hint table names for hash `h`, if it lies in `key`'s
    /// bucket (a hint is only a place to look first: the caller checks
    /// the slot's state and key).
    fn hinted(&self, h: u64) -> Option<usize> {
        let s = self.hint(h).load(Ordering::Acquire).checked_sub(1)? as usize;
        let (_, ways) = self.ways_at(h);
        ways.contains(&s).then_some(s)
    }

    /// The ways of `key`'s bucket whose fingerprint matches `key`'s: the
    /// only slots that may hold it (the caller checks their metadata).
    fn candidates(&self, h: u64) -> impl Iterator<Item = usize> + '_ {
        let (_, ways) = self.ways_at(h);
        let (lo, hi) = (ways.start, ways.end);
        let pattern = u64::from(fingerprint(h)) * 0x0101_0101_0101_0101;
        let words = lo / 8..hi.div_ceil(8);
        words.flat_map(move |w| {
            let x = self.fp_word(w).load(Ordering::Acquire) ^ pattern;
            // High bit of each zero byte of `x` (a matching lane); a lane
            // above a match may be flagged too, which the metadata check
            // rejects.
            let mut m = x.wrapping_sub(0x0101_0101_0101_0101) & !x & 0x8080_8080_8080_8080;
            std::iter::from_fn(move || {
                if m == 0 {
                    return None;
                }
                let lane = m.trailing_zeros() as usize / 8;
                m &= m - 1;
                Some(w * 8 + lane)
            })
            .filter(move |&s| s >= lo && s < hi)
        })
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.cfg.slots
    }

    /// Bytes per slot.
    pub fn slot_bytes(&self) -> usize {
        self.cfg.shard_bytes
    }

    /// Offset of slot `slot`'s data in the data area ([`ClockPool::data_region`]).
    pub fn data_at(&self, slot: usize) -> usize {
        slot * self.cfg.shard_bytes
    }

    /// Base address and length of the data area, to register with a
    /// device (`Device::register_host`) so slots are DMA-able.
    pub fn data_region(&self) -> (*mut u8, usize) {
        // SAFETY: `data_off` lies inside the mapping.
        let p = unsafe { self.map.as_mut_ptr().add(self.data_off) };
        (p, self.cfg.slots * self.cfg.shard_bytes)
    }

    /// Registers the data area with `dev` (pinned, DMA-able) and returns it
    /// as one region; slot `i` is at offset [`ClockPool::data_at`]`(i)`.
    /// The returned handle must be dropped before the pool.
    pub fn register<D: ucm_device::Device>(&self, dev: &D) -> Result<ucm_device::Memory> {
        let (base, len) = self.data_region();
        // SAFETY: the data area is mapped, writable, for the pool's lifetime;
        // the caller drops the handle before the pool (documented above).
        Ok(unsafe { dev.register_host(base, len) }?)
    }

    /// The shared-memory file, if shared.
    pub fn shm_path(&self) -> Option<&std::path::Path> {
        self.path.as_deref()
    }

    fn key_matches(&self, m: &SlotMeta, key: &Key) -> bool {
        m.key_lo.load(Ordering::Acquire)
            == u64::from_le_bytes(key.0[..8].try_into().unwrap_or([0; 8]))
            && m.key_hi.load(Ordering::Acquire)
                == u64::from_le_bytes(key.0[8..].try_into().unwrap_or([0; 8]))
            && m.shard.load(Ordering::Acquire) == key.1
    }

    fn ways_of(&self, key: &Key) -> (usize, std::ops::Range<usize>) {
        self.ways_at(hash(key))
    }

    /// The bucket and ways of a key whose hash is `h`.
    fn ways_at(&self, h: u64) -> (usize, std::ops::Range<usize>) {
        let b = (h % self.buckets as u64) as usize;
        (b, b * self.cfg.ways..(b + 1) * self.cfg.ways)
    }

    /// Pins `slot` if it is READY with `key`. Lock-free.
    fn try_pin(&self, slot: usize, key: &Key) -> Option<SlotRef<'_>> {
        let m = self.meta(slot);
        if !slot::try_pin(&m.ctl, &m.access, || self.key_matches(m, key)) {
            return None;
        }
        // A use: the slot is normal again.
        self.clear_low(m);
        Some(SlotRef { pool: self, slot })
    }

    /// Marks `m`'s slot low priority (counted once).
    fn mark_low(&self, m: &SlotMeta) {
        if m.low.swap(1, Ordering::AcqRel) == 0 {
            self.header().low_slots.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Makes `m`'s slot normal priority (uncounted once).
    fn clear_low(&self, m: &SlotMeta) {
        if m.low.load(Ordering::Relaxed) != 0 && m.low.swap(0, Ordering::AcqRel) != 0 {
            self.header().low_slots.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Sets the speculative share: the fraction of the slots that slots
    /// held at low priority ([`SlotRef::cool`]) may fill before they are
    /// evicted first. Within it, CLOCK evicts normal slots and passes low
    /// ones over (unless a bucket holds nothing else); beyond it, a bucket
    /// gives up a low slot before any normal one. 0 (the default): low
    /// slots always go first; 1: normal slots do, while a bucket has any.
    /// Clamped to 0-1; one value for every process of a shared pool.
    pub fn set_speculative_share(&self, share: f64) {
        let ppm = (share.clamp(0.0, 1.0) * 1e6).round() as u32;
        self.header().share_ppm.store(ppm, Ordering::Relaxed);
    }

    /// The speculative share ([`ClockPool::set_speculative_share`]).
    pub fn speculative_share(&self) -> f64 {
        f64::from(self.header().share_ppm.load(Ordering::Relaxed)) / 1e6
    }

    /// Slots held at low priority now.
    pub fn low_slots(&self) -> u64 {
        self.header().low_slots.load(Ordering::Acquire)
    }

    /// Whether low-priority slots hold more than their share.
    fn low_over_share(&self) -> bool {
        let ppm = u128::from(self.header().share_ppm.load(Ordering::Relaxed));
        let keep = (self.cfg.slots as u128 * ppm / 1_000_000) as u64;
        self.low_slots() > keep
    }

    fn unpin(&self, slot: usize) {
        slot::unpin(&self.meta(slot).ctl);
    }

    /// True when `key` is READY in the pool (no pin, no lock). Reads the
    /// bucket's fingerprints, then the metadata of the matching slots only.
    /// A key being claimed this instant may read as absent: a miss.
    pub fn contains(&self, key: &Key) -> bool {
        let ready = |s: usize| {
            let m = self.meta(s);
            state_of(m.ctl.load(Ordering::Acquire)) == READY && self.key_matches(m, key)
        };
        let h = hash(key);
        if self.hinted(h).is_some_and(ready) {
            return true;
        }
        match self.candidates(h).find(|&s| ready(s)) {
            Some(s) => {
                self.hint(h).store(s as u32 + 1, Ordering::Release);
                true
            }
            None => false,
        }
    }

    /// A hotness pulse: sets the access bit of `key`'s slot. Never a pin.
    pub fn touch(&self, key: &Key) {
        for s in self.candidates(hash(key)) {
            let m = self.meta(s);
            if state_of(m.ctl.load(Ordering::Acquire)) == READY && self.key_matches(m, key) {
                m.access.store(1, Ordering::Relaxed);
                self.clear_low(m);
            }
        }
    }

    /// The opposite of [`ClockPool::touch`]: holds `key`'s slot at low
    /// priority (see [`SlotRef::cool`]). A later use makes it normal
    /// again. Never an eviction by itself.
    pub fn cool(&self, key: &Key) {
        for s in self.candidates(hash(key)) {
            let m = self.meta(s);
            if state_of(m.ctl.load(Ordering::Acquire)) == READY && self.key_matches(m, key) {
                m.access.store(0, Ordering::Relaxed);
                self.mark_low(m);
            }
        }
    }

    fn lock_bucket(&self, b: usize) {
        let lock = &self.bucket(b).lock;
        let me = my_pid();
        let mut spins = 0u32;
        loop {
            match lock.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return,
                Err(holder) => {
                    spins += 1;
                    if spins % 1024 == 0 && !alive(holder) {
                        // The holder died inside the (short) claim section.
                        let _ =
                            lock.compare_exchange(holder, 0, Ordering::AcqRel, Ordering::Relaxed);
                    }
                    std::thread::yield_now();
                }
            }
        }
    }

    fn unlock_bucket(&self, b: usize) {
        self.bucket(b).lock.store(0, Ordering::Release);
    }

    /// Pins `key` if present, else makes the caller the owner of its load;
    /// a concurrent load of the same key is waited for (futex), and taken
    /// over if its owner died. `Ok(None)` when every slot of the bucket is
    /// pinned or loading (the caller treats it as a miss it cannot cache).
    pub fn acquire(&self, key: Key) -> Result<Option<Acquire<'_>>> {
        let (b, ways) = self.ways_of(&key);
        loop {
            // 1. Lock-free hit (the hinted slot, then the slots whose
            // fingerprint matches; a miss here is checked again in full
            // under the lock below).
            let h = hash(&key);
            for s in self.hinted(h).into_iter().chain(self.candidates(h)) {
                if let Some(r) = self.try_pin(s, &key) {
                    return Ok(Some(Acquire::Hit(r)));
                }
            }
            // 2. Someone is loading it: wait.
            if let Some(s) = ways.clone().find(|&s| {
                let m = self.meta(s);
                state_of(m.ctl.load(Ordering::Acquire)) == LOADING && self.key_matches(m, &key)
            }) {
                if let Some(outcome) = self.wait_for(s, &key)? {
                    return Ok(Some(outcome));
                }
                continue;
            }
            // 3. Claim under the bucket lock.
            self.lock_bucket(b);
            let again = ways.clone().any(|s| {
                let m = self.meta(s);
                matches!(state_of(m.ctl.load(Ordering::Acquire)), READY | LOADING)
                    && self.key_matches(m, &key)
            });
            if again {
                self.unlock_bucket(b);
                continue;
            }
            let victim = self.clock_victim(b);
            let Some(slot) = victim else {
                self.unlock_bucket(b);
                return Ok(None);
            };
            let m = self.meta(slot);
            m.key_lo.store(
                u64::from_le_bytes(key.0[..8].try_into().unwrap_or([0; 8])),
                Ordering::Release,
            );
            m.key_hi.store(
                u64::from_le_bytes(key.0[8..].try_into().unwrap_or([0; 8])),
                Ordering::Release,
            );
            m.shard.store(key.1, Ordering::Release);
            let h = hash(&key);
            self.set_fingerprint(slot, fingerprint(h));
            self.hint(h).store(slot as u32 + 1, Ordering::Release);
            m.owner.store(my_pid(), Ordering::Release);
            m.claimed_ms.store(now_ms(), Ordering::Release);
            m.err.store(0, Ordering::Release);
            m.version.fetch_add(1, Ordering::AcqRel);
            self.unlock_bucket(b);
            return Ok(Some(Acquire::Load(LoadGuard {
                pool: self,
                slot,
                done: false,
            })));
        }
    }

    /// A victim in bucket `b`, moved to LOADING with one reference. Called
    /// under the bucket lock. Slots held at low priority beyond their share
    /// go first, with no second chance; then CLOCK over the normal slots:
    /// a set access bit is cleared (second chance) and the first clear,
    /// unreferenced, non-loading slot is taken; low slots within their
    /// share are passed over, and taken only when nothing else is free.
    fn clock_victim(&self, b: usize) -> Option<usize> {
        let ways = self.cfg.ways;
        let base = b * ways;
        let hand = &self.bucket(b).hand;
        if self.low_over_share() {
            if let Some(s) = self.claim_low(base, hand.load(Ordering::Relaxed) as usize) {
                return Some(s);
            }
        }
        for _ in 0..2 * ways + 1 {
            let i = hand.fetch_add(1, Ordering::Relaxed) as usize % ways;
            let m = self.meta(base + i);
            if self.dirty_recent(m) || m.low.load(Ordering::Acquire) != 0 {
                continue; // not on disk yet, or kept within its share
            }
            if slot::try_claim(&m.ctl, &m.access) == Claim::Claimed {
                self.clear_low(m);
                return Some(base + i);
            }
        }
        self.claim_low(base, hand.load(Ordering::Relaxed) as usize)
    }

    /// Claims the first free low-priority slot of the bucket at `base`,
    /// looking from way `from` on.
    fn claim_low(&self, base: usize, from: usize) -> Option<usize> {
        let ways = self.cfg.ways;
        (0..ways).map(|j| base + (from + j) % ways).find(|&s| {
            let m = self.meta(s);
            let claimed = m.low.load(Ordering::Acquire) != 0
                && !self.dirty_recent(m)
                && slot::try_claim(&m.ctl, &m.access) == Claim::Claimed;
            if claimed {
                self.clear_low(m);
            }
            claimed
        })
    }

    /// Dumped, not on disk yet, and within the dirty timeout: no victim.
    fn dirty_recent(&self, m: &SlotMeta) -> bool {
        m.dirty.load(Ordering::Acquire) != 0
            && now_ms().saturating_sub(m.claimed_ms.load(Ordering::Acquire))
                < self.cfg.dirty_timeout.as_millis() as u64
    }

    /// Waits for the load of `key` in `slot`. `Ok(None)`: look again.
    fn wait_for(&self, slot: usize, key: &Key) -> Result<Option<Acquire<'_>>> {
        let m = self.meta(slot);
        let start = Instant::now();
        loop {
            // Record the version before checking, so a wake-up between the
            // check and the sleep is not lost.
            let v = m.version.load(Ordering::Acquire);
            let c = m.ctl.load(Ordering::Acquire);
            if !self.key_matches(m, key) {
                return Ok(None);
            }
            match state_of(c) {
                READY => return Ok(None), // the hit path pins it
                FAILED => return Ok(Some(Acquire::Failed(m.err.load(Ordering::Acquire)))),
                LOADING => {}
                EMPTY => return Ok(None),
                _ => return Ok(None),
            }
            let owner = m.owner.load(Ordering::Acquire);
            if start.elapsed() >= self.cfg.load_timeout && !alive(owner) {
                // Take the load over: one waiter wins the owner word; the
                // dead owner's reference becomes ours.
                if slot::take_over(&m.owner, owner, my_pid()) {
                    log::warn!("pool slot {slot}: owner {owner} died mid-load; taking over");
                    m.claimed_ms.store(now_ms(), Ordering::Release);
                    return Ok(Some(Acquire::Load(LoadGuard {
                        pool: self,
                        slot,
                        done: false,
                    })));
                }
                continue;
            }
            futex_wait(
                &m.version,
                v,
                Duration::from_millis(50).min(self.cfg.load_timeout),
            );
        }
    }

    /// Ends a load: LOADING -> `state`, dropping the owner's reference
    /// unless `keep_ref`, then wakes every waiter.
    fn publish(&self, slot: usize, state: u32, err: i32, keep_ref: bool) {
        let m = self.meta(slot);
        m.err.store(err, Ordering::Release);
        slot::publish(&m.ctl, &m.access, &m.version, state, keep_ref);
        futex_wake_all(&m.version);
    }

    /// Removes this pool's shared-memory file (the mapping stays valid for
    /// processes that have it). For tests and for cleaning stale segments.
    pub fn unlink(&self) -> Result<()> {
        match &self.path {
            Some(p) => fs::remove_file(p).map_err(StoreError::fs("unlink shared pool", p)),
            None => Ok(()),
        }
    }
}

fn shm_free_bytes() -> Option<u64> {
    // SAFETY: statvfs writes into the zeroed struct; the path is a valid C string.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c"/dev/shm".as_ptr(), &mut st) == 0 {
            Some(st.f_bavail as u64 * st.f_frsize as u64)
        } else {
            None
        }
    }
}

impl SlotRef<'_> {
    /// The slot index.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Holds the slot at low priority until a use (a pin, a touch) makes
    /// it normal again: its access bit is cleared (no second chance) and it
    /// counts against the speculative share
    /// ([`ClockPool::set_speculative_share`]), beyond which such slots are
    /// evicted before any normal one.
    pub fn cool(&self) {
        let m = self.pool.meta(self.slot);
        m.access.store(0, Ordering::Relaxed);
        self.pool.mark_low(m);
    }

    /// An I/O buffer over the slot, for a disk write straight from the pool.
    /// The buffer must be dropped (its write finished) before this pin.
    pub fn io_buf(&self) -> IoBuf {
        let data = self.data();
        let p = NonNull::from(data).cast::<u8>();
        // SAFETY: the slot is pinned READY while `self` lives and the caller
        // finishes the write first; a write only reads the buffer.
        unsafe { IoBuf::external(p, data.len()) }.unwrap_or_else(|_| IoBuf::from_slice(data))
    }

    /// Marks the slot dumped-but-not-on-disk (`true`) or clean (`false`).
    pub fn set_dirty(&self, dirty: bool) {
        let m = self.pool.meta(self.slot);
        if dirty {
            m.claimed_ms.store(now_ms(), Ordering::Release);
        }
        m.dirty.store(u32::from(dirty), Ordering::Release);
    }

    /// The slot's bytes.
    pub fn data(&self) -> &[u8] {
        let (base, _) = self.pool.data_region();
        // SAFETY: the slot is pinned READY: nobody writes it until the pin
        // goes; the range lies in the data area.
        unsafe {
            std::slice::from_raw_parts(
                base.add(self.pool.data_at(self.slot)),
                self.pool.cfg.shard_bytes,
            )
        }
    }
}

impl Drop for SlotRef<'_> {
    fn drop(&mut self) {
        self.pool.unpin(self.slot);
    }
}

impl<'a> LoadGuard<'a> {
    /// The slot index.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The slot's bytes, to fill.
    pub fn data_mut(&mut self) -> &mut [u8] {
        let (base, _) = self.pool.data_region();
        // SAFETY: the owner of a LOADING slot is its only writer; readers
        // wait for READY.
        unsafe {
            std::slice::from_raw_parts_mut(
                base.add(self.pool.data_at(self.slot)),
                self.pool.cfg.shard_bytes,
            )
        }
    }

    /// An I/O buffer over the slot, to read from disk straight into it. The
    /// read must finish before the guard completes or fails.
    pub fn io_buf(&mut self) -> IoBuf {
        let data = self.data_mut();
        let len = data.len();
        let p = NonNull::from(data).cast::<u8>();
        // SAFETY: the slot is LOADING and this guard is its only writer; the
        // caller finishes the read before completing or failing the guard.
        unsafe { IoBuf::external(p, len) }.unwrap_or_else(|_| IoBuf::new(len))
    }

    /// Publishes the slot as READY, wakes the waiters, and keeps the
    /// owner's reference as a pin.
    pub fn complete(mut self) -> SlotRef<'a> {
        self.done = true;
        self.pool.publish(self.slot, READY, 0, true);
        SlotRef {
            pool: self.pool,
            slot: self.slot,
        }
    }

    /// Publishes the load as FAILED with `code` and wakes the waiters.
    pub fn fail(mut self, code: i32) {
        self.done = true;
        self.pool.publish(self.slot, FAILED, code, false);
    }
}

impl Drop for LoadGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            // Abandoned (error path or unwinding): never leave waiters hanging.
            self.pool.publish(self.slot, FAILED, libc::ECANCELED, false);
        }
    }
}

/// The order in which rank `device_id` of `ranks` visits `n` items: start
/// at `device_id % ranks`, stride `ranks`, then the next residue, so ranks
/// sharing a pool do not all contend for the same slot at once. Rotation
/// changes order, never ownership.
pub fn rank_order(device_id: usize, ranks: usize, n: usize) -> Vec<usize> {
    let ranks = ranks.max(1);
    let start = device_id % ranks;
    (0..ranks)
        .flat_map(|r| ((start + r) % ranks..n).step_by(ranks))
        .collect()
}

// SAFETY: the mapping is shared memory accessed only through atomics and
// pinned/owned slots (see the module docs); the raw pointer is stable.
unsafe impl Send for ClockPool {}
// SAFETY: as above.
unsafe impl Sync for ClockPool {}

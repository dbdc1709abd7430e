//! The C ABI: opaque handles for a spec table, a cache, its scheduler side,
//! its worker side and a step's metadata, mirroring the adapter.
//!
//! Every function returns a status code (`UCM_OK` or one of `UCM_ERR_*`);
//! on an error, `ucm_last_error()` describes it until the next call on the
//! same thread. No panic crosses the boundary: each body runs under
//! `catch_unwind` and a caught panic is `UCM_ERR_PANIC`. Every pointer and
//! length is checked before use: NULL, a misaligned array, a length whose
//! byte size overflows, a string that is not UTF-8 are `UCM_ERR_INVALID`,
//! never undefined behaviour. What cannot be checked is the caller's part
//! of the contract: a non-NULL pointer must point to what its type says, a
//! handle must come from this library and not be freed yet, and the
//! memory registered with a worker must outlive it. Each handle takes a
//! lock, so calls on one handle from several threads are serialised.
//!
//! The header `ffi/include/ucm.h` is generated from this file by cbindgen
//! (`UCM_BLESS=1 cargo test -p ucm-ffi --test header` rewrites it; CI fails
//! when it is stale).

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::{Arc, Mutex};

use ucm_coordinator::adapter::{Allocation, Finished, LoadCause, LoadError, Scheduled};
use ucm_coordinator::store::SyncMode;
use ucm_coordinator::{RequestKeys, SpecTable};

use crate::error::{ArgProblem, FfiError, Result};
use crate::runtime::{Backend, Cache, CacheOptions, RawRegion, SchedulerSide, WorkerSide};

pub use crate::status::*;

/// Load failure causes in `ucm_load_error_t::cause`.
pub const UCM_LOAD_MISS: u32 = 0;
/// The store failed to bring the item (I/O, checksum, device).
pub const UCM_LOAD_FAILED: u32 = 1;

/// Lists of a `ucm_finished_t`.
pub const UCM_FINISHED_SAVED: u32 = 0;
/// Requests with a failed save.
pub const UCM_FINISHED_SAVE_FAILED: u32 = 1;
/// Requests whose loads completed.
pub const UCM_FINISHED_LOADED: u32 = 2;

/// `ucm_options_t::sync_mode`: one `syncfs` per batch of block writes
/// where the file system's `syncfs` stands for an fsync of each file
/// (ext4, XFS, btrfs, tmpfs on Linux 5.8+), else an fsync per file and
/// directory. The default.
pub const UCM_SYNC_AUTO: u32 = 0;
/// `ucm_options_t::sync_mode`: an fsync per block file and per directory
/// that got a new entry, never a `syncfs` (for a store on a busy shared
/// file system, where a `syncfs` would also write back what other
/// programs left dirty).
pub const UCM_SYNC_FILES: u32 = 1;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Runs `f` at the boundary: its error becomes a status code and the
/// thread's last error; a panic is caught.
fn guard(f: impl FnOnce() -> Result<()>) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => {
            set_last_error("");
            UCM_OK
        }
        Ok(Err(e)) => {
            set_last_error(&e.to_string());
            e.status()
        }
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown".into());
            let e = FfiError::Panic(what);
            set_last_error(&e.to_string());
            e.status()
        }
    }
}

fn arg(name: impl Into<String>, problem: ArgProblem) -> FfiError {
    FfiError::Argument {
        name: name.into(),
        problem,
    }
}

/// A NUL-terminated UTF-8 string argument.
///
/// # Safety
/// A non-NULL `p` must point to a NUL-terminated string.
unsafe fn str_arg<'a>(p: *const c_char, what: &str) -> Result<&'a str> {
    if p.is_null() {
        return Err(arg(what, ArgProblem::Null));
    }
    // SAFETY: non-NULL and, by this function's contract, NUL-terminated.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| arg(what, ArgProblem::NotUtf8))
}

/// An optional string argument: NULL is `None`.
///
/// # Safety
/// As [`str_arg`].
unsafe fn opt_str_arg<'a>(p: *const c_char, what: &str) -> Result<Option<&'a str>> {
    if p.is_null() {
        Ok(None)
    } else {
        // SAFETY: forwarded contract.
        unsafe { str_arg(p, what) }.map(Some)
    }
}

/// An array argument of `n` items; NULL is allowed only for `n == 0`.
///
/// # Safety
/// A non-NULL `p` must point to `n` initialised items that stay valid and
/// unmodified for the returned lifetime.
unsafe fn slice_arg<'a, T>(p: *const T, n: usize, what: &str) -> Result<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(arg(what, ArgProblem::NullWithLength { len: n }));
    }
    if (p as usize) % std::mem::align_of::<T>() != 0 {
        return Err(arg(what, ArgProblem::Misaligned));
    }
    match n.checked_mul(std::mem::size_of::<T>()) {
        Some(b) if b <= isize::MAX as usize && (p as usize).checked_add(b).is_some() => {}
        _ => return Err(arg(what, ArgProblem::LengthOverflows { len: n })),
    }
    // SAFETY: non-NULL, aligned, the byte size fits in isize and does not
    // wrap the address space; validity of the items is the caller's part.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// Writes `v` through an output pointer.
///
/// # Safety
/// A non-NULL `p` must be valid for a write of `T`.
unsafe fn out_arg<T>(p: *mut T, what: &str, v: T) -> Result<()> {
    if p.is_null() {
        return Err(arg(what, ArgProblem::Null));
    }
    if (p as usize) % std::mem::align_of::<T>() != 0 {
        return Err(arg(what, ArgProblem::Misaligned));
    }
    // SAFETY: non-NULL, aligned, writable by this function's contract.
    unsafe { p.write(v) };
    Ok(())
}

/// A handle argument.
///
/// # Safety
/// A non-NULL `p` must be a live handle of this library of type `T`.
unsafe fn handle<'a, T>(p: *const T, what: &str) -> Result<&'a T> {
    if p.is_null() {
        return Err(arg(what, ArgProblem::Null));
    }
    if (p as usize) % std::mem::align_of::<T>() != 0 {
        return Err(arg(what, ArgProblem::NotAHandle));
    }
    // SAFETY: a live handle by this function's contract.
    Ok(unsafe { &*p })
}

/// Frees a handle made by `Box::into_raw` (NULL: nothing).
///
/// # Safety
/// NULL or a live handle of type `T`, not used afterwards.
unsafe fn free_handle<T>(p: *mut T) {
    if !p.is_null() {
        // SAFETY: made by Box::into_raw in this library, freed once (the
        // caller's contract).
        drop(unsafe { Box::from_raw(p) });
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A parsed, validated spec table.
pub struct UcmSpec(SpecTable);

/// One model's cache: its stores, checkpoint directory and metrics.
pub struct UcmCache(Arc<Cache>);

/// The scheduler side of a cache.
pub struct UcmScheduler(Mutex<SchedulerSide>);

/// The worker side of one rank.
pub struct UcmWorker(Mutex<WorkerState>);

struct WorkerState {
    side: WorkerSide,
    /// Load errors not yet handed out (a caller's buffer was too small).
    pending_errors: Vec<LoadError>,
}

/// The metadata of one step, encoded (see `ucm_meta_bytes`).
pub struct UcmMeta(Vec<u8>);

/// What a worker reports as finished.
pub struct UcmFinished {
    lists: [Vec<CString>; 3],
}

/// How a cache is opened. Zero fields take the defaults.
#[repr(C)]
pub struct UcmOptions {
    /// The store directory (NUL-terminated; created if missing).
    pub dir: *const c_char,
    /// Tensor-parallel ranks (0: 1).
    pub tp_size: u32,
    /// Units loaded ahead of the one a layer waits for (0: 2).
    pub lookahead: u32,
    /// Memory-pool bytes per group (0: 256 MiB).
    pub pool_bytes: u64,
    /// The disk capacity, as this many block files of every group, shared
    /// by the groups as one byte budget (0: 2^20).
    pub disk_blocks: u64,
    /// How the disk tiers make writes durable: `UCM_SYNC_AUTO` (0) or
    /// `UCM_SYNC_FILES`; any other value is `UCM_ERR_INVALID`.
    pub sync_mode: u32,
    /// Store worker threads per group (0: 2).
    pub workers: u32,
    /// A Redis or Valkey cluster below every group's disk tier,
    /// `redis://host:port[,host:port...]` (NUL-terminated; NULL: none),
    /// shared with other instances. A malformed URL is `UCM_ERR_STORE`;
    /// nothing is contacted until the stores open (the first worker).
    pub remote: *const c_char,
    /// An S3-compatible bucket below that (or below the disk tier without
    /// `remote`): the cold tier, `s3://bucket[/prefix][?endpoint=URL]`
    /// (NUL-terminated; NULL: none; credentials from `AWS_*`).
    pub cold: *const c_char,
    /// 1: no local disk tier; `remote` and/or `cold` are the persistent
    /// tiers (a diskless node; without either, `UCM_ERR_STORE`). 0: a disk
    /// tier under `dir`. Any other value is `UCM_ERR_INVALID`.
    pub no_disk: u32,
}

/// One group's placement of a request (`ucm_scheduler_update_after_alloc`).
#[repr(C)]
pub struct UcmGroupAlloc {
    /// The group's index in the spec table.
    pub group: u32,
    /// Chain and sidecar groups: the engine block of each block index.
    pub blocks: *const u32,
    /// Entries of `blocks`.
    pub n_blocks: usize,
    /// Snapshot groups: the request's state slot; -1 for none.
    pub state_slot: i64,
}

/// A chunk of a request computed in a step: tokens `[start, end)`.
#[repr(C)]
pub struct UcmChunk {
    /// The request id (NUL-terminated).
    pub req_id: *const c_char,
    /// First token computed.
    pub start: u64,
    /// One past the last.
    pub end: u64,
}

/// One engine layer's tensor.
#[repr(C)]
pub struct UcmRegion {
    /// The spec layer.
    pub layer: u32,
    /// Base address.
    pub addr: *mut u8,
    /// Length in bytes.
    pub len: usize,
    /// Bytes between engine blocks (chain, sidecar) or state slots
    /// (snapshot).
    pub stride: usize,
}

/// A load item that failed: the engine recomputes this block.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UcmLoadError {
    /// The group's index.
    pub group: u32,
    /// The engine block (chain, sidecar) or state slot (snapshot).
    pub engine_block: u32,
    /// `UCM_LOAD_MISS` or `UCM_LOAD_FAILED`.
    pub cause: u32,
}

/// A byte string argument (an extra hash key).
#[repr(C)]
pub struct UcmBytes {
    /// The bytes.
    pub data: *const u8,
    /// Their count.
    pub len: usize,
}

/// The ABI version of this library.
#[no_mangle]
pub extern "C" fn ucm_abi_version() -> u32 {
    crate::ABI_VERSION
}

/// The last error of this thread, or "" after a success. Valid until the
/// next call on this thread; never NULL.
#[no_mangle]
pub extern "C" fn ucm_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Parses a spec table from TOML text (`len` bytes, no NUL needed).
///
/// # Safety
/// `toml` must point to `len` bytes; `out` must be writable.
#[no_mangle]
pub unsafe extern "C" fn ucm_spec_from_toml(
    toml: *const u8,
    len: usize,
    out: *mut *mut UcmSpec,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract.
        let bytes = unsafe { slice_arg(toml, len, "toml") }?;
        let text = std::str::from_utf8(bytes).map_err(|_| arg("toml", ArgProblem::NotUtf8))?;
        let spec = SpecTable::from_toml(text)?;
        // SAFETY: the caller's contract.
        unsafe { out_arg(out, "out", Box::into_raw(Box::new(UcmSpec(spec)))) }
    })
}

/// Loads a spec table from a TOML file.
///
/// # Safety
/// `path` must be a NUL-terminated string; `out` must be writable.
#[no_mangle]
pub unsafe extern "C" fn ucm_spec_load(path: *const c_char, out: *mut *mut UcmSpec) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract.
        let p = unsafe { str_arg(path, "path") }?;
        let spec = SpecTable::load(Path::new(p))?;
        // SAFETY: the caller's contract.
        unsafe { out_arg(out, "out", Box::into_raw(Box::new(UcmSpec(spec)))) }
    })
}

/// Frees a spec table (NULL: nothing).
///
/// # Safety
/// `spec` must be NULL or a live spec handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ucm_spec_free(spec: *mut UcmSpec) {
    // SAFETY: the caller\'s contract, forwarded.
    unsafe { free_handle(spec) }
}

/// The number of groups of a spec table.
///
/// # Safety
/// `spec` must be a live spec handle; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn ucm_spec_num_groups(spec: *const UcmSpec, out: *mut u32) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract.
        let s = unsafe { handle(spec, "spec") }?;
        // SAFETY: the caller's contract.
        unsafe { out_arg(out, "out", s.0.groups().len() as u32) }
    })
}

/// The index of group `name`.
///
/// # Safety
/// `spec` a live handle, `name` a NUL-terminated string, `out` writable.
#[no_mangle]
pub unsafe extern "C" fn ucm_spec_group_index(
    spec: *const UcmSpec,
    name: *const c_char,
    out: *mut u32,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract.
        let (s, n) = unsafe { (handle(spec, "spec")?, str_arg(name, "name")?) };
        let g = s.0.group(n)?;
        // SAFETY: the caller's contract.
        unsafe { out_arg(out, "out", g.index as u32) }
    })
}

/// # Safety
/// `salt` NULL or a string; `extra` `n_extra` items each pointing to its
/// bytes.
unsafe fn keys_arg(
    salt: *const c_char,
    extra: *const UcmBytes,
    n_extra: usize,
) -> Result<RequestKeys> {
    // SAFETY: the caller's contract.
    let salt = unsafe { opt_str_arg(salt, "cache_salt") }?.map(str::to_owned);
    // SAFETY: the caller's contract.
    let extra = unsafe { slice_arg(extra, n_extra, "extra_keys") }?;
    let mut extra_keys = Vec::with_capacity(extra.len());
    for (i, b) in extra.iter().enumerate() {
        // SAFETY: the caller's contract.
        let bytes = unsafe { slice_arg(b.data, b.len, &format!("extra_keys[{i}]")) }?;
        extra_keys.push(bytes.to_vec());
    }
    Ok(RequestKeys {
        cache_salt: salt,
        extra_keys,
    })
}

/// The chain ids of `tokens` in group `group` for `rank` (16 bytes each,
/// written to `out_ids`, `cap` ids at most). `*n_out` gets the count; a
/// `cap` too small is `UCM_ERR_BUFFER` with the needed count in `*n_out`.
///
/// # Safety
/// Every pointer as its type says; `out_ids` writable for `cap * 16` bytes.
#[no_mangle]
pub unsafe extern "C" fn ucm_block_ids(
    spec: *const UcmSpec,
    tp_size: u32,
    cache_salt: *const c_char,
    extra: *const UcmBytes,
    n_extra: usize,
    tokens: *const u32,
    n_tokens: usize,
    group: *const c_char,
    rank: u32,
    out_ids: *mut u8,
    cap: usize,
    n_out: *mut usize,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract, for each argument.
        let (s, keys, toks, g) = unsafe {
            (
                handle(spec, "spec")?,
                keys_arg(cache_salt, extra, n_extra)?,
                slice_arg(tokens, n_tokens, "tokens")?,
                str_arg(group, "group")?,
            )
        };
        let ids = crate::hashing::block_ids(&s.0, tp_size, &keys, toks, g, rank)?;
        // SAFETY: the caller's contract.
        unsafe { out_arg(n_out, "n_out", ids.len()) }?;
        if ids.len() > cap {
            return Err(FfiError::Buffer {
                capacity: cap,
                needed: ids.len(),
                unit: "ids",
            });
        }
        let flat: Vec<u8> = ids.concat();
        if !flat.is_empty() {
            if out_ids.is_null() {
                return Err(arg("out_ids", ArgProblem::Null));
            }
            // SAFETY: non-NULL, writable for cap*16 >= flat.len() bytes by
            // the caller's contract; u8 needs no alignment.
            unsafe { std::ptr::copy_nonoverlapping(flat.as_ptr(), out_ids, flat.len()) };
        }
        Ok(())
    })
}

/// The checkpoint hash of snapshot group `group` at `position` (16 bytes
/// to `out`).
///
/// # Safety
/// Every pointer as its type says; `out` writable for 16 bytes.
#[no_mangle]
pub unsafe extern "C" fn ucm_checkpoint_hash(
    spec: *const UcmSpec,
    tp_size: u32,
    cache_salt: *const c_char,
    extra: *const UcmBytes,
    n_extra: usize,
    tokens: *const u32,
    n_tokens: usize,
    group: *const c_char,
    rank: u32,
    position: u64,
    out: *mut u8,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract, for each argument.
        let (s, keys, toks, g) = unsafe {
            (
                handle(spec, "spec")?,
                keys_arg(cache_salt, extra, n_extra)?,
                slice_arg(tokens, n_tokens, "tokens")?,
                str_arg(group, "group")?,
            )
        };
        let id = crate::hashing::checkpoint(&s.0, tp_size, &keys, toks, g, rank, position)?;
        if out.is_null() {
            return Err(arg("out", ArgProblem::Null));
        }
        // SAFETY: non-NULL and writable for 16 bytes by the contract.
        unsafe { std::ptr::copy_nonoverlapping(id.as_ptr(), out, 16) };
        Ok(())
    })
}

/// Opens a cache of `spec` (copied; the spec handle may be freed after).
///
/// # Safety
/// `spec` a live handle; `opts` points to a `ucm_options_t`; `out`
/// writable.
#[no_mangle]
pub unsafe extern "C" fn ucm_cache_open(
    spec: *const UcmSpec,
    opts: *const UcmOptions,
    out: *mut *mut UcmCache,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract.
        let (s, o) = unsafe { (handle(spec, "spec")?, handle(opts, "opts")?) };
        // SAFETY: the caller's contract.
        let dir = unsafe { str_arg(o.dir, "opts.dir") }?;
        let mut co = CacheOptions::new(dir);
        if o.tp_size > 0 {
            co.tp_size = o.tp_size;
        }
        if o.lookahead > 0 {
            co.lookahead = o.lookahead as usize;
        }
        if o.pool_bytes > 0 {
            co.store.pool_bytes = Some(usize::try_from(o.pool_bytes).map_err(|_| {
                arg(
                    "opts.pool_bytes",
                    ArgProblem::OutOfRange {
                        value: o.pool_bytes.to_string(),
                        expected: "at most usize::MAX",
                    },
                )
            })?);
        }
        if o.disk_blocks > 0 {
            co.store.disk_blocks = o.disk_blocks;
        }
        if o.workers > 0 {
            co.store.workers = o.workers as usize;
        }
        // SAFETY: the caller's contract (NULL or a NUL-terminated string).
        co.store.remote = unsafe { opt_str_arg(o.remote, "opts.remote") }?.map(String::from);
        // SAFETY: as above.
        co.store.cold = unsafe { opt_str_arg(o.cold, "opts.cold") }?.map(String::from);
        co.store.no_disk = match o.no_disk {
            0 => false,
            1 => true,
            other => {
                return Err(arg(
                    "opts.no_disk",
                    ArgProblem::OutOfRange {
                        value: other.to_string(),
                        expected: "0 or 1",
                    },
                ))
            }
        };
        co.store.sync = match o.sync_mode {
            UCM_SYNC_AUTO => SyncMode::Auto,
            UCM_SYNC_FILES => SyncMode::Files,
            other => {
                return Err(arg(
                    "opts.sync_mode",
                    ArgProblem::OutOfRange {
                        value: other.to_string(),
                        expected: "UCM_SYNC_AUTO or UCM_SYNC_FILES",
                    },
                ))
            }
        };
        let cache = Cache::open(s.0.clone(), co)?;
        // SAFETY: the caller's contract.
        unsafe { out_arg(out, "out", Box::into_raw(Box::new(UcmCache(cache)))) }
    })
}

/// Closes a cache handle (NULL: nothing). Scheduler and worker handles
/// keep what they need alive; the stores close with the last of them.
///
/// # Safety
/// NULL or a live cache handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ucm_cache_close(cache: *mut UcmCache) {
    // SAFETY: the caller\'s contract, forwarded.
    unsafe { free_handle(cache) }
}

/// The cache's metrics in the Prometheus text format, NUL-terminated, into
/// `buf` of `cap` bytes. `*needed` gets the size with the NUL; a `cap` too
/// small is `UCM_ERR_BUFFER`.
///
/// # Safety
/// `cache` live; `buf` writable for `cap` bytes (NULL with `cap` 0);
/// `needed` writable.
#[no_mangle]
pub unsafe extern "C" fn ucm_cache_metrics(
    cache: *const UcmCache,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { handle(cache, "cache") }?;
        let text = c.0.prometheus();
        let n = text.len() + 1;
        // SAFETY: the caller's contract.
        unsafe { out_arg(needed, "needed", n) }?;
        if cap < n {
            return Err(FfiError::Buffer {
                capacity: cap,
                needed: n,
                unit: "bytes",
            });
        }
        if buf.is_null() {
            return Err(arg("buf", ArgProblem::Null));
        }
        // SAFETY: non-NULL, writable for cap >= n bytes by the contract.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
            buf.add(text.len()).write(0);
        }
        Ok(())
    })
}

/// The scheduler side of a cache.
///
/// # Safety
/// `cache` live; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn ucm_scheduler_new(
    cache: *const UcmCache,
    out: *mut *mut UcmScheduler,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { handle(cache, "cache") }?;
        let s = UcmScheduler(Mutex::new(c.0.scheduler()));
        // SAFETY: the caller's contract.
        unsafe { out_arg(out, "out", Box::into_raw(Box::new(s))) }
    })
}

/// Frees a scheduler handle (NULL: nothing).
///
/// # Safety
/// NULL or a live scheduler handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ucm_scheduler_free(s: *mut UcmScheduler) {
    // SAFETY: the caller\'s contract, forwarded.
    unsafe { free_handle(s) }
}

/// How many tokens of the prompt beyond `num_computed` UCM serves
/// (`*matched`). The last prompt token is never served.
///
/// # Safety
/// Every pointer as its type says.
#[no_mangle]
pub unsafe extern "C" fn ucm_scheduler_lookup(
    s: *const UcmScheduler,
    req_id: *const c_char,
    tokens: *const u32,
    n_tokens: usize,
    cache_salt: *const c_char,
    num_computed: u64,
    matched: *mut u64,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract, for each argument.
        let (s, id, toks, keys) = unsafe {
            (
                handle(s, "scheduler")?,
                str_arg(req_id, "req_id")?,
                slice_arg(tokens, n_tokens, "tokens")?,
                keys_arg(cache_salt, std::ptr::null(), 0)?,
            )
        };
        let n = lock(&s.0).get_num_new_matched_tokens(
            id,
            Arc::new(toks.to_vec()),
            keys,
            num_computed,
        )?;
        // SAFETY: the caller's contract.
        unsafe { out_arg(matched, "matched", n) }
    })
}

/// Where the engine placed the request's blocks and state slots, and how
/// many external tokens it takes (0: it recomputes).
///
/// # Safety
/// Every pointer as its type says; each `blocks` array of `n_blocks`.
#[no_mangle]
pub unsafe extern "C" fn ucm_scheduler_update_after_alloc(
    s: *const UcmScheduler,
    req_id: *const c_char,
    groups: *const UcmGroupAlloc,
    n_groups: usize,
    num_external_tokens: u64,
) -> i32 {
    // SAFETY: the caller's contract, forwarded.
    guard(|| unsafe {
        with_alloc(s, req_id, groups, n_groups, |side, id, alloc| {
            side.update_state_after_alloc(id, alloc, num_external_tokens)
        })
    })
}

/// An allocation from its C form.
///
/// # Safety
/// Each item's `blocks` points to `n_blocks` items.
unsafe fn alloc_arg(num_groups: usize, gs: &[UcmGroupAlloc]) -> Result<Allocation> {
    let mut alloc = Allocation::default();
    for (i, g) in gs.iter().enumerate() {
        if g.group as usize >= num_groups {
            return Err(arg(
                format!("groups[{i}].group"),
                ArgProblem::OutOfRange {
                    value: g.group.to_string(),
                    expected: "a group of the spec",
                },
            ));
        }
        // SAFETY: the caller's contract.
        let b = unsafe { slice_arg(g.blocks, g.n_blocks, &format!("groups[{i}].blocks")) }?;
        if !b.is_empty() {
            alloc.blocks.insert(g.group as usize, b.to_vec());
        }
        match g.state_slot {
            -1 => {}
            s if (0..=u32::MAX as i64).contains(&s) => {
                alloc.state_slots.insert(g.group as usize, s as u32);
            }
            s => {
                return Err(arg(
                    format!("groups[{i}].state_slot"),
                    ArgProblem::OutOfRange {
                        value: s.to_string(),
                        expected: "-1 or a slot index",
                    },
                ))
            }
        }
    }
    Ok(alloc)
}

/// Decodes a scheduler, a request id and an allocation, then runs `f`.
///
/// # Safety
/// Every pointer as its type says; each `blocks` array of `n_blocks`.
unsafe fn with_alloc(
    s: *const UcmScheduler,
    req_id: *const c_char,
    groups: *const UcmGroupAlloc,
    n_groups: usize,
    f: impl FnOnce(&mut SchedulerSide, &str, Allocation) -> Result<()>,
) -> Result<()> {
    // SAFETY: the caller's contract, for each argument.
    let (s, id, gs) = unsafe {
        (
            handle(s, "scheduler")?,
            str_arg(req_id, "req_id")?,
            slice_arg(groups, n_groups, "groups")?,
        )
    };
    let mut side = lock(&s.0);
    // SAFETY: the caller's contract.
    let alloc = unsafe { alloc_arg(side.cache().spec().groups().len(), gs) }?;
    f(&mut side, id, alloc)
}

/// The engine's placement of a request grew (blocks allocated after its
/// first step): later saves use it.
///
/// # Safety
/// Every pointer as its type says; each `blocks` array of `n_blocks`.
#[no_mangle]
pub unsafe extern "C" fn ucm_scheduler_update_allocation(
    s: *const UcmScheduler,
    req_id: *const c_char,
    groups: *const UcmGroupAlloc,
    n_groups: usize,
) -> i32 {
    // SAFETY: the caller's contract, forwarded.
    guard(|| unsafe {
        with_alloc(s, req_id, groups, n_groups, |side, id, alloc| {
            side.update_allocation(id, alloc)
        })
    })
}

/// The metadata of a step computing `chunks`.
///
/// # Safety
/// Every pointer as its type says.
#[no_mangle]
pub unsafe extern "C" fn ucm_scheduler_build_meta(
    s: *const UcmScheduler,
    chunks: *const UcmChunk,
    n_chunks: usize,
    out: *mut *mut UcmMeta,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract.
        let (s, cs) = unsafe {
            (
                handle(s, "scheduler")?,
                slice_arg(chunks, n_chunks, "chunks")?,
            )
        };
        let mut v = Vec::with_capacity(cs.len());
        for (i, c) in cs.iter().enumerate() {
            v.push(Scheduled {
                // SAFETY: the caller's contract.
                req: unsafe { str_arg(c.req_id, &format!("chunks[{i}].req_id")) }?.to_owned(),
                start: c.start,
                end: c.end,
            });
        }
        let meta = lock(&s.0).build_meta(&v)?;
        let m = UcmMeta(crate::wire::encode(&meta));
        // SAFETY: the caller's contract.
        unsafe { out_arg(out, "out", Box::into_raw(Box::new(m))) }
    })
}

/// The request's tokens grew by decoding (`tokens`: all `n_tokens` so far,
/// beginning with the prompt): blocks they complete are saved too.
///
/// # Safety
/// Every pointer as its type says.
#[no_mangle]
pub unsafe extern "C" fn ucm_scheduler_extend_tokens(
    s: *const UcmScheduler,
    req_id: *const c_char,
    tokens: *const u32,
    n_tokens: usize,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract, for each argument.
        let (s, id, toks) = unsafe {
            (
                handle(s, "scheduler")?,
                str_arg(req_id, "req_id")?,
                slice_arg(tokens, n_tokens, "tokens")?,
            )
        };
        lock(&s.0).extend_tokens(id, Arc::new(toks.to_vec()))
    })
}

/// The request ended.
///
/// # Safety
/// Every pointer as its type says.
#[no_mangle]
pub unsafe extern "C" fn ucm_scheduler_request_finished(
    s: *const UcmScheduler,
    req_id: *const c_char,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract.
        let (s, id) = unsafe { (handle(s, "scheduler")?, str_arg(req_id, "req_id")?) };
        lock(&s.0).request_finished(id);
        Ok(())
    })
}

/// The encoded bytes of a step's metadata (valid while `meta` lives), to
/// hand to the workers (`ucm_worker_start_load`), possibly in another
/// process.
///
/// # Safety
/// `meta` live; `data` and `len` writable.
#[no_mangle]
pub unsafe extern "C" fn ucm_meta_bytes(
    meta: *const UcmMeta,
    data: *mut *const u8,
    len: *mut usize,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract.
        let m = unsafe { handle(meta, "meta") }?;
        // SAFETY: the caller's contract.
        unsafe {
            out_arg(data, "data", m.0.as_ptr())?;
            out_arg(len, "len", m.0.len())
        }
    })
}

/// Frees a step's metadata (NULL: nothing).
///
/// # Safety
/// NULL or a live meta handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ucm_meta_free(meta: *mut UcmMeta) {
    // SAFETY: the caller\'s contract, forwarded.
    unsafe { free_handle(meta) }
}

/// A worker of `rank` over spec layers `[stage_start, stage_end)` whose KV
/// caches live on `device` (`"cpu"`, `"cuda:N"`).
///
/// # Safety
/// Every pointer as its type says.
#[no_mangle]
pub unsafe extern "C" fn ucm_worker_new(
    cache: *const UcmCache,
    device: *const c_char,
    rank: u32,
    stage_start: u32,
    stage_end: u32,
    out: *mut *mut UcmWorker,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract.
        let (c, d) = unsafe { (handle(cache, "cache")?, str_arg(device, "device")?) };
        let side =
            c.0.worker(Backend::parse(d)?, rank, stage_start..stage_end)?;
        let w = UcmWorker(Mutex::new(WorkerState {
            side,
            pending_errors: Vec::new(),
        }));
        // SAFETY: the caller's contract.
        unsafe { out_arg(out, "out", Box::into_raw(Box::new(w))) }
    })
}

/// Frees a worker (NULL: nothing). Its step's saves are waited for first.
///
/// # Safety
/// NULL or a live worker handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ucm_worker_free(w: *mut UcmWorker) {
    if !w.is_null() {
        // SAFETY: made by Box::into_raw, freed once.
        let w = unsafe { Box::from_raw(w) };
        let _ = catch_unwind(AssertUnwindSafe(|| {
            let mut st = lock(&w.0);
            let _ = st.side.wait_for_save();
        }));
        drop(w);
    }
}

/// Registers the engine's KV-cache tensors.
///
/// # Safety
/// Every pointer as its type says; each region must be memory of the
/// worker's device that stays allocated until the worker is freed.
#[no_mangle]
pub unsafe extern "C" fn ucm_worker_register(
    w: *const UcmWorker,
    regions: *const UcmRegion,
    n_regions: usize,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract.
        let (w, rs) = unsafe {
            (
                handle(w, "worker")?,
                slice_arg(regions, n_regions, "regions")?,
            )
        };
        let raw: Vec<RawRegion> = rs
            .iter()
            .map(|r| RawRegion {
                layer: r.layer,
                addr: r.addr as u64,
                len: r.len,
                stride: r.stride,
            })
            .collect();
        // SAFETY: the regions' validity and lifetime are the caller's part
        // of this function's contract, forwarded.
        unsafe { lock(&w.0).side.register_kv_caches(&raw) }
    })
}

/// Starts a step from its encoded metadata: loads begin.
///
/// # Safety
/// Every pointer as its type says.
#[no_mangle]
pub unsafe extern "C" fn ucm_worker_start_load(
    w: *const UcmWorker,
    meta: *const u8,
    len: usize,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract.
        let (w, bytes) = unsafe { (handle(w, "worker")?, slice_arg(meta, len, "meta")?) };
        let mut st = lock(&w.0);
        let m = crate::wire::decode(st.side.cache().spec(), bytes)?;
        st.side.start_load_kv(m)
    })
}

/// Blocks until `layer`'s loads of this step are in place (or reported).
///
/// # Safety
/// `w` a live worker handle.
#[no_mangle]
pub unsafe extern "C" fn ucm_worker_wait_layer(w: *const UcmWorker, layer: u32) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract.
        let w = unsafe { handle(w, "worker") }?;
        lock(&w.0).side.wait_for_layer_load(layer)
    })
}

/// `layer` is computed: its saves of this step start.
///
/// # Safety
/// `w` a live worker handle.
#[no_mangle]
pub unsafe extern "C" fn ucm_worker_save_layer(w: *const UcmWorker, layer: u32) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract.
        let w = unsafe { handle(w, "worker") }?;
        lock(&w.0).side.save_kv_layer(layer)
    })
}

/// Blocks until this step's saves are out of the engine's memory.
///
/// # Safety
/// `w` a live worker handle.
#[no_mangle]
pub unsafe extern "C" fn ucm_worker_wait_save(w: *const UcmWorker) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract.
        let w = unsafe { handle(w, "worker") }?;
        lock(&w.0).side.wait_for_save()
    })
}

/// Load items that failed since the last call, up to `cap` into `out`;
/// `*n_out` gets the count written. Items beyond `cap` are kept for the
/// next call (`*more` is 1 then).
///
/// # Safety
/// Every pointer as its type says; `out` writable for `cap` items.
#[no_mangle]
pub unsafe extern "C" fn ucm_worker_load_errors(
    w: *const UcmWorker,
    out: *mut UcmLoadError,
    cap: usize,
    n_out: *mut usize,
    more: *mut u8,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract.
        let w = unsafe { handle(w, "worker") }?;
        if cap > 0 && out.is_null() {
            return Err(arg("out", ArgProblem::Null));
        }
        if cap > 0 && (out as usize) % std::mem::align_of::<UcmLoadError>() != 0 {
            return Err(arg("out", ArgProblem::Misaligned));
        }
        let mut st = lock(&w.0);
        let fresh = st.side.block_ids_with_load_errors();
        st.pending_errors.extend(fresh);
        let n = cap.min(st.pending_errors.len());
        let taken: Vec<LoadError> = st.pending_errors.drain(..n).collect();
        for (i, e) in taken.iter().enumerate() {
            let item = UcmLoadError {
                group: e.group as u32,
                engine_block: e.engine_block,
                cause: match e.cause {
                    LoadCause::Miss => UCM_LOAD_MISS,
                    LoadCause::Failed(_) => UCM_LOAD_FAILED,
                },
            };
            // SAFETY: i < n <= cap, `out` non-NULL, aligned and writable
            // for cap items by the contract.
            unsafe { out.add(i).write(item) };
        }
        let left = !st.pending_errors.is_empty();
        // SAFETY: the caller's contract.
        unsafe {
            out_arg(n_out, "n_out", n)?;
            out_arg(more, "more", u8::from(left))
        }
    })
}

/// What finished, given the requests the engine finished since the last
/// call (`finished`, `n` ids).
///
/// # Safety
/// Every pointer as its type says.
#[no_mangle]
pub unsafe extern "C" fn ucm_worker_get_finished(
    w: *const UcmWorker,
    finished: *const *const c_char,
    n: usize,
    out: *mut *mut UcmFinished,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract.
        let (w, ids) = unsafe { (handle(w, "worker")?, slice_arg(finished, n, "finished")?) };
        let mut names = Vec::with_capacity(ids.len());
        for (i, p) in ids.iter().enumerate() {
            // SAFETY: the caller's contract.
            names.push(unsafe { str_arg(*p, &format!("finished[{i}]")) }?.to_owned());
        }
        let f: Finished = lock(&w.0).side.get_finished(&names);
        let cs = |v: Vec<String>| -> Vec<CString> {
            v.into_iter()
                .map(|s| CString::new(s).unwrap_or_default())
                .collect()
        };
        let res = UcmFinished {
            lists: [
                cs(f.saved),
                cs(f.save_failed.into_iter().map(|(r, _)| r).collect()),
                cs(f.loaded),
            ],
        };
        // SAFETY: the caller's contract.
        unsafe { out_arg(out, "out", Box::into_raw(Box::new(res))) }
    })
}

/// The number of request ids in list `which` (`UCM_FINISHED_*`).
///
/// # Safety
/// `f` live; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn ucm_finished_count(
    f: *const UcmFinished,
    which: u32,
    out: *mut usize,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract.
        let f = unsafe { handle(f, "finished") }?;
        let l = f.lists.get(which as usize).ok_or_else(|| {
            arg(
                "which",
                ArgProblem::OutOfRange {
                    value: which.to_string(),
                    expected: "a list of the finished set",
                },
            )
        })?;
        // SAFETY: the caller's contract.
        unsafe { out_arg(out, "out", l.len()) }
    })
}

/// Request id `i` of list `which` (valid while `f` lives).
///
/// # Safety
/// `f` live; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn ucm_finished_id(
    f: *const UcmFinished,
    which: u32,
    i: usize,
    out: *mut *const c_char,
) -> i32 {
    guard(|| {
        // SAFETY: the caller's contract.
        let f = unsafe { handle(f, "finished") }?;
        let id = f
            .lists
            .get(which as usize)
            .and_then(|l| l.get(i))
            .ok_or_else(|| {
                arg(
                    "i",
                    ArgProblem::OutOfRange {
                        value: i.to_string(),
                        expected: "an item of the list",
                    },
                )
            })?;
        // SAFETY: the caller's contract.
        unsafe { out_arg(out, "out", id.as_ptr()) }
    })
}

/// Frees a finished report (NULL: nothing).
///
/// # Safety
/// NULL or a live handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ucm_finished_free(f: *mut UcmFinished) {
    // SAFETY: the caller\'s contract, forwarded.
    unsafe { free_handle(f) }
}

//! The Ascend ACL backend of the [`Device`] trait (feature `ascend`).
//!
//! Layered as cudarc is: [`sys`] (the bindgen table, loaded at run time
//! with libloading), [`result`] (every call returns `Result`, unsafe with
//! numbered preconditions) and this module's safe RAII types, whose `Drop`
//! never panics: a failed release is recorded and reported by
//! [`take_deferred_errors`].
//!
//! `libascendcl.so` is taken from `UCM_ACL_LIB` when set, else from the
//! loader path, else from the toolkit (`ASCEND_TOOLKIT_HOME`,
//! `ASCEND_HOME_PATH`, `/usr/local/Ascend/ascend-toolkit/latest`, each
//! `lib64/`). `aclInit` runs once per library per process; the device is set
//! on every thread before it calls the runtime; `aclrtResetDevice` runs when
//! the last stream, event, allocation and device handle are gone.
//!
//! ACL has no notion of a host function failing, so the sticky-error
//! semantics of the trait are kept here: each stream counts the work queued
//! on it, a failed host function marks its position, and events and waiting
//! streams compare positions (see `docs/decisions.md`).

pub mod result;
pub mod sys;

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use super::sticky::{
    batch_attributes, host_trampoline, same_device, EventMark, HostCall, StreamState,
};
use super::{
    check_alloc_len, check_region, CopyKind, CopyRun, Device, DeviceId, HostFn, MemKind, Memory,
};
use crate::error::{DeviceError, Result};
use sys::AclLib;

/// ACL's alignment rule for async copy addresses.
pub const ACL_COPY_ALIGN: usize = 64;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn unsupported(reason: String) -> DeviceError {
    DeviceError::Unsupported {
        backend: "ascend",
        reason,
    }
}

/// A loaded and initialised ACL library. Lives for the rest of the process
/// (ACL forbids re-initialisation after `aclFinalize` on some versions).
pub struct Runtime {
    lib: AclLib,
    path: PathBuf,
    deferred: Mutex<Vec<DeviceError>>,
    generation: AtomicU64,
}

impl Runtime {
    /// The library file in use.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The raw function table, for the `result` layer.
    pub fn lib(&self) -> &AclLib {
        &self.lib
    }

    fn defer(&self, e: DeviceError) {
        log::error!("ascend: deferred error: {e}");
        lock(&self.deferred).push(e);
    }
}

/// Errors that `Drop` implementations recorded instead of panicking.
pub fn take_deferred_errors(rt: &Runtime) -> Vec<DeviceError> {
    std::mem::take(&mut *lock(&rt.deferred))
}

/// Symbols the backend cannot work without.
fn missing_required(lib: &AclLib) -> Vec<&'static str> {
    let mut missing = Vec::new();
    macro_rules! need {
        ($($f:ident),*) => {$(
            if lib.$f.is_err() {
                missing.push(stringify!($f));
            }
        )*};
    }
    need!(
        aclInit,
        aclrtSetDevice,
        aclrtResetDevice,
        aclrtGetDeviceCount,
        aclrtSynchronizeDevice,
        aclrtMalloc,
        aclrtFree,
        aclrtMallocHost,
        aclrtFreeHost,
        aclrtHostRegister,
        aclrtHostUnregister,
        aclrtCreateStream,
        aclrtDestroyStream,
        aclrtSynchronizeStream,
        aclrtCreateEvent,
        aclrtDestroyEvent,
        aclrtRecordEvent,
        aclrtQueryEventStatus,
        aclrtSynchronizeEvent,
        aclrtStreamWaitEvent,
        aclrtMemcpyAsync
    );
    missing
}

/// Candidate library paths, in search order, with where each came from.
fn candidates() -> Vec<PathBuf> {
    if let Some(p) = std::env::var_os("UCM_ACL_LIB").filter(|p| !p.is_empty()) {
        return vec![PathBuf::from(p)];
    }
    let mut v = vec![PathBuf::from("libascendcl.so")];
    let roots = [
        std::env::var("ASCEND_TOOLKIT_HOME").ok(),
        std::env::var("ASCEND_HOME_PATH").ok(),
        Some("/usr/local/Ascend/ascend-toolkit/latest".to_string()),
    ];
    for r in roots.into_iter().flatten() {
        v.push(Path::new(&r).join("lib64").join("libascendcl.so"));
    }
    v
}

static RUNTIMES: Mutex<Option<HashMap<PathBuf, Arc<Runtime>>>> = Mutex::new(None);

/// Loads `path` (once per process) and runs `aclInit`. Never panics.
pub fn load_library(path: &Path) -> Result<Arc<Runtime>> {
    let mut map = lock(&RUNTIMES);
    let map = map.get_or_insert_with(HashMap::new);
    if let Some(rt) = map.get(path) {
        return Ok(Arc::clone(rt));
    }
    // SAFETY: loading runs the library's initialisers; libascendcl (or the
    // test double) has no initialisers with preconditions on our side.
    let lib = unsafe { AclLib::new(path.as_os_str()) }
        .map_err(|e| unsupported(format!("cannot load {}: {e}", path.display())))?;
    let missing = missing_required(&lib);
    if !missing.is_empty() {
        return Err(unsupported(format!(
            "{} lacks required symbols: {}",
            path.display(),
            missing.join(", ")
        )));
    }
    // SAFETY: the library loaded and every required symbol resolved.
    unsafe { result::init(&lib) }?;
    let rt = Arc::new(Runtime {
        lib,
        path: path.to_path_buf(),
        deferred: Mutex::new(Vec::new()),
        generation: AtomicU64::new(1),
    });
    map.insert(path.to_path_buf(), Arc::clone(&rt));
    Ok(rt)
}

/// Finds and loads libascendcl as the module docs describe.
pub fn load_default() -> Result<Arc<Runtime>> {
    let mut reasons = Vec::new();
    for c in candidates() {
        match load_library(&c) {
            Ok(rt) => return Ok(rt),
            Err(e) => reasons.push(e.to_string()),
        }
    }
    Err(unsupported(reasons.join("; ")))
}

/// What `ucm info` says of the Ascend backend. Never panics.
pub fn probe() -> (bool, String) {
    match load_default() {
        Err(e) => (false, e.to_string()),
        // SAFETY: `load_default` checked the symbols and ran aclInit.
        Ok(rt) => match unsafe { result::device_count(&rt.lib) } {
            Ok(0) => (false, format!("{}: no NPU found", rt.path.display())),
            Ok(n) => (true, format!("{} NPU(s) through {}", n, rt.path.display())),
            Err(e) => (false, format!("{}: {e}", rt.path.display())),
        },
    }
}

/// One device of one runtime. Shared by every handle made from it; its
/// `Drop` (the last handle gone) resets the device.
struct DeviceCtx {
    rt: Arc<Runtime>,
    device: i32,
    generation: u64,
    /// `aclrtSetDevice` calls made for this context (one per thread); ACL
    /// reference-counts them, so `Drop` resets as many times.
    binds: AtomicUsize,
}

thread_local! {
    /// The device context generation bound on this thread (0: none).
    static BOUND: Cell<u64> = const { Cell::new(0) };
}

impl DeviceCtx {
    fn lib(&self) -> &AclLib {
        &self.rt.lib
    }

    /// Sets the device on the calling thread, once per thread.
    fn bind(&self) -> Result<()> {
        if BOUND.with(Cell::get) == self.generation {
            return Ok(());
        }
        // SAFETY: the runtime was initialised when the context was made.
        unsafe { result::set_device(self.lib(), self.device) }?;
        self.binds.fetch_add(1, Ordering::SeqCst);
        BOUND.with(|b| b.set(self.generation));
        Ok(())
    }

    /// Runs a release call in `Drop`: binds, calls, defers any error.
    fn release(&self, f: impl FnOnce(&AclLib) -> Result<()>) {
        if let Err(e) = self.bind().and_then(|_| f(self.lib())) {
            self.rt.defer(e);
        }
    }
}

impl Drop for DeviceCtx {
    fn drop(&mut self) {
        // Every stream, event and allocation holds this context, so all of
        // them are released by now: reset is last, as ACL wants it.
        let binds = self.binds.swap(0, Ordering::SeqCst);
        for _ in 0..binds {
            // SAFETY: nothing of this device is used after this point.
            if let Err(e) = unsafe { result::reset_device(self.lib(), self.device) } {
                self.rt.defer(e);
            }
        }
        BOUND.with(|b| {
            if b.get() == self.generation {
                b.set(0);
            }
        });
    }
}

/// A raw ACL handle that may cross threads (ACL handles are thread-safe).
#[derive(Clone, Copy)]
struct Raw(*mut c_void);

// SAFETY: ACL stream and event handles and device pointers are opaque
// values that the runtime allows to be used from any thread.
unsafe impl Send for Raw {}
// SAFETY: as above.
unsafe impl Sync for Raw {}

/// An ACL stream.
pub struct AscendStream {
    ctx: Arc<DeviceCtx>,
    raw: Raw,
    state: Arc<StreamState>,
}

impl Drop for AscendStream {
    fn drop(&mut self) {
        // SAFETY: the stream is live and destroyed once, here.
        self.ctx
            .release(|lib| unsafe { result::destroy_stream(lib, self.raw.0) });
    }
}

/// An ACL event.
pub struct AscendEvent {
    ctx: Arc<DeviceCtx>,
    raw: Raw,
    mark: EventMark,
}

impl Drop for AscendEvent {
    fn drop(&mut self) {
        // SAFETY: the event is live and destroyed once, here.
        self.ctx
            .release(|lib| unsafe { result::destroy_event(lib, self.raw.0) });
    }
}

enum AllocKind {
    Device,
    Host,
    Registered,
}

/// Releases an allocation or registration when the last `Memory` goes.
struct Alloc {
    ctx: Arc<DeviceCtx>,
    ptr: Raw,
    kind: AllocKind,
}

impl Drop for Alloc {
    fn drop(&mut self) {
        let p = self.ptr.0;
        self.ctx.release(|lib| {
            // Queued copies may still use the memory: drain the device first.
            // SAFETY: the pointer is live and released once, here, after all
            // queued work on this device completed.
            unsafe {
                result::synchronize_device(lib)?;
                match self.kind {
                    AllocKind::Device => result::free(lib, p),
                    AllocKind::Host => result::free_host(lib, p),
                    AllocKind::Registered => result::host_unregister(lib, p),
                }
            }
        });
    }
}

/// A Device on one Ascend NPU through ACL.
pub struct AscendDevice {
    ctx: Arc<DeviceCtx>,
    id: DeviceId,
    use_batch_api: AtomicBool,
}

impl AscendDevice {
    /// Opens NPU `device` through the library found as the module docs say.
    pub fn new(device: i32) -> Result<Self> {
        Self::with_runtime(load_default()?, device)
    }

    /// Opens NPU `device` through an already loaded runtime.
    pub fn with_runtime(rt: Arc<Runtime>, device: i32) -> Result<Self> {
        // SAFETY: the runtime was initialised by `load_library`.
        let count = unsafe { result::device_count(&rt.lib) }?;
        if device < 0 || device as u32 >= count {
            return Err(DeviceError::InvalidArgument(format!(
                "NPU {device} does not exist ({count} found)"
            )));
        }
        let generation = rt.generation.fetch_add(1, Ordering::Relaxed);
        let ctx = Arc::new(DeviceCtx {
            rt,
            device,
            generation,
            binds: AtomicUsize::new(0),
        });
        ctx.bind()?;
        // SAFETY: symbols resolved at load.
        let batch = result::has_batch_copy(ctx.lib());
        Ok(AscendDevice {
            ctx,
            id: DeviceId::fresh(),
            use_batch_api: AtomicBool::new(batch),
        })
    }

    /// The runtime this device uses.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.ctx.rt
    }

    /// Whether batched copies go through `aclrtMemcpyBatchAsync` (when the
    /// library exports it) or a loop of `aclrtMemcpyAsync`.
    pub fn batch_api(&self) -> bool {
        self.use_batch_api.load(Ordering::Relaxed)
    }

    /// Chooses the batch API (when exported) or the loop; for tests and
    /// benchmarks of both paths.
    pub fn set_batch_api(&self, on: bool) {
        let available = result::has_batch_copy(self.ctx.lib());
        self.use_batch_api.store(on && available, Ordering::Relaxed);
    }

    /// The raw baseline of `ucm bench device`: `aclrtMemcpyAsync` of
    /// `chunk`-byte pieces straight through the `result` layer on a private
    /// stream, then `aclrtSynchronizeStream`. Regions are validated first.
    pub fn raw_copy(&self, dst: &Memory, src: &Memory, len: usize, chunk: usize) -> Result<()> {
        let kind = CopyRun::new(dst, 0, src, 0, len).validate(self.id, ACL_COPY_ALIGN)?;
        if chunk == 0 || chunk % ACL_COPY_ALIGN != 0 {
            return Err(DeviceError::InvalidArgument(format!(
                "chunk {chunk} is not a positive multiple of {ACL_COPY_ALIGN}"
            )));
        }
        let stream = self.create_stream()?;
        let lib = self.ctx.lib();
        let mut off = 0;
        while off < len {
            let n = chunk.min(len - off);
            // SAFETY: validated above: same device, in bounds, 64-byte
            // aligned starts and chunk offsets; both regions outlive the
            // synchronisation below.
            unsafe {
                result::memcpy_async(
                    lib,
                    (dst.addr() as usize + off) as *mut c_void,
                    dst.len() - off,
                    (src.addr() as usize + off) as *const c_void,
                    n,
                    acl_kind(kind),
                    stream.raw.0,
                )
            }?;
            off += n;
        }
        // SAFETY: live stream of this device.
        unsafe { result::synchronize_stream(lib, stream.raw.0) }
    }

    fn check_stream(&self, s: &AscendStream) -> Result<()> {
        same_device(&self.ctx, &s.ctx, "stream")
    }

    fn check_event(&self, e: &AscendEvent) -> Result<()> {
        same_device(&self.ctx, &e.ctx, "event")
    }

    fn memory(
        &self,
        kind: MemKind,
        ptr: *mut c_void,
        len: usize,
        alloc: Option<AllocKind>,
    ) -> Memory {
        let owner: Box<dyn std::any::Any + Send + Sync> = match alloc {
            Some(kind) => Box::new(Alloc {
                ctx: Arc::clone(&self.ctx),
                ptr: Raw(ptr),
                kind,
            }),
            None => Box::new(Arc::clone(&self.ctx)),
        };
        Memory::from_parts(self.id, kind, ptr as u64, len, owner)
    }
}

fn acl_kind(k: CopyKind) -> sys::aclrtMemcpyKind {
    match k {
        CopyKind::HostToDevice => sys::ACL_MEMCPY_HOST_TO_DEVICE,
        CopyKind::DeviceToHost => sys::ACL_MEMCPY_DEVICE_TO_HOST,
        CopyKind::DeviceToDevice => sys::ACL_MEMCPY_DEVICE_TO_DEVICE,
    }
}

fn location(kind: MemKind, device: i32) -> sys::aclrtMemLocation {
    sys::aclrtMemLocation {
        id: if kind == MemKind::Device {
            device as u32
        } else {
            0
        },
        type_: if kind == MemKind::Device {
            sys::ACL_MEM_LOCATION_TYPE_DEVICE
        } else {
            sys::ACL_MEM_LOCATION_TYPE_HOST
        },
    }
}

impl Device for AscendDevice {
    type Stream = AscendStream;
    type Event = AscendEvent;

    fn name(&self) -> &'static str {
        "ascend"
    }

    fn id(&self) -> DeviceId {
        self.id
    }

    fn copy_alignment(&self) -> usize {
        ACL_COPY_ALIGN
    }

    fn alloc_device(&self, len: usize) -> Result<Memory> {
        check_alloc_len(len)?;
        self.ctx.bind()?;
        // SAFETY: device bound on this thread.
        let p = unsafe { result::malloc(self.ctx.lib(), len) }?;
        Ok(self.memory(MemKind::Device, p, len, Some(AllocKind::Device)))
    }

    fn alloc_pinned(&self, len: usize) -> Result<Memory> {
        check_alloc_len(len)?;
        self.ctx.bind()?;
        // SAFETY: device bound on this thread.
        let p = unsafe { result::malloc_host(self.ctx.lib(), len) }?;
        Ok(self.memory(MemKind::Pinned, p, len, Some(AllocKind::Host)))
    }

    unsafe fn register_host(&self, addr: *mut u8, len: usize) -> Result<Memory> {
        check_region(addr.is_null(), len, "host")?;
        self.ctx.bind()?;
        // SAFETY: the caller guarantees the region (trait contract).
        unsafe { result::host_register(self.ctx.lib(), addr.cast(), len as u64) }?;
        Ok(self.memory(
            MemKind::Pinned,
            addr.cast(),
            len,
            Some(AllocKind::Registered),
        ))
    }

    unsafe fn import_device(&self, addr: u64, len: usize) -> Result<Memory> {
        check_region(addr == 0, len, "device")?;
        Ok(self.memory(MemKind::Device, addr as *mut c_void, len, None))
    }

    fn create_stream(&self) -> Result<AscendStream> {
        self.ctx.bind()?;
        // SAFETY: device bound on this thread.
        let raw = unsafe { result::create_stream(self.ctx.lib()) }?;
        Ok(AscendStream {
            ctx: Arc::clone(&self.ctx),
            raw: Raw(raw),
            state: Arc::new(StreamState::default()),
        })
    }

    fn create_event(&self) -> Result<AscendEvent> {
        self.ctx.bind()?;
        // SAFETY: device bound on this thread.
        let raw = unsafe { result::create_event(self.ctx.lib()) }?;
        Ok(AscendEvent {
            ctx: Arc::clone(&self.ctx),
            raw: Raw(raw),
            mark: EventMark::default(),
        })
    }

    fn copy_async(&self, stream: &AscendStream, run: &CopyRun<'_>) -> Result<()> {
        self.copy_batch_async(stream, std::slice::from_ref(run))
    }

    fn copy_batch_async(&self, stream: &AscendStream, runs: &[CopyRun<'_>]) -> Result<()> {
        self.check_stream(stream)?;
        let runs = CopyRun::validate_batch(runs, self.id, ACL_COPY_ALIGN)?;
        if runs.is_empty() {
            return Ok(());
        }
        self.ctx.bind()?;
        let lib = self.ctx.lib();
        let addr = |m: &Memory, off: usize| (m.addr() as usize + off) as *mut c_void;
        if runs.len() > 1 && self.batch_api() {
            let mut plan = batch_attributes(&runs, |r| sys::aclrtMemcpyBatchAttr {
                dstLoc: location(r.dst.kind(), self.ctx.device),
                srcLoc: location(r.src.kind(), self.ctx.device),
                ..Default::default()
            });
            let run = |i: &usize| runs[*i].0;
            let mut dsts: Vec<_> = plan
                .order
                .iter()
                .map(|i| addr(run(i).dst, run(i).dst_offset))
                .collect();
            let mut maxs: Vec<_> = plan
                .order
                .iter()
                .map(|i| run(i).dst.len() - run(i).dst_offset)
                .collect();
            let mut srcs: Vec<_> = plan
                .order
                .iter()
                .map(|i| addr(run(i).src, run(i).src_offset))
                .collect();
            let mut sizes: Vec<_> = plan.order.iter().map(|i| run(i).len).collect();
            for _ in &runs {
                stream.state.next();
            }
            // SAFETY: every run was validated (bounds, 64-byte alignment,
            // direction) and the regions stay alive: an allocation drains
            // the device before it is released.
            return unsafe {
                result::memcpy_batch_async(
                    lib,
                    &mut dsts,
                    &mut maxs,
                    &mut srcs,
                    &mut sizes,
                    &mut plan.attrs,
                    &mut plan.starts,
                    &plan.order,
                    stream.raw.0,
                )
            };
        }
        for (r, k) in runs {
            stream.state.next();
            // SAFETY: as for the batch above.
            unsafe {
                result::memcpy_async(
                    lib,
                    addr(r.dst, r.dst_offset),
                    r.dst.len() - r.dst_offset,
                    addr(r.src, r.src_offset),
                    r.len,
                    acl_kind(k),
                    stream.raw.0,
                )
            }?;
        }
        Ok(())
    }

    fn launch_host_fn(&self, stream: &AscendStream, f: HostFn) -> Result<()> {
        self.check_stream(stream)?;
        self.ctx.bind()?;
        let at = stream.state.next();
        let call = HostCall::into_raw(f, &stream.state, at);
        // SAFETY: the trampoline takes the box back exactly once and never
        // unwinds; on failure the runtime never calls it, so we reclaim it.
        let r = unsafe {
            result::launch_host_func(self.ctx.lib(), stream.raw.0, host_trampoline, call)
        };
        if r.is_err() {
            // SAFETY: not handed to the runtime.
            unsafe { HostCall::reclaim(call) };
        }
        r
    }

    fn record_event(&self, event: &AscendEvent, stream: &AscendStream) -> Result<()> {
        self.check_stream(stream)?;
        self.check_event(event)?;
        self.ctx.bind()?;
        // SAFETY: live handles of this device, bound on this thread.
        unsafe { result::record_event(self.ctx.lib(), event.raw.0, stream.raw.0) }?;
        event.mark.set(&stream.state);
        Ok(())
    }

    fn query_event(&self, event: &AscendEvent) -> Result<bool> {
        self.check_event(event)?;
        self.ctx.bind()?;
        // SAFETY: live handle of this device, bound on this thread.
        if !unsafe { result::query_event(self.ctx.lib(), event.raw.0) }? {
            return Ok(false);
        }
        match event.mark.error() {
            Some(e) => Err(e),
            None => Ok(true),
        }
    }

    fn synchronize_event(&self, event: &AscendEvent) -> Result<()> {
        self.check_event(event)?;
        self.ctx.bind()?;
        // SAFETY: live handle of this device, bound on this thread.
        unsafe { result::synchronize_event(self.ctx.lib(), event.raw.0) }?;
        match event.mark.error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn stream_wait_event(&self, stream: &AscendStream, event: &AscendEvent) -> Result<()> {
        self.check_stream(stream)?;
        self.check_event(event)?;
        self.ctx.bind()?;
        let Some((on, upto)) = event.mark.get() else {
            return Ok(()); // never recorded: nothing to wait for
        };
        // SAFETY: live handles of this device, bound on this thread.
        unsafe { result::stream_wait_event(self.ctx.lib(), stream.raw.0, event.raw.0) }?;
        stream.state.wait_on(stream.state.next(), on, upto);
        Ok(())
    }

    fn synchronize_stream(&self, stream: &AscendStream) -> Result<()> {
        self.check_stream(stream)?;
        self.ctx.bind()?;
        // SAFETY: live handle of this device, bound on this thread.
        unsafe { result::synchronize_stream(self.ctx.lib(), stream.raw.0) }?;
        match stream.state.error_before(u64::MAX) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Path of the host-memory ACL double built by `build.rs` (empty when the
/// build had no C compiler). For tests.
pub fn double_path() -> Option<PathBuf> {
    static P: OnceLock<Option<PathBuf>> = OnceLock::new();
    P.get_or_init(|| {
        let p = env!("UCM_ACL_DOUBLE_PATH");
        (!p.is_empty()).then(|| PathBuf::from(p))
    })
    .clone()
}

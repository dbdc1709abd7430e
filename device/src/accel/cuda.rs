//! The CUDA backend of the [`Device`] trait (feature `cuda`), through
//! cudarc 0.19 with libcuda loaded at run time, so the crate builds with no
//! CUDA toolkit and runs with no driver (the probe says why).
//!
//! Context handling is cudarc's (`CudaContext`: the primary context, bound
//! to each calling thread); every other call goes through cudarc's `result`
//! and `sys` layers on raw handles held by RAII types whose `Drop` never
//! panics (errors are kept, see [`CudaDevice::take_deferred_errors`]).
//! Sticky errors of host functions follow the same positions scheme as the
//! Ascend backend (`docs/decisions.md`, D17).
//!
//! cudarc opens libcuda by name (`libcuda.so`, then versioned names) through
//! the loader path. `UCM_CUDA_LIB`, when set, names a library file loaded
//! first (once per process); since the loader matches later opens by soname,
//! cudarc then uses that file. This is how tests run the backend against the
//! host-memory double of the driver (`cuda/cuda_double.c`, built by
//! `build.rs`; [`double_path`]), and how a driver outside the loader path can
//! be named.

use std::ffi::c_void;
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::{sys, CudaContext};

use super::sticky::{
    at_run, batch_attributes, host_trampoline, same_device, EventMark, HostCall, StreamState,
};
use super::{
    check_alloc_len, check_region, CopyKind, CopyRun, Device, DeviceId, HostFn, MemKind, Memory,
};
use crate::error::{DeviceError, Result};

fn drv(api: &'static str) -> impl FnOnce(DriverError) -> DeviceError {
    move |e| DeviceError::Driver {
        api,
        code: e.0 as i64,
        message: e
            .error_string()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
    }
}

fn unsupported(reason: String) -> DeviceError {
    DeviceError::Unsupported {
        backend: "cuda",
        reason,
    }
}

/// Why, without the "unsupported" prefix of an `Unsupported` error.
fn reason_of(e: DeviceError) -> String {
    match e {
        DeviceError::Unsupported { reason, .. } => reason,
        other => other.to_string(),
    }
}

/// The library `UCM_CUDA_LIB` or [`preload_library`] loaded, kept for the
/// rest of the process (cudarc holds its symbols).
static PRELOADED: Mutex<Option<(std::path::PathBuf, libloading::Library)>> = Mutex::new(None);

/// Loads the CUDA driver library at `path` before cudarc looks for
/// `libcuda.so`, so that cudarc uses it (the loader matches the soname). Once
/// per process: loading another path after the first is an error, as is a
/// file whose soname is not `libcuda.so`'s (cudarc would not find it).
///
/// # Safety
/// Loading runs the library's initialisers; `path` must be a CUDA driver
/// library (or its test double), and no other libcuda may be in use yet.
pub unsafe fn preload_library(path: &std::path::Path) -> Result<()> {
    let mut slot = PRELOADED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((have, _)) = slot.as_ref() {
        if have == path {
            return Ok(());
        }
        return Err(unsupported(format!(
            "{} is loaded as libcuda already; {} cannot replace it in this process",
            have.display(),
            path.display()
        )));
    }
    // SAFETY: the caller's contract.
    let lib = unsafe { libloading::Library::new(path) }
        .map_err(|e| unsupported(format!("cannot load {}: {e}", path.display())))?;
    // SAFETY: only opens by name; the preloaded file answers if its soname
    // is libcuda.so, else the name resolves elsewhere or not at all.
    let same = unsafe {
        match (
            lib.get::<unsafe extern "C" fn()>(b"cuInit"),
            libloading::Library::new("libcuda.so"),
        ) {
            (Ok(a), Ok(by_name)) => by_name
                .get::<unsafe extern "C" fn()>(b"cuInit")
                .is_ok_and(|b| *a as usize == *b as usize),
            _ => false,
        }
    };
    if !same {
        return Err(unsupported(format!(
            "{}: not found again as libcuda.so (no cuInit, or another soname)",
            path.display()
        )));
    }
    *slot = Some((path.to_path_buf(), lib));
    Ok(())
}

/// Loads `UCM_CUDA_LIB` once, when set; its failure is kept and returned by
/// every later call.
fn preload_from_env() -> Result<()> {
    static DONE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    DONE.get_or_init(
        || match std::env::var_os("UCM_CUDA_LIB").filter(|p| !p.is_empty()) {
            None => Ok(()),
            // SAFETY: the operator names a CUDA driver library (or the double).
            Some(p) => unsafe { preload_library(std::path::Path::new(&p)) }.map_err(reason_of),
        },
    )
    .clone()
    .map_err(|why| unsupported(format!("UCM_CUDA_LIB: {why}")))
}

/// The library loaded in place of the loader's libcuda (`UCM_CUDA_LIB` or
/// [`preload_library`]), and whether it is UCM's host-memory test double
/// (it exports the double's controls). `None`: cudarc's own search.
pub fn preloaded() -> Option<(std::path::PathBuf, bool)> {
    let _ = preload_from_env();
    let slot = PRELOADED.lock().unwrap_or_else(|e| e.into_inner());
    slot.as_ref().map(|(p, lib)| {
        // SAFETY: a symbol lookup only.
        let double = unsafe { lib.get::<unsafe extern "C" fn()>(b"ucm_cuda_double_stats") }.is_ok();
        (p.clone(), double)
    })
}

/// Path of the host-memory CUDA driver double built by `build.rs` (`None`
/// when it could not be built).
pub fn double_path() -> Option<std::path::PathBuf> {
    let p = env!("UCM_CUDA_DOUBLE_PATH");
    (!p.is_empty()).then(|| std::path::PathBuf::from(p))
}

/// True when libcuda can be loaded here. Never panics.
pub fn driver_present() -> bool {
    if preload_from_env().is_err() {
        return false;
    }
    // SAFETY: only tries to dlopen the candidate library names.
    unsafe { sys::is_culib_present() }
}

/// What `ucm info` says of the CUDA backend. Never panics.
pub fn probe() -> (bool, String) {
    if let Err(e) = preload_from_env() {
        return (false, reason_of(e));
    }
    if !driver_present() {
        return (
            false,
            "libcuda not found (no NVIDIA driver on this machine)".into(),
        );
    }
    match CudaContext::device_count() {
        Ok(0) => (false, "the driver reports no CUDA device".into()),
        Ok(n) => {
            // How batched copies reach GPU 0 (the kernel loads here).
            let path = match CudaDevice::new(0) {
                Ok(d) => match d.copy_kernel_unavailable() {
                    None => format!("batched copies: {}", d.copy_path().name()),
                    Some(why) => format!(
                        "batched copies: {} (no copy kernel: {why})",
                        d.copy_path().name()
                    ),
                },
                Err(e) => format!("GPU 0 did not open: {e}"),
            };
            (true, format!("{n} CUDA device(s); {path}"))
        }
        Err(e) => (false, drv("cuInit")(e).to_string()),
    }
}

/// Shared by every handle of one device: the context and the errors that
/// `Drop` implementations could not return.
struct Ctx {
    cu: Arc<CudaContext>,
    deferred: Mutex<Vec<DeviceError>>,
}

impl Ctx {
    fn bind(&self) -> Result<()> {
        self.cu.bind_to_thread().map_err(drv("cuCtxSetCurrent"))
    }

    fn release(&self, api: &'static str, f: impl FnOnce() -> std::result::Result<(), DriverError>) {
        let r = self.bind().and_then(|_| f().map_err(drv(api)));
        if let Err(e) = r {
            log::error!("cuda: deferred error: {e}");
            self.deferred
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(e);
        }
    }
}

/// A raw CUDA handle or pointer that may cross threads.
#[derive(Clone, Copy)]
struct Raw<T>(T);

// SAFETY: CUDA streams, events and addresses are process-wide values that
// the driver allows on any thread once the context is current there.
unsafe impl<T> Send for Raw<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Raw<T> {}

/// A CUDA stream (non-blocking).
pub struct CudaStream {
    ctx: Arc<Ctx>,
    raw: Raw<sys::CUstream>,
    state: Arc<StreamState>,
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        let s = self.raw.0;
        // SAFETY: the stream is live and destroyed once, here.
        self.ctx
            .release("cuStreamDestroy", || unsafe { result::stream::destroy(s) });
    }
}

/// A CUDA event (timing disabled).
pub struct CudaEvent {
    ctx: Arc<Ctx>,
    raw: Raw<sys::CUevent>,
    mark: EventMark,
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        let e = self.raw.0;
        // SAFETY: the event is live and destroyed once, here.
        self.ctx
            .release("cuEventDestroy", || unsafe { result::event::destroy(e) });
    }
}

enum AllocKind {
    Device,
    Host,
    Registered,
}

struct Alloc {
    ctx: Arc<Ctx>,
    addr: Raw<u64>,
    kind: AllocKind,
}

impl Drop for Alloc {
    fn drop(&mut self) {
        let a = self.addr.0;
        let kind = std::mem::replace(&mut self.kind, AllocKind::Device);
        self.ctx.release("cuMemFree", || {
            // Queued copies may still use the memory: drain the context.
            result::ctx::synchronize()?;
            // SAFETY: the allocation is live, released once, and no queued
            // work uses it any more.
            unsafe {
                match kind {
                    AllocKind::Device => result::free_sync(a),
                    AllocKind::Host => result::free_host(a as *mut c_void),
                    AllocKind::Registered => sys::cuMemHostUnregister(a as *mut c_void).result(),
                }
            }
        });
    }
}

/// A kernel of UCM's PTX (`device/cuda/*.ptx`), loaded once per device.
struct Kernel {
    ctx: Arc<Ctx>,
    module: Raw<sys::CUmodule>,
    function: Raw<sys::CUfunction>,
}

impl Drop for Kernel {
    fn drop(&mut self) {
        let m = self.module.0;
        // SAFETY: the module is live and unloaded once; the context is
        // drained first so no launch still uses it.
        self.ctx.release("cuModuleUnload", || {
            result::ctx::synchronize()?;
            unsafe { result::module::unload(m) }
        });
    }
}

const LAYER_COMPUTE_PTX: &str = include_str!("../../cuda/layer_compute.ptx");
const COPY_RUNS_PTX: &str = include_str!("../../cuda/copy_runs.ptx");

/// Runs per launch of the copy kernel: its parameter block (4 KiB at most
/// on every GPU) holds a count and this many (dst, src, len) triples.
pub const COPY_KERNEL_RUNS: usize = 168;
/// Runs of this length or longer go to the copy engines, which reach the
/// bus's rate at that size with one call per run; the kernel serves the
/// shorter ones, where a call per run costs more than the bytes.
pub const COPY_KERNEL_MAX_RUN: usize = 1 << 20;
/// Threads per block of the copy kernel.
const COPY_KERNEL_THREADS: u32 = 512;

/// The copy kernel's parameter block, laid out as `copy_runs.ptx` reads it.
#[repr(C, align(8))]
struct CopyRunsParam {
    count: u32,
    pad: u32,
    runs: [[u64; 3]; COPY_KERNEL_RUNS],
}

const _: () = assert!(std::mem::size_of::<CopyRunsParam>() == 4040);

/// How a batch of copies reaches the GPU ([`CudaDevice::copy_path`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyPath {
    /// UCM's copy kernel for runs under [`COPY_KERNEL_MAX_RUN`] (one launch
    /// per [`COPY_KERNEL_RUNS`] runs), the copy engines for longer ones.
    Kernel,
    /// One `cuMemcpyBatchAsync` per batch (CUDA 12.8+).
    BatchApi,
    /// One `cuMemcpy*Async` per run.
    PerRun,
}

impl CopyPath {
    /// The name `ucm info` and the benches print.
    pub fn name(self) -> &'static str {
        match self {
            CopyPath::Kernel => "kernel",
            CopyPath::BatchApi => "batch_api",
            CopyPath::PerRun => "per_run",
        }
    }
}

/// A Device on one NVIDIA GPU.
pub struct CudaDevice {
    ctx: Arc<Ctx>,
    id: DeviceId,
    use_batch_api: AtomicBool,
    use_copy_kernel: AtomicBool,
    /// Unified addressing, with registered host memory at its host address:
    /// what the copy kernel needs to reach host memory.
    uva: bool,
    kernel: OnceLock<std::result::Result<Kernel, DeviceError>>,
    copy_kernel: OnceLock<std::result::Result<Kernel, DeviceError>>,
}

impl CudaDevice {
    /// Opens GPU `ordinal`. Without a driver this is an `Unsupported` error,
    /// never a panic.
    pub fn new(ordinal: usize) -> Result<Self> {
        preload_from_env()?;
        if !driver_present() {
            return Err(unsupported(
                "libcuda not found (no NVIDIA driver on this machine)".into(),
            ));
        }
        let count = CudaContext::device_count().map_err(drv("cuDeviceGetCount"))?;
        if ordinal >= count.max(0) as usize {
            return Err(DeviceError::InvalidArgument(format!(
                "GPU {ordinal} does not exist ({count} found)"
            )));
        }
        let cu = CudaContext::new(ordinal).map_err(drv("cuDevicePrimaryCtxRetain"))?;
        let attr = |a| cu.attribute(a).map_err(drv("cuDeviceGetAttribute"));
        let uva = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)? == 1
            && attr(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
            )? == 1;
        Ok(CudaDevice {
            ctx: Arc::new(Ctx {
                cu,
                deferred: Mutex::new(Vec::new()),
            }),
            id: DeviceId::fresh(),
            use_batch_api: AtomicBool::new(false),
            use_copy_kernel: AtomicBool::new(true),
            uva,
            kernel: OnceLock::new(),
            copy_kernel: OnceLock::new(),
        })
    }

    /// Loads `name` from the PTX text `ptx`.
    fn load_kernel(&self, ptx: &str, name: &str) -> Result<Kernel> {
        self.ctx.bind()?;
        let image = CString::new(ptx)
            .map_err(|_| DeviceError::InvalidArgument("PTX holds a NUL byte".into()))?;
        // SAFETY: `image` is a NUL-terminated PTX text, alive for the call.
        let module = unsafe { result::module::load_data(image.as_ptr().cast()) }
            .map_err(drv("cuModuleLoadData"))?;
        let name = CString::new(name).unwrap_or_default();
        // SAFETY: `module` is live; the name is NUL-terminated.
        match unsafe { result::module::get_function(module, name) } {
            Ok(f) => Ok(Kernel {
                ctx: Arc::clone(&self.ctx),
                module: Raw(module),
                function: Raw(f),
            }),
            Err(e) => {
                // SAFETY: loaded above, unused.
                let _ = unsafe { result::module::unload(module) };
                Err(drv("cuModuleGetFunction")(e))
            }
        }
    }

    fn layer_kernel(&self) -> Result<&Kernel> {
        let k = self
            .kernel
            .get_or_init(|| self.load_kernel(LAYER_COMPUTE_PTX, "ucm_layer_compute"));
        k.as_ref().map_err(Clone::clone)
    }

    /// The copy kernel, where it can serve: unified addressing, and the
    /// module loads (a driver too old for its PTX cannot JIT it).
    fn copy_kernel(&self) -> Result<&Kernel> {
        if !self.uva {
            return Err(unsupported(
                "no unified addressing with host pointers for registered memory".into(),
            ));
        }
        let k = self
            .copy_kernel
            .get_or_init(|| self.load_kernel(COPY_RUNS_PTX, "ucm_copy_runs"));
        k.as_ref().map_err(Clone::clone)
    }

    /// The path batched copies take now: the copy kernel where it can serve
    /// and is on ([`set_copy_kernel`](Self::set_copy_kernel)), else the
    /// batch API where chosen, else a call per run. Loads the kernel on
    /// first use; why it cannot serve is [`copy_kernel_unavailable`](Self::copy_kernel_unavailable).
    pub fn copy_path(&self) -> CopyPath {
        if self.use_copy_kernel.load(Ordering::Relaxed) && self.copy_kernel().is_ok() {
            CopyPath::Kernel
        } else if self.batch_api() {
            CopyPath::BatchApi
        } else {
            CopyPath::PerRun
        }
    }

    /// Why the copy kernel cannot serve on this device, or `None` when it
    /// can.
    pub fn copy_kernel_unavailable(&self) -> Option<String> {
        self.copy_kernel().err().map(|e| e.to_string())
    }

    /// Turns the copy kernel on (the default) or off; off, batches take the
    /// batch API or a call per run.
    pub fn set_copy_kernel(&self, on: bool) {
        self.use_copy_kernel.store(on, Ordering::Relaxed);
    }

    /// Queues one layer's worth of real compute on `stream`: a kernel over
    /// the floats of `buf` (device memory of this device) that runs `iters`
    /// dependent FMAs per element. Used by `ucm bench device` to measure how
    /// much I/O a layerwise pipeline hides.
    pub fn launch_layer_compute(
        &self,
        stream: &CudaStream,
        buf: &Memory,
        iters: u32,
    ) -> Result<()> {
        self.check_stream(stream)?;
        if buf.device() != self.id || buf.kind() != MemKind::Device || buf.len() < 4 {
            return Err(DeviceError::InvalidArgument(
                "layer compute needs device memory of this GPU, at least 4 bytes".into(),
            ));
        }
        let k = self.layer_kernel()?;
        self.ctx.bind()?;
        let mut x = buf.addr();
        let mut n = (buf.len() / 4) as u64;
        let mut it = iters;
        let mut params: [*mut c_void; 3] = [
            (&mut x as *mut u64).cast(),
            (&mut n as *mut u64).cast(),
            (&mut it as *mut u32).cast(),
        ];
        let threads = 256u32;
        let blocks = n.div_ceil(threads as u64).min(132 * 16) as u32;
        stream.state.next();
        // SAFETY: the kernel's parameters are (u64 ptr, u64 n, u32 iters),
        // matching `params`; `x` is device memory of `n` floats that lives
        // until the context is drained.
        unsafe {
            result::launch_kernel(
                k.function.0,
                (blocks, 1, 1),
                (threads, 1, 1),
                0,
                stream.raw.0,
                &mut params,
            )
        }
        .map_err(drv("cuLaunchKernel"))
    }

    /// Blocks the calling thread until an event the engine recorded (a
    /// `CUevent` handed over as an integer, as upstream UCM's
    /// `prerequisite_handle`) has completed.
    ///
    /// # Safety
    /// `raw` must be a live `CUevent` of this device's context, not
    /// destroyed during the call.
    pub unsafe fn synchronize_raw_event(&self, raw: u64) -> Result<()> {
        if raw == 0 {
            return Err(DeviceError::InvalidArgument("a NULL event".into()));
        }
        self.ctx.bind()?;
        // SAFETY: the caller guarantees a live event of this context (the
        // function's contract); the context is current on this thread.
        unsafe { sys::cuEventSynchronize(raw as sys::CUevent) }
            .result()
            .map_err(drv("cuEventSynchronize"))
    }

    /// Errors that `Drop` implementations recorded instead of panicking.
    pub fn take_deferred_errors(&self) -> Vec<DeviceError> {
        std::mem::take(&mut *self.ctx.deferred.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// True when the driver exports `cuMemcpyBatchAsync` (CUDA 12.8+).
    pub fn batch_api_available(&self) -> bool {
        // SAFETY: the library is present (checked in `new`); looking up a
        // symbol has no other precondition.
        unsafe {
            sys::culib()
                .get::<unsafe extern "C" fn()>(b"cuMemcpyBatchAsync")
                .is_ok()
        }
    }

    /// Whether batched copies use `cuMemcpyBatchAsync` (off by default until
    /// a GPU run shows it is faster than the loop; see the README).
    pub fn batch_api(&self) -> bool {
        self.use_batch_api.load(Ordering::Relaxed)
    }

    /// Chooses `cuMemcpyBatchAsync` (when the driver has it) or the loop.
    pub fn set_batch_api(&self, on: bool) {
        let on = on && self.batch_api_available();
        self.use_batch_api.store(on, Ordering::Relaxed);
    }

    /// The raw baseline of `ucm bench device`: `cuMemcpy*Async` of
    /// `chunk`-byte pieces through cudarc's `sys` layer on a private
    /// stream, then `cuStreamSynchronize`.
    pub fn raw_copy(&self, dst: &Memory, src: &Memory, len: usize, chunk: usize) -> Result<()> {
        let kind = CopyRun::new(dst, 0, src, 0, len).validate(self.id, 1)?;
        if chunk == 0 {
            return Err(DeviceError::InvalidArgument(
                "chunk must be positive".into(),
            ));
        }
        let stream = self.create_stream()?;
        let mut off = 0;
        while off < len {
            let n = chunk.min(len - off);
            // SAFETY: validated in bounds above; both regions outlive the
            // synchronisation below.
            unsafe {
                raw_copy(
                    kind,
                    dst.addr() + off as u64,
                    src.addr() + off as u64,
                    n,
                    stream.raw.0,
                )
            }?;
            off += n;
        }
        // SAFETY: live stream.
        unsafe { result::stream::synchronize(stream.raw.0) }.map_err(drv("cuStreamSynchronize"))
    }

    /// Runs through the copy kernel: one launch per [`COPY_KERNEL_RUNS`],
    /// one thread block per run, on `stream`, with no host synchronisation.
    fn kernel_copies(&self, stream: &CudaStream, runs: &[(&CopyRun<'_>, CopyKind)]) -> Result<()> {
        let k = self.copy_kernel()?;
        for (c, chunk) in runs.chunks(COPY_KERNEL_RUNS).enumerate() {
            let mut p = CopyRunsParam {
                count: chunk.len() as u32,
                pad: 0,
                runs: [[0; 3]; COPY_KERNEL_RUNS],
            };
            for (slot, (r, _)) in p.runs.iter_mut().zip(chunk) {
                *slot = [
                    r.dst.addr() + r.dst_offset as u64,
                    r.src.addr() + r.src_offset as u64,
                    r.len as u64,
                ];
            }
            for _ in chunk {
                stream.state.next();
            }
            let mut params: [*mut c_void; 1] = [(&mut p as *mut CopyRunsParam).cast()];
            // SAFETY: the kernel takes one parameter block laid out as
            // `CopyRunsParam` (checked in size above), copied at launch;
            // every run was validated (same device, in bounds, device or
            // page-locked memory, which unified addressing maps at these
            // addresses) and its memory stays alive until the context is
            // drained.
            unsafe {
                result::launch_kernel(
                    k.function.0,
                    (chunk.len() as u32, 1, 1),
                    (COPY_KERNEL_THREADS, 1, 1),
                    0,
                    stream.raw.0,
                    &mut params,
                )
            }
            .map_err(|e| at_run(drv("cuLaunchKernel")(e), c * COPY_KERNEL_RUNS))?;
        }
        Ok(())
    }

    /// Batched copies through the copy engines: the batch API where chosen,
    /// else one call per run.
    fn engine_copies(
        &self,
        stream: &CudaStream,
        runs: Vec<(&CopyRun<'_>, CopyKind)>,
    ) -> Result<()> {
        if runs.is_empty() {
            return Ok(());
        }
        let s = stream.raw.0;
        if runs.len() > 1 && self.batch_api() {
            let ordinal = self.ctx.cu.ordinal();
            let mut plan = batch_attributes(&runs, |r| sys::CUmemcpyAttributes {
                srcAccessOrder: sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
                srcLocHint: location(r.src.kind(), ordinal),
                dstLocHint: location(r.dst.kind(), ordinal),
                flags: 0,
            });
            let mut dsts: Vec<u64> = plan
                .order
                .iter()
                .map(|&i| runs[i].0.dst.addr() + runs[i].0.dst_offset as u64)
                .collect();
            let mut srcs: Vec<u64> = plan
                .order
                .iter()
                .map(|&i| runs[i].0.src.addr() + runs[i].0.src_offset as u64)
                .collect();
            let mut sizes: Vec<usize> = plan.order.iter().map(|&i| runs[i].0.len).collect();
            for _ in &runs {
                stream.state.next();
            }
            let mut fail = usize::MAX;
            // SAFETY: every run was validated; the copy arrays have one entry
            // per run, `plan.attrs` and `plan.starts` one per group (`starts[0] == 0`,
            // increasing, below the run count); memory stays alive
            // (allocations drain the context before release).
            return unsafe {
                sys::cuMemcpyBatchAsync(
                    dsts.as_mut_ptr(),
                    srcs.as_mut_ptr(),
                    sizes.as_mut_ptr(),
                    dsts.len(),
                    plan.attrs.as_mut_ptr(),
                    plan.starts.as_mut_ptr(),
                    plan.attrs.len(),
                    &mut fail,
                    s,
                )
            }
            .result()
            .map_err(|e| at_run(drv("cuMemcpyBatchAsync")(e), plan.run_at(fail)));
        }
        for (r, k) in runs {
            stream.state.next();
            // SAFETY: validated (same device, in bounds, legal direction);
            // memory stays alive until the context is drained.
            unsafe {
                raw_copy(
                    k,
                    r.dst.addr() + r.dst_offset as u64,
                    r.src.addr() + r.src_offset as u64,
                    r.len,
                    s,
                )
            }?;
        }
        Ok(())
    }

    fn check_stream(&self, s: &CudaStream) -> Result<()> {
        same_device(&self.ctx, &s.ctx, "stream")
    }

    fn check_event(&self, e: &CudaEvent) -> Result<()> {
        same_device(&self.ctx, &e.ctx, "event")
    }

    fn memory(&self, kind: MemKind, addr: u64, len: usize, alloc: Option<AllocKind>) -> Memory {
        let owner: Box<dyn std::any::Any + Send + Sync> = match alloc {
            Some(kind) => Box::new(Alloc {
                ctx: Arc::clone(&self.ctx),
                addr: Raw(addr),
                kind,
            }),
            None => Box::new(Arc::clone(&self.ctx)),
        };
        Memory::from_parts(self.id, kind, addr, len, owner)
    }
}

/// One async copy through the driver.
///
/// # Safety
/// 1. The context is current on this thread and `stream` is live.
/// 2. `[dst, dst + n)` and `[src, src + n)` are valid memory of the kinds
///    `kind` names until the copy completes.
unsafe fn raw_copy(
    kind: CopyKind,
    dst: u64,
    src: u64,
    n: usize,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: per the contract.
    unsafe {
        match kind {
            CopyKind::HostToDevice => {
                sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, n, stream)
                    .result()
                    .map_err(drv("cuMemcpyHtoDAsync"))
            }
            CopyKind::DeviceToHost => sys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, n, stream)
                .result()
                .map_err(drv("cuMemcpyDtoHAsync")),
            CopyKind::DeviceToDevice => sys::cuMemcpyDtoDAsync_v2(dst, src, n, stream)
                .result()
                .map_err(drv("cuMemcpyDtoDAsync")),
        }
    }
}

fn location(kind: MemKind, ordinal: usize) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: match kind {
            MemKind::Device => sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            MemKind::Pinned => sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
        },
        id: if kind == MemKind::Device {
            ordinal as i32
        } else {
            0
        },
    }
}

impl Device for CudaDevice {
    type Stream = CudaStream;
    type Event = CudaEvent;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn id(&self) -> DeviceId {
        self.id
    }

    fn copy_alignment(&self) -> usize {
        1
    }

    fn alloc_device(&self, len: usize) -> Result<Memory> {
        check_alloc_len(len)?;
        self.ctx.bind()?;
        // SAFETY: context current on this thread.
        let p = unsafe { result::malloc_sync(len) }.map_err(drv("cuMemAlloc"))?;
        Ok(self.memory(MemKind::Device, p, len, Some(AllocKind::Device)))
    }

    fn alloc_pinned(&self, len: usize) -> Result<Memory> {
        check_alloc_len(len)?;
        self.ctx.bind()?;
        // Mapped for the copy kernel (implied with unified addressing).
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: context current on this thread.
        let p = unsafe { result::malloc_host(len, flags) }.map_err(drv("cuMemHostAlloc"))?;
        Ok(self.memory(MemKind::Pinned, p as u64, len, Some(AllocKind::Host)))
    }

    unsafe fn register_host(&self, addr: *mut u8, len: usize) -> Result<Memory> {
        check_region(addr.is_null(), len, "host")?;
        self.ctx.bind()?;
        // Mapped for the copy kernel (implied with unified addressing).
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: the caller guarantees the region (trait contract).
        unsafe { sys::cuMemHostRegister_v2(addr.cast(), len, flags) }
            .result()
            .map_err(drv("cuMemHostRegister"))?;
        Ok(self.memory(
            MemKind::Pinned,
            addr as u64,
            len,
            Some(AllocKind::Registered),
        ))
    }

    unsafe fn import_device(&self, addr: u64, len: usize) -> Result<Memory> {
        check_region(addr == 0, len, "device")?;
        Ok(self.memory(MemKind::Device, addr, len, None))
    }

    fn create_stream(&self) -> Result<CudaStream> {
        self.ctx.bind()?;
        let raw = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(drv("cuStreamCreate"))?;
        Ok(CudaStream {
            ctx: Arc::clone(&self.ctx),
            raw: Raw(raw),
            state: Arc::new(StreamState::default()),
        })
    }

    fn create_event(&self) -> Result<CudaEvent> {
        self.ctx.bind()?;
        let raw = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(drv("cuEventCreate"))?;
        Ok(CudaEvent {
            ctx: Arc::clone(&self.ctx),
            raw: Raw(raw),
            mark: EventMark::default(),
        })
    }

    fn copy_async(&self, stream: &CudaStream, run: &CopyRun<'_>) -> Result<()> {
        self.copy_batch_async(stream, std::slice::from_ref(run))
    }

    fn copy_batch_async(&self, stream: &CudaStream, runs: &[CopyRun<'_>]) -> Result<()> {
        self.check_stream(stream)?;
        let runs = CopyRun::validate_batch(runs, self.id, 1)?;
        if runs.is_empty() {
            return Ok(());
        }
        self.ctx.bind()?;
        // The kernel takes the short runs when there are two or more; a
        // single one is a call to the copy engines like the long ones.
        let short = |r: &CopyRun<'_>| r.len < COPY_KERNEL_MAX_RUN;
        if runs.iter().filter(|(r, _)| short(r)).count() > 1 && self.copy_path() == CopyPath::Kernel
        {
            let (small, long): (Vec<_>, Vec<_>) = runs.into_iter().partition(|(r, _)| short(r));
            self.kernel_copies(stream, &small)?;
            return self.engine_copies(stream, long);
        }
        self.engine_copies(stream, runs)
    }

    fn launch_host_fn(&self, stream: &CudaStream, f: HostFn) -> Result<()> {
        self.check_stream(stream)?;
        self.ctx.bind()?;
        let at = stream.state.next();
        let call = HostCall::into_raw(f, &stream.state, at);
        // SAFETY: the trampoline takes the box back once and never unwinds.
        let r =
            unsafe { result::stream::launch_host_function(stream.raw.0, host_trampoline, call) }
                .map_err(drv("cuLaunchHostFunc"));
        if r.is_err() {
            // SAFETY: not handed to the driver.
            unsafe { HostCall::reclaim(call) };
        }
        r
    }

    fn record_event(&self, event: &CudaEvent, stream: &CudaStream) -> Result<()> {
        self.check_stream(stream)?;
        self.check_event(event)?;
        self.ctx.bind()?;
        // SAFETY: live handles of this context.
        unsafe { result::event::record(event.raw.0, stream.raw.0) }
            .map_err(drv("cuEventRecord"))?;
        event.mark.set(&stream.state);
        Ok(())
    }

    fn query_event(&self, event: &CudaEvent) -> Result<bool> {
        self.check_event(event)?;
        self.ctx.bind()?;
        // SAFETY: live handle of this context.
        match unsafe { result::event::query(event.raw.0) } {
            Ok(()) => match event.mark.error() {
                Some(e) => Err(e),
                None => Ok(true),
            },
            Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_READY)) => Ok(false),
            Err(e) => Err(drv("cuEventQuery")(e)),
        }
    }

    fn synchronize_event(&self, event: &CudaEvent) -> Result<()> {
        self.check_event(event)?;
        self.ctx.bind()?;
        // SAFETY: live handle of this context.
        unsafe { result::event::synchronize(event.raw.0) }.map_err(drv("cuEventSynchronize"))?;
        match event.mark.error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn stream_wait_event(&self, stream: &CudaStream, event: &CudaEvent) -> Result<()> {
        self.check_stream(stream)?;
        self.check_event(event)?;
        self.ctx.bind()?;
        let Some((on, upto)) = event.mark.get() else {
            return Ok(()); // never recorded: nothing to wait for
        };
        // SAFETY: live handles of this context.
        unsafe {
            result::stream::wait_event(
                stream.raw.0,
                event.raw.0,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(drv("cuStreamWaitEvent"))?;
        stream.state.wait_on(stream.state.next(), on, upto);
        Ok(())
    }

    fn synchronize_stream(&self, stream: &CudaStream) -> Result<()> {
        self.check_stream(stream)?;
        self.ctx.bind()?;
        // SAFETY: live handle of this context.
        unsafe { result::stream::synchronize(stream.raw.0) }.map_err(drv("cuStreamSynchronize"))?;
        match stream.state.error_before(u64::MAX) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

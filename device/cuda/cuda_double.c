/*
 * A host-memory stand-in for libcuda: the CUDA driver subset that cudarc and
 * ucm-device's CUDA backend call, on plain memory, with one worker thread per
 * stream. Built by device/build.rs (feature `cuda`) with the soname
 * `libcuda.so`: once a process has loaded it by path (UCM_CUDA_LIB, or
 * `cuda::preload_library`), cudarc's dlopen("libcuda.so") finds it, so the
 * backend's real loading path runs in tests on machines without a GPU.
 *
 * Model:
 *   - "device" memory is host memory tagged as device; pinned allocations and
 *     registered ranges are tagged as host. Every copy is checked against the
 *     tags: a host-to-device call needs device memory at dst and host memory
 *     at src, and so on; a host-to-host copy through a device call, a null
 *     pointer or a range outside its allocation is CUDA_ERROR_INVALID_VALUE.
 *   - each stream is an in-order queue run by a thread; events carry epochs
 *     (a record completes when the stream reaches it; a wait holds the stream
 *     until the epoch the event had when the wait was queued): the machinery
 *     shared with the ACL double, ../doubles/stream_queue.h.
 *   - a launch of `ucm_layer_compute` (device/cuda/layer_compute.ptx) runs a
 *     host loop with the same arithmetic; a launch of `ucm_copy_runs`
 *     (device/cuda/copy_runs.ptx) reads its parameter block as the kernel
 *     does (a u32 count at 0, then (dst, src, len) u64 triples at 8 + 24 i)
 *     and copies each run; each end must lie in device memory or in
 *     registered or pinned host memory (a GPU faults on pageable memory:
 *     CUDA_ERROR_ILLEGAL_ADDRESS). Other kernels are not found.
 *   - unified addressing and host pointers for registered memory are
 *     reported (device attributes 41 and 91), as on 64-bit Linux GPUs.
 *   - one primary context per device, reference counted; calls need cuInit
 *     and a current context. A stream error is sticky for the context (as
 *     CUDA's asynchronous errors are) until its last release.
 *   - stricter than CUDA where that catches bugs of the caller: freeing or
 *     unregistering memory, or unloading a module, that work still queued on
 *     a stream uses is CUDA_ERROR_ILLEGAL_STATE. An event may be destroyed
 *     while records or waits of it are queued (CUDA allows it): it is freed
 *     after them. A stream with queued work may be destroyed: its work runs
 *     first.
 *
 * Test controls (not CUDA):
 *   ucm_cuda_double_fail_next(api, code): the next call of `api` returns code;
 *   ucm_cuda_double_fail_stream(code): the next operation a stream runs
 *     fails with `code` (a sticky context error);
 *   ucm_cuda_double_stats(out): counters of live resources and calls.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../doubles/stream_queue.h"

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void (*CUhostFn)(void *);

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_IMAGE 200
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_ILLEGAL_STATE 401
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_ILLEGAL_ADDRESS 700
#define CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED 713
#define CUDA_ERROR_LAUNCH_FAILED 719

#define MAGIC_STREAM 0x5354524du
#define MAGIC_EVENT 0x4556544eu
#define MAGIC_MODULE 0x4d4f444cu
#define MAGIC_FUNC 0x46554e43u
#define MAGIC_CTX 0x43545854u

/* ---- errors and fault injection ---------------------------------------- */

static int g_fail_stream_code;

void ucm_cuda_double_fail_next(const char *api, int code) { dq_fail_next(api, code); }

void ucm_cuda_double_fail_stream(int code) {
    pthread_mutex_lock(&g_lock);
    g_fail_stream_code = code;
    pthread_mutex_unlock(&g_lock);
}

#define injected dq_injected

CUresult cuGetErrorName(CUresult error, const char **pStr);

CUresult cuGetErrorString(CUresult error, const char **pStr) {
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    const char *s;
    switch (error) {
    case CUDA_SUCCESS: s = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: s = "invalid argument (double)"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: s = "out of memory (double)"; break;
    case CUDA_ERROR_NOT_INITIALIZED: s = "initialization error: cuInit not called (double)"; break;
    case CUDA_ERROR_NO_DEVICE: s = "no CUDA-capable device is detected (double)"; break;
    case CUDA_ERROR_INVALID_DEVICE: s = "invalid device ordinal (double)"; break;
    case CUDA_ERROR_INVALID_IMAGE: s = "device kernel image is invalid (double)"; break;
    case CUDA_ERROR_INVALID_CONTEXT: s = "invalid device context (double)"; break;
    case CUDA_ERROR_INVALID_HANDLE: s = "invalid resource handle (double)"; break;
    case CUDA_ERROR_ILLEGAL_STATE: s = "operation not permitted: in use by queued work (double)"; break;
    case CUDA_ERROR_NOT_FOUND: s = "named symbol not found (double)"; break;
    case CUDA_ERROR_NOT_READY: s = "device not ready (double)"; break;
    case CUDA_ERROR_ILLEGAL_ADDRESS: s = "an illegal memory access was encountered (double)"; break;
    case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: s = "part or all of the range is already registered (double)"; break;
    case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: s = "pointer does not correspond to a registered region (double)"; break;
    case CUDA_ERROR_LAUNCH_FAILED: s = "unspecified launch failure (double)"; break;
    default: s = "injected or unknown error (double)"; break;
    }
    *pStr = s;
    return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char **pStr) {
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    static __thread char buf[48];
    snprintf(buf, sizeof buf, "CUDA_ERROR_%d", error);
    *pStr = error == CUDA_SUCCESS ? "CUDA_SUCCESS" : buf;
    return CUDA_SUCCESS;
}

/* ---- counters ----------------------------------------------------------- */

typedef struct {
    int64_t init_calls, retains, releases;
    int64_t live_streams, live_events, live_device_allocs, live_host_allocs, live_registrations;
    int64_t live_modules, copies, batch_calls, kernel_launches, host_fns;
} ucm_cuda_double_stats_t;

static ucm_cuda_double_stats_t g_stats;

void ucm_cuda_double_stats(ucm_cuda_double_stats_t *out) {
    pthread_mutex_lock(&g_lock);
    *out = g_stats;
    pthread_mutex_unlock(&g_lock);
}

/* ---- init, devices, contexts ------------------------------------------- */

typedef struct ctx {
    uint32_t magic;
    int device;
    int64_t refs;
    int sticky; /* a stream error: returned by every later call until the last release */
} ctx_t;

#define MAX_DEVICES 8
static ctx_t g_ctx[MAX_DEVICES];
static int g_initialized;
static __thread ctx_t *t_current;

static int device_count(void) {
    const char *e = getenv("UCM_CUDA_DOUBLE_DEVICES");
    int n = e ? atoi(e) : 1;
    return n < 0 ? 0 : (n > MAX_DEVICES ? MAX_DEVICES : n);
}

CUresult cuInit(unsigned int flags) {
    int c = injected("cuInit");
    if (c) return c;
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    g_initialized = 1;
    g_stats.init_calls++;
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

#define NEED_INIT(api)                                  \
    do {                                                \
        int c_ = injected(api);                         \
        if (c_) return c_;                              \
        if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED; \
    } while (0)

/* Runtime calls need a current, retained context without a sticky error. */
#define NEED_CTX(api)                                                   \
    do {                                                                \
        NEED_INIT(api);                                                 \
        if (!t_current || t_current->refs <= 0) return CUDA_ERROR_INVALID_CONTEXT; \
        if (t_current->sticky) return t_current->sticky;                \
    } while (0)

CUresult cuDeviceGetCount(int *count) {
    NEED_INIT("cuDeviceGetCount");
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = device_count();
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    NEED_INIT("cuDeviceGet");
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (device_count() == 0) return CUDA_ERROR_NO_DEVICE;
    if (ordinal < 0 || ordinal >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev) {
    NEED_INIT("cuDeviceGetAttribute");
    if (!pi) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
    switch (attrib) {
    case 75: *pi = 9; break; /* compute capability major */
    case 76: *pi = 0; break; /* minor */
    case 16: *pi = 132; break; /* multiprocessors */
    case 41: *pi = 1; break; /* unified addressing */
    case 91: *pi = 1; break; /* can use host pointer for registered memory */
    default: *pi = 0; break; /* memory pools and the rest: not supported */
    }
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(void **pctx, CUdevice dev) {
    NEED_INIT("cuDevicePrimaryCtxRetain");
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_lock);
    ctx_t *c = &g_ctx[dev];
    c->magic = MAGIC_CTX;
    c->device = dev;
    c->refs++;
    g_stats.retains++;
    pthread_mutex_unlock(&g_lock);
    *pctx = c;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    NEED_INIT("cuDevicePrimaryCtxRelease");
    if (dev < 0 || dev >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_lock);
    ctx_t *c = &g_ctx[dev];
    int r = CUDA_SUCCESS;
    if (c->refs <= 0) {
        r = CUDA_ERROR_INVALID_CONTEXT;
    } else if (--c->refs == 0) {
        c->sticky = 0; /* the context is destroyed: a new one starts clean */
    }
    g_stats.releases++;
    pthread_mutex_unlock(&g_lock);
    return r;
}

CUresult cuCtxGetCurrent(void **pctx) {
    NEED_INIT("cuCtxGetCurrent");
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    *pctx = t_current;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(void *ctx) {
    NEED_INIT("cuCtxSetCurrent");
    ctx_t *c = ctx;
    if (c && (c->magic != MAGIC_CTX || c->refs <= 0)) return CUDA_ERROR_INVALID_CONTEXT;
    t_current = c;
    return CUDA_SUCCESS;
}

/* ---- memory tags -------------------------------------------------------- */

enum tag { TAG_DEVICE = 1, TAG_HOST = 2, TAG_REGISTERED = 3 };

typedef struct region {
    uintptr_t base;
    size_t len;
    enum tag tag;
    int64_t users; /* queued operations touching it */
    struct region *next;
} region_t;

static region_t *g_regions;

static region_t *find_locked(uintptr_t p) {
    for (region_t *r = g_regions; r; r = r->next)
        if (p >= r->base && p < r->base + r->len) return r;
    return NULL;
}

static void add_region(uintptr_t base, size_t len, enum tag tag) {
    region_t *r = calloc(1, sizeof *r);
    if (!r) abort();
    r->base = base;
    r->len = len;
    r->tag = tag;
    pthread_mutex_lock(&g_lock);
    r->next = g_regions;
    g_regions = r;
    pthread_mutex_unlock(&g_lock);
}

/* Removes the region starting at `base` with `tag`; a region still used by
 * queued work is kept and the call refused. */
static CUresult remove_region(uintptr_t base, enum tag tag, CUresult missing) {
    pthread_mutex_lock(&g_lock);
    region_t **pp = &g_regions;
    for (; *pp; pp = &(*pp)->next) {
        region_t *r = *pp;
        if (r->base == base && r->tag == tag) {
            if (r->users > 0) {
                pthread_mutex_unlock(&g_lock);
                return CUDA_ERROR_ILLEGAL_STATE;
            }
            *pp = r->next;
            free(r);
            pthread_mutex_unlock(&g_lock);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return missing;
}

/* The region holding [p, p + n) if it is device memory (want_device) or
 * host memory (any host tag, or untracked pageable memory for host sides). */
static CUresult check_side(uintptr_t p, size_t n, int want_device, region_t **out) {
    if (p == 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    region_t *r = find_locked(p);
    CUresult res = CUDA_SUCCESS;
    if (want_device) {
        if (!r || r->tag != TAG_DEVICE || n > r->base + r->len - p) res = CUDA_ERROR_INVALID_VALUE;
    } else if (r && (r->tag == TAG_DEVICE || n > r->base + r->len - p)) {
        res = CUDA_ERROR_INVALID_VALUE;
    }
    if (res == CUDA_SUCCESS && r) r->users++;
    pthread_mutex_unlock(&g_lock);
    *out = res == CUDA_SUCCESS ? r : NULL;
    return res;
}

static void release_use(region_t *r) {
    if (!r) return;
    pthread_mutex_lock(&g_lock);
    r->users--;
    pthread_mutex_unlock(&g_lock);
}

static CUresult alloc_tagged(void **out, size_t size, enum tag tag, int64_t *live) {
    if (!out || size == 0) return CUDA_ERROR_INVALID_VALUE;
    void *p = NULL;
    if (posix_memalign(&p, 4096, size) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    memset(p, 0, size);
    add_region((uintptr_t)p, size, tag);
    bump(live, 1);
    *out = p;
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
    NEED_CTX("cuMemAlloc");
    void *p = NULL;
    CUresult r = alloc_tagged(&p, size, TAG_DEVICE, &g_stats.live_device_allocs);
    if (r == CUDA_SUCCESS) *dptr = (CUdeviceptr)(uintptr_t)p;
    return r;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
    NEED_CTX("cuMemFree");
    if (dptr == 0) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = remove_region((uintptr_t)dptr, TAG_DEVICE, CUDA_ERROR_INVALID_VALUE);
    if (r != CUDA_SUCCESS) return r;
    free((void *)(uintptr_t)dptr);
    bump(&g_stats.live_device_allocs, -1);
    return CUDA_SUCCESS;
}

CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
    NEED_CTX("cuMemHostAlloc");
    (void)flags;
    return alloc_tagged(pp, size, TAG_HOST, &g_stats.live_host_allocs);
}

CUresult cuMemAllocHost_v2(void **pp, size_t size) {
    NEED_CTX("cuMemAllocHost");
    return alloc_tagged(pp, size, TAG_HOST, &g_stats.live_host_allocs);
}

CUresult cuMemFreeHost(void *p) {
    NEED_CTX("cuMemFreeHost");
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = remove_region((uintptr_t)p, TAG_HOST, CUDA_ERROR_INVALID_VALUE);
    if (r != CUDA_SUCCESS) return r;
    free(p);
    bump(&g_stats.live_host_allocs, -1);
    return CUDA_SUCCESS;
}

CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags) {
    NEED_CTX("cuMemHostRegister");
    (void)flags;
    if (!p || size == 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    for (region_t *r = g_regions; r; r = r->next) {
        if ((uintptr_t)p < r->base + r->len && r->base < (uintptr_t)p + size) {
            pthread_mutex_unlock(&g_lock);
            return r->tag == TAG_DEVICE ? CUDA_ERROR_INVALID_VALUE
                                        : CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
        }
    }
    pthread_mutex_unlock(&g_lock);
    add_region((uintptr_t)p, size, TAG_REGISTERED);
    bump(&g_stats.live_registrations, 1);
    return CUDA_SUCCESS;
}

CUresult cuMemHostUnregister(void *p) {
    NEED_CTX("cuMemHostUnregister");
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = remove_region((uintptr_t)p, TAG_REGISTERED, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    if (r == CUDA_SUCCESS) bump(&g_stats.live_registrations, -1);
    return r;
}

/* ---- events ------------------------------------------------------------- */

typedef dq_event_t event_t;

static int live_event(event_t *e) { return e && e->magic == MAGIC_EVENT; }

CUresult cuEventCreate(void **out, unsigned int flags) {
    NEED_CTX("cuEventCreate");
    if (!out || (flags & ~0xfu)) return CUDA_ERROR_INVALID_VALUE;
    event_t *e = dq_event_new(MAGIC_EVENT);
    if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
    *out = e;
    bump(&g_stats.live_events, 1);
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(void *ev) {
    NEED_INIT("cuEventDestroy");
    event_t *e = ev;
    if (!live_event(e)) return CUDA_ERROR_INVALID_HANDLE;
    dq_event_release(e); /* freed once queued work no longer uses it, as CUDA does */
    bump(&g_stats.live_events, -1);
    return CUDA_SUCCESS;
}

CUresult cuEventQuery(void *ev) {
    NEED_CTX("cuEventQuery");
    event_t *e = ev;
    if (!live_event(e)) return CUDA_ERROR_INVALID_HANDLE;
    int done = dq_event_done(e);
    if (t_current->sticky) return t_current->sticky;
    return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(void *ev) {
    NEED_CTX("cuEventSynchronize");
    event_t *e = ev;
    if (!live_event(e)) return CUDA_ERROR_INVALID_HANDLE;
    dq_event_sync(e);
    return t_current->sticky ? t_current->sticky : CUDA_SUCCESS;
}

/* ---- streams ------------------------------------------------------------ */

typedef dq_stream_t stream_t;

/* The kernels the double runs: one per module (as UCM ships them). */
enum kernel { K_NONE, K_LAYER_COMPUTE, K_COPY_RUNS };

typedef struct module {
    uint32_t magic;
    enum kernel kernel;
    int64_t users; /* queued launches */
} module_t;

typedef struct func {
    uint32_t magic;
    module_t *module;
} func_t;

static int live_stream(stream_t *s) { return s && s->magic == MAGIC_STREAM; }

static ctx_t *ctx_of(stream_t *s) { return s->owner; }

/* An injected device error: the next copy, launch or host function of any
 * stream fails, and the error sticks to the stream's context. */
static int stream_fails(stream_t *s) {
    pthread_mutex_lock(&g_lock);
    int fail = g_fail_stream_code;
    g_fail_stream_code = 0;
    if (fail && !ctx_of(s)->sticky) ctx_of(s)->sticky = fail;
    pthread_mutex_unlock(&g_lock);
    return fail;
}

CUresult cuStreamCreate(void **out, unsigned int flags) {
    NEED_CTX("cuStreamCreate");
    if (!out || flags > 1) return CUDA_ERROR_INVALID_VALUE;
    stream_t *s = dq_stream_new(MAGIC_STREAM, t_current, stream_fails);
    if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
    *out = s;
    bump(&g_stats.live_streams, 1);
    return CUDA_SUCCESS;
}

/* CUDA lets a stream with queued work be destroyed (the work still runs):
 * so does the double, which runs it first. */
CUresult cuStreamDestroy_v2(void *st) {
    NEED_INIT("cuStreamDestroy");
    stream_t *s = st;
    if (!live_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
    dq_stream_free(s);
    bump(&g_stats.live_streams, -1);
    return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(void *st) {
    NEED_INIT("cuStreamSynchronize");
    stream_t *s = st;
    if (!live_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
    dq_drain(s);
    return ctx_of(s)->sticky ? ctx_of(s)->sticky : CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
    NEED_INIT("cuCtxSynchronize");
    if (!t_current) return CUDA_ERROR_INVALID_CONTEXT;
    dq_drain_all(t_current);
    return t_current->sticky ? t_current->sticky : CUDA_SUCCESS;
}

#define NEED_STREAM(api, st)                                              \
    NEED_CTX(api);                                                        \
    stream_t *s = (st);                                                   \
    if (!live_stream(s)) return CUDA_ERROR_INVALID_HANDLE;                \
    if (ctx_of(s) != t_current) return CUDA_ERROR_INVALID_CONTEXT

CUresult cuEventRecord(void *ev, void *st) {
    NEED_STREAM("cuEventRecord", st);
    event_t *e = ev;
    if (!live_event(e)) return CUDA_ERROR_INVALID_HANDLE;
    dq_push_record(s, e);
    return CUDA_SUCCESS;
}

CUresult cuStreamWaitEvent(void *st, void *ev, unsigned int flags) {
    NEED_STREAM("cuStreamWaitEvent", st);
    event_t *e = ev;
    if (!live_event(e)) return CUDA_ERROR_INVALID_HANDLE;
    if (flags > 1) return CUDA_ERROR_INVALID_VALUE;
    dq_push_wait(s, e);
    return CUDA_SUCCESS;
}

CUresult cuLaunchHostFunc(void *st, CUhostFn fn, void *userData) {
    NEED_STREAM("cuLaunchHostFunc", st);
    if (!fn) return CUDA_ERROR_INVALID_VALUE;
    dq_op_t *op = dq_op(DQ_HOST_FN);
    op->host_fn = fn;
    op->args = userData;
    bump(&g_stats.host_fns, 1);
    dq_push(s, op);
    return CUDA_SUCCESS;
}

/* ---- copies ------------------------------------------------------------- */

/* After an operation ran: the regions it used may be freed again. */
static void release_regions(dq_op_t *op) {
    release_use(op->user[0]);
    release_use(op->user[1]);
}

static CUresult queue_copy(stream_t *s, uintptr_t dst, int dst_dev, uintptr_t src, int src_dev,
                           size_t n) {
    if (n == 0) return CUDA_SUCCESS;
    region_t *rd = NULL, *rs = NULL;
    CUresult r = check_side(dst, n, dst_dev, &rd);
    if (r != CUDA_SUCCESS) return r;
    r = check_side(src, n, src_dev, &rs);
    if (r != CUDA_SUCCESS) {
        release_use(rd);
        return r;
    }
    dq_op_t *op = dq_op(DQ_COPY);
    op->dst = (void *)dst;
    op->src = (const void *)src;
    op->len = n;
    op->user[0] = rd;
    op->user[1] = rs;
    op->done = release_regions;
    bump(&g_stats.copies, 1);
    dq_push(s, op);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *st) {
    NEED_STREAM("cuMemcpyHtoDAsync", st);
    return queue_copy(s, (uintptr_t)dst, 1, (uintptr_t)src, 0, n);
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *st) {
    NEED_STREAM("cuMemcpyDtoHAsync", st);
    return queue_copy(s, (uintptr_t)dst, 0, (uintptr_t)src, 1, n);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void *st) {
    NEED_STREAM("cuMemcpyDtoDAsync", st);
    return queue_copy(s, (uintptr_t)dst, 1, (uintptr_t)src, 1, n);
}

typedef struct {
    int type; /* CU_MEM_LOCATION_TYPE_DEVICE = 1, _HOST = 2 */
    int id;
} CUmemLocation;

typedef struct {
    int srcAccessOrder; /* STREAM = 1, DURING_API_CALL = 2, ANY = 3 */
    CUmemLocation srcLocHint;
    CUmemLocation dstLocHint;
    unsigned int flags;
} CUmemcpyAttributes;

static int is_device(uintptr_t p) {
    pthread_mutex_lock(&g_lock);
    region_t *r = find_locked(p);
    int d = r && r->tag == TAG_DEVICE;
    pthread_mutex_unlock(&g_lock);
    return d;
}

/* Every run is checked first (its location hints must name where its
 * memory is): a bad run rejects the whole batch, with its index. */
CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                            CUmemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs,
                            size_t *failIdx, void *st) {
    NEED_STREAM("cuMemcpyBatchAsync", st);
    if (!dsts || !srcs || !sizes || !attrs || !attrsIdxs || numAttrs == 0 || numAttrs > count ||
        !failIdx || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (attrsIdxs[0] != 0) {
        *failIdx = 0;
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (size_t a = 0; a < numAttrs; a++) {
        size_t end = a + 1 < numAttrs ? attrsIdxs[a + 1] : count;
        if (attrsIdxs[a] >= end || end > count) {
            *failIdx = attrsIdxs[a] < count ? attrsIdxs[a] : 0;
            return CUDA_ERROR_INVALID_VALUE;
        }
        CUmemcpyAttributes *at = &attrs[a];
        if (at->srcAccessOrder < 1 || at->srcAccessOrder > 3 || at->flags != 0) {
            *failIdx = attrsIdxs[a];
            return CUDA_ERROR_INVALID_VALUE;
        }
        for (size_t i = attrsIdxs[a]; i < end; i++) {
            int dd = is_device((uintptr_t)dsts[i]), sd = is_device((uintptr_t)srcs[i]);
            int ok = (at->dstLocHint.type == (dd ? 1 : 2)) && (at->srcLocHint.type == (sd ? 1 : 2)) &&
                     (dd || sd) && dsts[i] && srcs[i];
            if (ok) {
                region_t *r1 = NULL, *r2 = NULL;
                ok = check_side((uintptr_t)dsts[i], sizes[i], dd, &r1) == CUDA_SUCCESS;
                if (ok) ok = check_side((uintptr_t)srcs[i], sizes[i], sd, &r2) == CUDA_SUCCESS;
                release_use(r1);
                release_use(r2);
            }
            if (!ok) {
                *failIdx = i;
                return CUDA_ERROR_INVALID_VALUE;
            }
        }
    }
    for (size_t i = 0; i < count; i++) {
        int dd = is_device((uintptr_t)dsts[i]), sd = is_device((uintptr_t)srcs[i]);
        CUresult r = queue_copy(s, (uintptr_t)dsts[i], dd, (uintptr_t)srcs[i], sd, sizes[i]);
        if (r != CUDA_SUCCESS) {
            *failIdx = i;
            return r;
        }
    }
    bump(&g_stats.batch_calls, 1);
    *failIdx = SIZE_MAX;
    return CUDA_SUCCESS;
}

/* ---- modules and kernels ------------------------------------------------ */

/* The host equivalent of ucm_layer_compute (layer_compute.ptx): `len`
 * floats at `dst`, `epoch` dependent FMAs each. */
static void run_layer_compute(dq_op_t *op) {
    float *x = op->dst;
    for (size_t i = 0; i < op->len; i++) {
        float v = x[i];
        for (uint64_t k = 0; k < op->epoch; k++) v = __builtin_fmaf(v, 0.9999f, 0.5f);
        x[i] = v;
    }
}

/* A launch queued on `s`: its module stays loaded until it ran. */
static CUresult queue_launch(func_t *f, stream_t *s, dq_op_t *op) {
    op->user[2] = f->module;
    pthread_mutex_lock(&g_lock);
    f->module->users++;
    g_stats.kernel_launches++;
    pthread_mutex_unlock(&g_lock);
    dq_push(s, op);
    return CUDA_SUCCESS;
}

/* After a launch ran: its module may be unloaded. */
static void module_done(dq_op_t *op) {
    module_t *m = op->user[2];
    pthread_mutex_lock(&g_lock);
    m->users--;
    pthread_mutex_unlock(&g_lock);
}

static void launch_done(dq_op_t *op) {
    release_use(op->user[0]);
    module_done(op);
}

/* ucm_copy_runs (copy_runs.ptx): its parameter block, copied at launch. */
#define COPY_RUNS_MAX 168
typedef struct {
    uint32_t count;
    uint32_t pad;
    uint64_t runs[COPY_RUNS_MAX][3]; /* dst, src, len */
} copy_batch_t;

typedef struct {
    copy_batch_t batch;
    region_t *regions[2 * COPY_RUNS_MAX];
} copy_job_t;

/* An end of a kernel's run: memory the GPU can address (device memory, or
 * registered or pinned host memory), whole. */
static CUresult check_mapped(uint64_t p, uint64_t n, region_t **out) {
    *out = NULL;
    if (p == 0) return CUDA_ERROR_ILLEGAL_ADDRESS;
    pthread_mutex_lock(&g_lock);
    region_t *r = find_locked((uintptr_t)p);
    CUresult res = r && n <= r->base + r->len - p ? CUDA_SUCCESS : CUDA_ERROR_ILLEGAL_ADDRESS;
    if (res == CUDA_SUCCESS) {
        r->users++;
        *out = r;
    }
    pthread_mutex_unlock(&g_lock);
    return res;
}

static void run_copy_runs(dq_op_t *op) {
    copy_job_t *j = op->args;
    for (uint32_t i = 0; i < j->batch.count; i++) {
        uint64_t *r = j->batch.runs[i];
        memcpy((void *)(uintptr_t)r[0], (const void *)(uintptr_t)r[1], (size_t)r[2]);
    }
}

static void copy_runs_done(dq_op_t *op) {
    copy_job_t *j = op->args;
    for (uint32_t i = 0; i < 2 * j->batch.count; i++) release_use(j->regions[i]);
    module_done(op);
    free(j);
}

static CUresult launch_copy_runs(func_t *f, stream_t *s, const void *param) {
    if (!param) return CUDA_ERROR_INVALID_VALUE;
    copy_job_t *j = calloc(1, sizeof *j);
    if (!j) return CUDA_ERROR_OUT_OF_MEMORY;
    memcpy(&j->batch, param, sizeof j->batch);
    CUresult res = j->batch.count == 0 || j->batch.count > COPY_RUNS_MAX ? CUDA_ERROR_INVALID_VALUE
                                                                        : CUDA_SUCCESS;
    for (uint32_t i = 0; res == CUDA_SUCCESS && i < j->batch.count; i++) {
        uint64_t *r = j->batch.runs[i];
        if (r[2] == 0) continue;
        res = check_mapped(r[0], r[2], &j->regions[2 * i]);
        if (res == CUDA_SUCCESS) res = check_mapped(r[1], r[2], &j->regions[2 * i + 1]);
    }
    if (res != CUDA_SUCCESS) {
        for (uint32_t i = 0; i < 2 * COPY_RUNS_MAX; i++) release_use(j->regions[i]);
        free(j);
        return res;
    }
    dq_op_t *op = dq_op(DQ_CALL);
    op->fn = run_copy_runs;
    op->done = copy_runs_done;
    op->args = j;
    return queue_launch(f, s, op);
}

CUresult cuModuleLoadData(void **out, const void *image) {
    NEED_CTX("cuModuleLoadData");
    if (!out || !image) return CUDA_ERROR_INVALID_VALUE;
    const char *text = image;
    if (!strstr(text, ".version") || !strstr(text, ".entry")) return CUDA_ERROR_INVALID_IMAGE;
    module_t *m = calloc(1, sizeof *m);
    if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
    m->magic = MAGIC_MODULE;
    m->kernel = strstr(text, ".entry ucm_layer_compute(") ? K_LAYER_COMPUTE
                : strstr(text, ".entry ucm_copy_runs(")   ? K_COPY_RUNS
                                                          : K_NONE;
    *out = m;
    bump(&g_stats.live_modules, 1);
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(void **out, void *mod, const char *name) {
    NEED_CTX("cuModuleGetFunction");
    module_t *m = mod;
    if (!out || !name) return CUDA_ERROR_INVALID_VALUE;
    if (!m || m->magic != MAGIC_MODULE) return CUDA_ERROR_INVALID_HANDLE;
    /* Only the kernels the double can run on the host. */
    const char *want = m->kernel == K_LAYER_COMPUTE ? "ucm_layer_compute"
                       : m->kernel == K_COPY_RUNS   ? "ucm_copy_runs"
                                                    : NULL;
    if (!want || strcmp(name, want) != 0) return CUDA_ERROR_NOT_FOUND;
    func_t *f = calloc(1, sizeof *f);
    if (!f) return CUDA_ERROR_OUT_OF_MEMORY;
    f->magic = MAGIC_FUNC;
    f->module = m;
    *out = f;
    return CUDA_SUCCESS;
}

CUresult cuModuleUnload(void *mod) {
    NEED_INIT("cuModuleUnload");
    module_t *m = mod;
    if (!m || m->magic != MAGIC_MODULE) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_lock);
    int busy = m->users > 0;
    pthread_mutex_unlock(&g_lock);
    if (busy) return CUDA_ERROR_ILLEGAL_STATE;
    m->magic = 0;
    free(m); /* functions of it stay allocated: a later launch of one is INVALID_HANDLE */
    bump(&g_stats.live_modules, -1);
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, void *st, void **params, void **extra) {
    NEED_STREAM("cuLaunchKernel", st);
    func_t *f = fn;
    if (!f || f->magic != MAGIC_FUNC || !f->module || f->module->magic != MAGIC_MODULE)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!params || extra || gx == 0 || gy != 1 || gz != 1 || bx == 0 || bx > 1024 || by != 1 ||
        bz != 1 || shared != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (f->module->kernel == K_COPY_RUNS) return launch_copy_runs(f, s, params[0]);
    uint64_t x = *(uint64_t *)params[0];
    uint64_t n = *(uint64_t *)params[1];
    uint32_t iters = *(uint32_t *)params[2];
    region_t *r = NULL;
    if (n == 0 || n > SIZE_MAX / 4) return CUDA_ERROR_INVALID_VALUE;
    CUresult res = check_side((uintptr_t)x, n * 4, 1, &r);
    if (res != CUDA_SUCCESS) return CUDA_ERROR_ILLEGAL_ADDRESS;
    dq_op_t *op = dq_op(DQ_CALL);
    op->fn = run_layer_compute;
    op->done = launch_done;
    op->dst = (void *)(uintptr_t)x;
    op->len = (size_t)n;
    op->epoch = iters;
    op->user[0] = r;
    return queue_launch(f, s, op);
}

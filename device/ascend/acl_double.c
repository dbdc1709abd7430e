/*
 * A host-memory stand-in for libascendcl: the ACL subset that ucm-device
 * calls, on plain memory, with one worker thread per stream. Built by
 * device/build.rs (feature `ascend`) and loaded through UCM_ACL_LIB, so the
 * real FFI path (bindgen table, libloading, result layer, safe types) runs
 * in tests on machines without an NPU.
 *
 * Beyond ACL it exports test controls:
 *   ucm_acl_double_fail_next(api, code): the next call of `api` returns code;
 *   ucm_acl_double_stats(out): counters for init / teardown checks.
 *
 * Rules it enforces like the runtime documents them: aclInit once
 * (ACL_ERROR_REPEAT_INITIALIZE), a device set on the calling thread before
 * runtime calls, 64-byte aligned async copy addresses, no async host-to-host
 * copy, count <= destMax.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl_vendored.h"
#include "../doubles/stream_queue.h"

#define ACL_SUCCESS 0
#define ACL_ERROR_INVALID_PARAM 100000
#define ACL_ERROR_UNINITIALIZE 100001
#define ACL_ERROR_REPEAT_INITIALIZE 100002
#define ACL_ERROR_INVALID_DEVICE 200002
#define ACL_ERROR_MEMORY_ADDRESS_UNALIGNED 200003
#define ACL_ERROR_RT_FEATURE_NOT_SUPPORT 207000
#define ACL_ERROR_RT_MEMORY_ALLOCATION 207001

#define MAGIC_STREAM 0x41434c53u
#define MAGIC_EVENT 0x41434c45u

/* ---- errors and fault injection ---------------------------------------- */

static __thread char g_msg[256];

static aclError fail(aclError code, const char *api, const char *why) {
    snprintf(g_msg, sizeof g_msg, "%s: %s (double)", api, why);
    return code;
}

void ucm_acl_double_fail_next(const char *api, int code) { dq_fail_next(api, code); }

static int injected(const char *api) {
    int code = dq_injected(api);
    if (code != 0) snprintf(g_msg, sizeof g_msg, "%s: injected failure %d (double)", api, code);
    return code;
}

#define INJECT(api)                      \
    do {                                 \
        int c_ = injected(api);          \
        if (c_ != 0) return c_;          \
    } while (0)

const char *aclGetRecentErrMsg(void) { return g_msg[0] ? g_msg : NULL; }

/* ---- init and devices --------------------------------------------------- */

typedef struct {
    int64_t init_calls, finalize_calls, set_device_calls, reset_device_calls;
    int64_t live_streams, live_events, live_device_allocs, live_host_allocs, live_registrations;
} ucm_acl_double_stats_t;

static ucm_acl_double_stats_t g_stats;
static int g_initialized;
static __thread int g_thread_device = -1;
static int64_t g_device_refs;

void ucm_acl_double_stats(ucm_acl_double_stats_t *out) {
    pthread_mutex_lock(&g_lock);
    *out = g_stats;
    pthread_mutex_unlock(&g_lock);
}

aclError aclInit(const char *configPath) {
    (void)configPath;
    INJECT("aclInit");
    pthread_mutex_lock(&g_lock);
    g_stats.init_calls++;
    int again = g_initialized;
    g_initialized = 1;
    pthread_mutex_unlock(&g_lock);
    if (again) return fail(ACL_ERROR_REPEAT_INITIALIZE, "aclInit", "already initialised");
    return ACL_SUCCESS;
}

aclError aclFinalize(void) {
    pthread_mutex_lock(&g_lock);
    g_stats.finalize_calls++;
    g_initialized = 0;
    pthread_mutex_unlock(&g_lock);
    return ACL_SUCCESS;
}

static int device_count(void) {
    const char *e = getenv("UCM_ACL_DOUBLE_DEVICES");
    return e ? atoi(e) : 1;
}

aclError aclrtGetDeviceCount(uint32_t *count) {
    INJECT("aclrtGetDeviceCount");
    if (!count) return fail(ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceCount", "null count");
    *count = (uint32_t)device_count();
    return ACL_SUCCESS;
}

aclError aclrtSetDevice(int32_t deviceId) {
    INJECT("aclrtSetDevice");
    if (!g_initialized) return fail(ACL_ERROR_UNINITIALIZE, "aclrtSetDevice", "aclInit not called");
    if (deviceId < 0 || deviceId >= device_count())
        return fail(ACL_ERROR_INVALID_DEVICE, "aclrtSetDevice", "no such device");
    g_thread_device = deviceId;
    pthread_mutex_lock(&g_lock);
    g_stats.set_device_calls++;
    g_device_refs++;
    pthread_mutex_unlock(&g_lock);
    return ACL_SUCCESS;
}

/* aclrtSetDevice / aclrtResetDevice are reference counted per process. When
 * the count drops to zero every resource must be gone: the double refuses a
 * reset that would pull memory, streams or events from under their owners. */
aclError aclrtResetDevice(int32_t deviceId) {
    (void)deviceId;
    INJECT("aclrtResetDevice");
    pthread_mutex_lock(&g_lock);
    g_stats.reset_device_calls++;
    int64_t refs = --g_device_refs;
    int64_t live = g_stats.live_streams + g_stats.live_events + g_stats.live_device_allocs +
                   g_stats.live_host_allocs + g_stats.live_registrations;
    pthread_mutex_unlock(&g_lock);
    if (refs < 0) return fail(ACL_ERROR_INVALID_DEVICE, "aclrtResetDevice", "more resets than sets");
    if (refs == 0 && live != 0)
        return fail(ACL_ERROR_INVALID_PARAM, "aclrtResetDevice", "resources still alive at the last reset");
    return ACL_SUCCESS;
}

/* Runtime calls need a device set on the calling thread. */
#define NEED_DEVICE(api)                                                            \
    do {                                                                            \
        INJECT(api);                                                                \
        if (g_thread_device < 0)                                                    \
            return fail(ACL_ERROR_INVALID_DEVICE, api, "no device set on this thread"); \
    } while (0)

/* ---- memory ------------------------------------------------------------- */

static aclError alloc_aligned(void **out, size_t size, const char *api) {
    if (!out || size == 0) return fail(ACL_ERROR_INVALID_PARAM, api, "null pointer or zero size");
    void *p = NULL;
    if (posix_memalign(&p, 4096, size) != 0) return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, api, "out of memory");
    memset(p, 0, size);
    *out = p;
    return ACL_SUCCESS;
}

aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy) {
    NEED_DEVICE("aclrtMalloc");
    (void)policy;
    aclError r = alloc_aligned(devPtr, size, "aclrtMalloc");
    if (r == ACL_SUCCESS) bump(&g_stats.live_device_allocs, 1);
    return r;
}

aclError aclrtFree(void *devPtr) {
    NEED_DEVICE("aclrtFree");
    if (!devPtr) return fail(ACL_ERROR_INVALID_PARAM, "aclrtFree", "null pointer");
    free(devPtr);
    bump(&g_stats.live_device_allocs, -1);
    return ACL_SUCCESS;
}

aclError aclrtMallocHost(void **hostPtr, size_t size) {
    NEED_DEVICE("aclrtMallocHost");
    aclError r = alloc_aligned(hostPtr, size, "aclrtMallocHost");
    if (r == ACL_SUCCESS) bump(&g_stats.live_host_allocs, 1);
    return r;
}

aclError aclrtFreeHost(void *hostPtr) {
    NEED_DEVICE("aclrtFreeHost");
    if (!hostPtr) return fail(ACL_ERROR_INVALID_PARAM, "aclrtFreeHost", "null pointer");
    free(hostPtr);
    bump(&g_stats.live_host_allocs, -1);
    return ACL_SUCCESS;
}

aclError aclrtHostRegister(void *ptr, uint64_t size, aclrtHostRegisterType type, void **devPtr) {
    NEED_DEVICE("aclrtHostRegister");
    if (!ptr || size == 0 || !devPtr || type != ACL_HOST_REGISTER_MAPPED)
        return fail(ACL_ERROR_INVALID_PARAM, "aclrtHostRegister", "bad argument");
    *devPtr = ptr;
    bump(&g_stats.live_registrations, 1);
    return ACL_SUCCESS;
}

aclError aclrtHostUnregister(void *ptr) {
    NEED_DEVICE("aclrtHostUnregister");
    if (!ptr) return fail(ACL_ERROR_INVALID_PARAM, "aclrtHostUnregister", "null pointer");
    bump(&g_stats.live_registrations, -1);
    return ACL_SUCCESS;
}

/* ---- events ------------------------------------------------------------- */

typedef dq_event_t event_t;

aclError aclrtCreateEvent(aclrtEvent *out) {
    NEED_DEVICE("aclrtCreateEvent");
    if (!out) return fail(ACL_ERROR_INVALID_PARAM, "aclrtCreateEvent", "null out");
    event_t *e = dq_event_new(MAGIC_EVENT);
    if (!e) return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtCreateEvent", "out of memory");
    *out = e;
    bump(&g_stats.live_events, 1);
    return ACL_SUCCESS;
}

aclError aclrtDestroyEvent(aclrtEvent ev) {
    NEED_DEVICE("aclrtDestroyEvent");
    event_t *e = ev;
    if (!e || e->magic != MAGIC_EVENT) return fail(ACL_ERROR_INVALID_PARAM, "aclrtDestroyEvent", "null event");
    /* Freed once the records and waits queued on it have run: queued work
     * never sees a freed event. */
    dq_event_release(e);
    bump(&g_stats.live_events, -1);
    return ACL_SUCCESS;
}

aclError aclrtQueryEventStatus(aclrtEvent ev, aclrtEventRecordedStatus *status) {
    NEED_DEVICE("aclrtQueryEventStatus");
    event_t *e = ev;
    if (!e || !status) return fail(ACL_ERROR_INVALID_PARAM, "aclrtQueryEventStatus", "null argument");
    *status = dq_event_done(e) ? ACL_EVENT_RECORDED_STATUS_COMPLETE : ACL_EVENT_RECORDED_STATUS_NOT_READY;
    return ACL_SUCCESS;
}

aclError aclrtSynchronizeEvent(aclrtEvent ev) {
    NEED_DEVICE("aclrtSynchronizeEvent");
    event_t *e = ev;
    if (!e) return fail(ACL_ERROR_INVALID_PARAM, "aclrtSynchronizeEvent", "null event");
    dq_event_sync(e);
    return ACL_SUCCESS;
}

/* ---- streams ------------------------------------------------------------ */

typedef dq_stream_t stream_t;

aclError aclrtCreateStreamWithConfig(aclrtStream *out, uint32_t priority, uint32_t flag) {
    NEED_DEVICE("aclrtCreateStreamWithConfig");
    (void)priority;
    (void)flag;
    if (!out) return fail(ACL_ERROR_INVALID_PARAM, "aclrtCreateStream", "null out");
    stream_t *s = dq_stream_new(MAGIC_STREAM, NULL, NULL);
    if (!s) return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtCreateStream", "out of memory");
    *out = s;
    bump(&g_stats.live_streams, 1);
    return ACL_SUCCESS;
}

aclError aclrtCreateStream(aclrtStream *out) { return aclrtCreateStreamWithConfig(out, 0, 0); }

#define STREAM_ARG(api, st)                                                   \
    stream_t *s = (st);                                                       \
    if (!s || s->magic != MAGIC_STREAM) return fail(ACL_ERROR_INVALID_PARAM, api, "null stream")

aclError aclrtSynchronizeStream(aclrtStream st) {
    NEED_DEVICE("aclrtSynchronizeStream");
    STREAM_ARG("aclrtSynchronizeStream", st);
    dq_drain(s);
    return ACL_SUCCESS;
}

aclError aclrtDestroyStream(aclrtStream st) {
    NEED_DEVICE("aclrtDestroyStream");
    STREAM_ARG("aclrtDestroyStream", st);
    dq_stream_free(s);
    bump(&g_stats.live_streams, -1);
    return ACL_SUCCESS;
}

aclError aclrtSynchronizeDevice(void) {
    NEED_DEVICE("aclrtSynchronizeDevice");
    dq_drain_all(NULL);
    return ACL_SUCCESS;
}

aclError aclrtRecordEvent(aclrtEvent ev, aclrtStream st) {
    NEED_DEVICE("aclrtRecordEvent");
    event_t *e = ev;
    if (!e) return fail(ACL_ERROR_INVALID_PARAM, "aclrtRecordEvent", "null event");
    STREAM_ARG("aclrtRecordEvent", st);
    dq_push_record(s, e);
    return ACL_SUCCESS;
}

aclError aclrtStreamWaitEvent(aclrtStream st, aclrtEvent ev) {
    NEED_DEVICE("aclrtStreamWaitEvent");
    event_t *e = ev;
    if (!e) return fail(ACL_ERROR_INVALID_PARAM, "aclrtStreamWaitEvent", "null event");
    STREAM_ARG("aclrtStreamWaitEvent", st);
    dq_push_wait(s, e);
    return ACL_SUCCESS;
}

aclError aclrtLaunchHostFunc(aclrtStream st, aclrtHostFunc fn, void *args) {
    NEED_DEVICE("aclrtLaunchHostFunc");
    if (!fn) return fail(ACL_ERROR_INVALID_PARAM, "aclrtLaunchHostFunc", "null function");
    STREAM_ARG("aclrtLaunchHostFunc", st);
    dq_op_t *op = dq_op(DQ_HOST_FN);
    op->host_fn = fn;
    op->args = args;
    dq_push(s, op);
    return ACL_SUCCESS;
}

/* ---- copies ------------------------------------------------------------- */

static aclError check_copy(void *dst, size_t destMax, const void *src, size_t count,
                           aclrtMemcpyKind kind, const char *api) {
    if (!dst || !src) return fail(ACL_ERROR_INVALID_PARAM, api, "null address");
    if (count > destMax) return fail(ACL_ERROR_INVALID_PARAM, api, "count exceeds destMax");
    if (((uintptr_t)dst % 64) != 0 || ((uintptr_t)src % 64) != 0)
        return fail(ACL_ERROR_MEMORY_ADDRESS_UNALIGNED, api, "addresses must be 64-byte aligned");
    if (kind == ACL_MEMCPY_HOST_TO_HOST)
        return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, api, "async host-to-host copy");
    if (kind > ACL_MEMCPY_DEFAULT) return fail(ACL_ERROR_INVALID_PARAM, api, "bad kind");
    return ACL_SUCCESS;
}

aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count,
                          aclrtMemcpyKind kind, aclrtStream st) {
    NEED_DEVICE("aclrtMemcpyAsync");
    aclError r = check_copy(dst, destMax, src, count, kind, "aclrtMemcpyAsync");
    if (r != ACL_SUCCESS) return r;
    STREAM_ARG("aclrtMemcpyAsync", st);
    dq_op_t *op = dq_op(DQ_COPY);
    op->dst = dst;
    op->src = src;
    op->len = count;
    dq_push(s, op);
    return ACL_SUCCESS;
}

aclError aclrtMemcpyBatchAsync(void **dsts, size_t *destMaxs, void **srcs, size_t *sizes,
                               size_t numBatches, aclrtMemcpyBatchAttr *attrs,
                               size_t *attrsIndexes, size_t numAttrs, size_t *failIndex,
                               aclrtStream st) {
    NEED_DEVICE("aclrtMemcpyBatchAsync");
    if (!dsts || !destMaxs || !srcs || !sizes || !attrs || !attrsIndexes || numAttrs == 0 || !failIndex)
        return fail(ACL_ERROR_INVALID_PARAM, "aclrtMemcpyBatchAsync", "null argument");
    /* attrs[k] applies to runs attrsIndexes[k] .. attrsIndexes[k + 1] - 1 (the
     * last to the end): the first index is 0 and they increase. */
    if (numAttrs > numBatches || attrsIndexes[0] != 0) {
        *failIndex = 0;
        return fail(ACL_ERROR_INVALID_PARAM, "aclrtMemcpyBatchAsync", "bad attribute indexes");
    }
    for (size_t k = 1; k < numAttrs; k++) {
        if (attrsIndexes[k] <= attrsIndexes[k - 1] || attrsIndexes[k] >= numBatches) {
            *failIndex = attrsIndexes[k - 1];
            return fail(ACL_ERROR_INVALID_PARAM, "aclrtMemcpyBatchAsync", "bad attribute indexes");
        }
    }
    /* Validate everything first: a bad run rejects the whole batch. */
    for (size_t i = 0; i < numBatches; i++) {
        aclError r = check_copy(dsts[i], destMaxs[i], srcs[i], sizes[i], ACL_MEMCPY_DEFAULT,
                                "aclrtMemcpyBatchAsync");
        if (r != ACL_SUCCESS) {
            *failIndex = i;
            return r;
        }
    }
    STREAM_ARG("aclrtMemcpyBatchAsync", st);
    for (size_t i = 0; i < numBatches; i++) {
        dq_op_t *op = dq_op(DQ_COPY);
        op->dst = dsts[i];
        op->src = srcs[i];
        op->len = sizes[i];
        dq_push(s, op);
    }
    *failIndex = SIZE_MAX;
    return ACL_SUCCESS;
}

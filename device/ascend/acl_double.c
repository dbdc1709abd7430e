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

#define ACL_SUCCESS 0
#define ACL_ERROR_INVALID_PARAM 100000
#define ACL_ERROR_UNINITIALIZE 100001
#define ACL_ERROR_REPEAT_INITIALIZE 100002
#define ACL_ERROR_INVALID_DEVICE 200002
#define ACL_ERROR_MEMORY_ADDRESS_UNALIGNED 200003
#define ACL_ERROR_RT_FEATURE_NOT_SUPPORT 207000
#define ACL_ERROR_RT_MEMORY_ALLOCATION 207001

/* ---- errors and fault injection ---------------------------------------- */

static __thread char g_msg[256];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_fail_api[64];
static int g_fail_code;

static aclError fail(aclError code, const char *api, const char *why) {
    snprintf(g_msg, sizeof g_msg, "%s: %s (double)", api, why);
    return code;
}

void ucm_acl_double_fail_next(const char *api, int code) {
    pthread_mutex_lock(&g_lock);
    snprintf(g_fail_api, sizeof g_fail_api, "%s", api);
    g_fail_code = code;
    pthread_mutex_unlock(&g_lock);
}

static int injected(const char *api) {
    int code = 0;
    pthread_mutex_lock(&g_lock);
    if (g_fail_code != 0 && strcmp(g_fail_api, api) == 0) {
        code = g_fail_code;
        g_fail_code = 0;
        g_fail_api[0] = 0;
    }
    pthread_mutex_unlock(&g_lock);
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

static void bump(int64_t *field, int64_t by) {
    pthread_mutex_lock(&g_lock);
    *field += by;
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

typedef struct event {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t recorded, completed;
} event_t;

aclError aclrtCreateEvent(aclrtEvent *out) {
    NEED_DEVICE("aclrtCreateEvent");
    if (!out) return fail(ACL_ERROR_INVALID_PARAM, "aclrtCreateEvent", "null out");
    event_t *e = calloc(1, sizeof *e);
    if (!e) return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtCreateEvent", "out of memory");
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    *out = e;
    bump(&g_stats.live_events, 1);
    return ACL_SUCCESS;
}

aclError aclrtDestroyEvent(aclrtEvent ev) {
    NEED_DEVICE("aclrtDestroyEvent");
    event_t *e = ev;
    if (!e) return fail(ACL_ERROR_INVALID_PARAM, "aclrtDestroyEvent", "null event");
    /* Waits until pending records complete, so queued work never sees a freed event. */
    pthread_mutex_lock(&e->mu);
    while (e->completed < e->recorded) pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
    bump(&g_stats.live_events, -1);
    return ACL_SUCCESS;
}

aclError aclrtQueryEventStatus(aclrtEvent ev, aclrtEventRecordedStatus *status) {
    NEED_DEVICE("aclrtQueryEventStatus");
    event_t *e = ev;
    if (!e || !status) return fail(ACL_ERROR_INVALID_PARAM, "aclrtQueryEventStatus", "null argument");
    pthread_mutex_lock(&e->mu);
    *status = e->completed >= e->recorded ? ACL_EVENT_RECORDED_STATUS_COMPLETE
                                          : ACL_EVENT_RECORDED_STATUS_NOT_READY;
    pthread_mutex_unlock(&e->mu);
    return ACL_SUCCESS;
}

static void event_wait(event_t *e, uint64_t epoch) {
    pthread_mutex_lock(&e->mu);
    while (e->completed < epoch) pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
}

aclError aclrtSynchronizeEvent(aclrtEvent ev) {
    NEED_DEVICE("aclrtSynchronizeEvent");
    event_t *e = ev;
    if (!e) return fail(ACL_ERROR_INVALID_PARAM, "aclrtSynchronizeEvent", "null event");
    pthread_mutex_lock(&e->mu);
    uint64_t epoch = e->recorded;
    pthread_mutex_unlock(&e->mu);
    event_wait(e, epoch);
    return ACL_SUCCESS;
}

/* ---- streams ------------------------------------------------------------ */

enum op_kind { OP_COPY, OP_RECORD, OP_WAIT, OP_HOST_FN, OP_STOP };

typedef struct op {
    enum op_kind kind;
    void *dst;
    const void *src;
    size_t len;
    event_t *event;
    uint64_t epoch;
    aclrtHostFunc fn;
    void *args;
    struct op *next;
} op_t;

typedef struct stream {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    op_t *head, *tail;
    uint64_t submitted, completed;
    pthread_t thread;
} stream_t;

/* Live streams, so that aclrtSynchronizeDevice can drain them all. */
#define MAX_STREAMS 1024
static stream_t *g_streams[MAX_STREAMS];

static void track(stream_t *s, int add) {
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < MAX_STREAMS; i++) {
        if (add && !g_streams[i]) { g_streams[i] = s; break; }
        if (!add && g_streams[i] == s) { g_streams[i] = NULL; break; }
    }
    pthread_mutex_unlock(&g_lock);
}

static void *stream_main(void *arg) {
    stream_t *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->head) pthread_cond_wait(&s->cv, &s->mu);
        op_t *op = s->head;
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        pthread_mutex_unlock(&s->mu);
        int stop = 0;
        switch (op->kind) {
        case OP_COPY: memmove(op->dst, op->src, op->len); break;
        case OP_RECORD:
            pthread_mutex_lock(&op->event->mu);
            if (op->epoch > op->event->completed) op->event->completed = op->epoch;
            pthread_cond_broadcast(&op->event->cv);
            pthread_mutex_unlock(&op->event->mu);
            break;
        case OP_WAIT: event_wait(op->event, op->epoch); break;
        case OP_HOST_FN: op->fn(op->args); break;
        case OP_STOP: stop = 1; break;
        }
        free(op);
        pthread_mutex_lock(&s->mu);
        s->completed++;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        if (stop) return NULL;
    }
}

static aclError push(stream_t *s, op_t *op, const char *api) {
    if (!s) {
        free(op);
        return fail(ACL_ERROR_INVALID_PARAM, api, "null stream");
    }
    op->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = op; else s->head = op;
    s->tail = op;
    s->submitted++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return ACL_SUCCESS;
}

static op_t *new_op(enum op_kind kind) {
    op_t *op = calloc(1, sizeof *op);
    if (op) op->kind = kind;
    return op;
}

aclError aclrtCreateStreamWithConfig(aclrtStream *out, uint32_t priority, uint32_t flag) {
    NEED_DEVICE("aclrtCreateStreamWithConfig");
    (void)priority;
    (void)flag;
    if (!out) return fail(ACL_ERROR_INVALID_PARAM, "aclrtCreateStream", "null out");
    stream_t *s = calloc(1, sizeof *s);
    if (!s) return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtCreateStream", "out of memory");
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
        free(s);
        return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtCreateStream", "no thread");
    }
    *out = s;
    track(s, 1);
    bump(&g_stats.live_streams, 1);
    return ACL_SUCCESS;
}

aclError aclrtCreateStream(aclrtStream *out) { return aclrtCreateStreamWithConfig(out, 0, 0); }

aclError aclrtSynchronizeStream(aclrtStream st) {
    NEED_DEVICE("aclrtSynchronizeStream");
    stream_t *s = st;
    if (!s) return fail(ACL_ERROR_INVALID_PARAM, "aclrtSynchronizeStream", "null stream");
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->submitted;
    while (s->completed < target) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return ACL_SUCCESS;
}

aclError aclrtDestroyStream(aclrtStream st) {
    NEED_DEVICE("aclrtDestroyStream");
    stream_t *s = st;
    if (!s) return fail(ACL_ERROR_INVALID_PARAM, "aclrtDestroyStream", "null stream");
    op_t *stop = new_op(OP_STOP);
    if (!stop) return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtDestroyStream", "out of memory");
    track(s, 0);
    push(s, stop, "aclrtDestroyStream");
    pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    bump(&g_stats.live_streams, -1);
    return ACL_SUCCESS;
}

aclError aclrtSynchronizeDevice(void) {
    NEED_DEVICE("aclrtSynchronizeDevice");
    stream_t *snapshot[MAX_STREAMS];
    pthread_mutex_lock(&g_lock);
    memcpy(snapshot, g_streams, sizeof snapshot);
    pthread_mutex_unlock(&g_lock);
    for (int i = 0; i < MAX_STREAMS; i++)
        if (snapshot[i]) aclrtSynchronizeStream(snapshot[i]);
    return ACL_SUCCESS;
}

aclError aclrtRecordEvent(aclrtEvent ev, aclrtStream st) {
    NEED_DEVICE("aclrtRecordEvent");
    event_t *e = ev;
    if (!e) return fail(ACL_ERROR_INVALID_PARAM, "aclrtRecordEvent", "null event");
    op_t *op = new_op(OP_RECORD);
    if (!op) return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtRecordEvent", "out of memory");
    pthread_mutex_lock(&e->mu);
    op->event = e;
    op->epoch = ++e->recorded;
    pthread_mutex_unlock(&e->mu);
    return push(st, op, "aclrtRecordEvent");
}

aclError aclrtStreamWaitEvent(aclrtStream st, aclrtEvent ev) {
    NEED_DEVICE("aclrtStreamWaitEvent");
    event_t *e = ev;
    if (!e) return fail(ACL_ERROR_INVALID_PARAM, "aclrtStreamWaitEvent", "null event");
    op_t *op = new_op(OP_WAIT);
    if (!op) return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtStreamWaitEvent", "out of memory");
    pthread_mutex_lock(&e->mu);
    op->event = e;
    op->epoch = e->recorded;
    pthread_mutex_unlock(&e->mu);
    return push(st, op, "aclrtStreamWaitEvent");
}

aclError aclrtLaunchHostFunc(aclrtStream st, aclrtHostFunc fn, void *args) {
    NEED_DEVICE("aclrtLaunchHostFunc");
    if (!fn) return fail(ACL_ERROR_INVALID_PARAM, "aclrtLaunchHostFunc", "null function");
    op_t *op = new_op(OP_HOST_FN);
    if (!op) return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtLaunchHostFunc", "out of memory");
    op->fn = fn;
    op->args = args;
    return push(st, op, "aclrtLaunchHostFunc");
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
    op_t *op = new_op(OP_COPY);
    if (!op) return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtMemcpyAsync", "out of memory");
    op->dst = dst;
    op->src = src;
    op->len = count;
    return push(st, op, "aclrtMemcpyAsync");
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
    for (size_t i = 0; i < numBatches; i++) {
        op_t *op = new_op(OP_COPY);
        if (!op) {
            *failIndex = i;
            return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, "aclrtMemcpyBatchAsync", "out of memory");
        }
        op->dst = dsts[i];
        op->src = srcs[i];
        op->len = sizes[i];
        push(st, op, "aclrtMemcpyBatchAsync");
    }
    *failIndex = SIZE_MAX;
    return ACL_SUCCESS;
}

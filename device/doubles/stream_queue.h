/*
 * What the host-memory driver doubles (ascend/acl_double.c,
 * cuda/cuda_double.c) share: one-shot fault injection by API name, counters,
 * events that carry epochs, and streams that are in-order queues run by one
 * thread each. Included by each double (static functions: every double is
 * its own shared library with its own state).
 *
 * A stream runs its operations in submission order. A record completes the
 * epoch it was given when the stream reaches it; a wait holds the stream
 * until the event completes the epoch it had when the wait was queued (so a
 * later record is not waited for, as the drivers document). An operation of
 * kind DQ_CALL runs `fn(op)`; every operation may carry `done(op)`, called
 * after it ran (to release what it held). `fails(stream)`, when set, is asked
 * before each copy or call: non-zero skips it (an injected device error).
 */
#ifndef UCM_DOUBLE_STREAM_QUEUE_H
#define UCM_DOUBLE_STREAM_QUEUE_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- fault injection and counters -------------------------------------- */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_fail_api[64];
static int g_fail_code;

/* The next call of `api` returns `code`. */
static void dq_fail_next(const char *api, int code) {
    pthread_mutex_lock(&g_lock);
    snprintf(g_fail_api, sizeof g_fail_api, "%s", api);
    g_fail_code = code;
    pthread_mutex_unlock(&g_lock);
}

/* The injected code for this call of `api` (consumed), or 0. */
static int dq_injected(const char *api) {
    int code = 0;
    pthread_mutex_lock(&g_lock);
    if (g_fail_code != 0 && strcmp(g_fail_api, api) == 0) {
        code = g_fail_code;
        g_fail_code = 0;
        g_fail_api[0] = 0;
    }
    pthread_mutex_unlock(&g_lock);
    return code;
}

static void bump(int64_t *field, int64_t by) {
    pthread_mutex_lock(&g_lock);
    *field += by;
    pthread_mutex_unlock(&g_lock);
}

/* ---- events ------------------------------------------------------------- */

typedef struct dq_event {
    uint32_t magic;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t recorded, completed;
    int64_t users; /* records and waits still queued */
    int dead;      /* destroyed while in use: freed by the last of them */
} dq_event_t;

static dq_event_t *dq_event_new(uint32_t magic) {
    dq_event_t *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->magic = magic;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    return e;
}

static void dq_event_free(dq_event_t *e) {
    e->magic = 0;
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}

/* Destroys the event now, or once the records and waits queued on it have
 * run (as CUDA's cuEventDestroy does). The handle is invalid at once. */
static void dq_event_release(dq_event_t *e) {
    pthread_mutex_lock(&e->mu);
    e->magic = 0;
    int now = e->users == 0;
    e->dead = 1;
    pthread_mutex_unlock(&e->mu);
    if (now) dq_event_free(e);
}

/* After a record or wait ran: one user less; the last frees a dead event. */
static void dq_event_unuse(dq_event_t *e) {
    pthread_mutex_lock(&e->mu);
    int last = --e->users == 0 && e->dead;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (last) dq_event_free(e);
}

/* True when the last record has completed (or none was made). */
static int dq_event_done(dq_event_t *e) {
    pthread_mutex_lock(&e->mu);
    int done = e->completed >= e->recorded;
    pthread_mutex_unlock(&e->mu);
    return done;
}

static void dq_event_wait(dq_event_t *e, uint64_t epoch) {
    pthread_mutex_lock(&e->mu);
    while (e->completed < epoch) pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
}

/* Blocks until the event's last record (at the time of the call) completes. */
static void dq_event_sync(dq_event_t *e) {
    pthread_mutex_lock(&e->mu);
    uint64_t epoch = e->recorded;
    pthread_mutex_unlock(&e->mu);
    dq_event_wait(e, epoch);
}

/* ---- streams ------------------------------------------------------------ */

enum dq_kind { DQ_COPY, DQ_RECORD, DQ_WAIT, DQ_HOST_FN, DQ_CALL, DQ_STOP };

struct dq_stream;

typedef struct dq_op {
    enum dq_kind kind;
    void *dst;
    const void *src;
    size_t len;
    dq_event_t *event;
    uint64_t epoch;
    void (*host_fn)(void *);
    void *args;
    void (*fn)(struct dq_op *);   /* DQ_CALL */
    void (*done)(struct dq_op *); /* after it ran, if set */
    void *user[3];
    struct dq_op *next;
} dq_op_t;

typedef struct dq_stream {
    uint32_t magic;
    void *owner; /* the double's context or device */
    int (*fails)(struct dq_stream *);
    pthread_mutex_t mu;
    pthread_cond_t cv;
    dq_op_t *head, *tail;
    uint64_t submitted, completed;
    pthread_t thread;
} dq_stream_t;

#define DQ_MAX_STREAMS 1024
static dq_stream_t *g_streams[DQ_MAX_STREAMS];

static void dq_track(dq_stream_t *s, int add) {
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < DQ_MAX_STREAMS; i++) {
        if (add && !g_streams[i]) { g_streams[i] = s; break; }
        if (!add && g_streams[i] == s) { g_streams[i] = NULL; break; }
    }
    pthread_mutex_unlock(&g_lock);
}

static void *dq_stream_main(void *arg) {
    dq_stream_t *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->head) pthread_cond_wait(&s->cv, &s->mu);
        dq_op_t *op = s->head;
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        pthread_mutex_unlock(&s->mu);
        int stop = 0;
        int skip = (op->kind == DQ_COPY || op->kind == DQ_CALL || op->kind == DQ_HOST_FN) &&
                   s->fails && s->fails(s);
        switch (op->kind) {
        case DQ_COPY:
            if (!skip) memmove(op->dst, op->src, op->len);
            break;
        case DQ_RECORD:
            pthread_mutex_lock(&op->event->mu);
            if (op->epoch > op->event->completed) op->event->completed = op->epoch;
            pthread_cond_broadcast(&op->event->cv);
            pthread_mutex_unlock(&op->event->mu);
            dq_event_unuse(op->event);
            break;
        case DQ_WAIT:
            dq_event_wait(op->event, op->epoch);
            dq_event_unuse(op->event);
            break;
        case DQ_HOST_FN: op->host_fn(op->args); break; /* runs even so: it owns its argument */
        case DQ_CALL:
            if (!skip) op->fn(op);
            break;
        case DQ_STOP: stop = 1; break;
        }
        if (op->done) op->done(op);
        free(op);
        pthread_mutex_lock(&s->mu);
        s->completed++;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        if (stop) return NULL;
    }
}

static dq_stream_t *dq_stream_new(uint32_t magic, void *owner, int (*fails)(dq_stream_t *)) {
    dq_stream_t *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->magic = magic;
    s->owner = owner;
    s->fails = fails;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->thread, NULL, dq_stream_main, s) != 0) {
        free(s);
        return NULL;
    }
    dq_track(s, 1);
    return s;
}

static dq_op_t *dq_op(enum dq_kind kind) {
    dq_op_t *op = calloc(1, sizeof *op);
    if (!op) abort(); /* a test double: no recovery from malloc failure */
    op->kind = kind;
    return op;
}

static void dq_push(dq_stream_t *s, dq_op_t *op) {
    op->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = op; else s->head = op;
    s->tail = op;
    s->submitted++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Queues a record of `e`: the epoch it will complete. */
static void dq_push_record(dq_stream_t *s, dq_event_t *e) {
    dq_op_t *op = dq_op(DQ_RECORD);
    pthread_mutex_lock(&e->mu);
    op->event = e;
    op->epoch = ++e->recorded;
    e->users++;
    pthread_mutex_unlock(&e->mu);
    dq_push(s, op);
}

/* Queues a wait for the epoch `e` has now. */
static void dq_push_wait(dq_stream_t *s, dq_event_t *e) {
    dq_op_t *op = dq_op(DQ_WAIT);
    pthread_mutex_lock(&e->mu);
    op->event = e;
    op->epoch = e->recorded;
    e->users++;
    pthread_mutex_unlock(&e->mu);
    dq_push(s, op);
}

/* Blocks until everything queued so far has run. */
static void dq_drain(dq_stream_t *s) {
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->submitted;
    while (s->completed < target) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

/* Drains every live stream whose owner is `owner` (NULL: all). */
static void dq_drain_all(void *owner) {
    dq_stream_t *snapshot[DQ_MAX_STREAMS];
    pthread_mutex_lock(&g_lock);
    memcpy(snapshot, g_streams, sizeof snapshot);
    pthread_mutex_unlock(&g_lock);
    for (int i = 0; i < DQ_MAX_STREAMS; i++)
        if (snapshot[i] && (!owner || snapshot[i]->owner == owner)) dq_drain(snapshot[i]);
}

/* Runs what is queued, stops the thread and frees the stream. */
static void dq_stream_free(dq_stream_t *s) {
    dq_track(s, 0);
    dq_push(s, dq_op(DQ_STOP));
    pthread_join(s->thread, NULL);
    s->magic = 0;
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

#endif

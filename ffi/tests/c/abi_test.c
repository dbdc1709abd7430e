/* The C ABI from C: create and destroy, hashes (printed for the Rust driver
 * to compare with the golden vectors), a save then load round trip through
 * the worker on host memory, and bad arguments answered by error codes.
 *
 *   abi_test roundtrip DIR
 *   abi_test tiers DIR_A DIR_B REMOTE|- COLD|-
 *   abi_test badargs DIR
 *   abi_test hash SPEC TP SALT|- EXTRAHEX|- ITEM...   ITEM = b:GROUP:RANK | c:GROUP:RANK:POS
 *
 * Built and run by ffi/tests/c_abi.rs. Exit status 0 on success. */
#include "ucm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures = 0;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, " (last error: %s)\n", ucm_last_error());           \
            failures++;                                                         \
        }                                                                       \
    } while (0)

#define OK(call) CHECK((call) == UCM_OK, "%s", #call)

static const char SPEC[] =
    "model = \"c-abi\"\n"
    "dtype = \"fp32\"\n"
    "num_layers = 2\n"
    "[[group]]\n"
    "name = \"attn\"\n"
    "kind = \"chain\"\n"
    "block_size = 16\n"
    "layers = \"0-1\"\n"
    "bytes_per_token = 256\n";

enum { BLOCK_BYTES = 16 * 256, NUM_BLOCKS = 16, LAYERS = 2, TOKENS = 64 };

static int open_cache(const char *dir, uint32_t sync_mode, ucm_spec_t **spec,
                      ucm_cache_t **cache) {
    if (ucm_spec_from_toml((const uint8_t *)SPEC, strlen(SPEC), spec) != UCM_OK) return 1;
    ucm_options_t o;
    memset(&o, 0, sizeof o);
    o.dir = dir;
    o.pool_bytes = 1 << 20;
    o.sync_mode = sync_mode;
    return ucm_cache_open(*spec, &o, cache) != UCM_OK;
}

static void fill(uint8_t *p, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)((i * 131u + seed * 7u + 1u) & 0xff);
}

/* One step of `req` computing [start, end) with blocks `blocks` already set. */
static void step(ucm_scheduler_t *s, ucm_worker_t *w, const char *req, uint64_t start,
                 uint64_t end) {
    ucm_chunk_t c = {req, start, end};
    ucm_meta_t *m = NULL;
    OK(ucm_scheduler_build_meta(s, &c, 1, &m));
    const uint8_t *bytes = NULL;
    size_t len = 0;
    OK(ucm_meta_bytes(m, &bytes, &len));
    OK(ucm_worker_start_load(w, bytes, len));
    for (uint32_t l = 0; l < LAYERS; l++) {
        OK(ucm_worker_wait_layer(w, l));
        OK(ucm_worker_save_layer(w, l));
    }
    OK(ucm_worker_wait_save(w));
    ucm_meta_free(m);
}

static int wait_saved(ucm_worker_t *w, const char *req) {
    const char *ids[1] = {req};
    for (int i = 0; i < 1000; i++) {
        ucm_finished_t *f = NULL;
        if (ucm_worker_get_finished(w, ids, 1, &f) != UCM_OK)
            return 0;
        size_t n = 0, failed = 0;
        ucm_finished_count(f, UCM_FINISHED_SAVED, &n);
        ucm_finished_count(f, UCM_FINISHED_SAVE_FAILED, &failed);
        ucm_finished_free(f);
        if (failed) return 0;
        if (n) return 1;
        usleep(10000);
    }
    return 0;
}

/* Saves and loads through a cache whose disk tier syncs by `sync_mode`;
 * prints the cache's blocks written and syncfs calls ("blocks_written N",
 * "fs_syncs N") for the Rust driver to check. */
static int roundtrip(const char *dir, uint32_t sync_mode) {
    ucm_spec_t *spec = NULL;
    ucm_cache_t *cache = NULL;
    CHECK(open_cache(dir, sync_mode, &spec, &cache) == 0, "open");
    if (!cache) return 1;
    ucm_scheduler_t *s = NULL;
    ucm_worker_t *w = NULL;
    OK(ucm_scheduler_new(cache, &s));
    OK(ucm_worker_new(cache, "cpu", 0, 0, LAYERS, &w));
    uint8_t *mem[LAYERS];
    ucm_region_t regs[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        mem[l] = aligned_alloc(4096, (size_t)BLOCK_BYTES * NUM_BLOCKS);
        memset(mem[l], 0xDE, (size_t)BLOCK_BYTES * NUM_BLOCKS);
        regs[l].layer = (uint32_t)l;
        regs[l].addr = mem[l];
        regs[l].len = (size_t)BLOCK_BYTES * NUM_BLOCKS;
        regs[l].stride = BLOCK_BYTES;
    }
    OK(ucm_worker_register(w, regs, LAYERS));

    uint32_t tokens[TOKENS];
    for (int i = 0; i < TOKENS; i++) tokens[i] = 1000u + (uint32_t)i * 3u;
    uint64_t matched = 99;

    /* Request a: a miss; its 4 blocks (engine blocks 0-3) are computed and saved. */
    OK(ucm_scheduler_lookup(s, "a", tokens, TOKENS, NULL, 0, &matched));
    CHECK(matched == 0, "a cold cache serves nothing, got %llu", (unsigned long long)matched);
    uint32_t blocks_a[4] = {0, 1, 2, 3};
    ucm_group_alloc_t ga = {0, blocks_a, 4, -1};
    OK(ucm_scheduler_update_after_alloc(s, "a", &ga, 1, 0));
    for (int l = 0; l < LAYERS; l++)
        for (int b = 0; b < 4; b++) fill(mem[l] + (size_t)b * BLOCK_BYTES, BLOCK_BYTES, l * 100u + b);
    step(s, w, "a", 0, TOKENS);
    CHECK(wait_saved(w, "a"), "request a saved");
    OK(ucm_scheduler_request_finished(s, "a"));

    /* Request b, same prompt, in engine blocks 8-11: 3 blocks are served
     * (the last token is always computed) and land in blocks 8-10. */
    OK(ucm_scheduler_lookup(s, "b", tokens, TOKENS, NULL, 0, &matched));
    CHECK(matched == 48, "served 48 tokens, got %llu", (unsigned long long)matched);
    uint32_t blocks_b[4] = {8, 9, 10, 11};
    ucm_group_alloc_t gb = {0, blocks_b, 4, -1};
    OK(ucm_scheduler_update_after_alloc(s, "b", &gb, 1, matched));
    step(s, w, "b", 48, TOKENS);
    for (int l = 0; l < LAYERS; l++)
        for (int b = 0; b < 3; b++)
            CHECK(memcmp(mem[l] + (size_t)(8 + b) * BLOCK_BYTES, mem[l] + (size_t)b * BLOCK_BYTES,
                         BLOCK_BYTES) == 0,
                  "layer %d block %d loaded into engine block %d", l, b, 8 + b);
    ucm_load_error_t errs[4];
    size_t nerr = 7;
    uint8_t more = 7;
    OK(ucm_worker_load_errors(w, errs, 4, &nerr, &more));
    CHECK(nerr == 0 && more == 0, "no load errors, got %zu", nerr);

    size_t need = 0;
    CHECK(ucm_cache_metrics(cache, NULL, 0, &need) == UCM_ERR_BUFFER, "metrics needs a buffer");
    char *text = malloc(need);
    OK(ucm_cache_metrics(cache, text, need, &need));
    CHECK(strstr(text, "ucm_hit_tokens_total{group=\"attn\"} 48") != NULL, "hit metric:\n%s", text);
    /* Two lookups of 63 servable tokens; 48 served; unlimited capacity
     * would have served b's 48 too (the hit ceiling), a's nothing. */
    CHECK(strstr(text, "\nucm_lookup_tokens_total 126\n") != NULL, "looked up:\n%s", text);
    CHECK(strstr(text, "\nucm_served_tokens_total 48\n") != NULL, "served:\n%s", text);
    CHECK(strstr(text, "\nucm_hit_ceiling_tokens_total 48\n") != NULL, "ceiling:\n%s", text);
    static const char *const shown[][2] = {
        {"blocks_written", "ucm_disk_blocks_written_total{group=\"attn\"} "},
        {"fs_syncs", "ucm_disk_fs_syncs_total{group=\"attn\"} "},
    };
    for (int i = 0; i < 2; i++) {
        const char *at = strstr(text, shown[i][1]);
        CHECK(at != NULL, "%s metric:\n%s", shown[i][0], text);
        if (at) {
            at += strlen(shown[i][1]);
            printf("%s %.*s\n", shown[i][0], (int)strcspn(at, "\n"), at);
        }
    }
    free(text);

    ucm_worker_free(w);
    ucm_scheduler_free(s);
    ucm_cache_close(cache);
    ucm_spec_free(spec);
    for (int l = 0; l < LAYERS; l++) free(mem[l]);
    return failures != 0;
}

/* One engine on `cache`: a scheduler, a worker on host memory, and its
 * poisoned layer regions. */
typedef struct {
    ucm_scheduler_t *s;
    ucm_worker_t *w;
    uint8_t *mem[LAYERS];
} engine_t;

static void engine_open(ucm_cache_t *cache, engine_t *e) {
    memset(e, 0, sizeof *e);
    OK(ucm_scheduler_new(cache, &e->s));
    OK(ucm_worker_new(cache, "cpu", 0, 0, LAYERS, &e->w));
    ucm_region_t regs[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        e->mem[l] = aligned_alloc(4096, (size_t)BLOCK_BYTES * NUM_BLOCKS);
        memset(e->mem[l], 0xDE, (size_t)BLOCK_BYTES * NUM_BLOCKS);
        regs[l].layer = (uint32_t)l;
        regs[l].addr = e->mem[l];
        regs[l].len = (size_t)BLOCK_BYTES * NUM_BLOCKS;
        regs[l].stride = BLOCK_BYTES;
    }
    OK(ucm_worker_register(e->w, regs, LAYERS));
}

static void engine_close(engine_t *e) {
    ucm_worker_free(e->w);
    ucm_scheduler_free(e->s);
    for (int l = 0; l < LAYERS; l++) free(e->mem[l]);
}

/* A cache with no disk tier (`no_disk` = 1) over the remote and cold tiers
 * named (either may be "-"): cache A, in DIR_A, computes and saves a
 * prompt and is closed; cache B, in DIR_B (its own pool, no disk), is
 * served the same prompt from the tiers below, and every loaded byte is
 * compared with what A computed. Prints "served N". */
static int tiers(const char *dir_a, const char *dir_b, const char *remote, const char *cold) {
    uint32_t tokens[TOKENS];
    for (int i = 0; i < TOKENS; i++) tokens[i] = 5000u + (uint32_t)i * 7u;
    const char *dirs[2] = {dir_a, dir_b};
    uint64_t served = 0;
    for (int round = 0; round < 2; round++) {
        ucm_spec_t *spec = NULL;
        OK(ucm_spec_from_toml((const uint8_t *)SPEC, strlen(SPEC), &spec));
        ucm_options_t o;
        memset(&o, 0, sizeof o);
        o.dir = dirs[round];
        o.pool_bytes = 1 << 20;
        o.workers = 1;
        o.no_disk = 1;
        o.remote = strcmp(remote, "-") ? remote : NULL;
        o.cold = strcmp(cold, "-") ? cold : NULL;
        ucm_cache_t *cache = NULL;
        CHECK(ucm_cache_open(spec, &o, &cache) == UCM_OK, "open %s", dirs[round]);
        if (!cache) return 1;
        engine_t e;
        engine_open(cache, &e);
        uint64_t matched = 99;
        OK(ucm_scheduler_lookup(e.s, "r", tokens, TOKENS, NULL, 0, &matched));
        uint32_t blocks[4] = {4, 5, 6, 7};
        ucm_group_alloc_t ga = {0, blocks, 4, -1};
        if (round == 0) {
            CHECK(matched == 0, "the first cache is served nothing, got %llu",
                  (unsigned long long)matched);
            OK(ucm_scheduler_update_after_alloc(e.s, "r", &ga, 1, 0));
            for (int l = 0; l < LAYERS; l++)
                for (int b = 0; b < 4; b++)
                    fill(e.mem[l] + (size_t)(4 + b) * BLOCK_BYTES, BLOCK_BYTES, 900u + l * 10u + b);
            step(e.s, e.w, "r", 0, TOKENS);
            CHECK(wait_saved(e.w, "r"), "saved to the tiers below");
        } else {
            CHECK(matched == 48, "the second cache is served 48 tokens, got %llu",
                  (unsigned long long)matched);
            served = matched;
            OK(ucm_scheduler_update_after_alloc(e.s, "r", &ga, 1, matched));
            step(e.s, e.w, "r", matched, TOKENS);
            ucm_load_error_t errs[4];
            size_t nerr = 7;
            uint8_t more = 7;
            OK(ucm_worker_load_errors(e.w, errs, 4, &nerr, &more));
            CHECK(nerr == 0 && more == 0, "no load errors, got %zu", nerr);
            uint8_t want[BLOCK_BYTES];
            for (int l = 0; l < LAYERS; l++)
                for (int b = 0; b < 3; b++) {
                    fill(want, BLOCK_BYTES, 900u + l * 10u + b);
                    CHECK(memcmp(e.mem[l] + (size_t)(4 + b) * BLOCK_BYTES, want, BLOCK_BYTES) == 0,
                          "layer %d block %d came back from the tiers below", l, b);
                }
        }
        OK(ucm_scheduler_request_finished(e.s, "r"));
        engine_close(&e);
        ucm_cache_close(cache);
        ucm_spec_free(spec);
    }
    printf("served %llu\n", (unsigned long long)served);
    return failures != 0;
}

static int badargs(const char *dir) {
    ucm_spec_t *spec = NULL;
    CHECK(ucm_spec_from_toml(NULL, 5, &spec) == UCM_ERR_INVALID, "NULL text");
    CHECK(strlen(ucm_last_error()) > 0, "an error message is set");
    CHECK(ucm_spec_from_toml((const uint8_t *)"model = 3", 9, &spec) == UCM_ERR_SPEC, "bad TOML");
    CHECK(ucm_spec_from_toml((const uint8_t *)SPEC, strlen(SPEC), NULL) == UCM_ERR_INVALID,
          "NULL out");
    CHECK(ucm_spec_load("/nonexistent/spec.toml", &spec) == UCM_ERR_SPEC, "missing file");
    ucm_cache_t *cache = NULL;
    ucm_cache_t *bad_sync = NULL;
    CHECK(open_cache(dir, 7, &spec, &bad_sync) != 0 && bad_sync == NULL, "sync_mode 7 refused");
    CHECK(strstr(ucm_last_error(), "sync_mode") != NULL, "the error names the field: %s",
          ucm_last_error());
    /* The tiers below the disk, and a diskless node: checked at open. */
    {
        ucm_spec_t *sp = NULL;
        OK(ucm_spec_from_toml((const uint8_t *)SPEC, strlen(SPEC), &sp));
        struct {
            const char *remote, *cold;
            uint32_t no_disk;
            int code;
            const char *says;
        } cases[] = {
            {"ftp://host:1", NULL, 0, UCM_ERR_STORE, "URL"},
            {"redis://nohostport", NULL, 0, UCM_ERR_STORE, "URL"},
            {NULL, "s3://AB", 0, UCM_ERR_STORE, "URL"},
            {NULL, NULL, 1, UCM_ERR_STORE, "needs a remote or a cold tier"},
            {NULL, NULL, 2, UCM_ERR_INVALID, "no_disk"},
            {"redis://127.0.0.1:1", "s3://bucket/p", 0, UCM_OK, ""},
            {"redis://127.0.0.1:1", NULL, 1, UCM_OK, ""},
            {NULL, "s3://bucket", 1, UCM_OK, ""},
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            ucm_options_t o;
            memset(&o, 0, sizeof o);
            o.dir = dir;
            o.pool_bytes = 1 << 20;
            o.workers = 1;
            o.remote = cases[i].remote;
            o.cold = cases[i].cold;
            o.no_disk = cases[i].no_disk;
            ucm_cache_t *c = NULL;
            int rc = ucm_cache_open(sp, &o, &c);
            CHECK(rc == cases[i].code, "tiers case %zu: code %d, expected %d", i, rc,
                  cases[i].code);
            CHECK(strstr(ucm_last_error(), cases[i].says) != NULL,
                  "tiers case %zu: the error names it: %s", i, ucm_last_error());
            CHECK((rc == UCM_OK) == (c != NULL), "tiers case %zu: a handle only on success", i);
            ucm_cache_close(c);
        }
        ucm_spec_free(sp);
    }
    ucm_spec_free(spec);
    spec = NULL;
    CHECK(open_cache(dir, UCM_SYNC_AUTO, &spec, &cache) == 0, "open");
    CHECK(strlen(ucm_last_error()) == 0, "success clears the error");
    uint32_t g = 9;
    CHECK(ucm_spec_group_index(spec, "nope", &g) == UCM_ERR_REQUEST, "unknown group");
    ucm_options_t o;
    memset(&o, 0, sizeof o);
    ucm_cache_t *c2 = NULL;
    CHECK(ucm_cache_open(spec, &o, &c2) == UCM_ERR_INVALID, "NULL dir");
    CHECK(ucm_cache_open(NULL, &o, &c2) == UCM_ERR_INVALID, "NULL spec");

    ucm_scheduler_t *s = NULL;
    OK(ucm_scheduler_new(cache, &s));
    uint32_t tokens[40];
    for (int i = 0; i < 40; i++) tokens[i] = (uint32_t)i;
    uint64_t m = 0;
    /* Misaligned token array; a length whose byte size overflows. */
    const uint32_t *odd = (const uint32_t *)((const char *)tokens + 1);
    CHECK(ucm_scheduler_lookup(s, "r", odd, 4, NULL, 0, &m) == UCM_ERR_INVALID, "misaligned");
    CHECK(ucm_scheduler_lookup(s, "r", tokens, SIZE_MAX / 2, NULL, 0, &m) == UCM_ERR_INVALID,
          "overflowing length");
    CHECK(ucm_scheduler_lookup(s, NULL, tokens, 40, NULL, 0, &m) == UCM_ERR_INVALID, "NULL id");
    CHECK(ucm_scheduler_lookup(s, "r", NULL, 40, NULL, 0, &m) == UCM_ERR_INVALID, "NULL tokens");
    CHECK(ucm_scheduler_lookup(NULL, "r", tokens, 40, NULL, 0, &m) == UCM_ERR_INVALID,
          "NULL handle");
    const char bad_utf8[] = {(char)0xff, (char)0xfe, 0};
    CHECK(ucm_scheduler_lookup(s, bad_utf8, tokens, 40, NULL, 0, &m) == UCM_ERR_INVALID,
          "id not UTF-8");
    uint32_t blocks[2] = {0, 1};
    ucm_group_alloc_t ga = {0, blocks, 2, -1};
    CHECK(ucm_scheduler_update_after_alloc(s, "never-looked-up", &ga, 1, 0) == UCM_ERR_REQUEST,
          "unknown request");
    ucm_group_alloc_t gbad = {7, blocks, 2, -1};
    OK(ucm_scheduler_lookup(s, "r", tokens, 40, NULL, 0, &m));
    CHECK(ucm_scheduler_update_after_alloc(s, "r", &gbad, 1, 0) == UCM_ERR_INVALID,
          "group out of range");
    ucm_chunk_t c = {"r", 0, 40};
    ucm_meta_t *meta = NULL;
    CHECK(ucm_scheduler_build_meta(s, &c, 1, &meta) == UCM_ERR_REQUEST, "meta before alloc");

    ucm_worker_t *w = NULL;
    ucm_spec_t *spec2 = NULL;
    CHECK(ucm_worker_new(cache, "tpu", 0, 0, 2, &w) == UCM_ERR_UNSUPPORTED, "unknown device");
    CHECK(ucm_worker_new(cache, "cpu", 3, 0, 2, &w) == UCM_ERR_REQUEST, "rank beyond TP");
    OK(ucm_worker_new(cache, "cpu", 0, 0, 2, &w));
    uint8_t junk[16] = {1, 2, 3};
    CHECK(ucm_worker_start_load(w, junk, sizeof junk) == UCM_ERR_INVALID, "corrupt metadata");
    ucm_region_t r = {0, NULL, 4096, 4096};
    CHECK(ucm_worker_register(w, &r, 1) == UCM_ERR_INVALID, "NULL region");
    ucm_region_t r2 = {0, junk, 16, 0};
    CHECK(ucm_worker_register(w, &r2, 1) == UCM_ERR_INVALID, "zero stride");
    ucm_region_t wraps = {0, junk, SIZE_MAX, 4096};
    CHECK(ucm_worker_register(w, &wraps, 1) == UCM_ERR_INVALID, "a region that wraps");
    CHECK(strstr(ucm_last_error(), "wraps") != NULL, "the error says so: %s", ucm_last_error());
    CHECK(ucm_worker_wait_layer(w, UINT32_MAX) == UCM_ERR_REQUEST, "wait on no such layer");
    CHECK(ucm_worker_save_layer(w, UINT32_MAX) == UCM_ERR_REQUEST, "save of no such layer");
    CHECK(ucm_worker_wait_layer(w, 0) == UCM_ERR_REQUEST, "wait before a step started");
    ucm_worker_t *w2 = NULL;
    CHECK(ucm_worker_new(cache, "cpu", 0, 2, 0, &w2) == UCM_ERR_REQUEST && w2 == NULL,
          "a stage that ends before it starts");
    CHECK(ucm_spec_load("/dev/zero", &spec2) == UCM_ERR_SPEC && spec2 == NULL,
          "a device as spec file");
    CHECK(strstr(ucm_last_error(), "not a regular file") != NULL, "the error says so: %s",
          ucm_last_error());

    uint8_t ids[16];
    size_t n = 0;
    CHECK(ucm_block_ids(spec, 1, NULL, NULL, 0, tokens, 40, "attn", 0, ids, 1, &n) ==
              UCM_ERR_BUFFER && n == 2,
          "buffer too small reports the needed count, got %zu", n);
    CHECK(ucm_block_ids(spec, 1, NULL, NULL, 0, tokens, 40, "attn", 1, ids, 1, &n) ==
              UCM_ERR_INVALID,
          "rank beyond TP");

    ucm_spec_free(NULL);
    ucm_cache_close(NULL);
    ucm_scheduler_free(NULL);
    ucm_worker_free(NULL);
    ucm_meta_free(NULL);
    ucm_finished_free(NULL);
    ucm_worker_free(w);
    ucm_scheduler_free(s);
    ucm_cache_close(cache);
    ucm_spec_free(spec);
    return failures != 0;
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static int hash(int argc, char **argv) {
    ucm_spec_t *spec = NULL;
    if (ucm_spec_load(argv[2], &spec) != UCM_OK) {
        fprintf(stderr, "spec: %s\n", ucm_last_error());
        return 1;
    }
    uint32_t tp = (uint32_t)atoi(argv[3]);
    const char *salt = strcmp(argv[4], "-") ? argv[4] : NULL;
    uint8_t extra_buf[256];
    ucm_bytes_t extra = {extra_buf, 0};
    size_t n_extra = 0;
    if (strcmp(argv[5], "-")) {
        size_t l = strlen(argv[5]) / 2;
        for (size_t i = 0; i < l && i < sizeof extra_buf; i++)
            extra_buf[i] = (uint8_t)(hexval(argv[5][2 * i]) * 16 + hexval(argv[5][2 * i + 1]));
        extra.len = l;
        n_extra = 1;
    }
    uint32_t tokens[1000];
    for (uint32_t i = 0; i < 1000; i++) tokens[i] = (i * 7919u) % 65521u;
    static uint8_t ids[16 * 1024];
    for (int a = 6; a < argc; a++) {
        char kind = argv[a][0];
        char group[128];
        unsigned rank = 0;
        unsigned long long pos = 0;
        if (kind == 'b' && sscanf(argv[a], "b:%127[^:]:%u", group, &rank) == 2) {
            size_t n = 0;
            if (ucm_block_ids(spec, tp, salt, &extra, n_extra, tokens, 1000, group, rank, ids,
                              1024, &n) != UCM_OK) {
                fprintf(stderr, "%s: %s\n", argv[a], ucm_last_error());
                return 1;
            }
            printf("%s", argv[a]);
            for (size_t i = 0; i < n; i++) {
                printf(" ");
                for (int k = 0; k < 16; k++) printf("%02x", ids[16 * i + k]);
            }
            printf("\n");
        } else if (kind == 'c' && sscanf(argv[a], "c:%127[^:]:%u:%llu", group, &rank, &pos) == 3) {
            uint8_t h[16];
            if (ucm_checkpoint_hash(spec, tp, salt, &extra, n_extra, tokens, 1000, group, rank,
                                    pos, h) != UCM_OK) {
                fprintf(stderr, "%s: %s\n", argv[a], ucm_last_error());
                return 1;
            }
            printf("%s ", argv[a]);
            for (int k = 0; k < 16; k++) printf("%02x", h[k]);
            printf("\n");
        } else {
            fprintf(stderr, "bad item %s\n", argv[a]);
            return 1;
        }
    }
    ucm_spec_free(spec);
    return 0;
}

int main(int argc, char **argv) {
    if (ucm_abi_version() != 4) {
        fprintf(stderr, "ABI version %u\n", ucm_abi_version());
        return 1;
    }
    if (argc >= 3 && !strcmp(argv[1], "roundtrip"))
        return roundtrip(argv[2], argc >= 4 && !strcmp(argv[3], "files") ? UCM_SYNC_FILES
                                                                           : UCM_SYNC_AUTO);
    if (argc >= 6 && !strcmp(argv[1], "tiers")) return tiers(argv[2], argv[3], argv[4], argv[5]);
    if (argc >= 3 && !strcmp(argv[1], "badargs")) return badargs(argv[2]);
    if (argc >= 6 && !strcmp(argv[1], "hash")) return hash(argc, argv);
    fprintf(stderr,
            "usage: abi_test roundtrip DIR [files] | tiers DIR_A DIR_B REMOTE COLD | badargs DIR |"
            " hash SPEC TP SALT EXTRA ITEM...\n");
    return 2;
}

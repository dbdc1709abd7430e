#!/usr/bin/env python3
"""One round of upstream UCM's store on the workload of `ucm bench store`,
printed as JSON lines in the same shape (`path`, `shard_bytes`, `gib_s` or
`blocks_s`), plus `lost` (shards read back wrong or missing).

Run by scripts/bench-upstream.sh with upstream's Python package (built from
the user's checkout) on PYTHONPATH; it never imports this repository's
`ucm`. Usage: bench_upstream.py DIR SHARD_BYTES [--bytes N] [--shards 32]
[--direct]

Workload (as `ucm bench store`): `bytes / (shards * shard)` blocks of
`shards` shards, one shard per layer tensor, on host memory (upstream's
`simu` runtime):
- dump_cold: the Posix store alone (aio with O_DIRECT where the file system
  takes it, psync on tmpfs), every shard, until its task completes (it
  issues no fsync: on ext4 the data is on the device through O_DIRECT, the
  file names are not; ours waits for a syncfs);
- load_cold: a fresh Cache|Posix store (empty cache) loads everything; every
  shard is compared with what was dumped (outside the timing);
- load_warm: the same store again (cache hits);
- load_layerwise: one shard index at a time across all blocks;
- lookup_disk / lookup_pool: 10,000 ids of which 9,000 are stored (one 4 KiB
  shard each): through the Posix store after it dumped them, then through
  Cache|Posix after the same ids were dumped through it (its cache).
"""
import argparse
import json
import os
import secrets
import shutil
import time

import torch
from ucm.store.pipeline.connector import UcmPipelineStore

LOOKUP_IDS = 10_000
LOOKUP_PRESENT = 9_000


def config(pipeline, d, shard, shards, direct, cache_bytes):
    c = {
        "store_pipeline": pipeline,
        "storage_backends": [d],
        "unique_id": secrets.token_hex(8),
        "timeout_ms": 60_000,
        "tensor_size": shard,
        "shard_size": shard,
        "block_size": shard * shards,
        "share_buffer_enable": True,
        "io_direct": direct,
        # Upstream's fastest engine where O_DIRECT works (aio needs it);
        # psync elsewhere (tmpfs). Its GC is off: nothing here evicts.
        "posix_io_engine": "aio" if direct else "psync",
        "posix_gc_enable": False,
        "device_id": 0,
        "posix_data_trans_concurrency": 32,
        "posix_lookup_concurrency": 32,
    }
    if cache_bytes:
        c["cache_buffer_capacity_gb"] = max(1, cache_bytes >> 30)
    return c


def aligned(n, align=4096):
    """A zeroed byte tensor of `n` bytes whose first byte is `align`-aligned."""
    raw = torch.zeros(n + align, dtype=torch.uint8)
    skip = -raw.data_ptr() % align
    return raw[skip : skip + n]


def shards_of(buf, keys, shard):
    """One `shard`-byte view of `buf` per key, in order."""
    return {k: buf[i * shard : (i + 1) * shard] for i, k in enumerate(keys)}


def gib_s(n, secs):
    return n / (1 << 30) / secs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("shard", type=int)
    ap.add_argument("--bytes", type=int, default=1 << 30)
    ap.add_argument("--shards", type=int, default=32)
    ap.add_argument("--direct", action="store_true")
    a = ap.parse_args()
    shard, shards = a.shard, a.shards
    blocks = a.bytes // (shard * shards)
    root = os.path.join(a.dir, f"up-{secrets.token_hex(4)}")
    os.makedirs(root)
    recs = []
    rec = lambda path, sb, **kw: recs.append({"path": path, "shard_bytes": sb, **kw})
    try:
        ids = [secrets.token_bytes(16) for _ in range(blocks)]
        keys = [(b, s) for b in range(blocks) for s in range(shards)]
        total = blocks * shards * shard
        # Every shard starts on a 4 KiB boundary: upstream's aio engine
        # reads and writes the caller's buffers with O_DIRECT, which the
        # kernel refuses (EINVAL) for unaligned memory.
        src = shards_of(aligned(total).random_(0, 256), keys, shard)

        posix = UcmPipelineStore(config("Posix", root, shard, shards, a.direct, 0))
        t0 = time.perf_counter()
        posix.wait(posix.dump([ids[b] for b, _ in keys], [s for _, s in keys], [[src[k]] for k in keys]))
        rec("dump_cold", shard, gib_s=gib_s(total, time.perf_counter() - t0))
        del posix

        cache = UcmPipelineStore(config("Cache|Posix", root, shard, shards, a.direct, 2 * total))
        dst = shards_of(aligned(total), keys, shard)
        t0 = time.perf_counter()
        cache.wait(cache.load([ids[b] for b, _ in keys], [s for _, s in keys], [[dst[k]] for k in keys]))
        secs = time.perf_counter() - t0
        lost = sum(1 for k in keys if not torch.equal(src[k], dst[k]))
        rec("load_cold", shard, gib_s=gib_s(total, secs), lost=lost)

        t0 = time.perf_counter()
        cache.wait(cache.load([ids[b] for b, _ in keys], [s for _, s in keys], [[dst[k]] for k in keys]))
        rec("load_warm", shard, gib_s=gib_s(total, time.perf_counter() - t0))

        t0 = time.perf_counter()
        for s in range(shards):
            cache.wait(cache.load(ids, [s] * blocks, [[dst[(b, s)]] for b in range(blocks)]))
        secs = time.perf_counter() - t0
        lost_lw = sum(1 for k in keys if not torch.equal(src[k], dst[k]))
        rec("load_layerwise", shard, gib_s=gib_s(total, secs), lost=lost_lw)
        del cache

        # Lookups: 10,000 ids, 9,000 stored (one 4 KiB shard each).
        small = 4096
        lroot = os.path.join(root, "lookup")
        os.makedirs(lroot)
        present = [secrets.token_bytes(16) for _ in range(LOOKUP_PRESENT)]
        absent = [secrets.token_bytes(16) for _ in range(LOOKUP_IDS - LOOKUP_PRESENT)]
        probe = present + absent
        buf = torch.randint(0, 256, (small,), dtype=torch.uint8)

        def timed_lookup(path, st):
            t0 = time.perf_counter()
            found = st.lookup(probe)
            secs = time.perf_counter() - t0
            missed = int(sum(1 for f in found[:LOOKUP_PRESENT] if not f))
            extra = int(sum(1 for f in found[LOOKUP_PRESENT:] if f))
            rec(path, small, blocks_s=LOOKUP_IDS / secs, lost=missed + extra)

        # On disk: dumped through the Posix store itself, whose task ends
        # when the files are written (Cache|Posix writes its files back
        # later, so a lookup right after its dump finds some not there yet).
        lp = UcmPipelineStore(config("Posix", lroot, small, 1, False, 0))
        lp.wait(lp.dump(present, [0] * len(present), [[buf] for _ in present]))
        timed_lookup("lookup_disk", lp)
        # In memory: the same ids dumped through Cache|Posix fill its cache.
        lc = UcmPipelineStore(config("Cache|Posix", lroot, small, 1, False, 1 << 30))
        lc.wait(lc.dump(present, [0] * len(present), [[buf] for _ in present]))
        timed_lookup("lookup_pool", lc)
        del lc, lp
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for r in recs:
        print(json.dumps(r))


if __name__ == "__main__":
    main()

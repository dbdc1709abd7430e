"""UCM as SGLang's HiCache storage backend (``ucm.sglang_hicache``), tested
against SGLang's own interface (its ``HiCacheStorage``, ``PoolTransfer``,
hit policies and the ``dynamic`` backend factory, from the installed
``sglang`` package) with host-memory pools that hand out page addresses as
SGLang's host pools do (``get_page_buffer_meta``):

- loaded by the factory from ``{"backend_name", "module_path",
  "class_name"}``;
- v1 zero-copy round trip into another instance's pool, ``batch_exists``;
- per-page failures (a missing page is ``False``, its neighbours load);
- hybrid v2 calls with a Mamba-like pool of two buffer sizes: trailing
  states gate the hit, ``all_pages`` and ``block_groups`` policies;
- TP ranks keep their own pages, MLA ranks share them;
- the older ``get``/``set`` interface; bad input refused.

Skipped when sglang cannot be imported, unless UCM_REQUIRE_SGLANG=1 (CI).
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
try:
    from sglang.srt.mem_cache.hicache_storage import (
        HiCacheStorage,
        HiCacheStorageConfig,
        PoolHitPolicy,
        PoolName,
        PoolTransfer,
    )
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
except ImportError as e:  # pragma: no cover - depends on the machine
    if os.environ.get("UCM_REQUIRE_SGLANG") == "1":
        raise
    pytest.skip(f"sglang is not importable ({e}); scripts/sglang-deps.sh installs it", allow_module_level=True)

from ucm.sglang_hicache import UcmHiCacheStorage  # noqa: E402

PAGE = 4  # tokens per page


class KVPool:
    """A layer-first MHA host pool: per page, K and V of each layer."""

    def __init__(self, pages=16, layers=2, token_bytes=1024, seed=None):
        self.page_size = PAGE
        self.layers = layers
        self.tb = token_bytes
        self.size = pages * PAGE
        self.kv_buffer = torch.zeros(2, layers, self.size, token_bytes, dtype=torch.uint8)
        if seed is not None:
            g = torch.Generator().manual_seed(seed)
            self.kv_buffer.copy_(torch.randint(0, 256, self.kv_buffer.shape, generator=g, dtype=torch.uint8))

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        base = self.kv_buffer.data_ptr()
        v_off = self.layers * self.size * self.tb
        idx = indices.tolist()
        ptrs = []
        for i in range(0, len(idx), self.page_size):
            for layer in range(self.layers):
                k = base + (layer * self.size + idx[i]) * self.tb
                ptrs += [k, k + v_off]
        return ptrs, [self.page_size * self.tb] * len(ptrs)

    def page(self, p):
        return self.kv_buffer[:, :, p * PAGE : (p + 1) * PAGE].clone()


class MambaPool:
    """A page-first Mamba host pool: one temporal state and two conv
    states per slot, of two sizes."""

    def __init__(self, slots=8, seed=None):
        self.page_size = 1
        self.temporal = torch.zeros(slots, 8192, dtype=torch.uint8)
        self.conv = [torch.zeros(slots, 4096, dtype=torch.uint8) for _ in range(2)]
        if seed is not None:
            g = torch.Generator().manual_seed(seed)
            for t in [self.temporal, *self.conv]:
                t.copy_(torch.randint(0, 256, t.shape, generator=g, dtype=torch.uint8))

    def get_page_buffer_meta(self, indices):
        ptrs, sizes = [], []
        for i in indices.tolist():
            ptrs.append(self.temporal[i].data_ptr())
            sizes.append(8192)
            for c in self.conv:
                ptrs.append(c[i].data_ptr())
                sizes.append(4096)
        return ptrs, sizes

    def slot(self, i):
        return [self.temporal[i].clone()] + [c[i].clone() for c in self.conv]


def storage_config(tmp_path, tp_rank=0, tp_size=1, mla=False, model="test-model", **extra):
    return HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=tp_size,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=mla,
        enable_storage_metrics=False,
        is_page_first_layout=False,
        model_name=model,
        extra_config={
            "backend_name": "ucm",
            "module_path": "ucm.sglang_hicache",
            "class_name": "UcmHiCacheStorage",
            "ucm_dir": str(tmp_path / "store"),
            "ucm_pool_bytes": 8 << 20,
            **extra,
        },
    )


def backend(tmp_path, pool, **kw):
    b = StorageBackendFactory.create_backend("dynamic", storage_config(tmp_path, **kw), pool)
    assert isinstance(b, UcmHiCacheStorage) and isinstance(b, HiCacheStorage)
    b.register_mem_pool_host(pool)
    return b


def pages(*ps):
    return torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in ps])


def test_v1_round_trip_into_another_instance_and_batch_exists(tmp_path):
    src = KVPool(seed=1)
    a = backend(tmp_path, src)
    keys = [f"hash-{i}" for i in range(8)]
    assert a.batch_exists(keys) == 0
    assert a.batch_set_v1(keys, pages(*range(8))) == [True] * 8
    assert a.batch_exists(keys) == 8
    assert a.batch_exists(keys[:3] + ["other"] + keys[3:]) == 3
    # Another instance (its own pool, empty), loading into other slots.
    dst = KVPool()
    b = backend(tmp_path, dst)
    assert b.batch_exists(keys) == 8
    assert b.batch_get_v1(keys, pages(*range(8, 16))) == [True] * 8
    for i in range(8):
        assert torch.equal(dst.page(8 + i), src.page(i)), i
    assert torch.count_nonzero(dst.kv_buffer[:, :, : 8 * PAGE]) == 0


def test_a_missing_page_is_false_and_its_neighbours_still_load(tmp_path):
    src = KVPool(seed=2)
    a = backend(tmp_path, src)
    assert a.batch_set_v1(["p0", "p2"], pages(0, 2)) == [True, True]
    dst = KVPool()
    b = backend(tmp_path, dst)
    assert b.batch_get_v1(["p0", "p1", "p2"], pages(0, 1, 2)) == [True, False, True]
    assert torch.equal(dst.page(0), src.page(0)) and torch.equal(dst.page(2), src.page(2))
    assert b.exists("p2") and not b.exists("p1")


def test_a_refused_write_is_false_never_a_silent_success(tmp_path):
    class Broken(KVPool):
        def get_page_buffer_meta(self, indices):
            ptrs, sizes = super().get_page_buffer_meta(indices)
            if len(indices) > PAGE:  # the probe of one page passes
                ptrs[1] = 0
            return ptrs, sizes

    b = backend(tmp_path, Broken(seed=3))
    assert b.batch_set_v1(["x", "y"], pages(0, 1)) == [False, False]
    assert b.batch_exists(["x", "y"]) == 0


def test_hybrid_v2_trailing_states_gate_the_hit(tmp_path):
    kv, mamba = KVPool(seed=4), MambaPool(seed=5)
    a = backend(tmp_path, kv)
    a.register_mem_host_pool_v2(mamba, PoolName.MAMBA)
    keys = [f"h{i}" for i in range(8)]
    assert a.batch_set_v1(keys, pages(*range(8))) == [True] * 8
    # States after page 4 and after page 8 (slots 1 and 2 of the pool).
    got = a.batch_set_v2(
        [
            PoolTransfer(name=PoolName.MAMBA, keys=[keys[3], keys[7]], host_indices=torch.tensor([1, 2])),
        ]
    )
    assert got == {PoolName.MAMBA: [True, True]}

    def exists(upto, policy=PoolHitPolicy.TRAILING_PAGES, **kw):
        t = PoolTransfer(name=PoolName.MAMBA, keys=[keys[upto - 1]], hit_policy=policy, **kw)
        return a.batch_exists_v2(keys[:upto], [t])

    r = exists(8)
    assert (r.kv_hit_pages, r.restorable_prefix_pages) == (8, [4, 8])
    r = exists(6)  # pages 1-6: only the state after page 4 serves
    assert (r.kv_hit_pages, r.restorable_prefix_pages) == (4, [4])
    r = exists(3)  # no state at or before page 3
    assert (r.kv_hit_pages, r.restorable_prefix_pages) == (0, [])
    # A window of two trailing pages (SWA-like): page 7 is needed too.
    assert a.batch_set_v2(
        [PoolTransfer(name=PoolName.MAMBA, keys=[keys[6]], host_indices=torch.tensor([3]))]
    ) == {PoolName.MAMBA: [True]}
    t = PoolTransfer(name=PoolName.MAMBA, keys=keys[6:8], hit_policy=PoolHitPolicy.TRAILING_PAGES)
    r = a.batch_exists_v2(keys, [t])
    assert (r.kv_hit_pages, r.restorable_prefix_pages) == (8, [8])
    assert r.extra_pool_hit_pages[PoolName.MAMBA] == 8
    # all_pages: the state pool must hold every page: it holds pages 4, 7, 8.
    r = exists(8, PoolHitPolicy.ALL_PAGES)
    assert r.kv_hit_pages == 0
    # block_groups: its own verdict, never gating the KV hit.
    r = exists(8, PoolHitPolicy.BLOCK_GROUPS, group_pages=4)
    assert r.kv_hit_pages == 8 and PoolName.MAMBA not in r.extra_pool_hit_pages
    # The states load into another instance's pool, both sizes whole.
    kv2, mamba2 = KVPool(), MambaPool()
    b = backend(tmp_path, kv2)
    b.register_mem_host_pool_v2(mamba2, PoolName.MAMBA)
    got = b.batch_get_v2(
        [PoolTransfer(name=PoolName.MAMBA, keys=[keys[7], "never"], host_indices=torch.tensor([5, 6]))]
    )
    assert got == {PoolName.MAMBA: [True, False]}
    for x, y in zip(mamba2.slot(5), mamba.slot(2)):
        assert torch.equal(x, y)


def test_the_host_pools_share_one_disk_budget(tmp_path):
    """With ``ucm_disk_blocks=8``, the KV pool's and the Mamba pool's stores
    collect as one budget of bytes: twelve KV pages written after eight
    states all stay on disk (alone, the KV stores would keep 8), paid for
    by the older states, each taken whole (its temporal and conv states
    are in two stores)."""
    kv, mamba = KVPool(seed=10), MambaPool(seed=11)
    a = backend(tmp_path, kv, ucm_disk_blocks=8)
    a.register_mem_host_pool_v2(mamba, PoolName.MAMBA)
    states = [f"s{i}" for i in range(8)]
    got = a.batch_set_v2([PoolTransfer(name=PoolName.MAMBA, keys=states, host_indices=torch.arange(8))])
    assert got == {PoolName.MAMBA: [True] * 8}
    keys = [f"p{i}" for i in range(12)]
    for i in range(0, 12, 4):  # four pages per batch, as HiCache backs up
        assert a.batch_set_v1(keys[i : i + 4], pages(*range(i, i + 4))) == [True] * 4
    # Another instance (its memory tiers empty) sees what is on disk.
    b = backend(tmp_path, KVPool(), ucm_disk_blocks=8)
    b.register_mem_host_pool_v2(MambaPool(), PoolName.MAMBA)
    assert b.batch_exists(keys) == 12
    held = b._pool(PoolName.MAMBA).stores.exists(b._ids(states))
    # Of the eight states (one batch, written store by store), five went
    # (about: the last pass runs after any of the last writes), each whole:
    # no component of a lost state stays on disk.
    assert 0 < sum(held) <= 3, held
    root = tmp_path / "store" / str(PoolName.MAMBA)
    files = sum(len(fs) for d in root.iterdir() if d.is_dir() for _, _, fs in os.walk(d / "blocks"))
    assert files == 2 * sum(held), (files, held)  # two stores


def test_tp_ranks_keep_their_pages_and_mla_ranks_share_them(tmp_path):
    pool = KVPool(seed=6)
    r0 = backend(tmp_path, pool, tp_rank=0, tp_size=2)
    r1 = backend(tmp_path, KVPool(), tp_rank=1, tp_size=2)
    assert r0.batch_set_v1(["k"], pages(0)) == [True]
    assert r0.batch_exists(["k"]) == 1 and r1.batch_exists(["k"]) == 0
    m0 = backend(tmp_path, pool, tp_rank=0, tp_size=2, mla=True)
    m1 = backend(tmp_path, KVPool(), tp_rank=1, tp_size=2, mla=True)
    assert m0.batch_set_v1(["k"], pages(0)) == [True]
    assert m1.batch_exists(["k"]) == 1


def test_a_deployment_with_another_identity_is_served_nothing(tmp_path):
    """The same model name with other config bytes, another KV dtype or
    other user keys shares no page; the same deployment shares all."""
    model = tmp_path / "ckpt"
    model.mkdir()
    (model / "config.json").write_text('{"rope_theta": 10000}')
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    keys = [f"h{i}" for i in range(4)]
    a = backend(tmp_path, KVPool(seed=9), model=str(model))
    assert a.batch_set_v1(keys, pages(*range(4))) == [True] * 4
    assert backend(tmp_path, KVPool(), model=str(model)).batch_exists(keys) == 4
    assert backend(tmp_path, KVPool(), model=str(model), ucm_identity={"a": "1"}).batch_exists(keys) == 0
    other_dtype = KVPool()
    other_dtype.dtype = torch.float8_e4m3fn
    assert backend(tmp_path, other_dtype, model=str(model)).batch_exists(keys) == 0
    (model / "config.json").write_text('{"rope_theta": 500000}')
    assert backend(tmp_path, KVPool(), model=str(model)).batch_exists(keys) == 0
    (model / "config.json").write_text('{"rope_theta": 10000}')
    assert backend(tmp_path, KVPool(), model=str(model)).batch_exists(keys) == 4
    with pytest.raises(ValueError, match="ucm_identity"):
        backend(tmp_path, KVPool(), ucm_identity="x")


def test_the_older_interface_over_host_tensors(tmp_path):
    b = backend(tmp_path, KVPool())
    page_bytes = 2 * 2 * PAGE * 1024
    v = torch.randint(0, 256, (page_bytes,), dtype=torch.uint8)
    assert b.get("k") is None
    assert b.set("k", v)
    assert torch.equal(b.get("k"), v)
    out = [torch.zeros(page_bytes, dtype=torch.uint8)]
    assert torch.equal(b.batch_get(["k"], out)[0], v)
    assert b.batch_set(["a", "b"], [v, v]) and b.batch_exists(["a", "b", "c"]) == 2
    with pytest.raises(ValueError, match="contiguous host tensor"):
        b.set("bad", v[:100])


def test_bad_input_is_refused(tmp_path):
    cfg = storage_config(tmp_path)
    cfg.extra_config.pop("ucm_dir")
    os.environ.pop("UCM_HICACHE_DIR", None)
    with pytest.raises(ValueError, match="ucm_dir"):
        UcmHiCacheStorage(cfg, {})
    b = UcmHiCacheStorage(storage_config(tmp_path), {})
    with pytest.raises(ValueError, match="4 KiB"):
        b.register_mem_pool_host(KVPool(token_bytes=1000))
    with pytest.raises(ValueError, match="never registered"):
        b.batch_exists(["k"])
    b.register_mem_pool_host(KVPool())
    with pytest.raises(ValueError, match="host indices"):
        b.batch_set_v1(["a", "b"], pages(0))
    with pytest.raises(ValueError, match="never registered"):
        b.batch_get_v2([PoolTransfer(name=PoolName.MAMBA, keys=["a"], host_indices=torch.tensor([0]))])

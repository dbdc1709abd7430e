"""The drop-in for upstream UCM's store interface (``ucm.upstream``), tested
against the interface's documented semantics on host buffers:

- the class implements every method of ``UcmKVStoreBaseV1`` with upstream's
  parameter names, and upstream's factory (a double of its
  ``create_connector``: import by module path, ``issubclass`` check) takes
  it when upstream's package sits beside ours;
- the flow of upstream's host-buffer store test (aligned mmap buffers,
  ``dump_data``/``wait``/``load_data``), switched by module path only;
- ``load``/``dump`` over tensors, several tensors per shard and several
  shards per block;
- lookups (per block, and the prefix index with -1), prefetch;
- ``wait`` raises on a miss, ``check`` polls, tasks end once;
- one task dumping every shard of many blocks loses no shard (upstream
  can), read back by a fresh store from disk;
- bad configuration and arguments are refused clearly.
"""

from __future__ import annotations

import importlib
import inspect
import mmap
import os
import secrets
import subprocess
import sys
import textwrap

import pytest

np = pytest.importorskip("numpy")

from ucm import upstream  # noqa: E402
from ucm.upstream import UcmPipelineStore, UcmStoreError  # noqa: E402

# Upstream's interface: method -> parameter names (ucm/store/ucmstore_v1.py).
INTERFACE = {
    "cc_store": [],
    "lookup": ["block_ids"],
    "lookup_on_prefix": ["block_ids"],
    "prefetch": ["block_ids"],
    "load": ["block_ids", "shard_index", "dst_tensor"],
    "dump": ["block_ids", "shard_index", "src_tensor"],
    "load_data": ["block_ids", "shard_index", "dst_addr"],
    "dump_data": ["block_ids", "shard_index", "src_addr", "prerequisite_handle"],
    "wait": ["task"],
    "check": ["task"],
    "need_register_kv_caches": [],
    "register_kv_caches": ["registrations"],
}

SHARD = 64 << 10


def config(path, **kw):
    c = {
        "store_pipeline": "Posix",
        "storage_backends": [str(path)],
        "tensor_size": SHARD,
        "shard_size": SHARD,
        "block_size": SHARD,
        "device_id": 0,
        "ucm_pool_bytes": 16 << 20,
    }
    c.update(kw)
    return c


def make_array(size, alignment=4096):
    """An aligned host buffer, as upstream's test makes them."""
    mm = mmap.mmap(-1, size + alignment)
    raw = np.frombuffer(mm, dtype=np.uint8, count=size + alignment)
    ptr = raw.__array_interface__["data"][0]
    off = ((ptr + alignment - 1) & ~(alignment - 1)) - ptr
    return raw[off : off + size]


def create(module_path, class_name, cfg):
    """What upstream's factory does: import by path, check, construct."""
    cls = getattr(importlib.import_module(module_path), class_name)
    assert issubclass(cls, upstream.UcmKVStoreBaseV1)
    return cls(cfg)


def test_every_interface_method_with_upstream_parameter_names():
    assert not inspect.isabstract(UcmPipelineStore)
    for name, params in INTERFACE.items():
        fn = getattr(UcmPipelineStore, name)
        got = list(inspect.signature(fn).parameters)[1:]
        assert got == params, (name, got)
        assert getattr(upstream.UcmKVStoreBaseV1, name, None) is not None, name
    assert inspect.signature(UcmPipelineStore.dump_data).parameters[
        "prerequisite_handle"
    ].default == 0


def test_upstream_host_buffer_flow_by_module_path(tmp_path):
    store = create("ucm.upstream", "UcmPipelineStore", config(tmp_path))
    assert store.cc_store() == 0 and store.need_register_kv_caches() is False
    n = 16
    ids = [secrets.token_bytes(16) for _ in range(n)]
    data = [make_array(SHARD) for _ in range(n)]
    for i, d in enumerate(data):
        d[:] = np.frombuffer(secrets.token_bytes(SHARD), dtype=np.uint8)
    ptrs = [d.ctypes.data for d in data]
    assert store.lookup(ids) == [False] * n
    assert store.lookup_on_prefix(ids) == -1
    task = store.dump_data(ids, [0] * n, [[p] for p in ptrs])
    store.wait(task)
    assert store.lookup(ids) == [True] * n
    assert store.lookup_on_prefix(ids) == n - 1
    out = [make_array(SHARD) for _ in range(n)]
    for o in out:
        o[:] = 0
    # A uint64 array of addresses, as upstream's connector passes them.
    addrs = np.array([[o.ctypes.data] for o in out], dtype=np.uint64)
    task = store.load_data(ids, [0] * n, addrs)
    store.wait(task)
    for d, o in zip(data, out):
        assert bytes(d) == bytes(o)


def test_tensors_several_per_shard_and_several_shards_per_block(tmp_path):
    torch = pytest.importorskip("torch")
    tensor = 16 << 10
    cfg = config(tmp_path, tensor_size=tensor, shard_size=4 * tensor, block_size=8 * tensor)
    store = UcmPipelineStore(cfg)
    ids = [secrets.token_bytes(16) for _ in range(3)]
    src = {
        (b, s): [torch.randint(-128, 127, (tensor,), dtype=torch.int8) for _ in range(4)]
        for b in range(3)
        for s in range(2)
    }
    # Shard 0 of every block in one task, shard 1 in another (two ranks).
    for s in range(2):
        assert store.lookup(ids) == [False] * 3, "a block is present only when whole"
        store.wait(store.dump(ids, [s] * 3, [src[(b, s)] for b in range(3)]))
    assert store.lookup(ids) == [True] * 3
    dst = {k: [torch.zeros_like(t) for t in v] for k, v in src.items()}
    # Block-major rows: (block, shard) pairs in any order.
    rows = [(b, s) for s in (1, 0) for b in range(3)]
    store.wait(store.load([ids[b] for b, _ in rows], [s for _, s in rows], [dst[r] for r in rows]))
    for k in src:
        for a, b in zip(src[k], dst[k]):
            assert torch.equal(a, b), k
    # A tensor of the wrong size, on a bad shard index, or a short row.
    bad = [[torch.zeros(tensor - 1, dtype=torch.int8)] + src[(0, 0)][1:]]
    with pytest.raises(ValueError, match="tensor_size"):
        store.load(ids[:1], [0], bad)
    with pytest.raises(ValueError, match="shard index 2"):
        store.load(ids[:1], [2], [src[(0, 0)]])
    with pytest.raises(ValueError, match="1 tensor"):
        store.load(ids[:1], [0], [src[(0, 0)][:1]])


def test_tensors_of_several_sizes_and_a_scheduler_that_knows_only_block_size(tmp_path):
    """Upstream's connector passes ``tensor_size_list`` to workers and only
    ``block_size`` to the scheduler side."""
    sizes = [8192, 4096, 4096]
    shard = sum(sizes)
    worker = UcmPipelineStore(
        {"storage_backends": f"{tmp_path}:", "block_size": 2 * shard, "shard_size": shard,
         "tensor_size_list": sizes, "device_id": 0}
    )
    sched = UcmPipelineStore({"storage_backends": str(tmp_path), "block_size": 2 * shard})
    ids = [secrets.token_bytes(16) for _ in range(3)]
    assert sched.lookup(ids) == [False] * 3
    src = {(b, s): [make_array(n) for n in sizes] for b in range(3) for s in range(2)}
    for bufs in src.values():
        for a in bufs:
            a[:] = np.frombuffer(secrets.token_bytes(len(a)), dtype=np.uint8)
    rows = [(b, s) for b in range(3) for s in range(2)]
    addrs = [[a.ctypes.data for a in src[r]] for r in rows]
    t = worker.dump_data([ids[b] for b, _ in rows], [s for _, s in rows], addrs)
    worker.wait(t)
    worker.close()
    import time

    deadline = time.monotonic() + 20
    while sched.lookup_on_prefix(ids) != 2:  # the write-behind reaches disk
        assert time.monotonic() < deadline
        time.sleep(0.01)
    dst = {r: [make_array(n) for n in sizes] for r in rows}
    t = worker.load_data([ids[b] for b, _ in rows], [s for _, s in rows],
                         [[a.ctypes.data for a in dst[r]] for r in rows])
    worker.wait(t)
    for r in rows:
        assert [bytes(a) for a in dst[r]] == [bytes(a) for a in src[r]], r
    with pytest.raises(RuntimeError, match="block_size only"):
        sched.load_data(ids[:1], [0], [[1, 2, 3]])
    with pytest.raises(ValueError, match=r"1 tensor\(s\), a shard has 3"):
        worker.load_data(ids[:1], [0], [[dst[(0, 0)][0].ctypes.data]])
    # Another layout over the same directory is refused.
    with pytest.raises(ValueError, match="another model or layout"):
        UcmPipelineStore({"storage_backends": str(tmp_path), "block_size": 8192, "tensor_size": 4096})


def test_prefix_lookup_stops_at_the_first_hole_and_prefetch_serves_from_memory(tmp_path):
    cfg = config(tmp_path)
    store = UcmPipelineStore(cfg)
    ids = [secrets.token_bytes(16) for _ in range(4)]
    bufs = [make_array(SHARD) for _ in range(4)]
    store.wait(store.dump_data([ids[0], ids[1], ids[3]], [0] * 3, [[b.ctypes.data] for b in bufs[:3]]))
    assert store.lookup(ids) == [True, True, False, True]
    assert store.lookup_on_prefix(ids) == 1
    assert store.lookup_on_prefix(ids[2:]) == -1
    assert store.lookup_on_prefix([]) == -1
    del store
    # A fresh store (empty memory tier): prefetch, then the load is a pool hit.
    store = UcmPipelineStore(cfg)
    store.prefetch(ids[:2])
    import time

    deadline = time.monotonic() + 20
    while store.counters()["disk_reads"] < 2:
        assert time.monotonic() < deadline, "prefetch read nothing"
        time.sleep(0.01)
    out = [make_array(SHARD) for _ in range(2)]
    store.wait(store.load_data(ids[:2], [0, 0], [[o.ctypes.data] for o in out]))
    assert store.counters()["pool_hits"] == 2 and store.counters()["disk_reads"] == 2


def test_wait_raises_on_a_miss_check_polls_and_tasks_end_once(tmp_path):
    store = UcmPipelineStore(config(tmp_path))
    have, missing = secrets.token_bytes(16), secrets.token_bytes(16)
    buf = make_array(SHARD)
    t = store.dump_data([have], [0], [[buf.ctypes.data]])
    while not store.check(t):
        pass
    store.wait(t)
    with pytest.raises(ValueError, match="already waited"):
        store.wait(t)
    with pytest.raises(ValueError, match="already waited"):
        store.check(t)
    out = [make_array(SHARD) for _ in range(2)]
    t = store.load_data([have, missing], [0, 0], [[o.ctypes.data] for o in out])
    with pytest.raises(UcmStoreError) as e:
        store.wait(t)
    assert [(p[0], p[3]) for p in e.value.problems] == [(missing, "miss")]
    assert bytes(out[0]) == bytes(buf), "the present block still loaded"


def test_one_task_with_every_shard_of_every_block_loses_no_shard(tmp_path):
    tensor = 16 << 10
    shards = 8
    cfg = config(
        tmp_path, tensor_size=tensor, shard_size=tensor, block_size=shards * tensor,
        ucm_durable_wait=True,
    )
    store = UcmPipelineStore(cfg)
    n = 64
    ids = [secrets.token_bytes(16) for _ in range(n)]
    src = make_array(n * shards * tensor)
    src[:] = np.frombuffer(secrets.token_bytes(len(src)), dtype=np.uint8)
    base = src.ctypes.data
    rows = [(b, s) for b in range(n) for s in range(shards)]
    addrs = [[base + (b * shards + s) * tensor] for b, s in rows]
    store.wait(store.dump_data([ids[b] for b, _ in rows], [s for _, s in rows], addrs))
    assert store.counters()["blocks_written"] == n
    del store
    fresh = UcmPipelineStore(cfg)
    assert fresh.lookup(ids) == [True] * n
    dst = make_array(len(src))
    dst[:] = 0
    base = dst.ctypes.data
    addrs = [[base + (b * shards + s) * tensor] for b, s in rows]
    fresh.wait(fresh.load_data([ids[b] for b, _ in rows], [s for _, s in rows], addrs))
    assert fresh.counters()["disk_reads"] == n * shards
    assert bytes(dst) == bytes(src)


def syncfs_stands_for_fsyncs(path) -> bool:
    """Whether UCM's `auto` sync mode uses syncfs under `path`: ext4, XFS,
    btrfs or tmpfs on Linux 5.8+ (as ``IoDir::syncfs_reports_all``)."""
    fs = subprocess.run(
        ["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True
    ).stdout.strip()
    major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    return fs in ("ext2/ext3", "xfs", "btrfs", "tmpfs") and (major, minor) >= (5, 8)


def test_the_sync_mode_is_taken_from_the_config(tmp_path):
    n = 8
    ids = [secrets.token_bytes(16) for _ in range(n)]
    data = [make_array(SHARD) for _ in range(n)]
    for mode in ("files", "auto"):
        store = UcmPipelineStore(
            config(tmp_path / mode, ucm_sync_mode=mode, ucm_durable_wait=True)
        )
        store.wait(store.dump_data(ids, [0] * n, [[d.ctypes.data] for d in data]))
        c = store.counters()
        assert c["blocks_written"] == n, (mode, c)
        if mode == "files":
            assert c["fs_syncs"] == 0, c
        else:
            assert (c["fs_syncs"] > 0) == syncfs_stands_for_fsyncs(tmp_path), c
    with pytest.raises(ValueError, match="expected auto or files"):
        UcmPipelineStore(config(tmp_path / "bad", ucm_sync_mode="fsync"))


def test_bad_configuration_and_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="block_size"):
        UcmPipelineStore({"storage_backends": [str(tmp_path)]})
    with pytest.raises(ValueError, match="multiple"):
        UcmPipelineStore(config(tmp_path, shard_size=3 * 4096, block_size=4 * 4096, tensor_size=4096))
    with pytest.raises(ValueError, match="storage_backends"):
        UcmPipelineStore(config(tmp_path, storage_backends=[str(tmp_path), str(tmp_path)]))
    with pytest.raises(ValueError, match="storage_backends"):
        UcmPipelineStore(config(tmp_path, storage_backends=[]))
    with pytest.raises(ValueError, match="4 KiB"):
        UcmPipelineStore(config(tmp_path / "odd", tensor_size=1000, shard_size=1000, block_size=1000))
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "LAYOUT").write_text("/etc/passwd? " * 1000)
    with pytest.raises(ValueError, match="not a UCM component layout"):
        UcmPipelineStore(config(junk))
    store = UcmPipelineStore(config(tmp_path))
    buf = make_array(SHARD)
    with pytest.raises(ValueError, match="16"):
        store.lookup([b"short"])
    with pytest.raises(ValueError, match="event"):
        store.dump_data([secrets.token_bytes(16)], [0], [[buf.ctypes.data]], prerequisite_handle=7)
    with pytest.raises(ValueError, match="one of each"):
        store.dump_data([secrets.token_bytes(16)] * 2, [0], [[buf.ctypes.data]])
    with pytest.raises(ValueError, match="NULL"):
        store.dump_data([secrets.token_bytes(16)], [0], [[0]])
    sched = UcmPipelineStore(config(tmp_path, transfer_enable=False, device_id=-1))
    assert sched.lookup([secrets.token_bytes(16)]) == [False]
    with pytest.raises(RuntimeError, match="transfer_enable"):
        sched.load_data([secrets.token_bytes(16)], [0], [[buf.ctypes.data]])


def env_finding_our_package() -> dict:
    """The environment for a child Python that must import the same ``ucm``
    package as this process, however it was installed (a venv, ``pip install
    --target`` with ``PYTHONPATH``, or the source tree): the directory holding
    that package comes first on the child's path, the rest of ``PYTHONPATH``
    after it."""
    import ucm

    ours = os.path.dirname(os.path.dirname(os.path.abspath(ucm.__file__)))
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([ours, *rest])}


def test_upstream_factory_takes_the_class_when_upstream_sits_beside_us(tmp_path):
    """A double of upstream's package (its interface module and factory, as
    documented) in a directory after ours on the path: ``ucm.store`` is
    found through the path extension and our class derives from its base."""
    fake = tmp_path / "upstream"
    store = fake / "ucm" / "store"
    store.mkdir(parents=True)
    (fake / "ucm" / "__init__.py").write_text("")
    (store / "__init__.py").write_text("")
    methods = "".join(
        f"    @abstractmethod\n    def {m}(self, *a, **k): ...\n" for m in INTERFACE
    )
    (store / "ucmstore_v1.py").write_text(
        "from abc import ABC, abstractmethod\n"
        "class Task(ABC):\n    pass\n"
        "class UcmKVStoreBaseV1(ABC):\n"
        "    def __init__(self, config):\n        self.config = config\n" + methods
    )
    (store / "factory_v1.py").write_text(
        textwrap.dedent(
            """
            import importlib
            from ucm.store.ucmstore_v1 import UcmKVStoreBaseV1
            class UcmConnectorFactoryV1:
                @classmethod
                def create_connector(cls, class_name, config, module_path):
                    c = getattr(importlib.import_module(module_path), class_name)
                    assert issubclass(c, UcmKVStoreBaseV1)
                    return c(config)
            """
        )
    )
    prog = textwrap.dedent(
        f"""
        import sys
        sys.path.append({str(fake)!r})
        from ucm.store.factory_v1 import UcmConnectorFactoryV1
        import ucm.upstream
        assert ucm.upstream.UPSTREAM_INTERFACE
        s = UcmConnectorFactoryV1.create_connector(
            "UcmPipelineStore", {config(tmp_path / "s")!r}, "ucm.upstream")
        assert s.lookup([b"x" * 16]) == [False]
        print("factory ok")
        """
    )
    r = subprocess.run(
        [sys.executable, "-c", prog], capture_output=True, text=True, timeout=120,
        env=env_finding_our_package(),
    )
    assert r.returncode == 0 and "factory ok" in r.stdout, r.stderr

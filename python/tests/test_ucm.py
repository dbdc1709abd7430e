"""The Python module: spec table, golden hashes, a save then load round trip
through the scheduler and worker on CPU tensors (registered without
copies), bad arguments, metrics, and that blocking calls release the GIL.

Run: pytest python/tests (the module installed, torch for the tensor tests).
"""

from __future__ import annotations

import json
import pathlib
import re
import threading
import time

import pytest

import ucm

ROOT = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "coordinator/tests/golden/hash-vectors.json"

SPEC = """
model = "py-test"
dtype = "fp32"
num_layers = 3

[[group]]
name = "attn"
kind = "chain"
block_size = 16
layers = "0-1"
bytes_per_token = 256

[[group]]
name = "ssm"
kind = "snapshot"
grid = 16
state_bytes = 8192
layers = "2"
"""

BLOCK_BYTES = 16 * 256


def golden_tokens():
    return [(i * 7919) % 65521 for i in range(1000)]


def test_golden_hash_vectors_match_from_python():
    golden = json.loads(GOLDEN.read_text())
    checked = 0
    for v in golden["vectors"]:
        spec = ucm.SpecTable.load(str(ROOT / v["spec"]))
        extra = [bytes.fromhex(h) for h in v["extra_keys_hex"]]
        kw = dict(tp_size=v["tp_size"], cache_salt=v["cache_salt"], extra_keys=extra)
        for group, ranks in v["blocks"].items():
            for rank, ids in ranks.items():
                got = ucm.block_ids(spec, golden_tokens(), group, rank=int(rank), **kw)
                assert [g.hex() for g in got] == ids, (v["spec"], group, rank)
                checked += len(ids)
        for group, ranks in v["checkpoints"].items():
            for rank, at in ranks.items():
                for pos, h in at.items():
                    got = ucm.checkpoint_hash(
                        spec, golden_tokens(), group, int(pos), rank=int(rank), **kw
                    )
                    assert got.hex() == h, (v["spec"], group, rank, pos)
                    checked += 1
    assert checked > 100


def test_spec_table_is_exposed_and_bad_specs_are_refused():
    spec = ucm.SpecTable.from_toml(SPEC)
    assert spec.model == "py-test" and spec.num_layers == 3
    groups = {g["name"]: g for g in spec.groups()}
    assert groups["attn"]["kind"] == "chain" and groups["attn"]["layer_bytes"] == BLOCK_BYTES
    assert groups["ssm"]["kind"] == "snapshot" and groups["ssm"]["layers"] == [2]
    with pytest.raises(RuntimeError, match="spec"):
        ucm.SpecTable.from_toml("model = 3")
    with pytest.raises(RuntimeError):
        ucm.SpecTable.load("/nonexistent/spec.toml")
    with pytest.raises(ValueError, match="rank"):
        ucm.block_ids(spec, [1, 2, 3], "attn", rank=1, tp_size=1)


def test_remote_and_cold_tier_urls_are_checked_at_open(tmp_path):
    spec = ucm.SpecTable.from_toml(SPEC)
    for kw in ({"remote": "ftp://host:1"}, {"remote": "redis://nohostport"}, {"cold": "s3://AB"}):
        with pytest.raises(Exception, match="URL"):
            ucm.Cache(spec, str(tmp_path / "store"), **kw)
    with pytest.raises(Exception, match="needs a remote or a cold tier"):
        ucm.Cache(spec, str(tmp_path / "store"), no_disk=True)
    # Well-formed URLs open (nothing is contacted until a store opens).
    ucm.Cache(spec, str(tmp_path / "store"), remote="redis://127.0.0.1:1", cold="s3://bucket/p")


torch = pytest.importorskip("torch")


def content(seed: int, n: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)


def make_engine(tmp_path, num_blocks=8, slots=4, device="cpu"):
    cache = ucm.Cache(ucm.SpecTable.from_toml(SPEC), str(tmp_path / "store"), pool_bytes=4 << 20)
    # vLLM's CPU layout for the attention layers: block-major, each block
    # one contiguous chunk; the state layer: one slot per row.
    kv = [torch.full((num_blocks, 2, 16, 32), float("nan"), device=device) for _ in range(2)]
    state = torch.full((slots, 2048), float("nan"), device=device)
    return cache, kv, state


def devices():
    """`cpu`, and `cuda` where a GPU is usable (UCM_REQUIRE_GPU=1: must be)."""
    import os

    out = ["cpu"]
    if torch.cuda.is_available():
        out.append("cuda")
    elif os.environ.get("UCM_REQUIRE_GPU") == "1":
        out.append("cuda")  # fails below: a GPU was required
    return out


def run_step(worker, meta, layers=3):
    worker.start_load_kv(meta)
    for layer in range(layers):
        worker.wait_for_layer_load(layer)
        worker.save_kv_layer(layer)
    worker.wait_for_save()


def wait_saved(worker, req):
    for _ in range(500):
        saved, failed, _ = worker.get_finished([req])
        assert not failed, failed
        if req in saved:
            return
        time.sleep(0.01)
    raise AssertionError(f"{req} never saved")


@pytest.mark.parametrize("device", devices())
def test_save_then_load_round_trip_on_tensors(tmp_path, device):
    cache, kv, state = make_engine(tmp_path, device=device)
    sched = cache.scheduler()
    worker = cache.worker()
    regs = [(0, kv[0], 0), (1, kv[1], 0), (2, state, 0)]
    worker.register_kv_caches(regs)
    tokens = [100 + 3 * i for i in range(64)]

    # Request a: computes its 4 blocks (engine blocks 0-3) and ends at 64.
    assert sched.get_num_new_matched_tokens("a", tokens, 0) == 0
    # The end (sure) and the grid points before it (speculative: states a
    # step ending there would keep; this one-step prefill ends only at 64).
    assert sched.checkpoint_positions("a") == [16, 32, 48, 64]
    sched.update_state_after_alloc("a", {0: [0, 1, 2, 3]}, {1: 0}, 0)
    for layer in range(2):
        flat = kv[layer].view(torch.uint8).view(8, -1)
        for b in range(4):
            flat[b].copy_(content(layer * 10 + b, BLOCK_BYTES))
    state.view(torch.uint8).view(4, -1)[0].copy_(content(99, 8192))
    if device == "cuda":
        torch.cuda.synchronize()
    run_step(worker, sched.build_meta([("a", 0, 64)]))
    wait_saved(worker, "a")
    sched.request_finished("a")

    # Request b, the same prompt plus more, in engine blocks 4-7, slot 3:
    # 64 tokens (4 blocks and the state at 64) come from UCM.
    longer = tokens + [7, 8, 9]
    assert sched.get_num_new_matched_tokens("b", longer, 0) == 64
    assert sched.resolution("b") == (64, 64)
    sched.update_state_after_alloc("b", {0: [4, 5, 6, 7]}, {1: 3}, 64)
    run_step(worker, sched.build_meta([("b", 64, 67)]))
    for layer in range(2):
        flat = kv[layer].view(torch.uint8).view(8, -1).cpu()
        for b in range(4):
            assert torch.equal(flat[4 + b], content(layer * 10 + b, BLOCK_BYTES)), (layer, b)
    assert torch.equal(state.view(torch.uint8).view(4, -1)[3].cpu(), content(99, 8192))
    assert worker.load_errors() == []
    m = cache.metrics()
    assert m["lookup_hits"] == 1 and m["failed_loads"] == 0
    text = cache.metrics_text()
    assert 'ucm_hit_tokens_total{group="attn"} 64' in text
    assert "ucm_layer_load_wait_seconds_count" in text


def test_the_sync_mode_reaches_the_disk_tiers(tmp_path):
    """`files`: saves are made durable by fsyncs, never a syncfs (the
    metric stays 0 while blocks are written); a bad mode is a ValueError."""
    spec = ucm.SpecTable.from_toml(SPEC)
    cache = ucm.Cache(spec, str(tmp_path / "files"), pool_bytes=4 << 20, sync_mode="files")
    sched = cache.scheduler()
    worker = cache.worker()
    torch = pytest.importorskip("torch")
    kv = [torch.zeros((8, 2, 16, 32)) for _ in range(2)]
    state = torch.zeros((4, 2048))
    worker.register_kv_caches([(0, kv[0], 0), (1, kv[1], 0), (2, state, 0)])
    tokens = [5 + i for i in range(64)]
    assert sched.get_num_new_matched_tokens("a", tokens, 0) == 0
    sched.update_state_after_alloc("a", {0: [0, 1, 2, 3]}, {1: 0}, 0)
    run_step(worker, sched.build_meta([("a", 0, 64)]))
    wait_saved(worker, "a")
    text = cache.metrics_text()

    def metric(name):
        m = re.search(rf'^{name}{{group="attn"}} (\d+)$', text, re.M)
        assert m, (name, text)
        return int(m.group(1))

    assert metric("ucm_disk_blocks_written_total") > 0, text
    assert metric("ucm_disk_fs_syncs_total") == 0, text
    with pytest.raises(ValueError, match="expected auto or files"):
        ucm.Cache(spec, str(tmp_path / "bad"), sync_mode="fsync")


def test_bad_arguments_are_errors_not_crashes(tmp_path):
    cache, kv, state = make_engine(tmp_path)
    sched = cache.scheduler()
    worker = cache.worker()
    with pytest.raises(ValueError, match="register_kv_caches first"):
        worker.wait_for_layer_load(0)
    # A layout whose blocks are not contiguous (K and V split outermost).
    split = torch.zeros(2, 8, 16, 64)
    with pytest.raises(ValueError, match="contiguous|block"):
        worker.register_kv_caches([(0, split.transpose(0, 1), 0)])
    with pytest.raises(ValueError, match="dimension"):
        worker.register_kv_caches([(0, kv[0], 9)])
    with pytest.raises(RuntimeError, match="unknown request"):
        sched.update_state_after_alloc("nope", {0: [0]}, {}, 0)
    with pytest.raises(RuntimeError):
        sched.build_meta([("nope", 0, 4)])
    worker.register_kv_caches([(0, kv[0], 0), (1, kv[1], 0), (2, state, 0)])
    with pytest.raises(ValueError, match="registered already"):
        worker.register_kv_caches([(0, kv[0], 0)])
    with pytest.raises(ValueError, match="metadata"):
        worker.start_load_kv(b"not metadata")
    # A stride too small for a shard is refused by the adapter.
    cache2, _, _ = make_engine(tmp_path / "two")
    w2 = cache2.worker()
    tiny = torch.zeros(8, 16)
    with pytest.raises(RuntimeError, match="stride"):
        w2.register_kv_caches([(0, tiny, 0), (1, tiny, 0), (2, tiny, 0)])
    with pytest.raises(RuntimeError, match="device"):
        cache.worker().register_kv_caches([(0, torch.zeros(1, 1, device="meta"), 0)])


def test_blocking_calls_release_the_gil(tmp_path):
    """While one thread is inside the native module (hashing a long prompt),
    another Python thread keeps running."""
    spec = ucm.SpecTable.from_toml(SPEC)
    tokens = list(range(2_000_000))
    ticks = []
    done = threading.Event()

    def ticker():
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.0005)

    t = threading.Thread(target=ticker)
    t.start()
    time.sleep(0.01)
    start = time.perf_counter()
    ucm.block_ids(spec, tokens, "attn")
    end = time.perf_counter()
    done.set()
    t.join()
    inside = [x for x in ticks if start < x < end]
    assert end - start > 0.005, "the call was too short to tell"
    assert len(inside) >= 2, f"no Python thread ran during the native call ({end - start:.3f} s)"


def test_cuda_tensors_without_a_driver_are_refused_clearly(tmp_path):
    """The wheel carries the CUDA backend; without a driver, registering a
    CUDA tensor says why (the GPU round trip above runs where one is)."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the round trip covers CUDA")

    class CudaLike:
        device = "cuda:0"

        def data_ptr(self):
            return 1 << 20

        def element_size(self):
            return 4

        def size(self):
            return [8, 1024]

        def stride(self):
            return [1024, 1]

    cache, _, _ = make_engine(tmp_path)
    with pytest.raises(RuntimeError, match="libcuda|driver|unsupported"):
        cache.worker().register_kv_caches([(0, CudaLike(), 0)])


def test_hostile_inputs_are_clear_errors_never_hangs_or_wraps(tmp_path):
    """A tensor-like object whose sizes overflow, a device as a spec file,
    and a task naming one (block, shard) twice: each a clear error."""

    class Huge:
        device = "cpu"

        def data_ptr(self):
            return 1 << 20

        def element_size(self):
            return 2**62

        def size(self):
            return [8, 1024]

        def stride(self):
            return [1024, 1]

    cache, _, _ = make_engine(tmp_path)
    with pytest.raises(ValueError, match="overflows"):
        cache.worker().register_kv_caches([(0, Huge(), 0)])
    with pytest.raises(RuntimeError, match="not a regular file"):
        ucm.SpecTable.load("/dev/zero")
    store = ucm.BlockStore(str(tmp_path / "raw"), 4096, 2)
    buf = torch.zeros(2 * 4096, dtype=torch.uint8)
    a = buf.data_ptr()
    block = b"\x07" * 16
    with pytest.raises(Exception, match="twice"):
        store.wait(store.dump([block, block], [0, 0], [a, a + 4096]))
    # The same block on its two shards is fine.
    t = store.dump([block, block], [0, 1], [a, a + 4096])
    store.wait(t)


def test_the_identity_note_names_another_identity_of_the_model_and_what_differs(tmp_path):
    """Two deployments of one model that differ in revision, on one store
    directory: each is told of the other, with the field that differs;
    a table without an identity is told nothing."""
    store = str(tmp_path / "store")
    ident = '\n[identity]\nrevision = "{}"\n'
    a = ucm.Cache(ucm.SpecTable.from_toml(SPEC + ident.format("r1")), store)
    b = ucm.Cache(ucm.SpecTable.from_toml(SPEC + ident.format("r2")), store)
    tokens = list(range(64))
    for c in (a, b):
        # A lookup opens the scheduler's view of the stores, which records
        # the identity in the directory.
        assert c.scheduler().get_num_new_matched_tokens("x", tokens, 0) == 0
    note = a.identity_note()
    assert note is not None and 'revision: "r1" -> "r2"' in note, note
    assert 'revision: "r2" -> "r1"' in b.identity_note()
    plain = ucm.Cache(ucm.SpecTable.from_toml(SPEC), store)
    assert plain.identity_note() is None

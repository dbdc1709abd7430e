"""The vLLM connector's spec derivation and layout checks, without an
engine: vLLM's own KV-cache spec classes in, UCM's spec table out; layouts
it does not know are refused with a clear error."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
kvi = pytest.importorskip("vllm.v1.kv_cache_interface")

import ucm  # noqa: E402
from vllm_fakes import Group, KvConfig  # noqa: E402
from ucm.vllm_layout import page_view, plan_from_kv_cache_config  # noqa: E402



def attn(block=128, window=None):
    kw = dict(block_size=block, num_kv_heads=2, head_size=64, dtype=torch.float32)
    if window:
        return kvi.SlidingWindowSpec(sliding_window=window, **kw)
    return kvi.FullAttentionSpec(**kw)


def test_a_hybrid_config_becomes_a_valid_spec_table():
    mamba = kvi.MambaSpec(
        block_size=2048,
        shapes=((3, 320), (8, 32, 32)),
        dtypes=(torch.float32, torch.float32),
        page_size_padded=attn().page_size_bytes,
    )
    cfg = KvConfig(
        [
            Group(["model.layers.0.mixer", "model.layers.2.mixer"], mamba),
            Group(["model.layers.1.attn"], attn()),
            Group(["model.layers.3.attn"], attn(window=256)),
        ]
    )
    plan = plan_from_kv_cache_config(cfg, "m", 1)
    spec = ucm.SpecTable.from_toml(plan.toml)
    groups = {g["name"]: g for g in spec.groups()}
    assert groups["g0_state"]["kind"] == "snapshot" and groups["g0_state"]["layers"] == [0, 2]
    assert groups["g1_attn"]["kind"] == "chain" and groups["g1_attn"]["block"] == 128
    assert groups["g2_attn"]["window"] == 256
    assert plan.layer_of == {
        "model.layers.0.mixer": 0,
        "model.layers.1.attn": 1,
        "model.layers.2.mixer": 2,
        "model.layers.3.attn": 3,
    }
    assert plan.hooked_layers == {1, 3}
    assert groups["g1_attn"]["layer_bytes"] == attn().page_size_bytes


def test_an_unknown_group_kind_is_refused_by_name():
    class Odd:
        block_size = 16
        page_size_bytes = 4096

    with pytest.raises(ValueError, match="Odd"):
        plan_from_kv_cache_config(KvConfig([Group(["model.layers.0.x"], Odd())]), "m", 1)


def test_layouts():
    page = 2 * 128 * 128 * 4
    cpu = torch.zeros(6, 2, 128, 128)  # vLLM's CPU layout
    v = page_view("l", cpu, page)
    assert v.shape == (6, page) and v.data_ptr() == cpu.data_ptr()
    # K and V in separate regions (all K blocks, then all V blocks).
    split = torch.zeros(2, 6, 128, 2, 64)
    with pytest.raises(ValueError, match="block-major"):
        page_view("l", split, page)
    # A CUDA-style [2, num_blocks, block_size, heads, head] view over
    # block-major memory: K and V of a block share its page.
    raw = torch.zeros(6, 2, 128, 2, 64)
    kv_split = raw.transpose(0, 1)
    v = page_view("c", kv_split, page)
    assert v.shape == (6, page) and v.data_ptr() == raw.data_ptr()
    # A Mamba layer: two state views into one page per block.
    raw = torch.zeros(6, 4096)
    conv = raw[:, :1000].view(torch.uint8)
    ssm = raw[:, 1000:3000]
    v = page_view("m", [conv.view(torch.float32), ssm], 4096 * 4)
    assert v.shape == (6, 4096 * 4) and v.data_ptr() == raw.data_ptr()
    # A page size that does not match the tensor's block step.
    with pytest.raises(ValueError, match="block-major"):
        page_view("s", torch.zeros(6, 64, 2), 64 * 4)
    # A block spilling out of its page.
    wide = torch.zeros(7, 4096)
    spill = torch.as_strided(wide, (6, 200), (4096, 1), storage_offset=4000)
    with pytest.raises(ValueError, match="one 16384-byte page"):
        page_view("w", [wide[:6, :100], spill], 4096 * 4)


def test_connector_stats_aggregate():
    from ucm.vllm_connector import UcmConnector

    a = UcmConnector.build_kv_connector_stats({"loads": 2, "failed_loads": 1})
    b = UcmConnector.build_kv_connector_stats({"loads": 3})
    assert a.aggregate(b).reduce() == {"loads": 5, "failed_loads": 1}
    assert UcmConnector.build_kv_connector_stats({}).is_empty()


def test_connector_options_choose_the_sync_mode(tmp_path):
    from ucm.vllm_connector import shared_cache

    spec = """
model = "sync-mode"
num_layers = 1
[[group]]
name = "attn"
kind = "chain"
block_size = 16
layers = "0"
bytes_per_token = 256
"""
    assert shared_cache(spec, str(tmp_path / "a"), 1, {"sync_mode": "files"}) is not None
    with pytest.raises(ValueError, match="expected auto or files"):
        shared_cache(spec, str(tmp_path / "b"), 1, {"sync_mode": "fsync"})


def test_metrics_published_by_another_process_are_read_and_dead_ones_ignored(tmp_path):
    """Under vLLM's engine multiprocessing the cache lives in the engine's
    process: ``metrics_text(dir)`` reads what live processes published to
    ``<dir>/metrics.<pid>.prom``, never a dead process's file, and a new
    publisher removes the files of dead processes."""
    import os
    import subprocess
    import sys

    from ucm import vllm_connector as vc

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        (tmp_path / f"metrics.{child.pid}.prom").write_text("ucm_lookup_hits_total 7\n")
        (tmp_path / f"metrics.{dead.pid}.prom").write_text("ucm_lookup_hits_total 1000\n")
        (tmp_path / "metrics.notapid.prom").write_text("ucm_lookup_hits_total 5000\n")
        text = vc.metrics_text(str(tmp_path))
        assert "ucm_lookup_hits_total 7" in text
        assert "1000" not in text and "5000" not in text
        # A publisher in this directory clears the dead process's file.
        spec = 'model = "m"\n[[group]]\nname = "a"\nkind = "chain"\nblock_size = 16\nlayers = "0"\nbytes_per_token = 256\n'
        cache = ucm.Cache(ucm.SpecTable.from_toml(spec), str(tmp_path / "s"))
        vc._MetricsPublisher(cache, str(tmp_path))
        assert not (tmp_path / f"metrics.{dead.pid}.prom").exists()
        assert (tmp_path / f"metrics.{child.pid}.prom").exists()
    finally:
        child.kill()
        child.wait()
    assert os.path.exists(tmp_path)


def test_the_production_connector_has_no_sabotage_switch():
    """The negative controls' bugs live in scripts/ucm_sabotage.py (test
    code, not in the wheel): the connector neither reads a ``sabotage`` key
    nor alters what it loaded."""
    from ucm.vllm_connector import UcmConnector

    assert "sabotage" not in UcmConnector.EXTRA_KEYS
    c = object.__new__(UcmConnector)
    loads = {}
    c._loads_planned({"have": 0, "hit": 64, "blocks": {0: [1, 2, 3, 4]}}, loads)
    assert loads == {}
    assert c._layer_loaded(0, at_start=False) is None
    import importlib.util

    assert importlib.util.find_spec("ucm.ucm_sabotage") is None

"""The cache identity the vLLM connector builds from vLLM's config: every
field it reads changes the identity digest (and so every id), the same
deployment keeps it, and a user may add to it but not replace it."""

from __future__ import annotations

import copy
import json
import types

import pytest

torch = pytest.importorskip("torch")
kvi = pytest.importorskip("vllm.v1.kv_cache_interface")

import ucm  # noqa: E402
from ucm.identity import model_revision, weights_fingerprint, with_identity  # noqa: E402
from vllm_fakes import Group, KvConfig  # noqa: E402
from ucm.vllm_layout import plan_from_kv_cache_config  # noqa: E402



def kv_config(heads=2, head=64, dtype=torch.float32, block=128):
    attn = kvi.FullAttentionSpec(block_size=block, num_kv_heads=heads, head_size=head, dtype=dtype)
    mamba = kvi.MambaSpec(
        block_size=2048,
        shapes=((3, 320), (8, 32, 32)),
        dtypes=(torch.float32, torch.float32),
        page_size_padded=attn.page_size_bytes,
    )
    return KvConfig(
        [
            Group(["model.layers.0.mixer"], mamba),
            Group(["model.layers.1.attn"], attn),
        ]
    )


def checkpoint(tmp_path, config=None):
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(config or {"rope_theta": 10000.0}))
    (d / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    (d / "model-00001.safetensors").write_bytes(b"\0" * 1000)
    return d


def vllm_config(model, revision=None, quant=None, rope_theta=10000.0, cache_dtype="auto",
                rope_scaling=None):
    hf = types.SimpleNamespace(rope_theta=rope_theta, rope_scaling=rope_scaling,
                               max_position_embeddings=4096)
    mc = types.SimpleNamespace(model=str(model), revision=revision, quantization=quant,
                               hf_config=hf, dtype="torch.bfloat16", code_revision=None,
                               tokenizer_revision=None)
    cc = types.SimpleNamespace(cache_dtype=cache_dtype)
    return types.SimpleNamespace(model_config=mc, cache_config=cc)


def digest(vc, kv, user=None):
    plan = plan_from_kv_cache_config(kv, "m", 1)
    toml = with_identity(plan.toml, vc, kv, plan, user)
    return ucm.SpecTable.from_toml(toml).identity


def test_every_field_read_from_vllm_changes_the_identity(tmp_path):
    model = checkpoint(tmp_path)
    kv = kv_config()
    base = digest(vllm_config(model), kv)
    assert base is not None and base == digest(vllm_config(model), kv_config())
    variants = {
        "revision": (vllm_config(model, revision="abc"), kv, None),
        "quantization": (vllm_config(model, quant="fp8"), kv, None),
        "rope theta": (vllm_config(model, rope_theta=500000.0), kv, None),
        "rope scaling": (vllm_config(model, rope_scaling={"type": "yarn", "factor": 4.0}), kv, None),
        "kv cache dtype": (vllm_config(model, cache_dtype="fp8_e4m3"), kv, None),
        "kv heads": (vllm_config(model), kv_config(heads=4, head=32), None),
        "tensor dtype": (vllm_config(model), kv_config(dtype=torch.float16), None),
        "user key": (vllm_config(model), kv, {"adapter": "lora-7"}),
    }
    seen = {base}
    for what, (vc, k, user) in variants.items():
        d = digest(vc, k, user)
        assert d not in seen, f"{what} does not change the identity"
        seen.add(d)


def test_the_checkpoints_config_bytes_change_the_identity_and_weights_are_not_read(tmp_path):
    model = checkpoint(tmp_path)
    kv = kv_config()
    before = digest(vllm_config(model), kv)
    fp = weights_fingerprint(str(model))
    # Same size, other bytes, in a weight file: not read, same fingerprint.
    (model / "model-00001.safetensors").write_bytes(b"\1" * 1000)
    assert weights_fingerprint(str(model)) == fp
    # A re-quantized checkpoint written over the old one: other sizes.
    (model / "model-00001.safetensors").write_bytes(b"\1" * 500)
    assert weights_fingerprint(str(model)) != fp
    (model / "model-00001.safetensors").write_bytes(b"\0" * 1000)
    assert digest(vllm_config(model), kv) == before
    # One more key in config.json: another identity.
    (model / "config.json").write_text(json.dumps({"rope_theta": 10000.0, "x": 1}))
    assert digest(vllm_config(model), kv) != before
    (model / "model.safetensors.index.json").write_text('{"weight_map": {"a": "b"}}')
    assert weights_fingerprint(str(model)) != fp
    assert weights_fingerprint(str(tmp_path / "nope")) == ""
    assert weights_fingerprint("org/name-on-the-hub") == ""


def test_the_revision_comes_from_vllm_or_the_hub_cache_path(tmp_path):
    commit = "0123456789abcdef0123456789abcdef01234567"
    assert model_revision("/x/models--a--b/snapshots/" + commit, None) == commit
    assert model_revision("/x/models--a--b/snapshots/" + commit + "/sub", None) == commit
    assert model_revision("/x/snapshots/" + commit, "v2") == "v2"
    assert model_revision(str(tmp_path), None) == ""


def test_a_spec_with_its_own_identity_is_kept_and_user_keys_cannot_replace_ours(tmp_path):
    model = checkpoint(tmp_path)
    kv = kv_config()
    plan = plan_from_kv_cache_config(kv, "m", 1)
    own = plan.toml + '\n[identity]\nrevision = "mine"\n'
    assert with_identity(own, vllm_config(model), kv, plan, None) == own
    with pytest.raises(ValueError, match="its own"):
        with_identity(own, vllm_config(model), kv, plan, {"a": "b"})
    with pytest.raises(ValueError, match="set by the connector"):
        with_identity(plan.toml, vllm_config(model), kv, plan, {"model_dtype": "x"})
    with pytest.raises(ValueError, match="dict"):
        with_identity(plan.toml, vllm_config(model), kv, plan, "rev")
    # Keys the table refuses are refused with the field named.
    with pytest.raises(Exception, match="extra"):
        with_identity_parsed(plan, model, kv, {"a/b": "c"})
    # Without an identity the ids are the old ones; with it they differ.
    plain = ucm.SpecTable.from_toml(plan.toml)
    pinned = ucm.SpecTable.from_toml(with_identity(plan.toml, vllm_config(model), kv, plan))
    toks = list(range(300))
    assert ucm.block_ids(plain, toks, "g1_attn") != ucm.block_ids(pinned, toks, "g1_attn")
    assert "revision=" in pinned.identity_text


def with_identity_parsed(plan, model, kv, user):
    return ucm.SpecTable.from_toml(with_identity(copy.copy(plan.toml), vllm_config(model), kv, plan, user))

"""A deployment's cache identity, built from the engine's own config.

UCM hashes an ``[identity]`` table of the spec into every block id and
checkpoint hash (``coordinator/src/identity.rs``), so two deployments that
differ in any of its fields share no hit. This module writes that table
from vLLM's config objects, with no user input:

* ``revision``: the model's revision as vLLM was given it, else the commit
  of a Hugging Face cache snapshot the model path lies in (``.../snapshots/
  <commit>``), else empty;
* ``weights``: a fingerprint of the checkpoint directory: md5 over the names
  and bytes of its config and weight-index files (``config.json``,
  ``*.index.json``, ``generation_config.json``, ``quant*config*.json``), and
  the names and sizes of its weight files (never their bytes);
* ``quantization``: vLLM's quantization method and the checkpoint's
  ``quantization_config``;
* ``position``: the position-encoding fields of the model's config (RoPE
  theta, scaling and parameters, rotary dimensions, maximum positions);
* per group: the KV-cache dtype (vLLM's ``cache_dtype`` and the group's
  tensor dtype) and the layout of its bytes (the group spec's kind, block
  size, heads, head size, shapes and page size);
* ``extra``: the model and tokenizer revisions vLLM was given, and whatever
  the user adds in ``kv_connector_extra_config["identity"]`` (a dict of
  plain keys to strings), which may add to the table but not replace it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any, Dict, Optional

_SNAPSHOT = re.compile(r"/snapshots/([0-9a-f]{40})(/|$)")
_READ = re.compile(r"^(config\.json|generation_config\.json|.*\.index\.json|quant.*config.*\.json)$")
_SIZED = re.compile(r".*\.(safetensors|bin|pt|pth|gguf|ckpt)$")
# Bytes of one config file read at most: a config or index file is small.
_MAX_READ = 64 << 20

_POSITION_KEYS = (
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "rope_type",
    "partial_rotary_factor",
    "rotary_dim",
    "rotary_emb_base",
    "max_position_embeddings",
    "position_embedding_type",
    "use_rope",
    "no_rope_layers",
    "qk_rope_head_dim",
)

_LAYOUT_KEYS = (
    "block_size",
    "num_kv_heads",
    "head_size",
    "head_size_v",
    "sliding_window",
    "attention_chunk_size",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "cache_dtype_str",
    "shapes",
    "dtypes",
    "mamba_type",
    "page_size_padded",
    "page_size_bytes",
)


def _plain(v: Any) -> Any:
    """A JSON-able, stable form of a config value."""
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if hasattr(v, "to_dict"):
        try:
            return _plain(v.to_dict())
        except Exception:  # noqa: BLE001 - a config object we cannot read: its text
            pass
    return str(v)


def _json(v: Any) -> str:
    return json.dumps(_plain(v), sort_keys=True, separators=(",", ":"))


def weights_fingerprint(model: str) -> str:
    """``md5:<hex>`` over a local checkpoint's config and index files (names
    and bytes) and its weight files (names and sizes), or ``""`` when
    ``model`` is not a local directory or file."""
    if os.path.isfile(model):
        st = os.stat(model)
        return "md5:" + hashlib.md5(f"{os.path.basename(model)}\0{st.st_size}".encode()).hexdigest()
    if not os.path.isdir(model):
        return ""
    h = hashlib.md5()
    for name in sorted(os.listdir(model)):
        path = os.path.join(model, name)
        if not os.path.isfile(path):
            continue
        if _READ.match(name):
            with open(path, "rb") as f:
                data = f.read(_MAX_READ + 1)
            if len(data) > _MAX_READ:
                raise ValueError(f"ucm: {path} is over {_MAX_READ} bytes; not a config file")
            h.update(b"F\0" + name.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
        elif _SIZED.match(name):
            h.update(b"S\0" + name.encode() + b"\0" + str(os.stat(path).st_size).encode() + b"\0")
    return "md5:" + h.hexdigest()


def model_revision(model: str, given: Optional[str]) -> str:
    """The revision vLLM was given, else the commit of the Hugging Face
    cache snapshot ``model`` lies in, else ``""``."""
    if given:
        return str(given)
    m = _SNAPSHOT.search(os.path.realpath(model) if os.path.exists(model) else model)
    return m.group(1) if m else ""


def _group_layout(spec: Any) -> str:
    fields = {"kind": type(spec).__name__}
    for k in _LAYOUT_KEYS:
        if hasattr(spec, k):
            try:
                fields[k] = getattr(spec, k)
            except Exception:  # noqa: BLE001 - a property that cannot be read here
                continue
    return _json(fields)


def _toml_str(s: str) -> str:
    # JSON strings are TOML basic strings (same escapes).
    return json.dumps(s, ensure_ascii=True)


def identity_toml(vllm_config: Any, kv_cache_config: Any, group_names: Dict[int, str],
                  user: Optional[Dict[str, Any]] = None) -> str:
    """The ``[identity]`` table (TOML) of a vLLM deployment. ``group_names``
    maps vLLM's KV-cache group index to the spec group's name."""
    mc = vllm_config.model_config
    cc = vllm_config.cache_config
    hf = getattr(mc, "hf_config", None)
    model = str(mc.model)
    quant = {
        "method": getattr(mc, "quantization", None),
        "config": getattr(hf, "quantization_config", None) if hf is not None else None,
    }
    position = {}
    if hf is not None:
        for k in _POSITION_KEYS:
            v = getattr(hf, k, None)
            if v is not None:
                position[k] = v
        text = getattr(hf, "text_config", None)
        if text is not None and text is not hf:
            for k in _POSITION_KEYS:
                v = getattr(text, k, None)
                if v is not None:
                    position["text." + k] = v
    lines = [
        "",
        "[identity]",
        f"revision = {_toml_str(model_revision(model, getattr(mc, 'revision', None)))}",
        f"weights = {_toml_str(weights_fingerprint(model))}",
        f"quantization = {_toml_str(_json(quant))}",
        f"position = {_toml_str(_json(position))}",
    ]
    extra: Dict[str, str] = {}
    for k in ("code_revision", "tokenizer_revision"):
        v = getattr(mc, k, None)
        if v:
            extra[k] = str(v)
    extra["model_dtype"] = str(getattr(mc, "dtype", ""))
    for k, v in (user or {}).items():
        if k in extra:
            raise ValueError(f"ucm: identity key `{k}` is set by the connector; pick another name")
        extra[str(k)] = v if isinstance(v, str) else _json(v)
    if extra:
        items = ", ".join(f"{_toml_str(k)} = {_toml_str(v)}" for k, v in sorted(extra.items()))
        lines.append(f"extra = {{ {items} }}")
    cache_dtype = str(getattr(cc, "cache_dtype", "auto"))
    for gi, g in enumerate(kv_cache_config.kv_cache_groups):
        name = group_names.get(gi)
        if name is None:
            continue
        spec = g.kv_cache_spec
        dtype = getattr(spec, "dtype", None)
        lines += [
            "",
            f"[identity.groups.{name}]",
            f"kv_dtype = {_toml_str(f'cache_dtype={cache_dtype} tensor={dtype}')}",
            f"layout = {_toml_str(_group_layout(spec))}",
        ]
    return "\n".join(lines) + "\n"


def with_identity(toml: str, vllm_config: Any, kv_cache_config: Any, plan: Any,
                  user: Optional[Dict[str, Any]] = None) -> str:
    """``toml`` (the spec derived from vLLM's config, or the user's spec
    file) with the deployment's ``[identity]`` appended. A spec that already
    has an ``[identity]`` table is the user's choice and is kept as it is
    (``user`` must then be empty). Group entries are written for the plan's
    groups that the spec names."""
    import ucm

    table = ucm.SpecTable.from_toml(toml)
    if table.identity is not None:
        if user:
            raise ValueError(
                "ucm: the spec file has its own [identity]; put the identity keys there, "
                "not in kv_connector_extra_config['identity']"
            )
        return toml
    if user is not None and not isinstance(user, dict):
        raise ValueError("ucm: kv_connector_extra_config['identity'] must be a dict of names to strings")
    named = {g["name"] for g in table.groups()}
    names = {g.vllm_index: g.name for g in plan.groups if g.name in named}
    return toml + identity_toml(vllm_config, kv_cache_config, names, user)


_POOL_KEYS = (
    "dtype",
    "layout",
    "page_size",
    "head_num",
    "head_dim",
    "v_head_dim",
    "layer_num",
    "start_layer",
    "end_layer",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "size_per_token",
)


def pool_layout(pool: Any) -> Dict[str, Any]:
    """The layout fields of an SGLang host pool (those it has)."""
    out: Dict[str, Any] = {"kind": type(pool).__name__}
    for k in _POOL_KEYS:
        v = getattr(pool, k, None)
        if v is not None and not callable(v):
            out[k] = v
    return out


def key_identity(model: Optional[str], user: Optional[Dict[str, Any]],
                 layout: Optional[Dict[str, Any]]) -> str:
    """The identity (md5 hex) of a backend that keys blocks by the engine's
    own page hashes (SGLang's HiCache): the model's revision and weights
    fingerprint from its path, the KV pool's layout and dtype, and the
    user's keys."""
    if user is not None and not isinstance(user, dict):
        raise ValueError("ucm: `ucm_identity` must be a dict of names to strings")
    m = str(model or "")
    record = {
        "schema": 1,
        "revision": model_revision(m, None),
        "weights": weights_fingerprint(m),
        "layout": layout or {},
        "extra": user or {},
    }
    return hashlib.md5(_json(record).encode()).hexdigest()

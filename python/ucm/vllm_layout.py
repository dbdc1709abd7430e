"""What UCM needs to know of a vLLM engine: its spec table, derived from
vLLM's ``KVCacheConfig``, and the memory layout of its KV caches.

Spec derivation. Every vLLM layer that holds KV cache or state becomes one
spec layer (ordered by its model layer index, then name). Per vLLM KV-cache
group:

* ``FullAttentionSpec`` (and MLA, a subclass): a ``chain`` group;
* ``SlidingWindowSpec``: a ``chain`` group with its ``window``;
* ``MambaSpec``: a ``snapshot`` group whose state is the layer's whole page
  (conv and SSM states together), on a grid of the attention block size.

Bytes per token are the group's page bytes over its block size, so a stored
shard is one layer's page: exactly what vLLM keeps per block. Any other
group kind is refused with an error naming it. A spec file given in the
connector's ``kv_connector_extra_config`` (``spec``) replaces the derived
table; its layers must then follow the same numbering.

Layouts. A layer's tensor must index engine blocks (or state slots) in its
first dimension, with each block one contiguous chunk: vLLM's CPU layout
``[num_blocks, kv_heads, block_size, 2 * head_size]`` and the CUDA layouts
whose block dimension is outermost (``[num_blocks, 2, block_size, heads,
head]``, MLA's ``[num_blocks, block_size, dim]``). A Mamba layer's states
are views into one page per block; the page is registered. Layouts with K
and V split in the outer dimension (``[2, num_blocks, ...]``) are refused.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

_LAYER_INDEX = re.compile(r"\.(\d+)\.")


def layer_index(name: str) -> int:
    """The model layer index in a vLLM layer name (`model.layers.3.attn`)."""
    m = _LAYER_INDEX.search("." + name + ".")
    if not m:
        raise ValueError(f"ucm: no layer index in the layer name `{name}`")
    return int(m.group(1))


@dataclass
class GroupPlan:
    """One vLLM KV-cache group as a UCM spec group."""

    vllm_index: int
    name: str
    kind: str  # "chain" or "snapshot"
    layer_names: list[str]
    page_bytes: int
    block_size: int
    window: int | None = None


@dataclass
class EnginePlan:
    """The spec table of an engine and how its layers map onto it."""

    groups: list[GroupPlan]
    layer_of: dict[str, int] = field(default_factory=dict)
    toml: str = ""

    def group_of_vllm(self, vllm_index: int) -> int | None:
        for i, g in enumerate(self.groups):
            if g.vllm_index == vllm_index:
                return i
        return None

    @property
    def hooked_layers(self) -> set[int]:
        """Spec layers whose engine layer calls the connector's layer hooks
        (attention); the others (Mamba) load at step start and save at its
        end."""
        return {
            self.layer_of[n] for g in self.groups if g.kind == "chain" for n in g.layer_names
        }


def _dtype_name(dtype) -> str:
    s = str(dtype).replace("torch.", "")
    return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(s, s)


def plan_from_kv_cache_config(kv_cache_config, model: str, tp_size: int) -> EnginePlan:
    """Derives UCM's spec table from vLLM's ``KVCacheConfig``."""
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        MambaSpec,
        SlidingWindowSpec,
    )

    raw = []
    attn_blocks = []
    dtype = "fp32"
    for gi, g in enumerate(kv_cache_config.kv_cache_groups):
        spec = g.kv_cache_spec
        kind_name = type(spec).__name__
        names = list(g.layer_names)
        if isinstance(spec, SlidingWindowSpec):
            raw.append((gi, "chain", names, spec, spec.sliding_window))
            attn_blocks.append(spec.block_size)
        elif isinstance(spec, FullAttentionSpec):
            if getattr(spec, "sliding_window", None):
                raw.append((gi, "chain", names, spec, spec.sliding_window))
            else:
                raw.append((gi, "chain", names, spec, None))
            attn_blocks.append(spec.block_size)
        elif isinstance(spec, MambaSpec):
            raw.append((gi, "snapshot", names, spec, None))
        else:
            raise ValueError(
                f"ucm: vLLM KV-cache group {gi} is a {kind_name}, which UCM's "
                "vLLM connector does not map; give a spec file in "
                "kv_connector_extra_config['spec']"
            )
        if hasattr(spec, "dtype"):
            dtype = _dtype_name(spec.dtype)
    if not attn_blocks:
        raise ValueError("ucm: the model has no attention group to chain blocks on")
    grid = min(attn_blocks)
    all_names = sorted(
        {n for _, _, names, _, _ in raw for n in names}, key=lambda n: (layer_index(n), n)
    )
    layer_of = {n: i for i, n in enumerate(all_names)}
    groups = []
    for gi, kind, names, spec, window in raw:
        page = spec.page_size_bytes
        name = f"g{gi}_{'attn' if kind == 'chain' else 'state'}"
        groups.append(
            GroupPlan(
                vllm_index=gi,
                name=name,
                kind=kind,
                layer_names=sorted(names, key=lambda n: layer_of[n]),
                page_bytes=page,
                block_size=spec.block_size if kind == "chain" else grid,
                window=window,
            )
        )
    plan = EnginePlan(groups=groups, layer_of=layer_of)
    plan.toml = plan_toml(plan, model, dtype, tp_size)
    return plan


def plan_toml(plan: EnginePlan, model: str, dtype: str, tp_size: int) -> str:
    """The spec table of a plan, as TOML."""
    rule = "intersection" if tp_size > 1 else "all_union"
    lines = [
        f"model = {json.dumps(model)}",
        f'dtype = "{dtype}"',
        f"num_layers = {len(plan.layer_of)}",
    ]
    for g in plan.groups:
        layers = ", ".join(str(plan.layer_of[n]) for n in g.layer_names)
        lines += ["", "[[group]]", f'name = "{g.name}"', f'kind = "{g.kind}"']
        lines.append(f"layers = [{layers}]")
        lines.append(f'rank_rule = "{rule}"')
        if g.kind == "chain":
            if g.page_bytes % g.block_size:
                raise ValueError(
                    f"ucm: group {g.name}: a page of {g.page_bytes} bytes is not a whole "
                    f"number of bytes per token for {g.block_size}-token blocks"
                )
            lines.append(f"block_size = {g.block_size}")
            lines.append(f"bytes_per_token = {g.page_bytes // g.block_size}")
            if g.window:
                lines.append(f"window = {g.window}")
        else:
            lines.append(f"grid = {g.block_size}")
            lines.append(f"state_bytes = {g.page_bytes}")
    return "\n".join(lines) + "\n"


def _block_dim(t, page_bytes: int) -> int | None:
    """The dimension of `t` that steps one page per index (the block
    dimension), or None."""
    for d in range(t.dim()):
        if t.stride(d) * t.element_size() == page_bytes and t.shape[d] > 1:
            return d
    if t.dim() and t.shape[0] == 1:
        return 0
    return None


def page_view(layer_name: str, value, page_bytes: int):
    """A ``[num_blocks, page_bytes]`` byte view of one layer's KV cache or
    state, checked to be block-major: block ``b`` of the layer is the page
    at ``base + b * page_bytes``, and everything of one block lies in it.

    ``value`` is a tensor (attention) or a list of state tensors (Mamba:
    views into one page per block). The block dimension need not be the
    first: a ``[2, num_blocks, ...]`` view whose K and V halves lie in one
    page per block (vLLM's block-major allocation under a K/V-split view)
    is accepted; K and V in separate regions are refused."""
    import torch

    views = list(value) if isinstance(value, (list, tuple)) else [value]
    if not views:
        raise ValueError(f"ucm: layer {layer_name} has no KV-cache tensor")
    dims = []
    for t in views:
        d = _block_dim(t, page_bytes) if t.dim() else None
        if d is None:
            raise ValueError(
                f"ucm: layer {layer_name}: tensor of shape {tuple(t.shape)} and strides "
                f"{t.stride()} is not block-major with {page_bytes}-byte pages "
                "(vLLM's CPU layout and block-major CUDA layouts are supported; K and V "
                "in separate regions are not)"
            )
        dims.append(d)
    base = min(t.data_ptr() for t in views)
    num_blocks = {t.shape[d] for t, d in zip(views, dims)}
    if len(num_blocks) != 1:
        raise ValueError(f"ucm: layer {layer_name}: its tensors disagree on the block count")
    num_blocks = num_blocks.pop()
    for t, d in zip(views, dims):
        # The bytes of block 0 over every other dimension must lie in page 0.
        lo = t.data_ptr()
        hi = lo + t.element_size() * (
            1 + sum((n - 1) * st for i, (n, st) in enumerate(zip(t.shape, t.stride())) if i != d)
        )
        if lo < base or hi - base > page_bytes:
            raise ValueError(
                f"ucm: layer {layer_name}: a block of tensor {tuple(t.shape)} (strides "
                f"{t.stride()}) does not lie in one {page_bytes}-byte page"
            )
    first = min(views, key=lambda t: t.data_ptr())
    storage = first.untyped_storage()
    offset = base - storage.data_ptr()
    if offset + num_blocks * page_bytes > storage.nbytes():
        raise ValueError(f"ucm: layer {layer_name}: its pages run past the tensor's storage")
    out = torch.empty(0, dtype=torch.uint8, device=first.device)
    out.set_(storage, offset, (num_blocks, page_bytes), (page_bytes, 1))
    return out

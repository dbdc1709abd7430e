"""Negative controls for ``scripts/vllm_e2e.py``: UCM's vLLM connector with
a deliberate bug, so the end-to-end checks prove they can fail.

Test code only: it is not part of the wheel, and a deployment cannot turn
it on. vLLM loads it by module path (``kv_connector_module_path =
"ucm_sabotage"``, with this directory on ``PYTHONPATH``); the extra config
key ``sabotage`` picks the bug:

- ``garble_loads``: flips bits of every block a step loads, after the load,
  as if stored bytes were corrupted and no checksum caught it;
- ``garble_states``: the same for the recurrent states loaded.
"""

from __future__ import annotations

from ucm.vllm_connector import UcmConnector


class SabotagedUcmConnector(UcmConnector):
    """``UcmConnector`` whose loads are garbled after they land."""

    EXTRA_KEYS = UcmConnector.EXTRA_KEYS | {"sabotage"}
    MODES = ("garble_loads", "garble_states")

    def __init__(self, vllm_config, role, kv_cache_config=None):
        extra = dict(vllm_config.kv_transfer_config.kv_connector_extra_config or {})
        self._sabotage = extra.get("sabotage")
        if self._sabotage not in self.MODES:
            raise ValueError(f"ucm_sabotage: sabotage must be one of {self.MODES}, not {self._sabotage!r}")
        super().__init__(vllm_config, role, kv_cache_config)

    def _loads_planned(self, st, loads):
        """Records the engine blocks (``garble_loads``) or state slots
        (``garble_states``) a request's load writes, per group."""
        p = st["have"] + st["hit"]
        for sg, g in enumerate(self._plan.groups):
            if g.kind == "chain" and self._sabotage == "garble_loads":
                lo, hi = st["have"] // g.block_size, p // g.block_size
                loads.setdefault(sg, []).extend(st["blocks"][sg][lo:hi])
            elif g.kind == "snapshot" and self._sabotage == "garble_states" and sg in st["slots"]:
                loads.setdefault(sg, []).append(st["slots"][sg])

    def _layer_loaded(self, layer, at_start):
        # Asynchronous loads land by the step's start; synchronous ones per
        # layer (chain blocks only: hookless layers' states are garbled
        # through the asynchronous path, which hybrids use).
        if at_start != self._async:
            return
        if not self._async and self._sabotage != "garble_loads":
            return
        meta = self._started
        for sg, g in enumerate(self._plan.groups):
            names = {self._plan.layer_of[n] for n in g.layer_names}
            if layer in names:
                for b in meta.loads.get(sg, []):
                    self._kv[layer][b].bitwise_xor_(0x10)

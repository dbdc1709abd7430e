"""vLLM's scheduler, ending prefill chunks where UCM plans checkpoints.

A recurrent (Mamba, KDA) state exists in the engine only where a step
ends. vLLM prefills a prompt in one step, so without help the only state a
prompt leaves is its last one, and a later prompt that shares a prefix and
then diverges finds no state to resume from. UCM's retention plans where
states are worth keeping (``checkpoint_positions``: the request's end, the
junctions it shares with earlier requests, and speculative grid points at
lower priority, see decision D71); this scheduler ends a prefill chunk at
each of those positions, so the connector saves a state there.

Use it beside the connector::

    LLM(model=..., scheduler_cls="ucm.vllm_scheduler.UcmScheduler",
        kv_transfer_config=KVTransferConfig(kv_connector="UcmConnector", ...))

``UcmAsyncScheduler`` is the same over vLLM's ``AsyncScheduler`` (for
``async_scheduling=True``). The scheduler settings (token budget, chunked
prefill, long-prefill threshold) stay vLLM's; a chunk only ends earlier,
at a planned position, and never later. Where vLLM's own Mamba "align"
mode is on, its clipping runs first and UCM's stops are added to it.

The hook is vLLM's ``_mamba_block_aligned_split`` (vLLM 0.32), which the
scheduler calls for every request it is about to prefill. A vLLM without
it runs unchanged, and the scheduler logs once that states stay at step
ends only.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

try:
    from vllm.logger import init_logger

    logger = init_logger("vllm.ucm")
except ImportError:  # pragma: no cover - vLLM always has it
    logger = logging.getLogger("ucm.vllm")

_HOOK = "_mamba_block_aligned_split"


def clip_to_stops(start: int, num_new_tokens: int, stops) -> int:
    """The chunk length from ``start`` that ends at the first of ``stops``
    strictly inside ``(start, start + num_new_tokens)``, or
    ``num_new_tokens`` when none is inside. Never 0 for a chunk that was not
    0, never longer than asked."""
    end = start + num_new_tokens
    for s in stops:
        if start < s < end:
            return s - start
    return num_new_tokens


class _ChunkStops:
    """The mixin: clips each prefill chunk at the connector's stops."""

    def _ucm_setup(self) -> None:
        conn = getattr(self, "connector", None)
        self._ucm_stops = getattr(conn, "chunk_stops", None)
        self._ucm_align = bool(getattr(self, "need_mamba_block_aligned_split", False))
        if self._ucm_stops is None:
            logger.warning(
                "ucm: %s without UCM's connector; prefill chunks are vLLM's",
                type(self).__name__,
            )
            return
        if not callable(getattr(super(), _HOOK, None)):
            logger.warning(
                "ucm: this vLLM has no %s hook; recurrent states are kept only "
                "where vLLM ends a step",
                _HOOK,
            )
            self._ucm_stops = None
            return
        # The scheduler calls the hook only when this is set (vLLM sets it
        # for its own "align" mode; the hook below keeps that behaviour).
        self.need_mamba_block_aligned_split = True

    def _mamba_block_aligned_split(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_local_computed_tokens: int = 0,
        num_external_computed_tokens: int = 0,
    ) -> int:
        if self._ucm_align:
            num_new_tokens = super()._mamba_block_aligned_split(  # type: ignore[misc]
                request,
                num_new_tokens,
                num_new_local_computed_tokens,
                num_external_computed_tokens,
            )
        if self._ucm_stops is None or num_new_tokens <= 0:
            return num_new_tokens
        start = (
            int(request.num_computed_tokens)
            + int(num_new_local_computed_tokens)
            + int(num_external_computed_tokens)
        )
        # Only a prompt's prefill is split: decode steps are one token.
        if start >= int(request.num_prompt_tokens):
            return num_new_tokens
        return clip_to_stops(start, num_new_tokens, self._ucm_stops(request.request_id))


class UcmScheduler(_ChunkStops, Scheduler):
    """vLLM's ``Scheduler`` whose prefill chunks also end at UCM's planned
    checkpoint positions."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._ucm_setup()


class UcmAsyncScheduler(_ChunkStops, AsyncScheduler):
    """vLLM's ``AsyncScheduler`` whose prefill chunks also end at UCM's
    planned checkpoint positions."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._ucm_setup()

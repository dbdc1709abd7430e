"""``ucm.vllm_scheduler``: prefill chunks end at the connector's planned
checkpoint positions, never later than vLLM would end them, and vLLM's own
"align" clipping still runs first. The real engine check (a plain shared
prefix hits in vLLM with default scheduler settings) is in
``scripts/vllm_e2e.py``; these run the mixin over a stand-in base."""

from __future__ import annotations

import types

import pytest

pytest.importorskip("vllm.v1.core.sched.scheduler")

from ucm import vllm_scheduler as vs  # noqa: E402


def test_clip_to_stops_ends_at_the_first_stop_inside_the_chunk():
    assert vs.clip_to_stops(0, 1600, [256, 512, 1536]) == 256
    assert vs.clip_to_stops(256, 1344, [256, 512, 1536]) == 256
    assert vs.clip_to_stops(1536, 64, [256, 512, 1536]) == 64
    # A stop at the chunk's end or outside it changes nothing.
    assert vs.clip_to_stops(0, 256, [256]) == 256
    assert vs.clip_to_stops(300, 100, [256, 512]) == 100
    assert vs.clip_to_stops(0, 100, []) == 100


class _Base:
    """Stands in for vLLM's scheduler: the hook, and the flag it sets in
    "align" mode; records what its own clipping was asked."""

    def __init__(self, connector, align=False, clip=None):
        self.connector = connector
        self.need_mamba_block_aligned_split = align
        self._clip = clip
        self.asked = []

    def _mamba_block_aligned_split(self, request, n, local=0, external=0):
        self.asked.append((request.request_id, n, local, external))
        return self._clip(n) if self._clip else n


class _Sched(vs._ChunkStops, _Base):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._ucm_setup()


class _Conn:
    def __init__(self, stops):
        self.stops = stops

    def chunk_stops(self, req_id):
        return self.stops.get(req_id, [])


def req(rid, computed, prompt):
    return types.SimpleNamespace(request_id=rid, num_computed_tokens=computed, num_prompt_tokens=prompt)


def test_a_prompt_is_prefilled_in_chunks_that_end_at_each_stop():
    s = _Sched(_Conn({"a": [256, 512, 1536]}))
    assert s.need_mamba_block_aligned_split, "the scheduler calls the hook only when this is set"
    r = req("a", 0, 1600)
    ends = []
    while r.num_computed_tokens < 1600:
        n = s._mamba_block_aligned_split(r, 1600 - r.num_computed_tokens)
        assert n > 0
        r.num_computed_tokens += n
        ends.append(r.num_computed_tokens)
    assert ends == [256, 512, 1536, 1600]
    assert s.asked == [], "vLLM's own clipping runs only in its align mode"


def test_a_load_or_local_hit_moves_the_start_and_decode_is_never_split():
    s = _Sched(_Conn({"b": [1408, 1536]}))
    # 1280 tokens served: the chunk starts there and ends at 1408.
    assert s._mamba_block_aligned_split(req("b", 0, 1620), 340, 0, 1280) == 128
    assert s._mamba_block_aligned_split(req("b", 1024, 1620), 596, 256, 0) == 128
    # Past the prompt (decode, or a resumed request's replay): unchanged.
    assert s._mamba_block_aligned_split(req("b", 1620, 1620), 1) == 1
    # A request the connector has not planned: unchanged.
    assert s._mamba_block_aligned_split(req("c", 0, 1000), 1000) == 1000


def test_vllms_align_clipping_runs_first_and_the_stops_apply_to_its_result():
    s = _Sched(_Conn({"a": [256, 512]}), align=True, clip=lambda n: min(n, 384))
    assert s._mamba_block_aligned_split(req("a", 0, 1600), 1600) == 256
    s2 = _Sched(_Conn({"a": [512]}), align=True, clip=lambda n: min(n, 384))
    assert s2._mamba_block_aligned_split(req("a", 0, 1600), 1600) == 384
    assert [a[1] for a in s.asked + s2.asked] == [1600, 1600]


def test_without_ucms_connector_the_scheduler_is_vllms():
    s = _Sched(object())
    assert not s.need_mamba_block_aligned_split
    assert s._mamba_block_aligned_split(req("a", 0, 1600), 1600) == 1600


def test_the_classes_are_vllms_schedulers():
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    assert issubclass(vs.UcmScheduler, Scheduler)
    assert issubclass(vs.UcmAsyncScheduler, AsyncScheduler)
    # The hook the mixin overrides is the one this vLLM's scheduler calls.
    assert callable(getattr(Scheduler, vs._HOOK, None))

"""The serve benchmark's prompts (`scripts/serve_bench.py`): the
throughput rounds' prompts are never served from cache, so none may begin
with another prompt's first block (the workload's, or another round's)."""

from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))

import serve_bench as sb  # noqa: E402

BLOCK = 64  # tokens: shorter than any block the benchmark's model caches


def test_throughput_prompts_share_no_first_block_with_any_other_prompt():
    args = argparse.Namespace(sessions=4, turns=4, docs=3, questions=3)
    starts = []
    for r in sb.workload(args):
        for part in (r["prefix"], r["message"]):
            if part:
                starts.append(tuple(part[:BLOCK]))
    seen = set(starts)
    for k in range(9):
        for arr, copies in (("concurrent", 2), ("sequential", 1)):
            for on in (True, False):
                for p in sb.throughput_prompts(arr, k, on, copies):
                    assert len(p) in sb.THROUGHPUT
                    assert all(50 <= t < 1950 for t in p)
                    head = tuple(p[:BLOCK])
                    assert head not in seen, (arr, k, on)
                    seen.add(head)

#!/usr/bin/env python3
"""Turns `ucm bench io --json` output (JSON lines on stdin) into a Markdown
table: one row per (op, block, depth), one column pair per engine. The
figures are the medians of the rounds, the ratio that of the medians; the
load average at the bench's start comes first."""
import json
import sys

recs = [json.loads(l) for l in sys.stdin if l.strip().startswith("{")]
engines = list(dict.fromkeys(r["engine"] for r in recs))
keys = list(dict.fromkeys((r["op"], r["block_bytes"], r["depth"]) for r in recs))
by = {(r["engine"], r["op"], r["block_bytes"], r["depth"]): r for r in recs}
only_blocks = {int(b) for b in sys.argv[1:]} if len(sys.argv) > 1 else None
loads = [r["load_average"] for r in recs if r.get("load_average") is not None]
print(f"Load average at start: {loads[0]:.2f}." if loads else "Load average at start: not recorded.")
print()
head = "| op | block | depth | " + " | ".join(f"{e} GiB/s (fio, ratio)" for e in engines) + " |"
print(head)
print("|" + "---|" * (3 + len(engines)))
for op, bs, d in keys:
    if only_blocks and bs not in only_blocks:
        continue
    cells = []
    for e in engines:
        r = by.get((e, op, bs, d))
        if r is None:
            cells.append("-")
        elif r["fio_gib_s"] is None:
            cells.append(f"{r['gib_s']:.2f}")
        else:
            cells.append(f"{r['gib_s']:.2f} ({r['fio_gib_s']:.2f}, {r['ratio']:.2f})")
    print(f"| {op} | {bs >> 10} KiB | {d} | " + " | ".join(cells) + " |")

#!/usr/bin/env python3
"""Summarises consecutive runs of the three benches of the hot-path goals
(`ucm bench store --dir /dev/shm`, `ucm bench layerwise`, `ucm bench io
--dir /dev/shm --engines posix --blocks 2M --depths 8,32`, each with
`--json`) as Markdown tables, one row per run, and says which goal a run
misses. Usage: bench-goals.py DIR (holding store-N.jsonl, layerwise-N.jsonl,
io-N.jsonl for N = 1, 2, ...). Exit status 1 if any goal is missed."""
import json
import pathlib
import sys

d = pathlib.Path(sys.argv[1])
runs = sorted(int(p.stem.split("-")[1]) for p in d.glob("store-*.jsonl") if p.stem.split("-")[1].isdigit())
load = lambda recs: f"{recs[0]['load_average']:.2f}" if recs and recs[0].get("load_average") is not None else "?"
read = lambda p: [json.loads(l) for l in p.read_text().splitlines() if l.startswith("{")]
missed = []

def cell(r, goal, what):
    ok = r is not None and r >= goal
    if not ok:
        missed.append(what)
    return "-" if r is None else (f"{r:.2f}" if ok else f"**{r:.2f}**")

print("Store, pool to device (ratio of medians to the memcpy limit; goal >= 0.8):\n")
print("| run | load | load_warm 64 KiB | load_layerwise 64 KiB | load_warm 2 MiB | load_layerwise 2 MiB | memcpy limit GiB/s (64 KiB, 2 MiB) |")
print("|---|---|---|---|---|---|---|")
for n in runs:
    recs = read(d / f"store-{n}.jsonl")
    by = {(r["path"], r["shard_bytes"]): r for r in recs}
    cells = []
    for path, sb in [("load_warm", 65536), ("load_layerwise", 65536), ("load_warm", 2 << 20), ("load_layerwise", 2 << 20)]:
        r = by.get((path, sb))
        cells.append(cell(r and r["ratio"], 0.8, f"run {n} {path} {sb >> 10} KiB"))
    lim = ", ".join(f"{by[('load_warm', sb)]['limit']:.1f}" for sb in (65536, 2 << 20) if ("load_warm", sb) in by)
    print(f"| {n} | {load(recs)} | " + " | ".join(cells) + f" | {lim} |")

print("\nLayerwise pipeline (hidden fraction from the medians; goal >= 0.9 where I/O <= compute):\n")
first = read(d / f"layerwise-{runs[0]}.jsonl")
ratios = [round(r["io_per_unit_ms"] / r["compute_per_unit_ms"], 2) for r in first]
print("| run | load | " + " | ".join(f"io/compute {x:g}" for x in ratios) + " | I/O per unit ms |")
print("|---|---|" + "---|" * (len(ratios) + 1))
for n in runs:
    recs = read(d / f"layerwise-{n}.jsonl")
    cells = []
    for r in recs:
        x = round(r["io_per_unit_ms"] / r["compute_per_unit_ms"], 2)
        if x <= 1.0 + 1e-9:
            cells.append(cell(r["hidden_fraction"], 0.9, f"run {n} layerwise {x:g}"))
        else:
            cells.append(f"{r['hidden_fraction']:.2f} (no goal)")
    print(f"| {n} | {load(recs)} | " + " | ".join(cells) + f" | {recs[0]['io_per_unit_ms']:.2f} |")

print(
    "\nPOSIX engine, 2 MiB on tmpfs, against a hand-off-free psync loop over the client's own"
    " buffers in the same pattern, each reused every `depth` operations (the bound of any"
    " engine serving this client; median of paired per-round ratios; goal >= 0.9, D70):\n"
)
first = read(d / f"io-{runs[0]}.jsonl")
keys = [(r["op"], r["depth"]) for r in first]


def io_table(cell_of):
    """One row per run, one column per (op, depth): `cell_of(run, key, record)`."""
    print("| run | load | " + " | ".join(f"{op} d{dep}" for op, dep in keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for n in runs:
        recs = read(d / f"io-{n}.jsonl")
        by = {(r["op"], r["depth"]): r for r in recs}
        print(f"| {n} | {load(recs)} | " + " | ".join(cell_of(n, k, by.get(k)) for k in keys) + " |")


def loop_cell(n, k, r):
    c = cell(r and r.get("loop_ratio"), 0.9, f"run {n} posix {k[0]} d{k[1]}")
    return c if r is None else f"{c} ({r['loop_gib_s']:.1f} GiB/s)"


def fio_cell(n, k, r):
    if r is None or r.get("ratio") is None:
        return "-"
    return f"{r['ratio']:.2f} ({r['fio_gib_s']:.1f} GiB/s)"


io_table(loop_cell)
print("\nThe same runs beside fio psync with as many jobs (each job rereads its own buffer; no goal):\n")
io_table(fio_cell)

print()
print("every goal met" if not missed else "missed: " + "; ".join(missed))
sys.exit(1 if missed else 0)

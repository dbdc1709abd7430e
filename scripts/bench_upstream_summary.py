#!/usr/bin/env python3
"""Summarises a run of scripts/bench-upstream.sh: per file system, shard
size and path, the per-round ratios ours / upstream (each round's two sides
ran back to back), their median and range, and the shards each side lost.
Usage: bench_upstream_summary.py OUT"""
import json
import pathlib
import re
import statistics
import sys

out = pathlib.Path(sys.argv[1])
PATHS = ["dump_cold", "load_cold", "load_warm", "load_layerwise", "lookup_disk", "lookup_pool"]


def read(p):
    if not p.exists():
        return {}
    recs = [json.loads(l) for l in p.read_text().splitlines() if l.startswith("{")]
    return {r["path"]: r for r in recs}


def rate(r):
    return r.get("gib_s", r.get("blocks_s"))


runs = {}
for p in sorted(out.glob("up-*.jsonl")):
    m = re.match(r"up-(.+)-(\d+)-(\d+)\.jsonl", p.name)
    if not m:
        continue
    fs, shard, rnd = m.group(1), int(m.group(2)), int(m.group(3))
    runs.setdefault((fs, shard), []).append((rnd, read(p), read(out / f"ours-{fs}-{shard}-{rnd}.jsonl")))

commit = (out / "upstream-commit").read_text().strip() if (out / "upstream-commit").exists() else "?"
print(f"Upstream commit {commit}; ratio = ours / upstream per round, median [min-max]\n")
print("| file system | shard | path | rounds | ours (median) | upstream (median) | ratio | upstream's lost shards |")
print("|---|---|---|---|---|---|---|---|")
for (fs, shard), rs in sorted(runs.items()):
    for path in PATHS:
        ratios, mine, theirs, lost_up = [], [], [], 0
        for _, up, ours in rs:
            if path not in up or path not in ours:
                continue
            u, o = rate(up[path]), rate(ours[path])
            lost_up += up[path].get("lost", 0)
            if u and o:
                ratios.append(o / u)
                mine.append(o)
                theirs.append(u)
        if not ratios:
            continue
        unit = "GiB/s" if "gib_s" in rs[0][1].get(path, {}) else "ids/s"
        fmt = (lambda v: f"{v:.2f}") if unit == "GiB/s" else (lambda v: f"{v / 1e6:.2f} M")
        print(
            f"| {fs} | {shard >> 10} KiB | {path} | {len(ratios)} | {fmt(statistics.median(mine))} {unit} "
            f"| {fmt(statistics.median(theirs))} {unit} | {statistics.median(ratios):.2f} "
            f"[{min(ratios):.2f}-{max(ratios):.2f}] | {lost_up} |"
        )
failed = [
    f"{side} {fs} {shard >> 10} KiB round {rnd}"
    for (fs, shard), rs in sorted(runs.items())
    for rnd, up, ours in rs
    for side, recs in (("upstream", up), ("ours", ours))
    if "failed" in recs or not recs
]
print("\nfailed rounds: " + (", ".join(failed) if failed else "none"))

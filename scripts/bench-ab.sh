#!/usr/bin/env bash
# Two builds of `ucm` measured in the same run: their store benchmarks
# interleaved pair by pair (the first binary first in odd pairs, the second
# first in even ones), and the per-pair ratio second / first of the cold
# load and the durable dump, with its median and range.
#
# Usage: scripts/bench-ab.sh FIRST_BIN SECOND_BIN DIR OUT [PAIRS]
#   FIRST_BIN, SECOND_BIN  two `ucm` binaries (e.g. a worktree of the base
#                          commit built with its own CARGO_TARGET_DIR, and
#                          target/release/ucm)
#   DIR                    where the stores go (a directory `ab` in it is
#                          made and removed each time)
#   OUT                    where each run's JSON lines go
#   PAIRS                  pairs per shard size (default 6)
# Environment: UCM_AB_SHARDS shard sizes (default "2M 64K").
set -euo pipefail
first=${1:?usage: bench-ab.sh FIRST_BIN SECOND_BIN DIR OUT [PAIRS]}
second=${2:?usage: bench-ab.sh FIRST_BIN SECOND_BIN DIR OUT [PAIRS]}
dir=${3:?usage: bench-ab.sh FIRST_BIN SECOND_BIN DIR OUT [PAIRS]}
out=${4:?usage: bench-ab.sh FIRST_BIN SECOND_BIN DIR OUT [PAIRS]}
pairs=${5:-6}
shards=${UCM_AB_SHARDS:-2M 64K}
for b in "$first" "$second"; do
  [ -x "$b" ] || { echo "bench-ab: $b is not an executable" >&2; exit 2; }
done
[ -d "$dir" ] || { echo "bench-ab: $dir is not a directory" >&2; exit 2; }
[ -e "$dir/ab" ] && { echo "bench-ab: $dir/ab exists; remove it first" >&2; exit 2; }
mkdir -p "$out"
trap 'rm -rf "$dir/ab"' EXIT
for s in $shards; do
  for p in $(seq 1 "$pairs"); do
    if [ $((p % 2)) = 1 ]; then order="first second"; else order="second first"; fi
    for w in $order; do
      bin=$first
      [ "$w" = second ] && bin=$second
      echo "bench-ab: $s pair $p/$pairs, $w ($(date -u +%H:%M:%S))" >&2
      "$bin" bench store --dir "$dir/ab" --shard-sizes "$s" --reps 1 --json \
        > "$out/$w-$s-$p.jsonl" 2> "$out/$w-$s-$p.log"
      rm -rf "$dir/ab"
    done
  done
done
python3 - "$out" "$pairs" $shards <<'PY'
import json
import statistics as st
import sys

out, pairs, shards = sys.argv[1], int(sys.argv[2]), sys.argv[3:]


def rec(f, path):
    for line in open(f):
        r = json.loads(line)
        if r["path"] == path:
            return r
    raise SystemExit(f"bench-ab: {f} has no {path} record")


def of_fio(r):
    return r["paired"]["median"] if r.get("paired") else float("nan")


print("| shard | path | second / first, median [min-max] | first GiB/s (of fio) | second GiB/s (of fio) |")
print("|---|---|---|---|---|")
for s in shards:
    for path in ("load_cold", "dump_cold"):
        a = [rec(f"{out}/first-{s}-{p}.jsonl", path) for p in range(1, pairs + 1)]
        b = [rec(f"{out}/second-{s}-{p}.jsonl", path) for p in range(1, pairs + 1)]
        ratios = [y["gib_s"] / x["gib_s"] for x, y in zip(a, b)]
        print(
            f"| {s} | {path} | {st.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}] "
            f"| {st.median(x['gib_s'] for x in a):.2f} ({st.median(of_fio(x) for x in a):.2f}) "
            f"| {st.median(y['gib_s'] for y in b):.2f} ({st.median(of_fio(y) for y in b):.2f}) |"
        )
PY

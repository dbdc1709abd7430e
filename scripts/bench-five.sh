#!/usr/bin/env bash
# Five consecutive runs of the hot-path benches of issue 18 on a quiet
# machine, in the order the README gives, into DIR (store-N.jsonl,
# layerwise-N.jsonl, io-N.jsonl and their progress logs), then the goal
# tables of scripts/bench-goals.py (exit status 1 if a goal is missed).
# Usage: scripts/bench-five.sh DIR [RUNS]   (RUNS defaults to 5)
# Build first: cargo build --release. About 10 minutes for five runs here.
# Each bench starts after a pause (UCM_BENCH_PAUSE seconds, 10 by default):
# the one before it leaves its threads' load and freed tmpfs pages behind.
set -euo pipefail
dir=${1:?usage: bench-five.sh DIR [RUNS]}
runs=${2:-5}
bin=${UCM_BIN:-target/release/ucm}
[ -x "$bin" ] || { echo "bench-five: $bin not built (cargo build --release)" >&2; exit 2; }
pause=${UCM_BENCH_PAUSE:-10}
mkdir -p "$dir"
for n in $(seq 1 "$runs"); do
  echo "bench-five: run $n/$runs ($(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg))" >&2
  sleep "$pause"
  "$bin" bench store --dir /dev/shm --json > "$dir/store-$n.jsonl" 2> "$dir/store-$n.log"
  sleep "$pause"
  "$bin" bench layerwise --json > "$dir/layerwise-$n.jsonl" 2> "$dir/layerwise-$n.log"
  sleep "$pause"
  "$bin" bench io --dir /dev/shm --engines posix --blocks 2M --depths 8,32 --json \
    > "$dir/io-$n.jsonl" 2> "$dir/io-$n.log"
done
python3 "$(dirname "$0")/bench-goals.py" "$dir"

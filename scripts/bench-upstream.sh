#!/usr/bin/env bash
# Upstream UCM's store and ours, measured in the same run on the same
# workload, interleaved round by round (issue 40).
#
# Usage: scripts/bench-upstream.sh UPSTREAM_SRC [OUT]
#   UPSTREAM_SRC  a checkout of ModelEngine-Group/unified-cache-management
#                 (nothing of it is copied into this repository; it is built
#                 in a work directory, its `simu` runtime, host memory only)
#   OUT           where the JSON lines and the summary go
#                 (default: bench-upstream-<date> in the current directory)
# Environment:
#   UCM_UPSTREAM_ROUNDS   rounds per file system and shard size (default 5)
#   UCM_UPSTREAM_DIRS     directories to measure on (default "/dev/shm /var/tmp":
#                         tmpfs and the root file system)
#   UCM_UPSTREAM_SHARDS   shard sizes in bytes (default "65536 2097152")
#   UCM_UPSTREAM_BYTES    bytes per workload (default 1 GiB, 32 shards per block)
#   UCM_UPSTREAM_WORK     build directory (default /var/tmp/ucm-upstream-bench)
#   UCM_UPSTREAM_VENDOR   a directory holding the sources of upstream's
#                         dependencies (fmt/ spdlog/ pybind11/ zlib/), for a
#                         machine that cannot reach GitHub; without it
#                         upstream's CMake fetches its own pins
#   UCM_UPSTREAM_PYTHON   a Python with torch and numpy (default python3)
#   UCM_UPSTREAM_WARM_GIB memory touched once before the rounds (default 32,
#                         capped at what is available less 3 GiB; 0 skips)
#   UCM_UPSTREAM_TIMEOUT  seconds one upstream round may take (default 600):
#                         upstream has hung in its loads (every thread
#                         waiting); such a round is killed and counted as
#                         failed
#   UCM_BIN               our binary (default target/release/ucm; build it first
#                         with cargo build --release)
# Each round runs `ucm bench store --reps 1 --no-fio` and one round of
# scripts/bench_upstream.py on the same directory, upstream first in odd
# rounds and ours first in even ones; the summary gives, per path, the
# median of the per-round ratios ours / upstream with their range, the
# shards upstream lost (read back wrong, or a stored id not found: every
# loaded shard is compared with what was dumped) and the rounds either side
# failed (ours fails a round when a shard's checksum does not match on load).
set -euo pipefail
src=${1:?usage: bench-upstream.sh UPSTREAM_SRC [OUT]}
out=${2:-bench-upstream-$(date -u +%Y-%m-%d)}
here=$(cd "$(dirname "$0")" && pwd)
rounds=${UCM_UPSTREAM_ROUNDS:-5}
dirs=${UCM_UPSTREAM_DIRS:-/dev/shm /var/tmp}
shards=${UCM_UPSTREAM_SHARDS:-65536 2097152}
bytes=${UCM_UPSTREAM_BYTES:-1073741824}
work=${UCM_UPSTREAM_WORK:-/var/tmp/ucm-upstream-bench}
py=${UCM_UPSTREAM_PYTHON:-python3}
round_timeout=${UCM_UPSTREAM_TIMEOUT:-600}
bin=${UCM_BIN:-target/release/ucm}
[ -x "$bin" ] || { echo "bench-upstream: $bin not built (cargo build --release)" >&2; exit 2; }
# A checkout, or a bare clone (its HEAD is built).
[ -d "$src/ucm/store" ] || git -C "$src" cat-file -e HEAD:ucm/store 2>/dev/null \
  || { echo "bench-upstream: $src is not an upstream UCM checkout" >&2; exit 2; }
command -v cmake >/dev/null || { echo "bench-upstream: needs cmake" >&2; exit 2; }
"$py" -c "import torch, numpy" 2>/dev/null || { echo "bench-upstream: $py lacks torch or numpy" >&2; exit 2; }
mkdir -p "$out" "$work"
out=$(cd "$out" && pwd)
work=$(cd "$work" && pwd)
say() { echo "bench-upstream: $*" >&2; }

commit=$(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)
stamp="$work/built-$commit"
if [ ! -f "$stamp" ]; then
  say "building upstream $commit (simu) in $work"
  rm -rf "$work/src" "$work/build" "$work/py"
  mkdir -p "$work/src"
  if git -C "$src" rev-parse HEAD >/dev/null 2>&1; then
    git -C "$src" archive HEAD | tar -x -C "$work/src"
  else
    cp -r "$src/." "$work/src/"
  fi
  download=ON
  if [ -n "${UCM_UPSTREAM_VENDOR:-}" ]; then
    for d in fmt spdlog pybind11 zlib; do
      [ -d "$UCM_UPSTREAM_VENDOR/$d" ] || { say "$UCM_UPSTREAM_VENDOR/$d missing"; exit 2; }
      cp -r "$UCM_UPSTREAM_VENDOR/$d" "$work/src/ucm/shared/vendor/"
    done
    download=OFF
  fi
  cmake -S "$work/src" -B "$work/build" -G "Unix Makefiles" -DRUNTIME_ENVIRONMENT=simu \
    -DCMAKE_BUILD_TYPE=Release -DDOWNLOAD_DEPENDENCE=$download > "$work/cmake.log" 2>&1 \
    || { say "cmake failed: $work/cmake.log"; exit 1; }
  make -C "$work/build" -j"$(nproc)" > "$work/make.log" 2>&1 || { say "build failed: $work/make.log"; exit 1; }
  mkdir -p "$work/py"
  cp -r "$work/src/ucm" "$work/py/"
  cmake --install "$work/build" --component ucm --prefix "$work/py" > "$work/install.log" 2>&1
  touch "$stamp"
fi
if ! PYTHONPATH="$work/py:$work/deps" "$py" -c "import wrapt" 2>/dev/null; then
  "$py" -m pip install -q --target "$work/deps" wrapt
fi
echo "$commit" > "$out/upstream-commit"

up() { # DIR SHARD ROUND
  local direct=() scratch
  [ "$(stat -f -c %T "$1")" = tmpfs ] || direct=(--direct)
  # Each round in a directory of its own, removed afterwards even when
  # the round was killed.
  scratch=$(mktemp -d "$1/ucm-upstream-round.XXXXXX")
  # Upstream's logger writes log/<pid>/ under the working directory: the
  # work directory, never the caller's.
  (cd "$work" && PYTHONPATH="$work/py:$work/deps" UC_LOGGER_LEVEL=error \
    timeout --kill-after=10 "$round_timeout" \
    "$py" "$here/bench_upstream.py" "$scratch" "$2" --bytes "$bytes" "${direct[@]}" \
    > "$out/up-$4-$2-$3.jsonl" 2> "$out/up-$4-$2-$3.log") \
    || { say "upstream failed or hung (round $3): $out/up-$4-$2-$3.log"; echo '{"path": "failed"}' >> "$out/up-$4-$2-$3.jsonl"; }
  rm -rf "$scratch"
}
ours() { # DIR SHARD ROUND
  "$bin" bench store --dir "$1" --shard-sizes "$2" --size "$bytes" --reps 1 --no-fio --json \
    > "$out/ours-$4-$2-$3.jsonl" 2> "$out/ours-$4-$2-$3.log" \
    || { say "ours failed (round $3): $out/ours-$4-$2-$3.log"; echo '{"path": "failed"}' >> "$out/ours-$4-$2-$3.jsonl"; }
}
# On a virtual machine, guest memory that was never touched since boot is
# backed by the host on first touch: a round that draws such pages (for its
# tmpfs files, its buffers) ran its dumps 2-4x slower than the next round
# (measured: 64 MiB writes to tmpfs 0.23 s against 0.055 s). Both sides'
# rounds start on memory touched once: a tmpfs file of all but 3 GiB of
# the available memory (at most UCM_UPSTREAM_WARM_GIB, default 32; 0 skips
# this) is written and removed first.
warm_gib=${UCM_UPSTREAM_WARM_GIB:-32}
avail_gib=$(awk '/^MemAvailable:/ {print int($2 / 1048576)}' /proc/meminfo)
warm=$((avail_gib - 3 < warm_gib ? avail_gib - 3 : warm_gib))
if [ "$warm" -gt 0 ] && [ -d /dev/shm ]; then
  say "touching ${warm} GiB of memory once (/dev/shm)"
  wfile=$(mktemp /dev/shm/ucm-bench-warm.XXXXXX)
  dd if=/dev/zero of="$wfile" bs=1M count=$((warm * 1024)) status=none || true
  rm -f "$wfile"
fi
for d in $dirs; do
  d=$(cd "$d" && pwd)
  fs=$(stat -f -c %T "$d" | tr -c "a-zA-Z0-9\n" _)
  for s in $shards; do
    for r in $(seq 1 "$rounds"); do
      say "$fs $s B round $r/$rounds ($(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg))"
      if [ $((r % 2)) = 1 ]; then up "$d" "$s" "$r" "$fs"; ours "$d" "$s" "$r" "$fs"
      else ours "$d" "$s" "$r" "$fs"; up "$d" "$s" "$r" "$fs"; fi
    done
  done
done
"$py" "$here/bench_upstream_summary.py" "$out" | tee "$out/summary.md"

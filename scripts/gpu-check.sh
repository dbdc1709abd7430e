#!/usr/bin/env bash
# Runs UCM's CUDA checks on a machine with an NVIDIA GPU and driver, but no
# Rust toolchain. Build the binaries beforehand on an x86-64 Linux machine:
#
#   cargo test -p ucm-device --features cuda --no-run 2>&1 | grep -o 'target/[^ )]*cuda_gpu-[0-9a-f]*'
#   cargo build --release --features cuda
#
#   (cd python && maturin build --release -o ../target/wheels)
#
# and put the test executable target/debug/deps/cuda_gpu-<hash>, the file
# target/release/ucm and the wheel target/wheels/ucm-*.whl (abi3, built
# with the `cuda` feature) into one folder (BIN_DIR, default: the script's
# folder). The Python tests run from the checkout the script sits in
# (python/tests: they read fixtures elsewhere in the repository). No CUDA toolkit is needed on either machine: cudarc
# loads libcuda at run time, and the layer kernel is PTX the driver compiles.
#
# It runs the CUDA tests and the Python tests with UCM_REQUIRE_GPU=1 (they
# fail, never skip, without a usable GPU), `ucm bench store --device cuda`
# and `ucm bench layerwise --device cuda`, `ucm replay --device cuda`
# (below), and
# `ucm bench device --device cuda --json`:
#   h2d_pinned / d2h_pinned   against a raw cuMemcpy*Async loop (goal >= 0.9)
#   scatter_64k               64 KiB runs against one contiguous copy (goal >= 0.9),
#                             through the copy kernel (`copy_path` says which ran)
#   scatter_64k_per_run       the same with one cuMemcpyAsync per run
#   scatter_64k_batch_api     the same through cuMemcpyBatchAsync, when exported
#   layerwise                 loads overlapped with a real kernel per layer,
#                             with the hidden fraction of the I/O
# Everything finishes in well under 5 minutes and exits 0 only when every
# step passed. Results go to $OUT (or $BIN_DIR/gpu-check-out), eight files
# at most, ending with summary.txt, the table it prints last.
set -euo pipefail
BIN_DIR=${BIN_DIR:-$(cd "$(dirname "$0")" && pwd)}
OUT=${OUT:-$BIN_DIR/gpu-check-out}
mkdir -p "$OUT"
export UCM_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
    | tee "$OUT/gpu.txt" || true
gpu_test=$(ls "$BIN_DIR"/cuda_gpu-* 2>/dev/null | grep -v '\.d$' | head -n 1 || true)
[ -x "$gpu_test" ] || { echo "no cuda_gpu-* test binary in $BIN_DIR" >&2; exit 2; }
echo "== CUDA tests (UCM_REQUIRE_GPU=1)"
timeout 120 "$gpu_test" --nocapture --test-threads=1 2>&1 | tee "$OUT/cuda-tests.log"
echo "== Python tests on cuda (UCM_REQUIRE_GPU=1)"
wheel=$(ls "$BIN_DIR"/ucm-*.whl 2>/dev/null | head -n 1 || true)
py_tests=$(cd "$(dirname "$0")/.." && pwd)/python/tests
[ -f "$wheel" ] || { echo "no ucm-*.whl in $BIN_DIR" >&2; exit 2; }
[ -d "$py_tests" ] || { echo "no $py_tests: run the script from a checkout" >&2; exit 2; }
py_dir=$(mktemp -d)
python3 -m pip install -q --no-deps --target "$py_dir" "$wheel"
PYTHONPATH="$py_dir${PYTHONPATH:+:$PYTHONPATH}" timeout 300 \
    python3 -m pytest -q "$py_tests" 2>&1 | tee "$OUT/python-tests.log"
rm -rf "$py_dir"
echo "== ucm info"
# Beside the GPU's name and driver: what this build found (nine files in
# all would be one too many).
"$BIN_DIR/ucm" info | tee -a "$OUT/gpu.txt"
echo "== ucm bench device --device cuda"
timeout 150 "$BIN_DIR/ucm" bench device --device cuda --json --size 1G --reps 5 \
    --layers 32 --layer-size 64M | tee "$OUT/bench-device.jsonl"
echo "== ucm bench store --device cuda (16 KiB, 64 KiB and 2 MiB shards; files on tmpfs)"
# Warm and layerwise loads against the contiguous pinned-to-GPU copy of the
# same bytes in the same round; every load's destination checked byte for
# byte in the first round.
store_dir=$(mktemp -d /dev/shm/ucm-gpu-check.XXXXXX)
trap 'rm -rf "$store_dir"' EXIT
timeout 300 "$BIN_DIR/ucm" bench store --device cuda --json --dir "$store_dir" \
    --shard-sizes 16K,64K,2M --size 1G --reps 3 --no-fio | tee "$OUT/bench-store.jsonl"
echo "== ucm bench layerwise --device cuda (32 layers x 64 blocks of 64 KiB into GPU memory)"
# The adapter's layer-by-layer loads into GPU memory behind a simulated
# per-layer compute; each layer's first load checked byte for byte.
timeout 120 "$BIN_DIR/ucm" bench layerwise --device cuda --json --dir "$store_dir" \
    --reps 3 | tee "$OUT/bench-layerwise.jsonl"
echo "== ucm replay --device cuda (the chat workload, KV caches and states in GPU memory)"
# Every loaded byte checked by the content oracle in GPU memory; exits
# non-zero on a wrong hit.
timeout 120 "$BIN_DIR/ucm" replay --device cuda --runs 1 --dir "$store_dir" \
    --spec "$(cd "$(dirname "$0")/.." && pwd)/specs/x-hybrid-96.toml" \
    2>&1 | tr '\r' '\n' | grep -v '^\(ucm\|fold\) *\[' | tee "$OUT/replay.txt"
echo "== summary"
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
def lines(name):
    p = out / name
    return [json.loads(l) for l in p.read_text().splitlines() if l.startswith("{")] if p.exists() else []
def ratio(r):
    p = r.get("paired") or {}
    return f"{p['median']:.2f} [{min(p['ratios']):.2f}-{max(p['ratios']):.2f}]" if p.get("ratios") else "-"
gpu = (out / "gpu.txt").read_text().splitlines() if (out / "gpu.txt").exists() else ["?"]
print("GPU:", gpu[0] if gpu else "?")
print("\nbench device (ratio to the raw or contiguous pinned copy, median [min-max] of paired rounds)")
for r in lines("bench-device.jsonl"):
    extra = f"  hidden {r['hidden_io_fraction']:.2f}" if "hidden_io_fraction" in r else ""
    print(f"  {r['case']:<24} {r.get('gib_s', 0):7.2f} GiB/s  {ratio(r):<20} {r.get('copy_path', '')}{extra}")
print("\nbench store, data in GPU memory, files on tmpfs (warm and layerwise: of the same round's contiguous pinned-to-GPU copy)")
print(f"  {'path':<16} {'shard':>8}  {'GiB/s':>7}  ratio")
for r in lines("bench-store.jsonl"):
    if r["path"].startswith("lookup"):
        continue
    print(f"  {r['path']:<16} {r['shard_bytes'] >> 10:>6} K  {r['gib_s']:7.2f}  {ratio(r)}")
print("\nbench layerwise into GPU memory (hidden fraction of the hideable load I/O; goal >= 0.9 where I/O <= compute)")
for r in lines("bench-layerwise.jsonl"):
    print(f"  io {r['io_per_unit_ms']:.3f} ms/unit  compute {r['compute_per_unit_ms']:.3f} ms/unit  hidden {r['hidden_fraction']:.3f}")
rp = out / "replay.txt"
if rp.exists():
    print("\nreplay --device cuda")
    print("\n".join("  " + l for l in rp.read_text().splitlines() if l.strip() and not l.startswith("note")))
PY
echo "== done: record the figures in docs/gpu.md with the date and GPU model"

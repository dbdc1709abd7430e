#!/usr/bin/env bash
# The serving benchmark in the real vLLM on this CPU (scripts/serve_bench.py):
# TTFT per turn, tokens from cache and output equality for no cache, vLLM's
# own prefix caching, UCM (with its scheduler, and with vLLM's), UCM with
# vLLM's alignment, and UCM after an engine restart, on a multi-turn chat and
# a document-reuse workload; and the prefill throughput cost of UCM's chunk
# stops.
#
#   bash scripts/serve-bench.sh [--smoke] [-- serve_bench.py options]
#
# Builds the wheel into vLLM's cached venv (scripts/vllm-venv.sh) unless
# UCM_SERVE_BENCH_NO_BUILD=1. --smoke: one session of two turns, one
# document of two questions and two throughput rounds (CI). Prints the table; the JSON report goes to
# $UCM_SERVE_BENCH_JSON when set. Work files go to a temp dir, removed.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(bash scripts/vllm-venv.sh)
work=$(mktemp -d /tmp/ucm-serve-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
args=()
if [ "${1:-}" = "--smoke" ]; then
    args=(--sessions 1 --turns 2 --docs 1 --questions 2 --throughput-rounds 2)
    shift
fi
[ "${1:-}" = "--" ] && shift
if [ "${UCM_SERVE_BENCH_NO_BUILD:-0}" != 1 ]; then
    (cd python && "$venv/bin/maturin" build --release --quiet -o "$work/wheels")
    "$venv/bin/pip" install -q --force-reinstall --no-deps "$work"/wheels/ucm-*.whl
fi
json=()
[ -n "${UCM_SERVE_BENCH_JSON:-}" ] && json=(--json "$UCM_SERVE_BENCH_JSON")
VLLM_TARGET_DEVICE=cpu VLLM_ENABLE_V1_MULTIPROCESSING=0 \
    "$venv/bin/python" scripts/serve_bench.py all --work "$work/run" "${args[@]}" "${json[@]}" "$@"

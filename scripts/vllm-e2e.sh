#!/usr/bin/env bash
# UCM inside a real vLLM on this machine's CPU, end to end:
#   1. vLLM for the CPU in a cached venv (scripts/vllm-venv.sh; ~6 GB, a few
#      minutes the first time, reused after);
#   2. the `ucm` wheel built by `maturin build --release` from python/, and
#      installed twice: into a fresh, empty venv (it must import there and
#      match a golden hash: one wheel, no dependencies) and into vLLM's;
#   3. the Python tests (python/tests) in vLLM's venv (torch for tensors),
#      with SGLang's package beside it for the HiCache backend's tests
#      (scripts/sglang-deps.sh; required here: UCM_REQUIRE_SGLANG=1);
#   4. scripts/vllm_e2e.py: a dense Llama and a NemotronH hybrid, with and
#      without UCM, warm restart, corrupted blocks, sabotaged loads.
# Exits non-zero on any failed check. Work files go to a temp dir, removed.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(bash scripts/vllm-venv.sh)
work=$(mktemp -d /tmp/ucm-vllm-e2e.XXXXXX)
trap 'rm -rf "$work"' EXIT

echo "vllm-e2e: building the wheel"
(cd python && "$venv/bin/maturin" build --release --quiet -o "$work/wheels")
wheel=$(ls "$work"/wheels/ucm-*.whl)
ls -la "$wheel"

echo "vllm-e2e: the wheel in a fresh venv"
python3 -m venv "$work/fresh"
"$work/fresh/bin/pip" install -q --no-index "$wheel"
"$work/fresh/bin/python" - <<'PY'
import ucm
spec = ucm.SpecTable.load("specs/attn-mamba-hybrid.toml")
tokens = [(i * 7919) % 65521 for i in range(1000)]
import json
g = json.load(open("coordinator/tests/golden/hash-vectors.json"))
v = next(v for v in g["vectors"] if v["spec"].endswith("attn-mamba-hybrid.toml"))
group, ranks = next(iter(v["blocks"].items()))
got = [x.hex() for x in ucm.block_ids(spec, tokens, group, rank=0, tp_size=v["tp_size"])]
assert got == ranks["0"], (group, got[:2])
print("fresh venv: import ucm ok, golden ids match;", ucm.abi_version())
PY

echo "vllm-e2e: the wheel in vLLM's venv, and the Python tests"
"$venv/bin/pip" install -q --force-reinstall --no-deps "$wheel"
sglang=$(bash scripts/sglang-deps.sh "$venv/bin/python")
PYTHONPATH="$sglang" UCM_REQUIRE_SGLANG=1 "$venv/bin/python" -m pytest -q python/tests

echo "vllm-e2e: inside vLLM"
VLLM_TARGET_DEVICE=cpu VLLM_ENABLE_V1_MULTIPROCESSING=0 \
    timeout 1500 "$venv/bin/python" scripts/vllm_e2e.py all --work "$work/e2e"

#!/usr/bin/env bash
# Runs UCM's Ascend checks on a machine with an Ascend NPU and CANN, but no
# Rust toolchain. Build the binaries beforehand on any x86-64 / aarch64
# machine of the same architecture:
#
#   cargo test -p ucm-device --features ascend --no-run --message-format=json \
#       | jq -r 'select(.executable != null and .target.kind == ["test"]) | .executable'
#   cargo build --release --features ascend
#
# then copy the test executables named ascend_npu-* and ascend_double-*, the
# file target/release/ucm, and this script to the NPU machine, into one
# folder (BIN_DIR, default: the script's folder).
#
# The script runs the real-NPU device test body with UCM_REQUIRE_NPU=1 (it
# fails, never skips, when no NPU is usable), then
# `ucm bench device --device ascend --json` (H2D / D2H against a raw
# aclrtMemcpyAsync loop, a 64 KiB scatter against one contiguous copy).
# It finishes in well under 5 minutes.
set -euo pipefail
BIN_DIR=${BIN_DIR:-$(cd "$(dirname "$0")" && pwd)}
OUT=${OUT:-$BIN_DIR/npu-check-out}
mkdir -p "$OUT"
export UCM_REQUIRE_NPU=1
if [ -n "${ASCEND_TOOLKIT_HOME:-}" ] && [ -f "$ASCEND_TOOLKIT_HOME/set_env.sh" ]; then
    # shellcheck disable=SC1091
    source "$ASCEND_TOOLKIT_HOME/set_env.sh"
fi
npu_test=$(ls "$BIN_DIR"/ascend_npu-* 2>/dev/null | head -n 1 || true)
[ -x "$npu_test" ] || { echo "no ascend_npu-* test binary in $BIN_DIR" >&2; exit 2; }
echo "== device test body on the NPU"
timeout 120 "$npu_test" --nocapture 2>&1 | tee "$OUT/npu-test.log"
echo "== ucm bench device --device ascend"
timeout 150 "$BIN_DIR/ucm" bench device --device ascend --json --size 1G --reps 5 \
    | tee "$OUT/bench-device.jsonl"
echo "== done: results in $OUT (record them in the README with the date and NPU model)"

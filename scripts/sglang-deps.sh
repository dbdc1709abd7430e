#!/usr/bin/env bash
# Installs SGLang's Python package (no server, no model: only its HiCache
# storage interface is imported by python/tests/test_sglang_hicache.py) into
# a cached directory for PYTHONPATH, and prints its path.
#
# `sglang` is installed with `--no-deps` beside the vLLM venv's torch; the
# only other modules its interface imports are orjson, IPython and
# traitlets. A directory that imports the interface is reused as it is.
#
#   $1              the Python whose torch the tests use (the vLLM venv's)
#   UCM_SGLANG_DIR  where the packages go (default /var/cache/ucm/sglang)
set -euo pipefail

python="${1:?usage: sglang-deps.sh PYTHON}"
dir="${UCM_SGLANG_DIR:-/var/cache/ucm/sglang}"
version="0.5.23"
stamp="$dir/.ucm-sglang-$version"
probe='import sglang.srt.mem_cache.hicache_storage, sglang.srt.mem_cache.storage.backend_factory'

if [[ -f "$stamp" ]] && PYTHONPATH="$dir" "$python" -c "$probe" >/dev/null 2>&1; then
    echo "$dir"
    exit 0
fi
echo "sglang-deps: installing sglang $version (interface only) into $dir" >&2
rm -rf "$dir"
mkdir -p "$dir"
"$python" -m pip install -q --no-deps --target "$dir" \
    "sglang==$version" "orjson==3.13.0" "ipython==9.18.1" "traitlets==5.16.1" >&2
PYTHONPATH="$dir" "$python" -c "$probe"
touch "$stamp"
echo "$dir"

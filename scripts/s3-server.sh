#!/usr/bin/env bash
# A local S3 server (moto, in memory) on loopback for `ucm bench store
# --cold` and CI smoke runs, with one bucket, everything under one
# directory.
#
#   scripts/s3-server.sh start DIR [PORT] [BUCKET]   # prints the tier URL
#   scripts/s3-server.sh stop DIR
#
# PORT defaults to 17500, BUCKET to ucm. Needs moto_server (UCM_MOTO_SERVER,
# else /var/cache/ucm/moto-venv/bin/moto_server, else PATH). The client
# takes any credentials: export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
set -euo pipefail
cmd=${1:?start or stop}
dir=${2:?a directory for the server}
port=${3:-17500}
bucket=${4:-ucm}
case "$cmd" in
start)
    bin=${UCM_MOTO_SERVER:-/var/cache/ucm/moto-venv/bin/moto_server}
    [ -x "$bin" ] || bin=$(command -v moto_server) || { echo "moto_server is not installed" >&2; exit 2; }
    mkdir -p "$dir"
    "$bin" -H 127.0.0.1 -p "$port" >"$dir/moto.log" 2>&1 &
    echo $! >"$dir/moto.pid"
    for _ in $(seq 300); do
        code=$(python3 - "$port" "$bucket" <<'PY' 2>/dev/null || true
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2)
s.sendall(f"PUT /{sys.argv[2]} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
print(s.recv(64).split()[1].decode())
PY
)
        [ "$code" = 200 ] && break
        sleep 0.1
    done
    [ "$code" = 200 ] || { echo "moto_server did not serve on port $port" >&2; exit 1; }
    echo "s3://$bucket/ucm?endpoint=http://127.0.0.1:$port"
    ;;
stop)
    if [ -f "$dir/moto.pid" ]; then
        kill "$(cat "$dir/moto.pid")" 2>/dev/null || true
        rm -f "$dir/moto.pid"
    fi
    rm -f "$dir/moto.log"
    rmdir "$dir" 2>/dev/null || true
    ;;
*)
    echo "usage: $0 start|stop DIR [PORT] [BUCKET]" >&2
    exit 2
    ;;
esac

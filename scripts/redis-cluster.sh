#!/usr/bin/env bash
# A 3-master Redis cluster on loopback for `ucm bench remote` and CI smoke
# runs: no persistence, ports of its own, everything under one directory.
#
#   scripts/redis-cluster.sh start DIR [BASE_PORT]   # prints the URL
#   scripts/redis-cluster.sh stop DIR
#
# BASE_PORT (default 17000) and the next two ports serve; each port + 10000
# is its cluster bus. Needs Debian's redis-server (and redis-cli).
set -euo pipefail
cmd=${1:?start or stop}
dir=${2:?a directory for the servers}
base=${3:-17000}
case "$cmd" in
start)
    command -v redis-server >/dev/null || { echo "redis-server is not installed" >&2; exit 2; }
    mkdir -p "$dir"
    ports=("$base" "$((base + 1))" "$((base + 2))")
    for p in "${ports[@]}"; do
        redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes \
            --cluster-config-file "nodes-$p.conf" --cluster-node-timeout 2000 \
            --save '' --appendonly no --protected-mode no --dir "$dir" \
            --daemonize yes --pidfile "$dir/redis-$p.pid" --logfile "$dir/redis-$p.log"
    done
    for p in "${ports[@]}"; do
        for _ in $(seq 100); do
            [ "$(redis-cli -p "$p" ping 2>/dev/null)" = PONG ] && break
            sleep 0.1
        done
    done
    redis-cli --cluster create "${ports[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes >/dev/null
    for p in "${ports[@]}"; do
        for _ in $(seq 200); do
            redis-cli -p "$p" cluster info 2>/dev/null | grep -q cluster_state:ok && break
            sleep 0.1
        done
    done
    echo "redis://127.0.0.1:${ports[0]},127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}"
    ;;
stop)
    for f in "$dir"/redis-*.pid; do
        [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true
    done
    sleep 0.5
    rm -rf "$dir"
    ;;
*)
    echo "usage: $0 start|stop DIR [BASE_PORT]" >&2
    exit 2
    ;;
esac

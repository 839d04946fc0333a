#!/usr/bin/env bash
# The proxy's throughput with new keys: bin/idem proxy in front of
# `idem upstream-demo`, wrk -t2 -c64 -d8s, 3 runs on the embedded store and
# 3 on a redis-server started here. Run it with `make bench-proxy`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.05; done; echo "nothing listens on $1" >&2; exit 1; }

(cd "$root/cmd/idem" && go build -o "$work/idem" .)
up=$(port); rp=$(port)
"$work/idem" upstream-demo --listen "127.0.0.1:$up" >/dev/null 2>&1 & pids+=($!)
redis-server --port "$rp" --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 & pids+=($!)
wait_port "$up"; wait_port "$rp"
for store in embedded redis; do
  px=$(port)
  if [ "$store" = embedded ]; then args=(--data "$work/data"); else args=(--redis "redis://127.0.0.1:$rp"); fi
  "$work/idem" proxy --listen "127.0.0.1:$px" --upstream "http://127.0.0.1:$up" "${args[@]}" >/dev/null 2>&1 & ppid=$!
  wait_port "$px"
  for run in 1 2 3; do
    out=$(wrk -t2 -c64 -d8s -s "$here/newkey.lua" "http://127.0.0.1:$px")
    echo "$store run $run: $(echo "$out" | grep Requests/sec | awk '{print $2}') req/s $(echo "$out" | grep Non-2xx || true)"
    sleep 1
  done
  kill "$ppid"; wait "$ppid" 2>/dev/null || true
done

#!/usr/bin/env bash
# The proxy's resources at its default limits, for the Helm chart's
# requests and limits (docs/deploy.md, "Resources"): bin/idem proxy in
# front of `idem upstream-demo`, new keys under wrk (RUNS runs of DURATION
# at each of CONNS connections), on a redis-server started here and on the
# embedded store. For each run: requests/s, the proxy's CPU time per
# 1,000 requests (= cores per 1,000 requests/s), its resident memory at
# the end and at its peak (VmHWM: a new proxy per run). Medians at the
# end. Run it with `make bench-resources`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
RUNS=${RUNS:-5}
DURATION=${DURATION:-10s}
CONNS=${CONNS:-"64 256"}
work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.05; done; echo "nothing listens on $1" >&2; exit 1; }
ticks=$(getconf CLK_TCK)
cpu() { awk -v t="$ticks" '{printf "%.3f", ($14 + $15) / t}' "/proc/$1/stat"; }
kb() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"; }
median() { sort -g | awk '{a[NR] = $1} END {if (NR % 2) print a[(NR + 1) / 2]; else printf "%.3f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

(cd "$root/cmd/idem" && go build -o "$work/idem" .)
up=$(port); rp=$(port)
"$work/idem" upstream-demo --listen "127.0.0.1:$up" >/dev/null 2>&1 & pids+=($!)
redis-server --port "$rp" --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 & pids+=($!)
wait_port "$up"; wait_port "$rp"
echo "nproc $(nproc), load $(cut -d' ' -f1-3 /proc/loadavg), $RUNS runs of $DURATION per row"
printf '%-9s %5s %4s %9s %14s %9s %9s %9s\n' store conns run req/s cpu-s/1k-req rss-idle rss-end rss-peak
for store in redis embedded; do
  for c in $CONNS; do
    : >"$work/rows"
    for run in $(seq "$RUNS"); do
      px=$(port)
      if [ "$store" = embedded ]; then args=(--data "$work/data-$c-$run"); else args=(--redis "redis://127.0.0.1:$rp"); fi
      "$work/idem" proxy --listen "127.0.0.1:$px" --upstream "http://127.0.0.1:$up" "${args[@]}" >/dev/null 2>&1 & ppid=$!
      wait_port "$px"
      idle=$(kb "$ppid" VmRSS)
      c0=$(cpu "$ppid")
      out=$(wrk -t2 -c"$c" -d"$DURATION" -s "$here/newkey.lua" "http://127.0.0.1:$px")
      c1=$(cpu "$ppid")
      rss=$(kb "$ppid" VmRSS); hwm=$(kb "$ppid" VmHWM)
      reqs=$(echo "$out" | awk '/requests in/ {print $1}')
      rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
      non2xx=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
      per1k=$(awk -v a="$c0" -v b="$c1" -v n="$reqs" 'BEGIN {printf "%.4f", (b - a) / n * 1000}')
      printf '%-9s %5s %4s %9.0f %14s %8dM %8dM %8dM %s\n' "$store" "$c" "$run" "$rps" "$per1k" $((idle / 1024)) $((rss / 1024)) $((hwm / 1024)) "${non2xx:+non-2xx: $non2xx}"
      echo "$rps $per1k $idle $rss $hwm" >>"$work/rows"
      kill "$ppid"; wait "$ppid" 2>/dev/null || true
    done
    printf '%-9s %5s %4s %9.0f %14s %8dM %8dM %8dM\n' "$store" "$c" median \
      "$(cut -d' ' -f1 "$work/rows" | median)" "$(cut -d' ' -f2 "$work/rows" | median)" \
      $(($(cut -d' ' -f3 "$work/rows" | median | cut -d. -f1) / 1024)) \
      $(($(cut -d' ' -f4 "$work/rows" | median | cut -d. -f1) / 1024)) \
      $(($(cut -d' ' -f5 "$work/rows" | median | cut -d. -f1) / 1024))
  done
done

#!/usr/bin/env bash
# make chaos-suite: the reliability scenarios with the race detector, one
# package at a time (they measure memory, connections and timings that a
# neighbour's load disturbs), as go test -race -p 1 ./... ran them, but
# built side by side first: go test -p 1 also compiled and linked one
# package at a time, leaving a core idle for most of the ~1,250 s a CI run
# spent building. One go test -c builds every package's test binary with
# all cores (and, beside it, the idem binary chaostest.BuildIdem would link
# again for each test that runs it); then each binary runs alone from its
# package's directory, as go test runs it. RUN is the -run regexp, CHAOS_TIMEOUT
# each package's -timeout; IDEM_CHAOS_REPORT is passed through. Every
# package runs; the exit status is 1 if any failed.
set -uo pipefail
GO=${GO:-go}
RUN=${RUN:-.}
TIMEOUT=${CHAOS_TIMEOUT:-20m}
cd "$(dirname "$0")"
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT

(cd ../cmd/idem && "$GO" build -trimpath -o "$bin/idem" .) &
idem=$!
build=0
"$GO" test -race -c -o "$bin/" ./... || build=1
wait "$idem" || build=1
[ "$build" = 0 ] || { echo "FAIL: building the chaos suite"; exit 1; }
echo "chaos: test binaries and idem built in ${SECONDS}s"

"$GO" list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}} {{.Dir}}{{end}}' ./... >"$bin/packages" || exit 1
export IDEM_CHAOS_BIN="$bin/idem"
# go test puts its Go's bin directory first on the tests' PATH.
PATH="$("$GO" env GOROOT)/bin:$PATH"
status=0
while read -r pkg dir; do
  start=$SECONDS
  out="$bin/${pkg##*/}.out"
  if (cd "$dir" && "$bin/${pkg##*/}.test" -test.paniconexit0 -test.timeout="$TIMEOUT" \
      -test.count=1 -test.run="$RUN") </dev/null >"$out" 2>&1; then
    note=""
    grep -q '^testing: warning: no tests to run' "$out" && note=" [no tests to run]"
    printf 'ok  \t%s\t%ds%s\n' "$pkg" $((SECONDS - start)) "$note"
  else
    cat "$out"
    printf 'FAIL\t%s\t%ds\n' "$pkg" $((SECONDS - start))
    status=1
  fi
done <"$bin/packages"
exit "$status"

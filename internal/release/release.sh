#!/usr/bin/env bash
# make release: idem for every platform in dist/, RELEASE_JOBS at a time,
# each step of each platform on a line of its own with its time. Each
# archive holds the binary, LICENSE, README.md, CHANGELOG.md and
# INSTALL.md; beside them SHA256SUMS and a CycloneDX SBOM per binary
# (cyclonedx-gomod bin: the modules the binary was built with, read from
# it, with their licences).
#
# Environment (the Makefile sets it): GO, VERSION, COMMIT, DATE, STAMP
# (the -X flags), PLATFORMS (os/arch ...), JOBS, CYCLONEDX (its binary).
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${GO:=go}" "${VERSION:?}" "${DATE:?}" "${STAMP:?}" "${PLATFORMS:?}" "${JOBS:=2}" "${CYCLONEDX:?}"
start=$SECONDS
say() { printf '[%4ds] %s\n' $((SECONDS - start)) "$*"; }

rm -rf dist && mkdir -p dist
install_note() { # os name ext
  local os=$1 name=$2 ext=$3
  cat <<NOTE
# Installing idem $VERSION

This archive holds idem$ext, a static binary for $os: no runtime to install.

NOTE
  if [ "$os" = windows ]; then
    cat <<'NOTE'
Put idem.exe in a directory on your PATH, then check it:

    idem version
NOTE
  else
    cat <<NOTE
Check the archive against SHA256SUMS, unpack it, put the binary on your
PATH and check it:

    sha256sum --check --ignore-missing SHA256SUMS   # shasum -a 256 -c on macOS
    tar -xzf $name.tar.gz
    sudo install -m 0755 $name/idem /usr/local/bin/idem
    idem version
NOTE
  fi
  cat <<'NOTE'

Then try the proxy on its embedded store (`idem help proxy`), or read
docs/deploy.md in the repository for the container image and the Helm
chart. CHANGELOG.md says what changed; LICENSE is the Apache License 2.0.
NOTE
}

build_one() { # os/arch
  local os=${1%/*} arch=${1#*/} ext="" t0=$SECONDS
  local name="idem_${VERSION}_${os}_${arch}"
  [ "$os" = windows ] && ext=.exe
  say "$os/$arch: go build"
  mkdir -p "dist/$name"
  # A compilation from a cold cache takes minutes: a line every 30s says
  # it goes on.
  (while sleep 30; do say "$os/$arch: go build still running ($((SECONDS - t0))s)"; done) &
  local ticker=$!
  local rc=0
  (cd cmd/idem && CGO_ENABLED=0 GOOS=$os GOARCH=$arch "$GO" build -trimpath -buildvcs=false \
    -ldflags "-s -w $STAMP" -o "../../dist/$name/idem$ext" .) || rc=$?
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  if [ "$rc" != 0 ]; then say "$os/$arch: go build failed"; return "$rc"; fi
  say "$os/$arch: built in $((SECONDS - t0))s ($(du -h "dist/$name/idem$ext" | cut -f1))"
  cp LICENSE README.md "dist/$name/"
  if [ -f CHANGELOG.md ]; then cp CHANGELOG.md "dist/$name/"; fi
  install_note "$os" "$name" "$ext" > "dist/$name/INSTALL.md"
  say "$os/$arch: SBOM"
  "$CYCLONEDX" bin -json -licenses -noserial -version "$VERSION" \
    -output "dist/$name.cdx.json" "dist/$name/idem$ext" 2>"dist/$name.sbom.log" \
    || { cat "dist/$name.sbom.log" >&2; return 1; }
  rm -f "dist/$name.sbom.log"
  touch -d "$DATE" "dist/$name"/*
  say "$os/$arch: archive"
  if [ "$os" = windows ]; then
    (cd dist && TZ=UTC zip -qrX "$name.zip" "$name")
  else
    tar -C dist --sort=name --owner=0 --group=0 --numeric-owner --mtime="$DATE" -cf - "$name" | gzip -n > "dist/$name.tar.gz"
  fi
  rm -r "dist/${name:?}"
  say "$os/$arch: done in $((SECONDS - t0))s"
}

read -r -a platforms <<<"$PLATFORMS"
say "release $VERSION: ${#platforms[@]} platforms, $JOBS at a time"
status="$(mktemp -d)"
trap 'rm -rf "$status"' EXIT
for p in "${platforms[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
  (set -e; build_one "$p"; touch "$status/${p/\//_}") &
done
wait
for p in "${platforms[@]}"; do
  if [ ! -e "$status/${p/\//_}" ]; then
    say "$p failed; dist/ is incomplete"
    exit 1
  fi
done
(cd dist && sha256sum idem_* > SHA256SUMS)
say "SHA256SUMS"
cat dist/SHA256SUMS
say "release $VERSION done in $((SECONDS - start))s"

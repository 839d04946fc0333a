#!/usr/bin/env bash
# Builds the idem image offline: FROM scratch, the static binary IDEM_BIN,
# the build machine's CA certificates, a passwd and group naming the user
# (65532, idem) and /data, the embedded store's directory, owned by it.
# `make image` runs it; so does the image test, with a storage of its own.
#
# Environment:
#   IDEM_BIN       the static linux binary (CGO_ENABLED=0); required
#   IMAGE          the name to tag, e.g. idem:v0.1.0; required
#   VERSION, COMMIT, DATE   the OCI labels' version, revision and created
#   CA_BUNDLE      the certificates to copy (default: Debian's and Alpine's
#                  /etc/ssl/certs/ca-certificates.crt, Fedora's
#                  /etc/pki/tls/certs/ca-bundle.crt)
#   IMAGE_TOOL     buildah or podman (default: buildah if found, else podman)
#   IMAGE_TOOL_FLAGS  global flags for it, e.g. --root DIR --runroot DIR --storage-driver vfs
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
: "${IDEM_BIN:?IDEM_BIN: the static idem binary to put in the image}"
: "${IMAGE:?IMAGE: the name to tag the image with}"
tool="${IMAGE_TOOL:-}"
if [ -z "$tool" ]; then
  if command -v buildah >/dev/null 2>&1; then tool=buildah
  elif command -v podman >/dev/null 2>&1; then tool=podman
  else
    echo "building the image needs buildah or podman: sudo apt-get install -y buildah (or podman)" >&2
    echo "(with Docker instead: docker build -t idem . at the repository's root, which downloads its base images)" >&2
    exit 1
  fi
fi
ca="${CA_BUNDLE:-}"
if [ -z "$ca" ]; then
  for f in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt; do
    if [ -s "$f" ]; then ca=$f; break; fi
  done
fi
if [ -z "$ca" ] || [ ! -s "$ca" ]; then
  echo "no CA certificates found to copy into the image: sudo apt-get install -y ca-certificates, or set CA_BUNDLE" >&2
  exit 1
fi

ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/rootfs/etc/ssl/certs" "$ctx/datadir/data"
install -m 0555 "$IDEM_BIN" "$ctx/rootfs/idem"
install -m 0444 "$ca" "$ctx/rootfs/etc/ssl/certs/ca-certificates.crt"
install -m 0444 "$here/passwd" "$ctx/rootfs/etc/passwd"
install -m 0444 "$here/group" "$ctx/rootfs/etc/group"
chmod 0755 "$ctx/datadir/data"
# A fixed time on every file, so that the same inputs give the same layer.
find "$ctx" -exec touch -h -d "${DATE:-1970-01-01T00:00:00Z}" {} +

args=(--format oci --file "$here/Containerfile" --tag "$IMAGE"
  --build-arg "VERSION=${VERSION:-devel}" --build-arg "REVISION=${COMMIT:-unknown}"
  --build-arg "CREATED=${DATE:-1970-01-01T00:00:00Z}")
# shellcheck disable=SC2086 # IMAGE_TOOL_FLAGS is a list of flags
case "$tool" in
  buildah) buildah ${IMAGE_TOOL_FLAGS:-} bud --quiet "${args[@]}" "$ctx" ;;
  podman) podman ${IMAGE_TOOL_FLAGS:-} build --quiet "${args[@]}" "$ctx" ;;
  *) echo "IMAGE_TOOL must be buildah or podman, not $tool" >&2; exit 1 ;;
esac

#!/usr/bin/env bash
# Builds containerd, ctr and containerd-shim-runc-v2 of the given release (default v2.3.4,
# the one kind v0.33.0's own node image carries) from the Go module proxy, static
# (CGO_ENABLED=0, leaving out the snapshotters that need cgo and that kind never selects),
# into a cache outside the repository keyed by version. A warm cache rebuilds nothing.
# Prints the bin directory as its last line.
#
# Debian bookworm's containerd (1.6.20), which the default node image runs, has no Container
# Device Interface; Dynamic Resource Allocation hands devices to containers through it, so
# a node image for a DRA driver carries this build instead (build-images.sh with
# MODELPOOL_KIND_CONTAINERD=<version>). containerd 2.x injects CDI devices by default.
#
# Usage: build-containerd.sh [VERSION]. Environment: MODELPOOL_CACHE.
set -euo pipefail

VERSION="${1:-v2.3.4}"
MODULE=github.com/containerd/containerd/v2
[[ $VERSION == v1.* ]] && MODULE=github.com/containerd/containerd
CACHE="${MODELPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelpool}"
BIN="$CACHE/kind/containerd-$VERSION/bin"
WORK="$CACHE/kind/work"
export CGO_ENABLED=0 GOFLAGS="-mod=mod" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

log() { printf '[kind-containerd %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
command -v go >/dev/null || { log "go is required to build containerd"; exit 1; }

if [[ ! -x $BIN/containerd || ! -x $BIN/ctr || ! -x $BIN/containerd-shim-runc-v2 ]]; then
  start=$SECONDS
  mkdir -p "$WORK" "$BIN"
  src="$(cd "$WORK" && GOFLAGS= go mod download -json "$MODULE@$VERSION" \
    | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
  [[ -n $src ]] || { log "$MODULE@$VERSION: not in the Go module proxy"; exit 1; }
  log "containerd $VERSION: building from $src"
  tags="no_aufs no_zfs no_btrfs no_devmapper"
  ldflags="-s -w -X $MODULE/version.Version=$VERSION -X $MODULE/version.Revision=module-proxy -X $MODULE/version.Package=$MODULE"
  for b in containerd ctr containerd-shim-runc-v2; do
    (cd "$src" && go build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$BIN/$b.tmp" "./cmd/$b" >&2)
    mv "$BIN/$b.tmp" "$BIN/$b"
  done
  log "containerd $VERSION: done in $((SECONDS - start))s"
fi
echo "$BIN"

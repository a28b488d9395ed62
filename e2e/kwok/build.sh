#!/usr/bin/env bash
# Builds KWOK (sigs.k8s.io/kwok: fake nodes and pods against a real API server) from the
# Go module proxy into a cache outside the repository, keyed by version; a warm cache
# rebuilds nothing. Prints the binary's path as its last line; KWOK's own stages (what it
# does to fake nodes and pods, and when) are copied beside it, under stages/.
#
# e2e/kwok/testbed.py runs it against the local testbed's control plane for the scale
# benchmark (benchmarks/bench_scale.py).
#
# Environment:
#   MODELPOOL_KWOK_VERSION  the module version (default v0.8.0)
#   MODELPOOL_CACHE         cache root (default ~/.cache/modelpool)
set -euo pipefail

VERSION="${MODELPOOL_KWOK_VERSION:-v0.8.0}"
CACHE="${MODELPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelpool}"
DIR="$CACHE/kwok/$VERSION"
WORK="$CACHE/kwok/work"
BIN="$DIR/kwok"
STAGES="$DIR/stages"
# The node stages (initialise, then renew a Lease) and the pod stages (Ready at once,
# deleted at once when deleted) that kwokctl's defaults use, from the module itself.
STAGE_FILES=(node/fast/node-initialize.yaml
  node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
  pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml)

export CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" GOWORK=off \
  GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

log() { printf '[kwok-build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ -x $BIN && -d $STAGES ]]; then
  log "cache warm: $BIN"
  echo "$BIN"
  exit 0
fi
command -v go >/dev/null || { log "go is required to build kwok"; exit 1; }
mkdir -p "$DIR" "$WORK"
start=$SECONDS
log "building kwok $VERSION (sigs.k8s.io/kwok/cmd/kwok; the first build takes minutes on 2 cores)"
module_dir="$(cd "$WORK" && GOFLAGS= go mod download -json "sigs.k8s.io/kwok@$VERSION" \
  | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
[[ -d $module_dir ]] || { log "go mod download of kwok $VERSION failed"; exit 1; }
mkdir -p "$STAGES.tmp"
for f in "${STAGE_FILES[@]}"; do cp "$module_dir/kustomize/stage/$f" "$STAGES.tmp/"; done
chmod -R u+w "$STAGES.tmp" && rm -rf "$STAGES" && mv "$STAGES.tmp" "$STAGES"
[[ -x $BIN ]] && { log "stages copied"; echo "$BIN"; exit 0; }
(cd "$module_dir" && go build -trimpath -ldflags "-s -w" -o "$BIN.tmp" ./cmd/kwok)
mv "$BIN.tmp" "$BIN"
log "kwok built in $((SECONDS - start))s"
echo "$BIN"

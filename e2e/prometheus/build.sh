#!/usr/bin/env bash
# Builds Prometheus from the Go module proxy into a cache outside the repository, keyed by
# version; a warm cache rebuilds nothing. Prints the binary's path as its last line.
#
# Version: github.com/prometheus/prometheus v0.316.0 (the module versions of Prometheus 3
# are v0.3xx). Built with `-tags remove_all_sd`: the dashboard's test names its targets in
# the configuration, so the cloud service discoveries (and most of the build time) are
# left out; static and file targets stay. The web UI's assets are not embedded: the
# HTTP API, which the test queries, needs none.
#
# Environment:
#   MODELPOOL_PROMETHEUS_VERSION  the module version (default v0.316.0)
#   MODELPOOL_CACHE               cache root (default ~/.cache/modelpool)
set -euo pipefail

VERSION="${MODELPOOL_PROMETHEUS_VERSION:-v0.316.0}"
CACHE="${MODELPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelpool}"
DIR="$CACHE/prometheus/$VERSION"
WORK="$CACHE/prometheus/work"
BIN="$DIR/prometheus"

export CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" GOWORK=off \
  GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

log() { printf '[prometheus-build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ -x $BIN ]]; then
  log "cache warm: $BIN"
  echo "$BIN"
  exit 0
fi
command -v go >/dev/null || { log "go is required to build Prometheus"; exit 1; }
mkdir -p "$DIR" "$WORK"
start=$SECONDS
log "building prometheus $VERSION (the first build downloads its modules: a few minutes)"
module_dir="$(cd "$WORK" && go mod download -json "github.com/prometheus/prometheus@$VERSION" \
  | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
[[ -d $module_dir ]] || { log "go mod download github.com/prometheus/prometheus@$VERSION failed"; exit 1; }
src="$WORK/prometheus-$VERSION"
rm -rf "$src" && cp -R "$module_dir" "$src" && chmod -R u+w "$src"
(cd "$src" && go build -trimpath -tags remove_all_sd -ldflags "-s -w" -o "$BIN.tmp" ./cmd/prometheus)
mv "$BIN.tmp" "$BIN"
rm -rf "$src"
log "prometheus built in $((SECONDS - start))s"
echo "$BIN"

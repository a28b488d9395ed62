#!/usr/bin/env bash
# Builds the container registry (distribution v3, the registry behind Docker Hub and most
# others) from the Go module proxy into a cache outside the repository, keyed by version; a
# warm cache rebuilds nothing; only the filesystem storage driver is built in. Prints the binary's path as its last line.
#
# e2e/registry/serve.py runs it on this machine for the test that installs modelpool from
# pushed images (e2e/kind_tests/test_registry_install.py).
#
# Environment:
#   MODELPOOL_REGISTRY_VERSION  the module version (default v3.1.2)
#   MODELPOOL_CACHE             cache root (default ~/.cache/modelpool)
set -euo pipefail

VERSION="${MODELPOOL_REGISTRY_VERSION:-v3.1.2}"
CACHE="${MODELPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelpool}"
DIR="$CACHE/registry/$VERSION"
WORK="$CACHE/registry/work"
BIN="$DIR/registry"

export CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" GOWORK=off \
  GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

log() { printf '[registry-build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ -x $BIN ]]; then
  log "cache warm: $BIN"
  echo "$BIN"
  exit 0
fi
command -v go >/dev/null || { log "go is required to build the registry"; exit 1; }
mkdir -p "$DIR" "$WORK"
start=$SECONDS
log "building registry $VERSION (github.com/distribution/distribution/v3)"
module_dir="$(cd "$WORK" && go mod download -json "github.com/distribution/distribution/v3@$VERSION" \
  | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
[[ -d $module_dir ]] || { log "go mod download of distribution $VERSION failed"; exit 1; }
src="$WORK/distribution-$VERSION"
rm -rf "$src" && cp -R "$module_dir" "$src" && chmod -R u+w "$src"
# The registry's own main, but for the storage drivers: only the filesystem one the test
# stores into. The cloud drivers (Azure, GCS, S3) and their SDKs are most of the build.
cat >"$src/cmd/registry/main.go" <<'GO'
// Command registry serves the distribution registry with the filesystem storage driver.
package main

import (
	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
)

func main() {
	if err := registry.RootCmd.Execute(); err != nil {
		panic(err)
	}
}
GO
(cd "$src" && go build -trimpath -ldflags "-s -w" -o "$BIN.tmp" ./cmd/registry)
mv "$BIN.tmp" "$BIN"
rm -rf "$src"
log "registry built in $((SECONDS - start))s"
echo "$BIN"

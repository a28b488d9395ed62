#!/usr/bin/env bash
# Builds Flux's source-controller and kustomize-controller from the Go module proxy into a
# cache outside the repository, keyed by version, with the CRDs, RBAC and Deployments of
# the same modules (their config/ directories). A warm cache rebuilds nothing. Prints the
# cache directory as its last line:
#
#   <dir>/bin/source-controller  <dir>/bin/kustomize-controller
#   <dir>/config/source-controller/{crd,rbac,manager}  <dir>/config/kustomize-controller/...
#
# source-controller is built with its GitRepository reconciler alone, the only source the
# tests use: its main is e2e/flux/source-controller/main.go, upstream's with the Helm, OCI
# and bucket reconcilers left out, and their files are left out of the copy of the module.
# Upstream's main links Helm, cosign and more: 2,352 packages to compile against 1,579
# (`go list -deps`). kustomize-controller is upstream's but for its SOPS decryptor, which no
# test uses (none of their Kustomizations has spec.decryption): e2e/flux/kustomize-controller/
# decryptor.go stands in for it, the same API and behaviour without decryption, and a clear
# error for a Kustomization that asks for it; upstream's links SOPS and the key services of
# five clouds: 1,884 packages against 1,461. Another version may need these files brought
# to its API.
#
# Version: v1.9.6 of both (Flux 2.7), the newest whose whole dependency graph the module
# proxy here serves. v1.10.x asks for Go 1.27 and for module versions the proxy refuses
# (fluxcd/pkg/artifact v0.27.1, pkg/apis/crypto v0.5.0, pkg/spiffe v0.2.0, sigstore/cosign/v3
# v3.1.4, among others). Two edits to upstream's go.mod, both to build from a module zip:
# - each controller's `replace .../api => ./api` points into its git repository, which a
#   module zip does not hold; the api module of the same version is required instead;
# - source-controller asks for fluxcd/pkg/artifact v0.18.3, which the proxy refuses;
#   v0.18.0, the newest it serves, has the same API (v0.18.x are patch releases).
#
# Environment:
#   MODELPOOL_FLUX_VERSION  the controllers' version (default v1.9.6)
#   MODELPOOL_CACHE         cache root (default ~/.cache/modelpool)
set -euo pipefail

VERSION="${MODELPOOL_FLUX_VERSION:-v1.9.6}"
CACHE="${MODELPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelpool}"
DIR="$CACHE/flux/$VERSION"
WORK="$CACHE/flux/work"
HERE="$(cd "$(dirname "$0")" && pwd)"
CONTROLLERS=(source-controller kustomize-controller)

export CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

log() { printf '[flux-build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

missing=()
for c in "${CONTROLLERS[@]}"; do
  [[ -x $DIR/bin/$c && -d $DIR/config/$c/crd ]] || missing+=("$c")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  log "cache warm: $DIR"
  echo "$DIR"
  exit 0
fi
command -v go >/dev/null || { log "go is required to build Flux's controllers"; exit 1; }
mkdir -p "$DIR/bin" "$DIR/config" "$WORK"

for c in "${missing[@]}"; do
  start=$SECONDS
  log "building $c $VERSION (the first build downloads its modules: a few minutes)"
  module_dir="$(cd "$WORK" && go mod download -json "github.com/fluxcd/$c@$VERSION" \
    | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
  [[ -d $module_dir ]] || { log "go mod download github.com/fluxcd/$c@$VERSION failed"; exit 1; }
  src="$WORK/$c-$VERSION"
  rm -rf "$src" && cp -R "$module_dir" "$src" && chmod -R u+w "$src"
  (
    cd "$src"
    go mod edit -dropreplace "github.com/fluxcd/$c/api"
    if [[ $c == source-controller ]]; then
      if grep -q 'fluxcd/pkg/artifact v0.18.3' go.mod; then
        go mod edit -replace github.com/fluxcd/pkg/artifact@v0.18.3=github.com/fluxcd/pkg/artifact@v0.18.0
      fi
      cp "$HERE/source-controller/main.go" main.go
      rm -f internal/controller/{bucket,helmchart,helmrepository,ocirepository}_controller.go
    else
      cp "$HERE/kustomize-controller/decryptor.go" internal/decryptor/decryptor.go
    fi
    go build -trimpath -ldflags "-s -w" -o "$DIR/bin/$c.tmp" .
  )
  rm -rf "$DIR/config/$c" && mkdir -p "$DIR/config/$c"
  for part in crd rbac manager; do cp -R "$src/config/$part" "$DIR/config/$c/$part"; done
  mv "$DIR/bin/$c.tmp" "$DIR/bin/$c"
  rm -rf "$src"
  log "$c built in $((SECONDS - start))s"
done
echo "$DIR"

#!/usr/bin/env bash
# Builds the test control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler) from the Go module proxy into a cache outside the repository,
# keyed by version. A warm cache rebuilds nothing.
#
#   e2e/build-control-plane.sh            # build (or reuse) and print the bin dir
#
# Environment:
#   MODELPOOL_K8S_VERSION   Kubernetes release (default v1.35.4)
#   MODELPOOL_ETCD_VERSION  etcd release (default v3.6.16)
#   MODELPOOL_CACHE         cache root (default ~/.cache/modelpool)
set -euo pipefail

K8S_VERSION="${MODELPOOL_K8S_VERSION:-v1.35.4}"
ETCD_VERSION="${MODELPOOL_ETCD_VERSION:-v3.6.16}"
CACHE="${MODELPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelpool}"
BIN="$CACHE/controlplane/k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}/bin"
WORK="$CACHE/controlplane/work"

export CGO_ENABLED=0 GOFLAGS="-mod=mod" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

log() { printf '[control-plane %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

want=(etcd kube-apiserver kube-controller-manager kube-scheduler)
missing=()
for b in "${want[@]}"; do [[ -x "$BIN/$b" ]] || missing+=("$b"); done
if [[ ${#missing[@]} -eq 0 ]]; then
  log "cache warm: $BIN"
  echo "$BIN"
  exit 0
fi
command -v go >/dev/null || { log "go is required to build the control plane"; exit 1; }
mkdir -p "$BIN" "$WORK"
log "building ${missing[*]} (kubernetes $K8S_VERSION, etcd $ETCD_VERSION) into $BIN"

# --- etcd: a consumer module, because etcd's own go.mod uses relative replaces.
build_etcd() {
  local dir="$WORK/etcd-$ETCD_VERSION"
  mkdir -p "$dir"
  cat >"$dir/main.go" <<'GO'
// Command etcd runs the etcd server, built from the module proxy.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  cat >"$dir/go.mod" <<GOMOD
module modelpool.dev/testbed/etcd

go 1.25

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
GOMOD
  log "etcd: resolving modules"
  (cd "$dir" && go mod tidy >&2)
  log "etcd: compiling"
  (cd "$dir" && go build -trimpath -o "$BIN/etcd.tmp" . >&2)
  mv "$BIN/etcd.tmp" "$BIN/etcd"
  log "etcd: done ($("$BIN/etcd" --version | head -1))"
}

# --- kubernetes: k8s.io/kubernetes with every staging module replaced by v0.X.Y.
build_kube() {
  local dir="$WORK/k8s-$K8S_VERSION"
  local staging_version="v0.${K8S_VERSION#v1.}"
  local major=1 minor
  minor="$(echo "$K8S_VERSION" | cut -d. -f2)"
  mkdir -p "$dir"
  log "kubernetes: fetching k8s.io/kubernetes@$K8S_VERSION go.mod"
  local src
  src="$(cd "$dir" && GOFLAGS= go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  {
    echo "module modelpool.dev/testbed/kubernetes"
    echo
    echo "go 1.25.0"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    # Every `k8s.io/x => ./staging/src/k8s.io/x` line becomes `k8s.io/x => k8s.io/x v0.X.Y`.
    sed -n 's#^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/src/.*#replace \1 => \1 '"$staging_version"'#p' "$src"
  } >"$dir/go.mod"
  cat >"$dir/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO
  log "kubernetes: $(grep -c '^replace' "$dir/go.mod") staging modules replaced with $staging_version; resolving modules"
  (cd "$dir" && go mod tidy -e >&2 2>&1 | grep -v '^go: finding' >&2 || true)
  (cd "$dir" && go mod download >&2)
  local pkg=k8s.io/component-base/version
  local ldflags="-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  ldflags="$ldflags -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=$major -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  for b in kube-apiserver kube-controller-manager kube-scheduler; do
    [[ -x "$BIN/$b" ]] && { log "$b: cached"; continue; }
    log "$b: compiling (the first build takes several minutes on 2 cores)"
    local start=$SECONDS
    (cd "$dir" && go build -trimpath -tags tools -ldflags "$ldflags" -o "$BIN/$b.tmp" "k8s.io/kubernetes/cmd/$b" >&2)
    mv "$BIN/$b.tmp" "$BIN/$b"
    log "$b: done in $((SECONDS - start))s ($("$BIN/$b" --version))"
  done
}

[[ -x "$BIN/etcd" ]] || build_etcd
build_kube
echo "$BIN"

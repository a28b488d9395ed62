#!/usr/bin/env bash
# Builds the test control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, and a kubectl of the same release) from the Go module proxy into a
# cache outside the repository, keyed by version. A warm cache rebuilds nothing.
#
# One deliberate change to upstream: the testbed runs pods on loopback addresses
# (127.0.x.y), which EndpointSlice validation rejects, so kube-apiserver is built from a
# copy of k8s.io/kubernetes whose EndpointSlice validation accepts loopback addresses
# (see patch_endpointslice_validation below). Nothing else differs from the release, except
# where the module proxy lacks a staging module at the release's version (see
# pin_unserved_staging below: the build log names each such module).
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

# Bump when the patch changes: a kube-apiserver without the matching marker is rebuilt.
PATCH_ID="loopback-endpointslices-1"
PATCH_MARKER="$BIN/kube-apiserver.patch"

want=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl)
missing=()
for b in "${want[@]}"; do [[ -x "$BIN/$b" ]] || missing+=("$b"); done
if [[ -x "$BIN/kube-apiserver" && "$(cat "$PATCH_MARKER" 2>/dev/null)" != "$PATCH_ID" ]]; then
  rm -f "$BIN/kube-apiserver"
  missing+=(kube-apiserver)
fi
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
  log "etcd: done ($("$BIN/etcd" --version | sed -n 1p))"
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
  pin_unserved_staging "$dir/go.mod" "$staging_version"
  cat >"$dir/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  log "kubernetes: $(grep -c '^replace' "$dir/go.mod") staging modules replaced with $staging_version; resolving modules"
  (cd "$dir" && go mod tidy -e >&2 2>&1 | grep -v '^go: finding' >&2 || true)
  (cd "$dir" && go mod download >&2)
  local pkg=k8s.io/component-base/version
  local ldflags="-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  ldflags="$ldflags -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=$major -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    [[ -x "$BIN/$b" ]] && { log "$b: cached"; continue; }
    log "$b: compiling (the first build takes several minutes on 2 cores)"
    local start=$SECONDS
    local build_dir="$dir"
    if [[ $b == kube-apiserver ]]; then
      build_dir="$dir-apiserver"
      patched_apiserver_module "$dir" "$build_dir"
    fi
    (cd "$build_dir" && go build -trimpath -tags tools -ldflags "$ldflags" -o "$BIN/$b.tmp" "k8s.io/kubernetes/cmd/$b" >&2)
    mv "$BIN/$b.tmp" "$BIN/$b"
    if [[ $b == kube-apiserver ]]; then echo "$PATCH_ID" >"$PATCH_MARKER"; fi
    local version_cmd=(--version)
    if [[ $b == kubectl ]]; then version_cmd=(version --client); fi
    log "$b: done in $((SECONDS - start))s ($("$BIN/$b" "${version_cmd[@]}" | sed -n 1p))"
  done
}

# A module proxy that mirrors only part of the public one may not serve every staging
# module at the release's own v0.X.Y. Such a module is replaced by the newest earlier patch
# of the same minor that the proxy serves (staging modules change little between patches),
# and the build says so; where every module is served, go.mod is left as written.
pin_unserved_staging() {
  local gomod="$1" version="$2" mod p pinned
  local minor="${version%.*}" patch="${version##*.}"
  for mod in $(sed -n 's#^replace \([^ ]*\) => .*#\1#p' "$gomod"); do
    (cd "$WORK" && GOFLAGS= go mod download "$mod@$version" 2>/dev/null) && continue
    pinned=""
    for ((p = patch - 1; p >= 0; p--)); do
      if (cd "$WORK" && GOFLAGS= go mod download "$mod@$minor.$p" 2>/dev/null); then
        pinned="$minor.$p"
        break
      fi
    done
    if [[ -z $pinned ]]; then
      log "kubernetes: the module proxy serves $mod at neither $version nor an earlier $minor.Z (fatal only if a binary imports it)"
      continue
    fi
    sed -i "s#^replace $mod => $mod $version\$#replace $mod => $mod $pinned#" "$gomod"
    log "kubernetes: the module proxy does not serve $mod $version; using $pinned"
  done
}

# kube-apiserver is built in its own consumer module, where k8s.io/kubernetes is replaced
# by a copy of the release's source with one file patched. (`go build -overlay` cannot
# replace files in the module cache.) Only k8s.io/kubernetes packages are recompiled; the
# staging modules stay cached.
patched_apiserver_module() {
  local base="$1" dir="$2"
  local src
  src="$(cd "$base" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)"
  rm -rf "$dir"
  mkdir -p "$dir/kubernetes"
  log "kube-apiserver: copying k8s.io/kubernetes $K8S_VERSION source to patch it"
  local part
  for part in go.mod cmd pkg plugin third_party; do cp -R "$src/$part" "$dir/kubernetes/"; done
  chmod -R u+w "$dir/kubernetes"
  patch_endpointslice_validation "$dir/kubernetes/pkg/apis/discovery/validation/validation.go"
  cp "$base/go.sum" "$dir/go.sum"
  {
    sed 's#^module .*#module modelpool.dev/testbed/kube-apiserver#' "$base/go.mod"
    echo
    echo "replace k8s.io/kubernetes => ./kubernetes"
  } >"$dir/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver"\n' >"$dir/tools.go"
}

# EndpointSlice validation calls ValidateEndpointIP (ValidateNonSpecialIP before 1.33),
# which refuses 127.0.0.0/8. The patch replaces those two calls with one that accepts
# loopback addresses and checks every other address as before. Releases whose file does
# not import k8s.io/utils/net yet get the import the wrapper needs.
patch_endpointslice_validation() {
  local file="$1"
  local check call count=0
  for check in ValidateEndpointIP ValidateNonSpecialIP; do
    call="apivalidation.$check(address, addressPath.Index(i))"
    count="$(grep -cF "$call" "$file" || true)"
    [[ $count -eq 0 ]] || break
  done
  if [[ $count -ne 2 ]]; then
    log "patch: expected 2 calls to ValidateEndpointIP or ValidateNonSpecialIP in $file, found $count"
    exit 1
  fi
  sed -i "s/apivalidation\.$check(address, addressPath\.Index(i))/testbedEndpointIP(address, addressPath.Index(i))/" "$file"
  if ! grep -qF 'netutils "k8s.io/utils/net"' "$file"; then
    sed -i '0,/^import (/s##import (\n\tnetutils "k8s.io/utils/net"\n#' "$file"
  fi
  cat >>"$file" <<GO

// testbedEndpointIP is apivalidation.$check that also accepts loopback
// addresses: the modelpool testbed gives each pod its own address in 127.0.0.0/8.
func testbedEndpointIP(address string, fldPath *field.Path) field.ErrorList {
	if ip := netutils.ParseIPSloppy(address); ip != nil && ip.IsLoopback() {
		return nil
	}
	return apivalidation.$check(address, fldPath)
}
GO
  log "patch: EndpointSlices may hold loopback addresses ($file)"
}

[[ -x "$BIN/etcd" ]] || build_etcd
build_kube
echo "$BIN"

#!/usr/bin/env bash
# Builds everything a kind cluster needs that no registry serves here, from the Go module
# proxy (and one C file), into a cache outside the repository keyed by version. A warm
# cache rebuilds nothing. Prints the bin directory as its last line.
#
#   kind            sigs.k8s.io/kind
#   kubelet kubeadm kube-proxy     k8s.io/kubernetes (the release of the local testbed; the
#                   control plane's own binaries come from e2e/build-control-plane.sh)
#   crictl          sigs.k8s.io/cri-tools
#   coredns         github.com/coredns/coredns, with only the plugins kubeadm's Corefile names
#   cni/            bridge, host-local, loopback, portmap (containernetworking/plugins) and
#                   the flannel CNI plugin (its older home, containernetworking/plugins v0.9.1)
#   flanneld        github.com/flannel-io/flannel, two backends left out (see build_flannel)
#   pause           a static C program that sleeps and reaps, as the sandbox image runs
#   kube-router     github.com/cloudnativelabs/kube-router/v2, run as a NetworkPolicy
#                   firewall only (flannel moves the packets and enforces no policy)
#
# Environment: MODELPOOL_CACHE (default ~/.cache/modelpool), MODELPOOL_K8S_VERSION.
set -euo pipefail

K8S_VERSION="${MODELPOOL_K8S_VERSION:-v1.35.4}"
KIND_VERSION=v0.33.0
CRICTL_VERSION=v1.36.0
COREDNS_VERSION=v1.13.1
CNI_PLUGINS_VERSION=v1.9.1
FLANNEL_VERSION=v0.28.10
FLANNEL_CNI_VERSION=v0.9.1
KUBE_ROUTER_VERSION=v2.1.0
CACHE="${MODELPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelpool}"
BIN="$CACHE/kind/tools-k8s-${K8S_VERSION}/bin"
WORK="$CACHE/kind/work"
export CGO_ENABLED=0 GOFLAGS="-mod=mod" GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

log() { printf '[kind-tools %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
command -v go >/dev/null || { log "go is required to build the kind tools"; exit 1; }
mkdir -p "$BIN/cni" "$WORK"

# timed NAME CMD...: runs the build of NAME unless $BIN/NAME exists, saying how long it took.
timed() {
  local name="$1"; shift
  if [[ -x "$BIN/$name" ]]; then return 0; fi
  log "$name: building"
  local start=$SECONDS
  "$@"
  [[ -x "$BIN/$name" ]] || { log "$name: the build left no $BIN/$name"; exit 1; }
  log "$name: done in $((SECONDS - start))s"
}

go_install() {  # go_install DEST_DIR PACKAGE@VERSION
  local dest="$1" pkg="$2"
  (cd "$WORK" && GOBIN="$dest" go install -trimpath -ldflags "-s -w" "$pkg" >&2)
}

build_kube_node() {
  local cp_mod="$CACHE/controlplane/work/k8s-$K8S_VERSION/go.mod"
  [[ -f $cp_mod ]] || { log "build the control plane first (e2e/build-control-plane.sh)"; exit 1; }
  local dir="$WORK/k8s-$K8S_VERSION-node"
  mkdir -p "$dir"
  sed 's#^module .*#module modelpool.dev/testbed/kind-node#' "$cp_mod" >"$dir/go.mod"
  cp "$(dirname "$cp_mod")/go.sum" "$dir/go.sum"
  printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kubelet"\n\t_ "k8s.io/kubernetes/cmd/kubeadm"\n\t_ "k8s.io/kubernetes/cmd/kube-proxy"\n)\n' >"$dir/tools.go"
  (cd "$dir" && go mod tidy -e >&2 2>&1 | grep -v '^go: finding' >&2 || true)
  local major=1 minor pkg=k8s.io/component-base/version
  minor="$(echo "$K8S_VERSION" | cut -d. -f2)"
  local ldflags="-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  ldflags="$ldflags -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=$major -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  local b
  for b in kubelet kubeadm kube-proxy; do
    [[ -x "$BIN/$b" ]] && continue
    log "$b: compiling"
    (cd "$dir" && go build -trimpath -tags tools -ldflags "$ldflags" -o "$BIN/$b.tmp" "k8s.io/kubernetes/cmd/$b" >&2)
    mv "$BIN/$b.tmp" "$BIN/$b"
  done
}

build_cni() {
  local p
  for p in main/bridge main/loopback ipam/host-local meta/portmap; do
    go_install "$BIN/cni" "github.com/containernetworking/plugins/plugins/$p@$CNI_PLUGINS_VERSION"
  done
  # The flannel CNI plugin's own module is refused by the proxy; its older home works, and
  # needs cniVersion 0.3.1 in the conflist (e2e/kind/flannel.yaml).
  go_install "$BIN/cni" "github.com/containernetworking/plugins/plugins/meta/flannel@$FLANNEL_CNI_VERSION"
  touch "$BIN/cni-plugins" && chmod +x "$BIN/cni-plugins"
}

# flanneld's tencentvpc backend needs a module the proxy refuses, and its udp backend needs
# cgo on amd64: both are left out of a copy of main.go (host-gw, the backend used here, and
# the others stay). go.mod and go.sum are the release's own.
build_kube_router() {  # from its module's own go.mod (go install refuses its replace lines)
  local dir
  dir="$(cd "$WORK" && go mod download -json \
    "github.com/cloudnativelabs/kube-router/v2@$KUBE_ROUTER_VERSION" \
    | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
  rm -rf "$WORK/kube-router" && cp -R "$dir" "$WORK/kube-router"
  chmod -R u+w "$WORK/kube-router"
  (cd "$WORK/kube-router" && go build -trimpath -ldflags "-s -w" -o "$BIN/kube-router" \
    ./cmd/kube-router >&2)
}

build_flannel() {
  local dir="$WORK/flannel-$FLANNEL_VERSION"
  (cd "$WORK" && GOFLAGS= go mod download "github.com/flannel-io/flannel@$FLANNEL_VERSION" >&2)
  local src
  src="$(cd "$WORK" && GOFLAGS= go mod download -json "github.com/flannel-io/flannel@$FLANNEL_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
  rm -rf "$dir" && cp -R "$src" "$dir" && chmod -R u+w "$dir"
  sed -i -e '/pkg\/backend\/tencentvpc"/d' -e '/pkg\/backend\/udp"/d' "$dir/main.go"
  (cd "$dir" && go build -trimpath -ldflags "-s -w -X github.com/flannel-io/flannel/pkg/version.Version=$FLANNEL_VERSION" -o "$BIN/flanneld" . >&2)
}

# CoreDNS with the plugins of kubeadm's default Corefile (errors, health, ready, kubernetes,
# prometheus, forward, cache, loop, reload, loadbalance) and log, in a module of its own that
# requires the release (its go.mod and go.sum): upstream's main links every plugin, with the
# AWS, Azure and Google SDKs of route53, azure and clouddns, which nothing here uses.
build_coredns() {
  local dir="$WORK/coredns-$COREDNS_VERSION" src
  src="$(cd "$WORK" && GOFLAGS= go mod download -json "github.com/coredns/coredns@$COREDNS_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
  [[ -f $src/go.mod ]] || { log "go mod download github.com/coredns/coredns@$COREDNS_VERSION failed"; exit 1; }
  rm -rf "$dir" && mkdir -p "$dir"
  sed "s#^module .*#module modelpool.dev/testbed/coredns\n\nrequire github.com/coredns/coredns $COREDNS_VERSION#" \
    "$src/go.mod" >"$dir/go.mod"
  cp "$src/go.sum" "$dir/go.sum"
  local plugins="cache errors forward health kubernetes loadbalance log loop metrics ready reload" p
  {
    printf '// CoreDNS with the plugins of kubeadm'"'"'s default Corefile.\npackage main\n\nimport (\n'
    for p in $plugins; do printf '\t_ "github.com/coredns/coredns/plugin/%s"\n' "$p"; done
    printf '\n\t"github.com/coredns/coredns/coremain"\n)\n\nfunc main() { coremain.Run() }\n'
  } >"$dir/main.go"
  (cd "$dir" && go build -trimpath -ldflags "-s -w" -o "$BIN/coredns.tmp" . >&2)
  mv "$BIN/coredns.tmp" "$BIN/coredns"
}

build_pause() {
  command -v gcc >/dev/null || { log "gcc is required to build pause"; exit 1; }
  cat >"$WORK/pause.c" <<'C'
/* The sandbox's one process: sleeps until told to stop, reaping the children it inherits. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void quit(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
  signal(SIGINT, quit); signal(SIGTERM, quit); signal(SIGCHLD, reap);
  for (;;) pause();
}
C
  gcc -static -O2 -o "$BIN/pause" "$WORK/pause.c"
}

timed kind go_install "$BIN" "sigs.k8s.io/kind@$KIND_VERSION"
timed kube-proxy build_kube_node
timed crictl go_install "$BIN" "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
timed coredns build_coredns
timed cni-plugins build_cni
timed flanneld build_flannel
timed pause build_pause
timed kube-router build_kube_router
log "tools ready: $BIN"
echo "$BIN"

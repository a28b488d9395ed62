#!/usr/bin/env bash
# Builds Argo CD's application controller and repo server from the Go module proxy into a
# cache outside the repository, keyed by version, with the CRDs of the same module; a warm
# cache rebuilds nothing. Prints the directory as its last line:
#
#   <dir>/argocd                     one binary; argv[0] (or ARGOCD_BINARY_NAME) picks
#                                    argocd-application-controller or argocd-repo-server
#   <dir>/crds/application-crd.yaml  and appproject-crd.yaml
#   <dir>/bin/git-verify-wrapper.sh  and gpg-wrapper.sh: the repo server runs them (Argo
#                                    CD's image puts them on PATH)
#
# Version: github.com/argoproj/argo-cd/v3 v3.6.1, which needs Go 1.27: GOTOOLCHAIN=go1.27.3,
# which the go command fetches from the module proxy like a module. Built inside the
# module's own source, so its go.mod's replace directives hold (they pin k8s.io to one
# release and point github.com/argoproj/argo-cd/gitops-engine/v3 at ./gitops-engine, which
# is a module of its own, downloaded beside it). The main package is a small one of this
# script's, with only the two components the e2e test runs: the upstream main also links the
# API server, the CLI, Dex, notifications and ApplicationSets, which nothing here uses.
#
# Redis, which both components need, is Debian's redis-server: installed here when it is
# missing, on a Debian machine as root (saying so); elsewhere this stops and says what to
# install.
#
# Environment:
#   MODELPOOL_ARGOCD_VERSION  the module version (default v3.6.1)
#   MODELPOOL_CACHE           cache root (default ~/.cache/modelpool)
set -euo pipefail

VERSION="${MODELPOOL_ARGOCD_VERSION:-v3.6.1}"
CACHE="${MODELPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelpool}"
DIR="$CACHE/argocd/$VERSION"
WORK="$CACHE/argocd/work"
BIN="$DIR/argocd"

export CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" GOWORK=off GOTOOLCHAIN=go1.27.3

log() { printf '[argocd-build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if ! command -v redis-server >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    log "redis-server is missing: installing Debian's package redis-server"
    apt_log="$(mktemp)"
    if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive NEEDRESTART_MODE=l \
        apt-get install -y -q --no-install-recommends redis-server; } >"$apt_log" 2>&1; then
      cat "$apt_log" >&2; log "apt-get install redis-server failed"; exit 1
    fi
    rm -f "$apt_log"
    # The package starts a system-wide server; the test starts one of its own.
    systemctl disable --now redis-server >/dev/null 2>&1 || service redis-server stop >/dev/null 2>&1 || true
  else
    log "Argo CD needs Redis: install redis-server (Debian: apt-get install redis-server)"
    exit 1
  fi
fi

if [[ -x $BIN && -f $DIR/crds/application-crd.yaml && -x $DIR/bin/git-verify-wrapper.sh ]]; then
  log "cache warm: $DIR"
  echo "$DIR"
  exit 0
fi
command -v go >/dev/null || { log "go is required to build Argo CD"; exit 1; }
mkdir -p "$DIR/crds" "$DIR/bin" "$WORK"
start=$SECONDS
download() {  # download MODULE@VERSION: prints its directory in the module cache
  (cd "$WORK" && go mod download -json "$1") | sed -n 's/.*"Dir": "\(.*\)".*/\1/p'
}
module_dir="$(download "github.com/argoproj/argo-cd/v3@$VERSION")"
[[ -d $module_dir ]] || { log "go mod download github.com/argoproj/argo-cd/v3@$VERSION failed"; exit 1; }
cp "$module_dir/manifests/crds/application-crd.yaml" "$module_dir/manifests/crds/appproject-crd.yaml" "$DIR/crds/"
cp "$module_dir/hack/git-verify-wrapper.sh" "$module_dir/hack/gpg-wrapper.sh" "$DIR/bin/"
chmod 0755 "$DIR/bin/"*
if [[ -x $BIN ]]; then
  log "binary cached; CRDs and scripts copied: $DIR"
  echo "$DIR"
  exit 0
fi
log "building argo-cd $VERSION (application controller and repo server; the first build downloads its modules and Go $GOTOOLCHAIN: several minutes)"
engine_dir="$(download "github.com/argoproj/argo-cd/gitops-engine/v3@$VERSION")"
[[ -d $engine_dir ]] || { log "go mod download github.com/argoproj/argo-cd/gitops-engine/v3@$VERSION failed"; exit 1; }
src="$WORK/argo-cd-$VERSION"
rm -rf "$src" && cp -R "$module_dir" "$src" && cp -R "$engine_dir" "$src/gitops-engine"
chmod -R u+w "$src"
mkdir -p "$src/cmd/modelpool-e2e"
cat >"$src/cmd/modelpool-e2e/main.go" <<'GO'
// The two Argo CD components modelpool's e2e test runs, chosen as upstream's main does.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	appcontroller "github.com/argoproj/argo-cd/v3/cmd/argocd-application-controller/commands"
	reposerver "github.com/argoproj/argo-cd/v3/cmd/argocd-repo-server/commands"
	"github.com/argoproj/argo-cd/v3/common"
)

func main() {
	name := filepath.Base(os.Args[0])
	if v := os.Getenv("ARGOCD_BINARY_NAME"); v != "" {
		name = v
	}
	var command *cobra.Command
	switch name {
	case common.CommandApplicationController:
		command = appcontroller.NewCommand()
	case common.CommandRepoServer:
		command = reposerver.NewCommand()
	default:
		fmt.Fprintf(os.Stderr, "set ARGOCD_BINARY_NAME to %s or %s\n",
			common.CommandApplicationController, common.CommandRepoServer)
		os.Exit(2)
	}
	if err := command.Execute(); err != nil {
		os.Exit(1)
	}
}
GO
(cd "$src" && go build -trimpath -ldflags "-s -w" -o "$BIN.tmp" ./cmd/modelpool-e2e)
mv "$BIN.tmp" "$BIN"
rm -rf "$src"
log "argo-cd built in $((SECONDS - start))s"
echo "$DIR"

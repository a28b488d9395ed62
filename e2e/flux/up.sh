#!/usr/bin/env bash
# Flux on the kind cluster of KUBECONFIG (e2e/kind/up.sh prints its kubeconfig), syncing
# modelpool from a git server in the cluster:
#
#   1. Flux's source-controller and kustomize-controller, built from the Go module proxy
#      (build.sh), in images on the project's base, side-loaded with `kind load`; their
#      CRDs, RBAC and Deployments from the same modules' config/, in namespace flux-system
#      (Pod Security `restricted`);
#   2. the git server (git_server.py: `git http-backend` over smart HTTP) at
#      http://git-server.flux-system.svc.cluster.local/modelpool.git;
#   3. this checkout pushed there as branch main: one commit of the working tree as it is
#      (tracked and untracked files, without what .gitignore excludes), so what is synced is
#      what is on disk; the checkout's own index and refs are not touched;
#   4. sync.yaml: a GitRepository and the Kustomizations `modelpool` (the base, through
#      overlays/kind) and `modelpool-examples` (overlays/examples-testbed), `wait: true`;
#      each reconciled at once and awaited until it applied the pushed commit and is Ready.
#
# Idempotent: a second run rebuilds nothing that is cached, pushes the working tree again
# (a new commit when it changed) and waits for Flux to apply it. Prints each stage's time,
# and the Kustomizations' names as its last line.
#
#   KUBECONFIG=$(e2e/kind/up.sh | tail -n 1) e2e/flux/up.sh
#
# Environment:
#   KIND_CLUSTER_NAME  the kind cluster to load images into (default modelpool)
#   MODELPOOL_CACHE    cache root (default ~/.cache/modelpool)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
kind_dir="$root/e2e/kind"
cluster="${KIND_CLUSTER_NAME:-modelpool}"
NAMESPACE=flux-system
KUSTOMIZATIONS=(modelpool modelpool-examples)
GIT_SERVER_IMAGE=modelpool/git-server:e2e

log() { printf '[flux-up %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
stage_start=$SECONDS
stage() { log "stage done in $((SECONDS - stage_start))s: $1"; stage_start=$SECONDS; }

[[ -n ${KUBECONFIG:-} ]] || { log "KUBECONFIG must name the cluster (e2e/kind/up.sh prints it)"; exit 1; }
export KUBECONFIG

dir="$(bash "$here/build.sh" | tail -n 1)"
version="$(basename "$dir")"
stage "controllers $version built"

# --- images ----------------------------------------------------------------------------
base="$(bash "$kind_dir/base-image.sh" | tail -n 1)"
build_image() {  # build_image TAG CONTEXT: quiet unless it fails
  DOCKER_BUILDKIT=0 docker build -q -t "$1" "$2" >/dev/null 2>&1 || {
    DOCKER_BUILDKIT=0 docker build -t "$1" "$2" >&2; exit 1; }
}
images=()
for c in source-controller kustomize-controller; do
  ctx="$(mktemp -d)"
  cp "$dir/bin/$c" "$ctx/$c"
  cat >"$ctx/Dockerfile" <<DOCKERFILE
FROM $base
COPY $c /usr/local/bin/$c
USER 65534:65534
ENTRYPOINT ["/usr/local/bin/$c"]
DOCKERFILE
  build_image "modelpool/flux-$c:$version" "$ctx"
  rm -rf "$ctx"
  images+=("modelpool/flux-$c:$version")
done
ctx="$(mktemp -d)"
cp "$here/git_server.py" "$ctx/git_server.py"
cat >"$ctx/Dockerfile" <<DOCKERFILE
FROM $base
USER 0:0
RUN command -v git >/dev/null || { apt-get update -q && apt-get install -y -q --no-install-recommends git \\
 && rm -rf /var/lib/apt/lists/*; }
COPY git_server.py /app/git_server.py
USER 65534:65534
ENTRYPOINT ["python3", "/app/git_server.py"]
DOCKERFILE
build_image "$GIT_SERVER_IMAGE" "$ctx"
rm -rf "$ctx"
images+=("$GIT_SERVER_IMAGE")
load_log="$(mktemp)"
bash "$kind_dir/kind.sh" load docker-image --name "$cluster" "${images[@]}" >"$load_log" 2>&1 || {
  cat "$load_log" >&2; exit 1; }
rm -f "$load_log"
stage "images built on $base and loaded: ${images[*]}"

# --- Flux and the git server -------------------------------------------------------------
install="$dir/install"
mkdir -p "$install"
cat >"$install/kustomization.yaml" <<EOF
# written by e2e/flux/up.sh: the controllers' own config/, in $NAMESPACE, on images built here
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: $NAMESPACE
resources:
- ../config/source-controller/crd
- ../config/source-controller/rbac
- ../config/source-controller/manager
- ../config/kustomize-controller/crd
- ../config/kustomize-controller/rbac
- ../config/kustomize-controller/manager
images:
- name: fluxcd/source-controller
  newName: modelpool/flux-source-controller
  newTag: $version
- name: fluxcd/kustomize-controller
  newName: modelpool/flux-kustomize-controller
  newTag: $version
EOF
kubectl apply -f "$here/namespace.yaml" >/dev/null
kubectl apply --server-side --force-conflicts -k "$install" >/dev/null
bash "$here/../crds-established.sh" \
  gitrepositories.source.toolkit.fluxcd.io kustomizations.kustomize.toolkit.fluxcd.io
kubectl apply -f "$here/git-server.yaml" >/dev/null
for c in source-controller kustomize-controller; do
  bash "$kind_dir/roll-to-image.sh" "deployment/$c" "$NAMESPACE" "modelpool/flux-$c:$version"
done
bash "$kind_dir/roll-to-image.sh" deployment/git-server "$NAMESPACE" "$GIT_SERVER_IMAGE"
for d in source-controller kustomize-controller git-server; do
  kubectl -n "$NAMESPACE" rollout status "deployment/$d" --timeout=180s >/dev/null
done
stage "Flux's controllers and the git server running in $NAMESPACE"

# --- the checkout, pushed ----------------------------------------------------------------
index="$(mktemp)"
cleanup() { rm -f "$index"; [[ -z ${forward:-} ]] || kill "$forward" 2>/dev/null || true; }
trap cleanup EXIT
git_() {
  GIT_INDEX_FILE="$index" GIT_AUTHOR_NAME=modelpool GIT_AUTHOR_EMAIL=e2e@modelpool.invalid \
    GIT_COMMITTER_NAME=modelpool GIT_COMMITTER_EMAIL=e2e@modelpool.invalid git -C "$root" "$@"
}
rm -f "$index"
git_ add -A .
tree="$(git_ write-tree)"
head="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo none)"
commit="$(git_ commit-tree "$tree" -m "modelpool: the working tree of $head")"
# The push goes through a port-forward to the Service: it needs no route to the pods.
forward_log="$(mktemp)"
kubectl -n "$NAMESPACE" port-forward service/git-server :80 >"$forward_log" 2>&1 &
forward=$!
port=""
for _ in $(seq 1 100); do
  port="$(sed -n 's/^Forwarding from 127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$forward_log" | sed -n 1p)"
  [[ -n $port ]] && break
  kill -0 "$forward" 2>/dev/null || break
  sleep 0.1
done
[[ -n $port ]] || { log "kubectl port-forward to the git server failed: $(cat "$forward_log")"; exit 1; }
git -C "$root" push -q --force "http://127.0.0.1:$port/modelpool.git" "$commit:refs/heads/main"
kill "$forward" && wait "$forward" 2>/dev/null || true
forward=""
rm -f "$forward_log"
revision="main@sha1:$commit"
stage "the working tree pushed: $revision"

# --- sync --------------------------------------------------------------------------------
kubectl apply -f "$here/sync.yaml" >/dev/null
requested="$(date +%s.%N)"
kubectl -n "$NAMESPACE" annotate --overwrite gitrepository/modelpool \
  "${KUSTOMIZATIONS[@]/#/kustomization/}" "reconcile.fluxcd.io/requestedAt=$requested" >/dev/null
explain() {  # what Flux says about OBJECT, for a wait that failed
  log "$1 did not get there: $(kubectl -n "$NAMESPACE" get "$1" \
    -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}')"
  exit 1
}
# A first fetch can fail (seen once: "repository not found" before any request reached the
# git server, just after the cluster came up), and source-controller then backs off for
# minutes; asking again every 15 s keeps the wait to what the fetch itself takes.
fetched=""
for _ in $(seq 1 8); do
  if kubectl -n "$NAMESPACE" wait gitrepository/modelpool --timeout=15s \
      --for=jsonpath='{.status.artifact.revision}'="$revision" >/dev/null 2>&1; then
    fetched=1 && break
  fi
  log "gitrepository/modelpool not at $revision yet: $(kubectl -n "$NAMESPACE" get gitrepository/modelpool \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].message}'); asking again"
  kubectl -n "$NAMESPACE" annotate --overwrite gitrepository/modelpool \
    "reconcile.fluxcd.io/requestedAt=$(date +%s.%N)" >/dev/null
done
[[ -n $fetched ]] || explain gitrepository/modelpool
for k in "${KUSTOMIZATIONS[@]}"; do
  kubectl -n "$NAMESPACE" wait "kustomization/$k" --timeout=360s \
    --for=jsonpath='{.status.lastAppliedRevision}'="$revision" >/dev/null || explain "kustomization/$k"
  kubectl -n "$NAMESPACE" wait "kustomization/$k" --timeout=60s --for=condition=Ready >/dev/null \
    || explain "kustomization/$k"
done
stage "Kustomizations Ready at $revision: ${KUSTOMIZATIONS[*]}"

echo "${KUSTOMIZATIONS[*]}"

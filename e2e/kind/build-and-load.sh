#!/usr/bin/env bash
# Builds the images the kind cluster runs and side-loads them into it (`kind load
# docker-image`), so no pod ever pulls them:
#
#   ghcr.io/modelpool/modelpool   the product's image (scripts/images, the Dockerfile at the
#       top of the checkout), at the version of pyproject.toml: what manifests/ names; also
#       tagged modelpool/reconciler and modelpool/router, at that version and `e2e` (what the
#       e2e suite names)
#   modelpool/fake-model          the fake model server (e2e/kind/Dockerfile.python), at the
#                                 version and `e2e`
#   modelpool/fake-gpu-plugin                                     the device plugin
#
# Dependencies are wheels built on this machine (pip reaches PyPI; a container may not),
# the device plugin's gRPC stubs are generated from the kubelet module's api.proto with
# grpcio-tools, both cached by their inputs. The base is python:3.11-slim where it can be
# pulled, else the Debian root that build-images.sh builds offline.
#
#   e2e/kind/build-and-load.sh [CLUSTER]      (default: KIND_CLUSTER_NAME, else modelpool)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cluster="${1:-${KIND_CLUSTER_NAME:-modelpool}}"
CACHE="${MODELPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelpool}"
GRPC_VERSION=1.85.1
PROTOBUF_VERSION=7.36.2
KUBELET_MODULE="k8s.io/kubelet@v0.35.4"
python="$root/.venv/bin/python"
[[ -x $python ]] || python=python3
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/pyproject.toml" | sed -n 1p)"

log() { printf '[kind-images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# Two clusters come up side by side (e2e/stages.py): their images are built one at a time
# (the product's build writes dist/wheels in the checkout), then each loads its own.
mkdir -p "$CACHE/kind"
exec 8>"$CACHE/kind/build-images.lock"
flock 8

base="$(bash "$here/base-image.sh" | tail -n 1)"

# Wheels of the runtime dependencies, at the versions this checkout's venv runs.
requirements="$("$python" - <<'PY'
import importlib.metadata as md
names = ["kr8s", "aiohttp", "pyyaml", "jinja2", "prometheus-client", "uvloop", "httptools"]
print("\n".join(f"{n}=={md.version(n)}" for n in names))
PY
)"
requirements="$requirements
grpcio==$GRPC_VERSION
protobuf==$PROTOBUF_VERSION"
key="$(printf '%s' "$requirements" | sha256sum | cut -c1-16)"
wheels="$CACHE/kind/wheels-$key"
if [[ ! -f $wheels/requirements.txt ]]; then
  log "building wheels of the dependencies into $wheels"
  rm -rf "$wheels.tmp" && mkdir -p "$wheels.tmp"
  printf '%s\n' "$requirements" >"$wheels.tmp/reqs"
  "$python" -m pip wheel -q --disable-pip-version-check -w "$wheels.tmp" -r "$wheels.tmp/reqs"
  mv "$wheels.tmp/reqs" "$wheels.tmp/requirements.txt"
  rm -rf "$wheels" && mv "$wheels.tmp" "$wheels"
fi

# gRPC stubs of the device plugin API, from the kubelet module's proto.
stubs="$CACHE/kind/deviceplugin-stubs-kubelet-${KUBELET_MODULE#*@}-grpcio-$GRPC_VERSION"
if [[ ! -f $stubs/api_pb2_grpc.py ]]; then
  tools="$CACHE/kind/grpcio-tools-$GRPC_VERSION"
  if [[ ! -x $tools/bin/python ]]; then
    log "installing grpcio-tools $GRPC_VERSION into $tools"
    python3 -m venv "$tools"
    "$tools/bin/pip" install -q --disable-pip-version-check "grpcio-tools==$GRPC_VERSION"
  fi
  proto_dir="$(cd "$CACHE/kind/work" 2>/dev/null || cd /tmp; GOFLAGS= go mod download -json "$KUBELET_MODULE" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')/pkg/apis/deviceplugin/v1beta1"
  mkdir -p "$stubs.tmp"
  "$tools/bin/python" -m grpc_tools.protoc -I "$proto_dir" --python_out="$stubs.tmp" \
    --grpc_python_out="$stubs.tmp" "$proto_dir/api.proto"
  rm -rf "$stubs" && mv "$stubs.tmp" "$stubs"
fi

# build NAME PROGRAM SOURCES...: one image, tagged with the version and `e2e`.
build() {
  local name="$1" program="$2"; shift 2
  local ctx
  ctx="$(mktemp -d)"
  mkdir -p "$ctx/app" "$ctx/stubs"
  cp -R "$wheels" "$ctx/wheels"
  local s
  for s in "$@"; do
    mkdir -p "$ctx/app/$(dirname "$s")"
    cp -R "$root/$s" "$ctx/app/$s"
  done
  find "$ctx/app" -name __pycache__ -prune -exec rm -rf {} +
  if [[ $program == e2e.device_plugin ]]; then cp "$stubs"/*.py "$ctx/stubs/"; fi
  if [[ $program == e2e.fake_model ]]; then cp "$here/fake-model/llama-server" "$ctx/app/"; fi
  cp "$here/Dockerfile.python" "$ctx/Dockerfile"
  local args=(--build-arg "BASE=$base" --build-arg "PROGRAM=$program"
              -t "modelpool/$name:$version" -t "modelpool/$name:e2e" "$ctx")
  DOCKER_BUILDKIT=0 docker build -q "${args[@]}" >/dev/null 2>&1 || {
    DOCKER_BUILDKIT=0 docker build "${args[@]}" >&2; exit 1; }
  rm -rf "$ctx"
  log "modelpool/$name:$version (and :e2e) built on $base"
}

# The product's image, as a release builds it; its wheels from this machine where the
# build's containers reach no package index (the offline Debian root). Labelled with the last
# commit that changed what it holds, not HEAD: a commit that changed only tests or docs
# leaves the image as it was, and no node is sent its 400 MB again.
build_product() {
  local options=(--base "$base" --context-revision) built
  [[ $base == modelpool/debian-root:* ]] && options+=(--host-wheels)
  built="$(bash "$root/scripts/images" "${options[@]}" | sed -n 1p)"
  local name
  for name in reconciler router; do
    docker tag "$built" "modelpool/$name:$version"
    docker tag "$built" "modelpool/$name:e2e"
  done
  product_image="$built"
  log "$built (and modelpool/reconciler, modelpool/router at $version and e2e) built on $base"
}
build_product
build fake-model e2e.fake_model e2e/__init__.py e2e/fake_model
build fake-gpu-plugin e2e.device_plugin e2e/__init__.py e2e/device_plugin

# modelpool/llama-server: the real llama-server (e2e/llama/build-llama-server.sh) at
# /app/llama-server, where llama.cpp's server image keeps it, and generated models in
# /models: alpha-large.gguf (271 MB, about 50 tokens/s here: a generation lasts long
# enough to be seen), beta.gguf and gemma.gguf (half a megabyte each; gemma is the member
# of examples/testbed). On the local testbed e2e/llama/serve.py stands for this image.
build_llama_server() {
  local binary ctx
  binary="$(bash "$root/e2e/llama/build-llama-server.sh" | tail -n 1)"
  ctx="$(mktemp -d)"
  mkdir -p "$ctx/models" "$ctx/py/e2e/fake_model" "$ctx/py/e2e/llama"
  cp "$binary" "$ctx/llama-server.bin"
  # /app/llama-server: the binary, charged first to a shared fake GPU's memory ledger when
  # the device plugin's shared mode gave the container MODELPOOL_GPU_MEMORY
  # (e2e/llama/charged.py, which needs only these files and the base's python3).
  cp "$root/e2e/__init__.py" "$ctx/py/e2e/"
  cp "$root/e2e/fake_model/"{__init__,gpu_lock,gpu_ledger}.py "$ctx/py/e2e/fake_model/"
  cp "$root/e2e/llama/"{__init__,charged}.py "$ctx/py/e2e/llama/"
  cat >"$ctx/llama-server" <<'WRAPPER'
#!/bin/sh
[ -n "${MODELPOOL_GPU_MEMORY:-}" ] || exec /app/llama-server.bin "$@"
PYTHONPATH=/app/py exec python3 -m e2e.llama.charged /app/llama-server.bin "$@"
WRAPPER
  chmod 755 "$ctx/llama-server"
  "$python" -m e2e.llama.models "$CACHE/llama/models" alpha --size large >/dev/null
  "$python" -m e2e.llama.models "$CACHE/llama/models" beta >/dev/null
  "$python" -m e2e.llama.models "$CACHE/llama/models" gemma >/dev/null
  cp "$CACHE/llama/models/"{alpha-large,beta,gemma}.gguf "$ctx/models/"
  local gomp="RUN apt-get update -q && apt-get install -y -q libgomp1 && rm -rf /var/lib/apt/lists/*"
  [[ $base == modelpool/debian-root:* ]] && gomp="# libgomp1 is in the Debian root"
  cat >"$ctx/Dockerfile" <<DOCKERFILE
FROM $base
$gomp
COPY llama-server llama-server.bin /app/
COPY py/ /app/py/
COPY models/ /models/
USER 1000:1000
ENTRYPOINT ["/app/llama-server"]
DOCKERFILE
  local args=(-t "modelpool/llama-server:$version" -t "modelpool/llama-server:e2e" "$ctx")
  DOCKER_BUILDKIT=0 docker build -q "${args[@]}" >/dev/null 2>&1 || {
    DOCKER_BUILDKIT=0 docker build "${args[@]}" >&2; exit 1; }
  rm -rf "$ctx"
  log "modelpool/llama-server:$version (and :e2e) built on $base"
}
build_llama_server

# modelpool/kube-router: kube-router (build-tools.sh) with the iptables and ipset it drives,
# from Debian; the NetworkPolicy firewall of the kind testbed (kube-router.yaml).
KUBE_ROUTER_IMAGE=modelpool/kube-router:v2.1.0
build_kube_router() {
  local ctx tools
  tools="$(bash "$here/build-tools.sh" | tail -n 1)"
  ctx="$(mktemp -d)"
  cp "$tools/kube-router" "$ctx/kube-router"
  cat >"$ctx/Dockerfile" <<DOCKERFILE
FROM $base
USER 0:0
RUN apt-get update -q && apt-get install -y -q --no-install-recommends iptables ipset \\
 && rm -rf /var/lib/apt/lists/*
COPY kube-router /usr/local/bin/kube-router
ENTRYPOINT ["/usr/local/bin/kube-router"]
DOCKERFILE
  DOCKER_BUILDKIT=0 docker build -q -t "$KUBE_ROUTER_IMAGE" "$ctx" >/dev/null 2>&1 || {
    DOCKER_BUILDKIT=0 docker build -t "$KUBE_ROUTER_IMAGE" "$ctx" >&2; exit 1; }
  rm -rf "$ctx"
  log "$KUBE_ROUTER_IMAGE built on $base"
}
build_kube_router

flock -u 8
exec 8>&-

# One load per image, each with all its tags: `kind load` saves every image it is given
# whenever one of them is missing from a node, so a load of them all would copy the
# unchanged llama-server and kube-router images to every node each time the product changes.
# An image every node already holds (same ID) is skipped by kind itself.
load() {
  local said
  said="$(bash "$here/kind.sh" load docker-image --name "$cluster" "$@" 2>&1 >/dev/null)" || {
    printf '%s\n' "$said" >&2; return 1; }
  printf '%s\n' "$said" | grep -v "found to be already present" >&2 || true
}
load "$product_image" "modelpool/reconciler:$version" "modelpool/reconciler:e2e" \
  "modelpool/router:$version" "modelpool/router:e2e"
for name in fake-model fake-gpu-plugin llama-server; do
  load "modelpool/$name:$version" "modelpool/$name:e2e"
done
load "$KUBE_ROUTER_IMAGE"
log "images loaded into kind cluster $cluster"

# `kind load` leaves each image it imports under a name of its own too (import-<date>@digest),
# which keeps an earlier build's layers after its tags moved on: some 400 MB a node for each
# change of the product, 5 GB a node after a day of runs. Those names go; an image still
# tagged keeps its tag, and containerd frees only what nothing else references.
for node in $(bash "$here/kind.sh" get nodes --name "$cluster"); do
  docker exec "$node" sh -c \
    'ctr -n k8s.io images ls -q | grep "^import-" | xargs -r ctr -n k8s.io images rm --sync' \
    >/dev/null 2>&1 || log "$node: could not remove the import names (kept)"
done

#!/usr/bin/env bash
# A kind cluster for the fake GPUs' Dynamic Resource Allocation driver (e2e/dra_driver),
# apart from the main one (up.sh): one node, kind's control plane, labelled with two fake
# GPUs of 1024 MiB each, on a node image whose containerd injects CDI devices
# (build-images.sh with MODELPOOL_KIND_CONTAINERD, default v2.3.4: Debian's containerd 1.6
# has no CDI), flannel, the fake model server's image (and the real llama-server's, where
# build-and-load.sh built it) side-loaded, and the driver's DaemonSet and DeviceClass
# (fake-gpu-dra.yaml), waited for until the node's ResourceSlice is published; then
# modelpool itself from overlays/kind, on the project's images (build-and-load.sh), so a
# pool can share a device through a claim. Its pod and Service ranges differ from the main
# cluster's, so the routes it adds on this machine (as root: tests reach pods by address)
# do not cross the main cluster's. Idempotent.
# Prints each stage's time, and the kubeconfig path as its last line.
#
#   MODELPOOL_KIND_KUBECONFIG=$(e2e/kind/up-dra.sh | tail -n 1) MODELPOOL_KIND_DRA=1 \
#     .venv/bin/pytest e2e/kind_tests/test_dra_driver.py
#   KIND_CLUSTER_NAME=modelpool-dra e2e/kind/down.sh
#
# Environment: KIND_CLUSTER_NAME (default modelpool-dra), MODELPOOL_KIND_KUBECONFIG,
# MODELPOOL_KIND_CONTAINERD (default v2.3.4), MODELPOOL_KIND_NODE_IMAGE (a node image to use
# as it is; it must carry a containerd with CDI).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cluster="${KIND_CLUSTER_NAME:-modelpool-dra}"
CACHE="${MODELPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelpool}"
kubeconfig="${MODELPOOL_KIND_KUBECONFIG:-$CACHE/kind/$cluster.kubeconfig}"
export MODELPOOL_KIND_CONTAINERD="${MODELPOOL_KIND_CONTAINERD:-v2.3.4}"
POD_SUBNET=10.246.0.0/16
SERVICE_SUBNET=10.95.0.0/16
DRIVER_IMAGE=modelpool/fake-gpu-dra:e2e

log() { printf '[kind-dra %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
stage_start=$SECONDS
stage() { log "stage done in $((SECONDS - stage_start))s: $1"; stage_start=$SECONDS; }

bash "$here/docker-engine.sh"
TOOLS="$(bash "$here/build-tools.sh" | tail -n 1)"
export PATH="$TOOLS:$PATH"
kubectl_() { kubectl --kubeconfig "$kubeconfig" "$@"; }
node_image="${MODELPOOL_KIND_NODE_IMAGE:-$(bash "$here/build-images.sh" | tail -n 1)}"
stage "node image $node_image"

if docker run --rm --privileged --user 0:0 --entrypoint /bin/true "$node_image" >/dev/null 2>&1; then
  export MODELPOOL_KIND_UNPRIVILEGED=0
else
  log "docker run --privileged fails here (no CAP_SYS_RESOURCE?): kind runs its nodes without it"
  export MODELPOOL_KIND_UNPRIVILEGED=1
fi
kind_() { bash "$here/kind.sh" "$@"; }
cgroup_patch=""
if [[ "$(stat -fc %T /sys/fs/cgroup)" != cgroup2fs ]]; then
  cgroup_patch='
kubeadmConfigPatches:
- |
  kind: KubeletConfiguration
  failCgroupV1: false'
fi
config="$CACHE/kind/$cluster.config.yaml"
mkdir -p "$(dirname "$config")" "$(dirname "$kubeconfig")"
cat >"$config" <<EOF
# written by e2e/kind/up-dra.sh
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
networking:
  disableDefaultCNI: true
  podSubnet: $POD_SUBNET
  serviceSubnet: $SERVICE_SUBNET
nodes:
- role: control-plane
  labels:
    modelpool.dev/fake-gpus: "2"
    modelpool.dev/fake-gpu-memory-mib: "1024"$cgroup_patch
EOF
# read whole before it is searched (a grep -q that stops early sends kind SIGPIPE)
clusters="$(kind_ get clusters 2>/dev/null || true)"
if ! grep -qx "$cluster" <<<"$clusters"; then
  kind_ create cluster --name "$cluster" --config "$config" \
    --image "$node_image" --kubeconfig "$kubeconfig" --wait 0s
fi
kind_ get kubeconfig --name "$cluster" >"$kubeconfig"
stage "kind create cluster"

flannel_image="$(docker exec "$cluster-control-plane" ctr -n k8s.io images ls -q | grep 'modelpool/flannel:' | sed -n 1p)"
sed -e "s#IMAGE#$flannel_image#" -e "s#10.244.0.0/16#$POD_SUBNET#" "$here/flannel.yaml" \
  | kubectl_ apply -f - >/dev/null
kubectl_ wait --for=condition=Ready node --all --timeout=180s >/dev/null
kubectl_ -n kube-system rollout status deployment/coredns --timeout=180s >/dev/null
stage "node Ready, CoreDNS up (containerd $(docker exec "$cluster-control-plane" containerd --version | awk '{print $3}'))"

# The driver: a static binary in a tiny root, rebuilt when its source changes.
key="$(cat "$root"/e2e/dra_driver/*.go "$root"/e2e/dra_driver/go.* | sha256sum | cut -c1-16)"
bin="$CACHE/kind/fake-gpu-dra-$key"
if [[ ! -x $bin/fake-gpu-dra ]]; then
  log "building the DRA driver"
  mkdir -p "$bin.tmp"
  (cd "$root/e2e/dra_driver" && CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN="${GOTOOLCHAIN:-local}" \
    go build -trimpath -ldflags "-s -w" -o "$bin.tmp/fake-gpu-dra" . >&2)
  rm -rf "$bin" && mv "$bin.tmp" "$bin"
fi
if ! docker image inspect "${DRIVER_IMAGE%:*}:$key" >/dev/null 2>&1; then
  dir="$CACHE/kind/work/fake-gpu-dra-root"
  rm -rf "$dir" && mkdir -p "$dir/usr/local/bin" "$dir/tmp" && chmod 1777 "$dir/tmp"
  cp "$bin/fake-gpu-dra" "$dir/usr/local/bin/"
  tar -C "$dir" -c . | docker import \
    --change 'ENTRYPOINT ["/usr/local/bin/fake-gpu-dra"]' - "${DRIVER_IMAGE%:*}:$key" >/dev/null
  rm -rf "$dir"
fi
docker tag "${DRIVER_IMAGE%:*}:$key" "$DRIVER_IMAGE"
kind_ load docker-image --name "$cluster" "$DRIVER_IMAGE" >/dev/null
bash "$here/build-and-load.sh" "$cluster"
stage "images loaded ($DRIVER_IMAGE, the project's)"

kubectl_ apply -f "$here/fake-gpu-dra.yaml" >/dev/null
KUBECONFIG="$kubeconfig" bash "$here/roll-to-image.sh" daemonset/modelpool-fake-gpu-dra kube-system "$DRIVER_IMAGE"
kubectl_ -n kube-system rollout status daemonset/modelpool-fake-gpu-dra --timeout=180s >/dev/null
for _ in $(seq 1 120); do
  published="$(kubectl_ get resourceslices --field-selector spec.driver=gpu.fake.modelpool.dev \
    -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | sort -u | wc -l)"
  [[ $published -ge 1 ]] && break
  sleep 0.5
done
[[ $published -ge 1 ]] || { log "the DRA driver published no ResourceSlice"; exit 1; }
stage "DRA driver publishing"

node="$cluster-control-plane"
address="$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$node")"
cidr="$(kubectl_ get node "$node" -o jsonpath='{.spec.podCIDR}')"
if [[ $(id -u) -eq 0 ]]; then
  ip route replace "$cidr" via "$address"
else
  log "as root, this would add: ip route replace $cidr via $address (tests reach pods by address)"
fi
kubectl_ apply --server-side --force-conflicts -k "$root/overlays/kind" >/dev/null
KUBECONFIG="$kubeconfig" bash "$here/../crds-established.sh" \
  modelservers.modelpool.dev modelpools.modelpool.dev modelrouters.modelpool.dev
KUBECONFIG="$kubeconfig" bash "$here/roll-to-image.sh" deployment/modelpool-reconciler \
  modelpool-system modelpool/reconciler:0.1.0
kubectl_ -n modelpool-system rollout status deployment/modelpool-reconciler --timeout=180s >/dev/null
stage "modelpool installed from overlays/kind, a route to the node's pods"

echo "$kubeconfig"

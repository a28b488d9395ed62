#!/usr/bin/env bash
# A kind cluster for the e2e tier, offline if need be: one control-plane node and two worker
# nodes whose fake GPU device plugin advertises 1 and 2 `nvidia.com/gpu`, pod networking
# across nodes by flannel (host-gw), NetworkPolicies enforced by kube-router, CoreDNS, the
# project's images side-loaded, modelpool
# installed from overlays/kind. Idempotent: an existing cluster of this name is reused.
# Prints each stage's time, and the kubeconfig path as its last line.
#
# Environment:
#   KIND_CLUSTER_NAME          cluster name (default modelpool)
#   MODELPOOL_KIND_KUBECONFIG  where to write the kubeconfig (default: in the cache)
#   MODELPOOL_KIND_NODE_IMAGE  a node image to use as it is (skips the pull and the build)
#   MODELPOOL_KIND_CONTAINERD  a built node image's containerd (build-images.sh; unset:
#                              Debian's). The DRA cluster (up-dra.sh) sets it.
#   MODELPOOL_KIND_POD_SUBNET, MODELPOOL_KIND_SERVICE_SUBNET
#                              the pod and Service ranges (default 10.244.0.0/16 and
#                              10.96.0.0/16): a second cluster beside the first needs others,
#                              since this machine routes to both (up-second.sh)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cluster="${KIND_CLUSTER_NAME:-modelpool}"
CACHE="${MODELPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelpool}"
kubeconfig="${MODELPOOL_KIND_KUBECONFIG:-$CACHE/kind/$cluster.kubeconfig}"
K8S_VERSION="${MODELPOOL_K8S_VERSION:-v1.35.4}"
OFFICIAL_NODE="kindest/node:$K8S_VERSION"
POD_SUBNET="${MODELPOOL_KIND_POD_SUBNET:-10.244.0.0/16}"
SERVICE_SUBNET="${MODELPOOL_KIND_SERVICE_SUBNET:-10.96.0.0/16}"

log() { printf '[kind-up %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
stage_start=$SECONDS
stage() { log "stage done in $((SECONDS - stage_start))s: $1"; stage_start=$SECONDS; }

bash "$here/docker-engine.sh"
stage "docker engine"
TOOLS="$(bash "$here/build-tools.sh" | tail -n 1)"
export PATH="$TOOLS:$PATH"
stage "tools (kind, kubelet, kubeadm, CNI, flannel, CoreDNS)"
kubectl_() { kubectl --kubeconfig "$kubeconfig" "$@"; }

# The node image: given, else kind's official one where it can be pulled, else built here.
cni=flannel
node_image="${MODELPOOL_KIND_NODE_IMAGE:-}"
if [[ -z $node_image ]]; then
  if docker image inspect "$OFFICIAL_NODE" >/dev/null 2>&1 || timeout 60 docker pull -q "$OFFICIAL_NODE" >/dev/null 2>&1; then
    node_image="$OFFICIAL_NODE"
    cni=kindnet  # the official image carries kind's own CNI
    log "using kind's node image $node_image"
  else
    log "$OFFICIAL_NODE cannot be pulled here: building a node image offline"
    node_image="$(bash "$here/build-images.sh" | tail -n 1)"
  fi
fi
stage "node image $node_image"

# Host accommodations, each only where its probe says so.
# 1. kind runs its nodes with --privileged; where runc cannot apply the full capability set
#    (a host without CAP_SYS_RESOURCE), kind.sh gives kind a docker that asks for everything
#    else instead.
if docker run --rm --privileged --user 0:0 --entrypoint /bin/true "$node_image" >/dev/null 2>&1; then
  export MODELPOOL_KIND_UNPRIVILEGED=0
else
  log "docker run --privileged fails here (no CAP_SYS_RESOURCE?): kind runs its nodes without it"
  export MODELPOOL_KIND_UNPRIVILEGED=1
fi
kind_() { bash "$here/kind.sh" "$@"; }
# 2. Each node's kubelet, containerd and systemd take inotify instances: two clusters of three
#    nodes pass the kernel's default of 128 per user, and a kubelet that gets none fails
#    ("too many open files"). Raised as root where it is lower than kind's advice.
if (($(cat /proc/sys/fs/inotify/max_user_instances) < 512)) && [[ $(id -u) -eq 0 ]]; then
  log "fs.inotify.max_user_instances $(cat /proc/sys/fs/inotify/max_user_instances) -> 512"
  sysctl -qw fs.inotify.max_user_instances=512 || log "could not raise it (kept as it is)"
fi
# 3. kubelet 1.35 refuses cgroup v1 unless told otherwise.
# 4. kubelet 1.35 re-verifies, by pulling it again, an image it once pulled from a registry
#    when a pod names it under a name it did not pull it by (KEP-2535, beta). The test that
#    installs from a registry pulls the product's build under `localhost:PORT/...`, the same
#    image as the one `kind load` side-loads as ghcr.io/modelpool/modelpool: after it, a pod
#    of the side-loaded name on that node tried to pull from ghcr.io (offline) and stayed in
#    ImagePullBackOff. On this testbed every image is side-loaded on purpose: the kubelets
#    use any image their node holds, as before 1.35.
KUBELET_POLICY="imagePullCredentialsVerificationPolicy: NeverVerify"
kubelet_patch="
kubeadmConfigPatches:
- |
  kind: KubeletConfiguration
  $KUBELET_POLICY"
if [[ "$(stat -fc %T /sys/fs/cgroup)" != cgroup2fs ]]; then
  log "cgroup v1 host: the kubelets run with failCgroupV1: false"
  kubelet_patch+="
  failCgroupV1: false"
fi

config="$CACHE/kind/$cluster.config.yaml"
CERTS_D=/etc/containerd/certs.d
mkdir -p "$(dirname "$config")" "$(dirname "$kubeconfig")"
cat >"$config" <<EOF
# written by e2e/kind/up.sh
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
containerdConfigPatches:
- |-
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$CERTS_D"
networking:
  disableDefaultCNI: $([[ $cni == flannel ]] && echo true || echo false)
  podSubnet: $POD_SUBNET
  serviceSubnet: $SERVICE_SUBNET
nodes:
- role: control-plane
- role: worker
  labels:
    modelpool.dev/fake-gpus: "1"
- role: worker
  labels:
    modelpool.dev/fake-gpus: "2"$kubelet_patch
EOF

# An existing cluster is reused once its API server answers again: after dockerd restarts,
# kind's node containers come back (maybe at other addresses) and their control plane takes
# a while. One that does not answer within the wait is deleted and created afresh.
reuse() {
  local node
  log "kind cluster $cluster exists; reusing it"
  for node in $(kind_ get nodes --name "$cluster"); do
    [[ $(docker inspect -f '{{.State.Running}}' "$node") == true ]] || docker start "$node" >/dev/null
  done
  kind_ get kubeconfig --name "$cluster" >"$kubeconfig"
  # Up to 5 min by the clock: with both clusters' nodes booting at once beside the tests,
  # their API servers answered after 109 s, each try taking several seconds.
  local began=$SECONDS next_say=$((SECONDS + 20))
  while ((SECONDS - began < 300)); do
    if kubectl_ get --raw /readyz --request-timeout=10s >/dev/null 2>&1; then
      return 0
    fi
    if ((SECONDS >= next_say)); then
      log "waiting for the reused cluster's API server ($((SECONDS - began))s of 300s)"
      next_say=$((SECONDS + 20))
    fi
    sleep 2
  done
  log "the API server of kind cluster $cluster did not answer in 300s: deleting the cluster"
  return 1
}
# The list is read whole before it is searched: kind writes a line per cluster, and a
# `grep -q` that ends at the first match leaves kind writing into a closed pipe (SIGPIPE),
# which pipefail would count as "no such cluster" once in a while.
exists() { local clusters; clusters="$(kind_ get clusters 2>/dev/null)" && grep -qx "$cluster" <<<"$clusters"; }
if exists && ! reuse; then
  kind_ delete cluster --name "$cluster" >/dev/null
fi
if ! exists; then
  kind_ create cluster --name "$cluster" --config "$config" \
    --image "$node_image" --kubeconfig "$kubeconfig" --wait 0s
fi
kind_ get kubeconfig --name "$cluster" >"$kubeconfig"
# Each node's containerd takes a registry's hosts from $CERTS_D (a directory per registry,
# as e2e/registry/ writes for the test that installs from pushed images). A cluster made
# before its config said so gets the line and a containerd restart, once; running
# containers outlive it.
for node in $(kind_ get nodes --name "$cluster"); do
  if ! docker exec "$node" grep -q "config_path *= *\"$CERTS_D\"" /etc/containerd/config.toml; then
    log "$node: containerd reads registry hosts from $CERTS_D (restarting containerd once)"
    docker exec "$node" sh -c "printf '\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"$CERTS_D\"\n' >>/etc/containerd/config.toml && systemctl restart containerd"
  fi
  # The same for the kubelet's image policy (4. above); the node turns Ready again below.
  if ! docker exec "$node" grep -qx "$KUBELET_POLICY" /var/lib/kubelet/config.yaml; then
    log "$node: the kubelet uses any image the node holds (restarting the kubelet once)"
    docker exec "$node" sh -c "echo '$KUBELET_POLICY' >>/var/lib/kubelet/config.yaml && systemctl restart kubelet"
  fi
done
stage "kind create cluster"

if [[ $cni == flannel ]]; then
  # the flannel image the node image carries (build-images.sh preloads it)
  preloaded="$(docker exec "$cluster-control-plane" ctr -n k8s.io images ls -q)"
  flannel_image="$(grep 'modelpool/flannel:' <<<"$preloaded" | sed -n 1p)"
  sed -e "s#IMAGE#$flannel_image#" -e "s#10.244.0.0/16#$POD_SUBNET#" "$here/flannel.yaml" \
    | kubectl_ apply -f - >/dev/null
fi
kubectl_ wait --for=condition=Ready node --all --timeout=180s >/dev/null
kubectl_ -n kube-system rollout status deployment/coredns --timeout=180s >/dev/null
# A reused cluster's pods may still carry the status of before its restart: every system pod
# must be Ready again (pods that are gone for good are replaced by their controllers).
for ns in kube-system kube-flannel; do
  kubectl_ -n "$ns" wait --for=condition=Ready pod --all --timeout=180s >/dev/null
done
stage "nodes Ready, CoreDNS up ($cni)"

# Pods are reached from this machine by their own addresses: a route to each node's pod
# range through the node's address on kind's bridge (needs root; else say how).
while read -r node cidr; do
  address="$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$node")"
  if [[ $(id -u) -eq 0 ]]; then
    ip route replace "$cidr" via "$address"
  else
    log "as root, this would add: ip route replace $cidr via $address (tests reach pods by address)"
  fi
done < <(kubectl_ get nodes -o jsonpath='{range .items[*]}{.metadata.name} {.spec.podCIDR}{"\n"}{end}')
# And Services by their cluster IPs, as a client in the cluster reaches them: through the
# control-plane node, whose kube-proxy picks an endpoint (and masquerades the reply's way).
service_cidr="$(kubectl_ -n kube-system get pod -l component=kube-apiserver \
  -o jsonpath='{.items[0].spec.containers[0].command}' \
  | grep -o 'service-cluster-ip-range=[0-9./]*' | cut -d= -f2)"
address="$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$cluster-control-plane")"
if [[ $(id -u) -eq 0 ]]; then
  ip route replace "$service_cidr" via "$address"
else
  log "as root, this would add: ip route replace $service_cidr via $address (tests reach Services by cluster IP)"
fi
stage "routes to the pod networks and the Services"

bash "$here/build-and-load.sh" "$cluster"
stage "project images built and loaded"

# A rebuilt image (same tag) restarts the pods that run it, and only then.
roll_to_image() { KUBECONFIG="$kubeconfig" bash "$here/roll-to-image.sh" "$@"; }
kubectl_ apply -f "$here/fake-gpu-plugin.yaml" >/dev/null
roll_to_image daemonset/modelpool-fake-gpu-plugin kube-system modelpool/fake-gpu-plugin:e2e
kubectl_ -n kube-system rollout status daemonset/modelpool-fake-gpu-plugin --timeout=180s >/dev/null
for node in $(kubectl_ get nodes -l modelpool.dev/fake-gpus -o name); do
  want="$(kubectl_ get "$node" -o jsonpath='{.metadata.labels.modelpool\.dev/fake-gpus}')"
  for _ in $(seq 1 120); do
    have="$(kubectl_ get "$node" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')"
    [[ $have == "$want" ]] && break
    sleep 0.5
  done
  [[ $have == "$want" ]] || { log "$node advertises ${have:-no} nvidia.com/gpu, not $want"; exit 1; }
done
stage "fake GPU device plugin registered on every GPU node"

kubectl_ apply -f "$here/kube-router.yaml" >/dev/null
roll_to_image daemonset/kube-router kube-system modelpool/kube-router:v2.1.0
kubectl_ -n kube-system rollout status daemonset/kube-router --timeout=180s >/dev/null
stage "NetworkPolicies enforced (kube-router, firewall only)"

# --force-conflicts: up.sh is this cluster's installer of record. A GitOps tool that synced
# the same objects before (Flux in e2e/kind_tests/test_flux.py) still owns their fields
# after it let go of them, and a changed manifest would conflict with it.
kubectl_ apply --server-side --force-conflicts -k "$root/overlays/kind" >/dev/null
KUBECONFIG="$kubeconfig" bash "$here/../crds-established.sh" \
  modelservers.modelpool.dev modelpools.modelpool.dev modelrouters.modelpool.dev
roll_to_image deployment/modelpool-reconciler modelpool-system modelpool/reconciler:0.1.0
kubectl_ -n modelpool-system rollout status deployment/modelpool-reconciler --timeout=180s >/dev/null
stage "modelpool installed from overlays/kind"

echo "$kubeconfig"

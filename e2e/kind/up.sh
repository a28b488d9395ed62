#!/usr/bin/env bash
# One command for a kind cluster ready for the e2e suite: creates the cluster (unless it
# exists), advertises a fake GPU on the worker, builds and side-loads the images, installs
# modelpool with `kubectl apply -k overlays/kind`, waits for the reconciler, and prints the
# kubeconfig path as its last line. Needs docker, kind and kubectl.
#
# Environment:
#   KIND_CLUSTER_NAME          cluster name (default modelpool)
#   KIND_NODE_IMAGE            kindest/node image (default: kind's own)
#   MODELPOOL_KIND_KUBECONFIG  where to write the kubeconfig
#                              (default ~/.kube/kind-$KIND_CLUSTER_NAME.yaml)
#   MODELPOOL_GPUS, MODELPOOL_IMAGE_TAG  passed on to the scripts below
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cluster="${KIND_CLUSTER_NAME:-modelpool}"
kubeconfig="${MODELPOOL_KIND_KUBECONFIG:-$HOME/.kube/kind-${cluster}.yaml}"

for tool in docker kind kubectl; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "$tool is required (see e2e/kind/README.md)" >&2
    exit 1
  fi
done

clusters="$(kind get clusters 2>/dev/null)"
if grep -qx "$cluster" <<<"$clusters"; then
  echo "kind cluster $cluster exists; reusing it"
else
  create=(kind create cluster --name "$cluster" --config "$here/cluster.yaml" --wait 180s)
  if [[ -n "${KIND_NODE_IMAGE:-}" ]]; then
    create+=(--image "$KIND_NODE_IMAGE")
  fi
  "${create[@]}"
fi

mkdir -p "$(dirname "$kubeconfig")"
kind get kubeconfig --name "$cluster" >"$kubeconfig"
export KUBECONFIG="$kubeconfig"
export KIND_CLUSTER_NAME="$cluster"

"$here/gpu-node-patch.sh"
"$here/build-and-load.sh"

kubectl --context "kind-${cluster}" apply --server-side -k "$root/overlays/kind"
kubectl --context "kind-${cluster}" wait --for=condition=Established --timeout=60s \
  crd/modelservers.modelpool.dev crd/modelpools.modelpool.dev crd/modelrouters.modelpool.dev
kubectl --context "kind-${cluster}" -n modelpool-system rollout status \
  deployment/modelpool-reconciler --timeout=180s

echo "run the e2e suite with: MODELPOOL_KUBECONFIG=$kubeconfig .venv/bin/pytest -m e2e"
echo "$kubeconfig"

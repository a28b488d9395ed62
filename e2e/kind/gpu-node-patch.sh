#!/usr/bin/env bash
# Advertises fake GPUs on the kind nodes labelled modelpool.dev/fake-gpu=true: adds
# nvidia.com/gpu to the node status (capacity and allocatable) with a JSON patch on the
# status subresource, which is what a device plugin's registration amounts to for the
# scheduler. Nothing backs the resource; the pods that request it are fake model servers.
#
# Environment:
#   KIND_CLUSTER_NAME  cluster name (default modelpool), used for the kubectl context
#   MODELPOOL_GPUS     GPUs per node (default 1)
#   KUBECONFIG         as usual; the context is kind-$KIND_CLUSTER_NAME
#
# Run it again after a node's kubelet restarts if the resource disappears.
set -euo pipefail

cluster="${KIND_CLUSTER_NAME:-modelpool}"
gpus="${MODELPOOL_GPUS:-1}"
kubectl=(kubectl --context "kind-${cluster}")

nodes=$("${kubectl[@]}" get nodes -l modelpool.dev/fake-gpu=true -o name)
if [[ -z "$nodes" ]]; then
  echo "no node labelled modelpool.dev/fake-gpu=true in kind-${cluster}" >&2
  exit 1
fi

patch=$(cat <<JSON
[
  {"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": "${gpus}"},
  {"op": "add", "path": "/status/allocatable/nvidia.com~1gpu", "value": "${gpus}"}
]
JSON
)

for node in $nodes; do
  "${kubectl[@]}" patch "$node" --subresource=status --type=json -p "$patch"
  echo "$node: nvidia.com/gpu=${gpus}"
done

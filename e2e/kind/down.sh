#!/usr/bin/env bash
# Removes what up.sh made: the kind cluster (its node containers and network), the routes
# to its pod networks and Services, and its kubeconfig. The cached builds and images stay
# (they are keyed by version; `docker image prune` and ~/.cache/modelpool/kind hold them).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cluster="${KIND_CLUSTER_NAME:-modelpool}"
CACHE="${MODELPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelpool}"
kubeconfig="${MODELPOOL_KIND_KUBECONFIG:-$CACHE/kind/$cluster.kubeconfig}"
TOOLS="$CACHE/kind/tools-k8s-${MODELPOOL_K8S_VERSION:-v1.35.4}/bin"
export PATH="$TOOLS:$PATH"

if [[ -f $kubeconfig && $(id -u) -eq 0 ]]; then
  while read -r cidr; do
    [[ -n $cidr ]] && ip route del "$cidr" 2>/dev/null || true
  done < <(kubectl --kubeconfig "$kubeconfig" get nodes -o jsonpath='{range .items[*]}{.spec.podCIDR}{"\n"}{end}' 2>/dev/null || true)
  service_cidr="$(kubectl --kubeconfig "$kubeconfig" -n kube-system get pod -l component=kube-apiserver \
    -o jsonpath='{.items[0].spec.containers[0].command}' 2>/dev/null \
    | grep -o 'service-cluster-ip-range=[0-9./]*' | cut -d= -f2 || true)"
  [[ -n $service_cidr ]] && ip route del "$service_cidr" 2>/dev/null || true
fi
bash "$here/kind.sh" delete cluster --name "$cluster"
rm -f "$kubeconfig"

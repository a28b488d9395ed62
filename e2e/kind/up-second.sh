#!/usr/bin/env bash
# A second kind cluster like the first (up.sh), named modelpool-b, with pod and Service ranges
# of its own (this machine routes to both): the kind lane runs its tests on two pytest-xdist
# workers, one cluster each (e2e/stages.py, e2e/testbeds.py). Idempotent, like up.sh.
#
# Prints the first cluster's kubeconfig (MODELPOOL_KIND_KUBECONFIG where the kind stage
# exported it, else where up.sh writes it; the two may come up side by side) and this one's,
# joined by ':', as its last line.
#
#   KIND_CLUSTER_NAME=modelpool-b e2e/kind/down.sh      takes it down
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
CACHE="${MODELPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelpool}"
first="${MODELPOOL_KIND_KUBECONFIG:-$CACHE/kind/modelpool.kubeconfig}"
first="${first%%:*}"
second="$(env -u MODELPOOL_KIND_KUBECONFIG KIND_CLUSTER_NAME=modelpool-b \
  MODELPOOL_KIND_POD_SUBNET=10.245.0.0/16 MODELPOOL_KIND_SERVICE_SUBNET=10.97.0.0/16 \
  bash "$here/up.sh" | tail -n 1)"
echo "$first:$second"

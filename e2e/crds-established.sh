#!/usr/bin/env bash
# Waits, up to 60 s, until every CRD named (by its full name) is Established, in the cluster
# of KUBECONFIG. `kubectl wait --for=condition=Established` fails at once, instead of
# waiting, on a CRD the API server has not given conditions yet (".status.conditions
# accessor error: <nil> is of the type <nil>").
set -euo pipefail
want=$#
for _ in $(seq 1 120); do
  got=$(kubectl get crd "$@" -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Established")].status}{"\n"}{end}' 2>/dev/null \
    | grep -c '^True$' || true)
  [[ $got -eq $want ]] && exit 0
  sleep 0.5  # polling the API server: kubectl has no wait that survives missing conditions
done
echo "crds-established: not Established after 60 s: $*" >&2
exit 1

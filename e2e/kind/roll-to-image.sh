#!/usr/bin/env bash
# roll-to-image.sh KIND/NAME NAMESPACE IMAGE: images are rebuilt under the same tags, so a
# pod template carries the ID of the image it should run (annotation modelpool.dev/image-id):
# a long-running workload of a reused cluster restarts when, and only when, its image
# changed (a patch that changes nothing starts no rollout). kubectl talks to KUBECONFIG.
set -euo pipefail
id="$(docker image inspect -f '{{.Id}}' "$3")"
kubectl -n "$2" patch "$1" --type merge >/dev/null \
  -p "{\"spec\":{\"template\":{\"metadata\":{\"annotations\":{\"modelpool.dev/image-id\":\"$id\"}}}}}"

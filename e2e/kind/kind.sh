#!/usr/bin/env bash
# kind, as the scripts here run it: on a host where `docker run --privileged` fails (no
# CAP_SYS_RESOURCE in the bounding set), with unprivileged/docker first on PATH, which asks
# docker for every capability but that one instead of --privileged. The probe runs once per
# shell that exports its answer (MODELPOOL_KIND_UNPRIVILEGED=1|0).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [[ -z ${MODELPOOL_KIND_UNPRIVILEGED:-} ]]; then
  probe_image="${MODELPOOL_KIND_PROBE_IMAGE:-$(docker image ls --format '{{.Repository}}:{{.Tag}}' | head -n 1)}"
  if docker run --rm --privileged --entrypoint /bin/true "$probe_image" >/dev/null 2>&1; then
    MODELPOOL_KIND_UNPRIVILEGED=0
  else
    MODELPOOL_KIND_UNPRIVILEGED=1
  fi
fi
if [[ $MODELPOOL_KIND_UNPRIVILEGED == 1 ]]; then
  MODELPOOL_REAL_DOCKER="$(command -v docker)"
  export MODELPOOL_REAL_DOCKER
  PATH="$here/unprivileged:$PATH" exec kind "$@"
fi
exec kind "$@"

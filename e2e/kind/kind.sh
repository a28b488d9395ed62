#!/usr/bin/env bash
# kind, as the scripts here run it: on a host where `docker run --privileged` fails (no
# CAP_SYS_RESOURCE in the bounding set), with unprivileged/docker first on PATH, which asks
# docker for every capability but that one instead of --privileged. The probe runs once per
# shell that exports its answer (MODELPOOL_KIND_UNPRIVILEGED=1|0).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
CACHE="${MODELPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelpool}"
# the kind that build-tools.sh built
export PATH="$CACHE/kind/tools-k8s-${MODELPOOL_K8S_VERSION:-v1.35.4}/bin:$PATH"
if [[ -z ${MODELPOOL_KIND_UNPRIVILEGED:-} ]]; then
  probe_image="${MODELPOOL_KIND_PROBE_IMAGE:-$(docker image ls --format '{{.Repository}}:{{.Tag}}' 'modelpool/debian-root' | sed -n 1p)}"
  # as root, as kind's nodes run (a non-root process gets no capabilities to apply)
  if [[ -z $probe_image ]] || docker run --rm --privileged --user 0:0 --entrypoint /bin/true "$probe_image" >/dev/null 2>&1; then
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

#!/usr/bin/env bash
# Builds the project's three images from the repository root and side-loads them into the
# kind cluster with `kind load docker-image`, so no pod ever pulls them:
#   modelpool/reconciler, modelpool/router, modelpool/fake-model, tagged with the project
#   version from pyproject.toml (the tag manifests/ and examples/ name) unless
#   MODELPOOL_IMAGE_TAG says otherwise.
#
# Environment:
#   KIND_CLUSTER_NAME    cluster name (default modelpool)
#   MODELPOOL_IMAGE_TAG  image tag (default: the version in pyproject.toml)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cluster="${KIND_CLUSTER_NAME:-modelpool}"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/pyproject.toml" | head -n 1)"
tag="${MODELPOOL_IMAGE_TAG:-$version}"
if [[ -z "$tag" ]]; then
  echo "cannot tell the image tag: set MODELPOOL_IMAGE_TAG" >&2
  exit 1
fi

for name in reconciler router fake-model; do
  image="modelpool/${name}:${tag}"
  echo "building $image"
  docker build -f "$here/Dockerfile.${name}" -t "$image" "$root"
  echo "loading $image into kind cluster $cluster"
  kind load docker-image --name "$cluster" "$image"
done

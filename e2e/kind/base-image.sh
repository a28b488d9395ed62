#!/usr/bin/env bash
# Prints the base of the project's images: MODELPOOL_PYTHON_BASE when set, else
# python:3.11-slim where it can be pulled, else the Debian root that build-images.sh builds
# offline (with python3 and apt, like the slim image).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [[ -n ${MODELPOOL_PYTHON_BASE:-} ]]; then
  echo "$MODELPOOL_PYTHON_BASE"
elif docker image inspect python:3.11-slim >/dev/null 2>&1 || timeout 60 docker pull -q python:3.11-slim >/dev/null 2>&1; then
  echo python:3.11-slim
else
  bash "$here/build-images.sh" --root | tail -n 1
fi

#!/usr/bin/env bash
# Deletes the kind cluster that up.sh created (and everything in it).
set -euo pipefail

cluster="${KIND_CLUSTER_NAME:-modelpool}"
kind delete cluster --name "$cluster"

#!/usr/bin/env bash
# Prints the Debian archive that the kind testbed's Debian root is built from: the one apt on
# this machine is configured with, so that a machine behind a company mirror uses its mirror.
#
#   MODELPOOL_DEBIAN_MIRROR set    that archive
#   else                           the repository apt fetches SUITE's main component from, as
#                                  `apt-get indextargets` reads sources.list and
#                                  sources.list.d (either format); else the one it fetches
#                                  another Debian release's main from (every release is in
#                                  one archive)
#
# Exits 1, saying why, when apt is configured with no Debian archive.
#
#   e2e/kind/debian-mirror.sh [SUITE]    (default: bookworm)
set -euo pipefail

suite="${1:-bookworm}"
if [[ -n ${MODELPOOL_DEBIAN_MIRROR:-} ]]; then
  echo "$MODELPOOL_DEBIAN_MIRROR"
  exit 0
fi
# One line per index apt fetches; the origin is known once `apt-get update` has run.
targets="$(apt-get indextargets --format '$(IDENTIFIER) $(COMPONENT) $(RELEASE) $(REPO_URI) $(ORIGIN)' 2>/dev/null || true)"
uri="$(awk -v suite="$suite" '$1 == "Packages" && $2 == "main" && $3 == suite {print $4; exit}' <<<"$targets")"
if [[ -z $uri ]]; then
  # A release's own suite (not -updates, -security, -backports) of an archive apt knows as Debian's.
  uri="$(awk '$1 == "Packages" && $2 == "main" && $3 !~ /-/ && $5 == "Debian" {print $4; exit}' <<<"$targets")"
fi
if [[ -z $uri ]]; then
  echo "apt on this machine is configured with no Debian archive for $suite main:" \
    "set MODELPOOL_DEBIAN_MIRROR to the one debootstrap should use" >&2
  exit 1
fi
echo "${uri%/}"

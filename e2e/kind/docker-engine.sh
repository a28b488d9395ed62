#!/usr/bin/env bash
# Makes sure a Docker engine answers. When `docker info` fails:
# - on a Debian machine where this runs as root (a CI machine, a fresh VM), it installs
#   Docker's engine from Debian's packages (docker.io) unless dockerd is there already,
#   starts dockerd in the background, and says so;
# - anywhere else it changes nothing and stops with a message saying what to install.
set -euo pipefail

log() { printf '[docker %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if docker info >/dev/null 2>&1; then
  exit 0
fi
if [[ $(id -u) -ne 0 || ! -f /etc/debian_version ]]; then
  log "no Docker engine answers. Install and start one (Debian/Ubuntu: apt-get install"
  log "docker.io; elsewhere https://docs.docker.com/engine/install/), then run this again."
  exit 1
fi
# Two clusters come up side by side (e2e/stages.py): one of them installs and starts the
# engine while the other waits here, then finds it answering.
exec 9>/run/modelpool-docker-engine.lock
flock 9
if docker info >/dev/null 2>&1; then
  exit 0
fi
if ! command -v dockerd >/dev/null 2>&1; then
  log "no Docker engine here: installing Debian's docker.io (this machine runs as root)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io >/dev/null
fi
# A dockerd that runs but does not answer is starting or stopping: let it finish first.
for ((i = 0; i < 120; i++)); do
  pgrep -x dockerd >/dev/null || break
  if docker info >/dev/null 2>&1; then
    exit 0
  fi
  ((i == 0)) && log "a dockerd runs but does not answer yet: waiting for it to start or stop"
  sleep 0.5
done
if pgrep -x dockerd >/dev/null; then
  log "dockerd (pid $(pgrep -x dockerd | tr '\n' ' ')) neither answers nor stops; stop it and run this again"
  exit 1
fi
log "starting dockerd (log: /var/log/modelpool-dockerd.log)"
nohup dockerd >>/var/log/modelpool-dockerd.log 2>&1 9>&- &  # the lock is not its to hold
for _ in $(seq 1 120); do
  if docker info >/dev/null 2>&1; then
    log "dockerd is up ($(docker version --format '{{.Server.Version}}'))"
    exit 0
  fi
  sleep 0.5
done
log "dockerd did not answer within 60s; its log:"
tail -n 20 /var/log/modelpool-dockerd.log >&2
exit 1

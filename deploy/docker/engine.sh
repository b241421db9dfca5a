#!/usr/bin/env bash
# Source this file: it makes sure a Docker engine and Compose are there and running, and sets
#   DOCKER          a docker CLI that builds with BuildKit (secrets and bind mounts in RUN)
#   COMPOSE         `docker compose` (v2) or `docker-compose` (v1)
#   ENGINE_STARTED  the pid of a dockerd this file started (empty when one was already running)
# As root on a machine without an engine it installs Debian's docker.io and docker-compose and
# starts dockerd by hand (no systemd needed); its log goes to $GYMSERVE_DOCKERD_LOG.

_gs_log() { echo "engine: $*" >&2; }

_gs_root() { [ "$(id -u)" -eq 0 ]; }

_gs_apt_install() {
  _gs_root || { _gs_log "missing $*; install it (apt-get install $*) or run as root"; return 1; }
  _gs_log "installing $* with apt-get"
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}

_gs_pick_cli() {
  # The first docker CLI that can build with BuildKit: one with the buildx plugin, or a client
  # older than 23 whose built-in builder is BuildKit (Debian's docker.io 20.10).
  local cli major
  for cli in $(type -ap docker); do
    if "$cli" buildx version >/dev/null 2>&1; then echo "$cli"; return 0; fi
    major=$("$cli" version --format '{{.Client.Version}}' 2>/dev/null | cut -d. -f1)
    if [ -n "$major" ] && [ "$major" -lt 23 ] 2>/dev/null; then echo "$cli"; return 0; fi
  done
  return 1
}

_gs_start_dockerd() {
  # Start dockerd in the background; fall back to settings that work in restricted sandboxes
  # (no overlayfs: vfs; no iptables: none). Leaves ENGINE_STARTED set on success.
  local opts pid i
  GYMSERVE_DOCKERD_LOG=${GYMSERVE_DOCKERD_LOG:-/var/log/gymserve-dockerd.log}
  for opts in "" "--storage-driver=vfs" "--storage-driver=vfs --iptables=false --ip-masq=false"; do
    _gs_log "starting dockerd $opts (log: $GYMSERVE_DOCKERD_LOG)"
    # shellcheck disable=SC2086
    nohup dockerd $opts >>"$GYMSERVE_DOCKERD_LOG" 2>&1 </dev/null &
    pid=$!
    for i in $(seq 1 60); do
      if "$DOCKER" info >/dev/null 2>&1; then ENGINE_STARTED=$pid; return 0; fi
      kill -0 "$pid" 2>/dev/null || break
      sleep 1
    done
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
  done
  _gs_log "dockerd did not start; see $GYMSERVE_DOCKERD_LOG"
  return 1
}

gymserve_engine() {
  ENGINE_STARTED=""
  if ! command -v dockerd >/dev/null 2>&1 && ! docker info >/dev/null 2>&1; then
    _gs_apt_install docker.io || return 1
  fi
  DOCKER=${DOCKER:-$(_gs_pick_cli)} || { _gs_log "no docker CLI that builds with BuildKit (need buildx or docker.io)"; return 1; }
  if ! "$DOCKER" info >/dev/null 2>&1; then
    _gs_root || { _gs_log "the Docker engine is not running and only root can start it"; return 1; }
    _gs_start_dockerd || return 1
  fi
  if [ -z "${COMPOSE:-}" ]; then
    if "$DOCKER" compose version >/dev/null 2>&1; then COMPOSE="$DOCKER compose"
    else
      command -v docker-compose >/dev/null 2>&1 || _gs_apt_install docker-compose || return 1
      COMPOSE=docker-compose
    fi
  fi
  export DOCKER COMPOSE ENGINE_STARTED DOCKER_BUILDKIT=1 COMPOSE_DOCKER_CLI_BUILD=1
}

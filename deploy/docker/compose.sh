#!/usr/bin/env bash
# `make compose-up` / `make compose-down`: build the image and start the stack, waiting until
# every server is healthy; or stop and remove it.
#   deploy/docker/compose.sh up     build (deploy/docker/build.sh), `compose up -d`, wait for health
#   deploy/docker/compose.sh down   `compose down` (GYMSERVE_DOWN_VOLUMES=1 also removes the volumes)
# Settings (environment or .env): COMPOSE_PROJECT_NAME, GYMSERVE_HEAD_PORT (11000),
# GYMSERVE_HEAD_BIND (127.0.0.1), GYMSERVE_UP_TIMEOUT_S (900), GYMSERVE_SKIP_BUILD=1,
# GYMSERVE_ENGINE_PIDFILE (where to write the pid of a dockerd this script started).
# Auth: with no GYMSERVE_API_KEY, `up` takes the key from the env file (GYMSERVE_ENV_FILE, default
# .env, gitignored), else from the key file `gymserve up` uses (GYMSERVE_API_KEY_FILE, default
# ~/.config/gymserve/api_key), else generates one; it ends up in both files (0600), so clients on
# this machine find it. Only the paths are printed, never the key.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=engine.sh
. deploy/docker/engine.sh
gymserve_engine
if [ -n "$ENGINE_STARTED" ] && [ -n "${GYMSERVE_ENGINE_PIDFILE:-}" ]; then
  echo "$ENGINE_STARTED" > "$GYMSERVE_ENGINE_PIDFILE"
fi
PROJECT=${COMPOSE_PROJECT_NAME:-$(basename "$PWD" | tr -cd 'a-z0-9_-')}
export COMPOSE_PROJECT_NAME=$PROJECT
# shellcheck disable=SC2206
compose=($COMPOSE -f docker-compose.yml ${GYMSERVE_COMPOSE_FILES:-})

ensure_key() {
  local env_file=${GYMSERVE_ENV_FILE:-.env} key=${GYMSERVE_API_KEY:-}
  local key_file=${GYMSERVE_API_KEY_FILE:-${XDG_CONFIG_HOME:-$HOME/.config}/gymserve/api_key}
  if [ -z "$key" ] && [ -f "$env_file" ]; then
    key=$(sed -n 's/^GYMSERVE_API_KEY=//p' "$env_file" | tail -n 1)
  fi
  if [ -z "$key" ] && [ -s "$key_file" ]; then key=$(tr -d '[:space:]' < "$key_file"); fi
  if [ -z "$key" ]; then key=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n'); fi
  (
    umask 077
    if ! grep -q "^GYMSERVE_API_KEY=." "$env_file" 2>/dev/null; then
      if [ -f "$env_file" ]; then sed -i '/^GYMSERVE_API_KEY=$/d' "$env_file"; fi
      printf 'GYMSERVE_API_KEY=%s\n' "$key" >> "$env_file"
    fi
    chmod 600 "$env_file"
    if [ ! -s "$key_file" ]; then mkdir -p "$(dirname "$key_file")"; printf '%s\n' "$key" > "$key_file"; fi
  )
  export GYMSERVE_API_KEY=$key  # compose reads it from our environment, never from argv
  echo "compose: bearer key in $env_file (GYMSERVE_API_KEY) and $key_file" >&2
}

wait_healthy() {
  local deadline=$((SECONDS + ${GYMSERVE_UP_TIMEOUT_S:-900})) total healthy line bad
  while :; do
    total=0; healthy=0; bad=""
    while read -r line; do
      [ -n "$line" ] || continue
      total=$((total + 1))
      case "$line" in
        *"(healthy)"*) healthy=$((healthy + 1)) ;;
        *) bad="$bad ${line%% *}" ;;
      esac
    done < <($DOCKER ps -a --filter "label=com.docker.compose.project=$PROJECT" \
               --format '{{.Label "com.docker.compose.service"}} {{.Status}}')
    echo "compose: $healthy/$total healthy${bad:+ (waiting:$bad)}" >&2
    if [ "$total" -gt 0 ] && [ "$healthy" -eq "$total" ]; then return 0; fi
    if [ $SECONDS -ge $deadline ]; then
      echo "compose: not healthy after ${GYMSERVE_UP_TIMEOUT_S:-900}s:$bad" >&2
      for s in $bad; do "${compose[@]}" logs --tail=30 "$s" >&2 || true; done
      return 1
    fi
    sleep 5
  done
}

case "${1:-}" in
  up)
    [ "${GYMSERVE_SKIP_BUILD:-0}" = 1 ] || DOCKER=$DOCKER COMPOSE=$COMPOSE deploy/docker/build.sh
    ensure_key
    start=$SECONDS
    "${compose[@]}" up -d --no-build
    wait_healthy
    echo "compose: all healthy in $((SECONDS - start))s; head on http://${GYMSERVE_HEAD_BIND:-127.0.0.1}:${GYMSERVE_HEAD_PORT:-11000}" >&2
    ;;
  down)
    args=(down --remove-orphans)
    [ "${GYMSERVE_DOWN_VOLUMES:-0}" = 1 ] && args+=(-v)
    "${compose[@]}" "${args[@]}"
    ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac

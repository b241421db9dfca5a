#!/usr/bin/env bash
# `make compose-up` / `make compose-down`: build the image and start the stack, waiting until
# every server is healthy; or stop and remove it.
#   deploy/docker/compose.sh up     build (deploy/docker/build.sh), `compose up -d`, wait for health
#   deploy/docker/compose.sh down   `compose down` (GYMSERVE_DOWN_VOLUMES=1 also removes the volumes)
# Settings (environment or .env): COMPOSE_PROJECT_NAME, GYMSERVE_HEAD_PORT (11000),
# GYMSERVE_HEAD_BIND (127.0.0.1), GYMSERVE_UP_TIMEOUT_S (900), GYMSERVE_SKIP_BUILD=1,
# GYMSERVE_ENGINE_PIDFILE (where to write the pid of a dockerd this script started).
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

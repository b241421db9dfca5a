#!/usr/bin/env bash
# Build the gymserve image (gymserve:latest, or $GYMSERVE_IMAGE) offline-friendly:
# - base: BASE_IMAGE if set, else one built from Debian packages (base.sh, cached by recipe hash);
# - CA bundle: the file pip trusts (its `cert` setting, else the system bundle) goes in as a
#   BuildKit secret, mounted only while pip runs: it is in no layer;
# - torch: the CPU wheel that pip's configured find-links hold is hard-linked into
#   deploy/docker/wheels/ (gitignored) and installed from there; no CUDA wheel is ever pulled.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=engine.sh
. deploy/docker/engine.sh
gymserve_engine

IMAGE=${GYMSERVE_IMAGE:-gymserve:latest}
PY=${PYTHON:-python3}
TORCH=$($PY deploy/docker/requirements.py --torch pyproject.toml)   # torch==X
TORCH_VERSION=${TORCH#torch==}

pip_setting() {  # last value of a pip setting (`pip config list` shows files and PIP_* variables)
  $PY -m pip config list 2>/dev/null | sed -n "s/^[^=]*\.$1='\(.*\)'$/\1/p" | tail -n1
}

CA=${GYMSERVE_CA_BUNDLE:-$(pip_setting cert)}
[ -n "$CA" ] || CA=$($PY -c 'import ssl; print(ssl.get_default_verify_paths().openssl_cafile)')
SECRET=()
if [ -s "$CA" ]; then SECRET=(--secret "id=ca,src=$CA"); else echo "build: no CA bundle found; pip uses the image's" >&2; fi

WHEELS=deploy/docker/wheels
rm -f "$WHEELS"/torch-*.whl
arch=$(uname -m)
for dir in ${GYMSERVE_TORCH_WHEELS:-} $(pip_setting find-links); do
  dir=${dir#file://}
  [ -d "$dir" ] || continue
  # the base image's Python is 3.11 (Debian bookworm)
  for whl in "$dir"/torch-"$TORCH_VERSION"+cpu-cp311-cp311-*"$arch".whl "$dir"/torch-"$TORCH_VERSION"-cp311-cp311-*"$arch".whl; do
    [ -f "$whl" ] || continue
    ln -f "$whl" "$WHEELS/" 2>/dev/null || cp "$whl" "$WHEELS/"
    echo "build: torch from $(basename "$whl")" >&2
    break 2
  done
done

ARGS=()
index=$(pip_setting index-url)
case "$index" in http*) ARGS+=(--build-arg "PIP_INDEX_URL=$index") ;; esac
[ -z "${TORCH_INDEX_URL:-}" ] || ARGS+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")

BASE=$(DOCKER=$DOCKER deploy/docker/base.sh)
echo "build: $IMAGE from $BASE" >&2
$DOCKER build --progress=plain "${SECRET[@]}" "${ARGS[@]}" --build-arg "BASE_IMAGE=$BASE" \
  -f deploy/docker/Dockerfile -t "$IMAGE" .
$DOCKER image inspect "$IMAGE" --format 'build: {{.RepoTags}} {{.Size}} bytes' >&2

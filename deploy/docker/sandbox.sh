#!/usr/bin/env bash
# Build the workspace image of the docker sandbox provider (terminal and swe): the Debian base that
# compose uses plus git, patch and Debian's pytest, built offline from Debian packages by base.sh.
# Its tag hashes the recipe, so an unchanged recipe is never rebuilt (CI keeps it between runs).
# Prints the tag. SANDBOX_IMAGE=...: use that image instead (nothing is built).
set -euo pipefail
if [ -n "${SANDBOX_IMAGE:-}" ]; then echo "$SANDBOX_IMAGE"; exit 0; fi
GYMSERVE_BASE_EXTRA=git,patch,python3-pytest exec bash "$(dirname "$0")/base.sh"

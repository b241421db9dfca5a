#!/usr/bin/env bash
# Build the image's base from Debian packages (no container image registry needed):
# debootstrap a minimal bookworm with Python 3.11 and bubblewrap, then `docker import` it.
# The tag is a hash of this recipe, so an unchanged recipe is never rebuilt. Prints the tag.
#   BASE_IMAGE=...      use that image instead (a site with a registry); nothing is built
#   DEBIAN_MIRROR=URL   the Debian mirror (default: the host's apt source)
#   GYMSERVE_BASE_EXTRA=a,b  more Debian packages (another tag: deploy/docker/sandbox.sh uses it)
set -euo pipefail
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
DOCKER=${DOCKER:-docker}
if [ -n "${BASE_IMAGE:-}" ]; then echo "$BASE_IMAGE"; exit 0; fi

SUITE=bookworm
PACKAGES=python3,python3-venv,bubblewrap,ca-certificates${GYMSERVE_BASE_EXTRA:+,$GYMSERVE_BASE_EXTRA}

host_mirror() {
  # The first Debian archive the host's apt uses (deb822 .sources or one-line .list files).
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && awk '/^URIs:/ {for (i = 2; i <= NF; i++) if ($i !~ /security/) {print $i; exit}}' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] && awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' "$f"
  done
  return 0
}
MIRROR=${DEBIAN_MIRROR:-$(host_mirror | head -n1 || true)}
[ -n "$MIRROR" ] || { echo "base: no Debian mirror found in the host's apt sources; set DEBIAN_MIRROR" >&2; exit 1; }

TAG="gymserve-base:$( (echo "$SUITE $PACKAGES"; sed -n '/^SUITE=/,$p' "$SELF") | sha256sum | cut -c1-12)"
if $DOCKER image inspect "$TAG" >/dev/null 2>&1; then echo "$TAG"; exit 0; fi

if ! command -v debootstrap >/dev/null 2>&1; then
  [ "$(id -u)" -eq 0 ] || { echo "base: debootstrap missing (apt-get install debootstrap) or set BASE_IMAGE" >&2; exit 1; }
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >&2
fi
[ "$(id -u)" -eq 0 ] || { echo "base: debootstrap needs root (or set BASE_IMAGE)" >&2; exit 1; }

ROOTFS=$(mktemp -d "${TMPDIR:-/tmp}/gymserve-rootfs.XXXXXX")
trap 'rm -rf "$ROOTFS"' EXIT
echo "base: debootstrap $SUITE ($PACKAGES) from $MIRROR" >&2
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR" >&2
# Only what a server needs at run time: no package caches, docs, manuals or translations.
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/* "$ROOTFS"/var/cache/debconf/*-old \
       "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/* \
       "$ROOTFS"/usr/share/locale/* "$ROOTFS"/var/log/*.log "$ROOTFS"/tmp/* "$ROOTFS"/dev/* 2>/dev/null || true
tar -C "$ROOTFS" --numeric-owner -c . \
  | $DOCKER import --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' - "$TAG" >&2
echo "$TAG"

#!/usr/bin/env bash
# The Dockerfile's base image, for a machine that cannot pull it.
#
# `bash scripts/base-image.sh` makes sure podman holds the image the Dockerfile's FROM names
# (docker.io/library/python:3.11-slim-bookworm). Present: nothing to do. Pullable: pulled, and
# that is the image every registry-connected build uses. Only when `podman pull` fails does it
# build a STAND-IN under that same name: a minimal Debian bookworm made with mmdebstrap (from
# the Debian mirror, which is reachable where Docker Hub is not) with Debian's python3.11,
# shaped where the Dockerfile relies on the official image:
#   - `python` and `python3` at /usr/local/bin (the official image's interpreter lives there);
#   - pip and setuptools installed by pip under /usr/local (from Debian's own wheels), so the
#     final stage's `python -m pip uninstall -y pip setuptools wheel` can remove them. Debian's
#     python3-pip package cannot be: its files carry no RECORD, pip refuses to uninstall it;
#   - no /usr/lib/python3*/EXTERNALLY-MANAGED (the official image has none; pip obeys it);
#   - python3-venv (ensurepip for `python -m venv`), ca-certificates, passwd (groupadd/useradd);
#   - ENV PATH and LANG as the official image sets them.
# It is NOT the official image: Debian's python 3.11.2 and Debian's patches, not python.org's
# latest 3.11 built from source. Use it to build and run the image on this machine; never
# push what is built on it. The image carries the label dlock.base.stand-in=true.
#
# Needs root (mmdebstrap in root mode), podman and mmdebstrap (installed with apt-get if absent).
# FORCE_STAND_IN=1 rebuilds the stand-in even if the base is present (replacing it).
set -euo pipefail
cd "$(dirname "$0")/.."

BASE="$(awk '$1 == "FROM" { print $2; exit }' Dockerfile)"
case "$BASE" in
  */*/*) ;;
  */*) BASE="docker.io/$BASE" ;;
  *) BASE="docker.io/library/$BASE" ;;
esac
SUITE=bookworm
PACKAGES=python3,python3-venv,ca-certificates,passwd

say() { echo "[dlock] $*" >&2; }

if [ "${FORCE_STAND_IN:-0}" != 1 ]; then
  if podman image exists "$BASE"; then
    if [ "$(podman image inspect --format '{{index .Labels "dlock.base.stand-in"}}' "$BASE")" = true ]; then
      say "$BASE is present: the STAND-IN this script built (Debian's python), not the official image"
    else
      say "$BASE is present"
    fi
    exit 0
  fi
  if podman pull "$BASE" >&2; then
    say "pulled $BASE (the official image)"
    exit 0
  fi
fi

say "================================================================================"
say "$BASE cannot be pulled here: building a STAND-IN under that name."
say "It is Debian $SUITE's python3.11 (3.11.2) made with mmdebstrap, NOT the official image."
say "A build on a machine that reaches a registry uses the real one; never push this build."
say "================================================================================"

[ "$(id -u)" = 0 ] || { say "run as root (mmdebstrap builds the root file system)"; exit 1; }
if ! command -v mmdebstrap >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mmdebstrap >/dev/null
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The customize hooks run inside the new root ($1). pip, run from Debian's own wheel file,
# installs pip and setuptools under /usr/local as the official image has them (with RECORD),
# with none of this machine's PIP_* settings (env -i).
mmdebstrap --variant=minbase --include="$PACKAGES" \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
  --customize-hook='ln -sf /usr/bin/python3 "$1/usr/local/bin/python3"' \
  --customize-hook='ln -sf /usr/bin/python3 "$1/usr/local/bin/python"' \
  --customize-hook='chroot "$1" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin sh -ec "pip=\$(ls /usr/share/python-wheels/pip-*.whl); \
    python3 \$pip/pip install --no-cache-dir --no-index \
      \$pip /usr/share/python-wheels/setuptools-*.whl; \
    python3 -m pip --version | grep -q \" /usr/local/lib/python3\""' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
  "$SUITE" "$work/rootfs.tar"

replaced="$(podman image inspect --format '{{.Id}}' "$BASE" 2>/dev/null || true)"
version="$(tar -xOf "$work/rootfs.tar" ./var/lib/dpkg/status \
  | awk '/^Package: python3.11-minimal$/ { p = 1 } p && /^Version:/ { print $2; exit }')"
podman import \
  --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'LABEL dlock.base.stand-in=true' \
  --change "LABEL dlock.base.stand-in.python=debian-python3.11-$version" \
  --change "LABEL dlock.base.stand-in.for=$BASE" \
  --change 'CMD ["python3"]' \
  --message "dlock STAND-IN for $BASE (Debian $SUITE python3.11 $version, scripts/base-image.sh)" \
  "$work/rootfs.tar" "$BASE" >/dev/null
# FORCE_STAND_IN=1: the stand-in it replaced, now nameless, goes (unless a build still uses it).
if [ -n "$replaced" ] && [ "$replaced" != "$(podman image inspect --format '{{.Id}}' "$BASE")" ]; then
  podman rmi "$replaced" >/dev/null 2>&1 || true
fi
say "imported the STAND-IN as $BASE (Debian python3.11 $version; label dlock.base.stand-in=true)"

#!/usr/bin/env bash
# Install what the container tests need (tests/container/, `make container-test`, docs/deployment.md): Debian's
# podman (4.3 on Debian 12, with what it recommends: netavark and aardvark-dns for compose's networks), runc (the
# runtime that works in this sandbox; tests/container/containers.conf says why) and debootstrap (the tests' Debian
# base image). Run as root; idempotent: what is installed already is left as it is.
#   bash scripts/install_container_deps.sh && make container-test
set -euo pipefail

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"; }
if ! command -v apt-get >/dev/null; then
    echo "no apt-get here: install podman, runc and debootstrap by hand" >&2
    exit 1
fi
if installed podman && installed runc && installed debootstrap; then
    echo "podman, runc and debootstrap are installed already"
else
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap >/dev/null
fi
echo "container engine ready: podman $(dpkg-query -W -f='${Version}' podman)," \
    "runc $(dpkg-query -W -f='${Version}' runc), debootstrap $(dpkg-query -W -f='${Version}' debootstrap)"

#!/usr/bin/env bash
# Install what the power-loss simulation needs (tests/chaos/test_power_loss.py, docs/power-loss.md):
#   - Debian's fuse3 (fusermount3) and libfuse3-3 (the library, loaded through ctypes: nothing is compiled);
#   - PyPI's mfusepy (ctypes bindings for libfuse 2 and 3) into the project's virtualenv.
# Run as root (apt-get; mounting a FUSE filesystem needs /dev/fuse, and root or the setuid fusermount3), once the
# virtualenv exists (`make` makes it):
#   bash scripts/install_powerloss_deps.sh && make chaos
# VENV=path picks another virtualenv (default .venv). Idempotent: what is installed already is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VENV:-.venv}

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"; }
if installed fuse3 && installed libfuse3-3; then
    echo "fuse3 and libfuse3-3 are installed already"
else
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends fuse3 libfuse3-3
fi

if [ ! -x "$venv/bin/pip" ]; then
    echo "no virtualenv at $venv: run \`make chaos\` once (it makes it), or \`make\`, first" >&2
    exit 1
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check 'mfusepy>=3.1,<4'

if [ ! -e /dev/fuse ]; then
    echo "warning: /dev/fuse is missing (no FUSE in this kernel or container): the power-loss tests will skip" >&2
fi
echo "power-loss simulation ready: libfuse3-3 $(dpkg-query -W -f='${Version}' libfuse3-3)," \
    "mfusepy $("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("mfusepy"))')"

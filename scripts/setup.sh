#!/usr/bin/env bash
# Install everything ddtree-deploy and its lab need on a fresh Debian 12 machine, as root.
# Idempotent: a second run changes nothing. Used by demo.sh and test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9
# patch: the payload tests apply payload.yaml's patches with patch(1); zstd: the overlay's
# compressed streams (a fresh Debian 12 has neither).
need_apt=()
for cmd in systemd-nspawn:systemd-container debootstrap:debootstrap sshd:openssh-server \
           ssh:openssh-client ip:iproute2 gcc:gcc readelf:binutils python3:python3 \
           git:git patch:patch zstd:zstd; do
  command -v "${cmd%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${cmd%%:*}" ] || need_apt+=("${cmd##*:}")
done
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
[ -e /usr/include/stdio.h ] || need_apt+=(libc6-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" ca-certificates >/dev/null
fi

# uv builds the project's venv from uv.lock (the tool, and the lab from lab/ as a workspace
# member: the tests', benchmarks' and demo's hosts); uv comes from PyPI into a venv of its own
# (DDTREE_DEPLOY_UV_HOME, /opt/ddtree-deploy-uv unless set: scripts/fresh-run.sh gives an empty one).
UV_HOME=${DDTREE_DEPLOY_UV_HOME:-/opt/ddtree-deploy-uv}
UV=$(command -v uv || true)
if [ -z "$UV" ] || [ "$("$UV" --version | awk '{print $2}')" != "$UV_VERSION" ]; then
  if [ ! -x "$UV_HOME/bin/uv" ]; then
    python3 -m venv "$UV_HOME"
    "$UV_HOME/bin/pip" install -q "uv==$UV_VERSION"
  fi
  UV=$UV_HOME/bin/uv
fi
# --compile-bytecode, and compileall for the project's own (editable) source: the CLI starts
# from .pyc files even where PYTHONDONTWRITEBYTECODE is set (about 60 ms per command).
"$UV" sync --frozen --quiet --compile-bytecode
.venv/bin/python -m compileall -q -j 0 ddtree_deploy lab/ddtree_lab >/dev/null
echo "setup: ok ($(.venv/bin/ddtree-deploy --version))"

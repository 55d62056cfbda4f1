#!/usr/bin/env bash
# The whole test suite: install, lint, type-check, then every test (the lab tests included).
# The lab is taken down at the end even when tests fail. Each stage prints its seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
stage() { local name=$1 t0=$SECONDS; shift; "$@"; echo "tier $name: $((SECONDS - t0)) s"; }
stage setup bash scripts/setup.sh
trap '.venv/bin/ddtree-deploy lab down >/dev/null 2>&1 || true' EXIT
stage ruff .venv/bin/ruff check .
stage mypy .venv/bin/mypy
stage pytest .venv/bin/pytest -q -p no:cacheprovider "$@"

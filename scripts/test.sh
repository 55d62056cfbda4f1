#!/usr/bin/env bash
# The whole test suite: install, lint, type-check, then every test (the lab tests included).
# The lab is taken down at the end even when tests fail.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
trap '.venv/bin/ddtree-deploy lab down >/dev/null 2>&1 || true' EXIT
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/pytest -q -p no:cacheprovider "$@"

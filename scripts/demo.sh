#!/usr/bin/env bash
# The main job on the embedded default (the lab): install, bring the lab up, show the hosts.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ddtree-deploy lab up
.venv/bin/ddtree-deploy hosts check ct129 ct200
echo "The lab stays up: 'ddtree-deploy lab down' takes it down (add --purge to drop its caches)."

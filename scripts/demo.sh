#!/usr/bin/env bash
# The main job on the embedded default (the lab): install, bring the lab up, show the hosts.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ddtree-deploy lab up
.venv/bin/ddtree-deploy inventory ct129 ct200 --refresh
# doctor exits 1 here on purpose: the story's first-attempt venv has every problem the story met.
.venv/bin/ddtree-deploy doctor ct200 --venv /root/venv_sglang || true
echo "The lab stays up: 'ddtree-deploy lab down' takes it down (add --purge to drop its caches)."

#!/usr/bin/env bash
# The main job on the embedded default (the lab): install, bring the lab up, look at the hosts,
# then plan and apply the story's deployment (DDTree on ct200's GPU1, port 30001) and plan again.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
dd=.venv/bin/ddtree-deploy
$dd lab up
$dd inventory ct129 ct200 --refresh
# doctor exits 1 here on purpose: the story's first-attempt venv has every problem the story met.
$dd doctor ct200 --venv /root/venv_sglang || true
# plan exits 4 while changes are pending.
$dd plan ct200 || [ $? -eq 4 ]
$dd apply ct200 --yes
$dd plan ct200
$dd probe ct200 sglang-ddtree
echo "The lab stays up: 'ddtree-deploy lab down' takes it down (add --purge to drop its caches)."

#!/usr/bin/env bash
# The GPU rehearsal (not CI: CI has no GPU). Two halves of one command:
#   bash scripts/gpu_rehearsal.sh prepare [RELEASE]   # workstation: build the carry set of SGLang
#                                                     # RELEASE: 0.5.11 (default, the patch set)
#                                                     # in .carry/, 0.5.17 (the plugin form) in
#                                                     # .carry-0.5.17/ (one per device call)
#   bash scripts/gpu_rehearsal.sh run OUT [PHASE [OPTIONS]]   # GPU host (repo + .carry there):
#                                                     # PHASE correctness (default), perf, bench
#                                                     # or dflash-sampled; OPTIONS: --budget S,
#                                                     # --keep-payload (python -m rehearsal.run -h)
#   REHEARSAL_SGLANG=0.5.17 bash scripts/gpu_rehearsal.sh run OUT PHASE   # the plugin form
# `run` writes OUT/rehearsal.json (schema: rehearsal/result.py) and OUT/logs.tar.gz.
set -euo pipefail
cd "$(dirname "$0")/.."
release=${REHEARSAL_SGLANG:-0.5.11}
case "${1:-}" in
  prepare)
    release=${2:-0.5.11}
    if [ "$release" = 0.5.11 ]; then dest=.carry; else dest=.carry-$release; fi
    .venv/bin/python -m rehearsal.carry build "$dest" --release "$release" ;;
  run)
    out=${2:?"usage: $0 run OUT [correctness|perf|bench|dflash-sampled [OPTIONS]]"}
    py=${REHEARSAL_PYTHON:-/opt/torch/.venv/bin/python}
    if [ "$release" = 0.5.11 ]; then carry=.carry; else carry=.carry-$release; fi
    PYTHONUNBUFFERED=1 "$py" -m rehearsal.run --carry "$carry" --sglang "$release" --out "$out" \
      --phase "${3:-correctness}" "${@:4}" ;;
  *)
    echo "usage: $0 prepare [RELEASE] | run OUT [correctness|perf|bench|dflash-sampled [OPTIONS]]" >&2
    exit 2 ;;
esac

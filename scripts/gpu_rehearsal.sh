#!/usr/bin/env bash
# The GPU rehearsal (not CI: CI has no GPU). Two halves of one command:
#   bash scripts/gpu_rehearsal.sh prepare             # workstation: build the carry set in .carry/
#   bash scripts/gpu_rehearsal.sh run OUT [PHASE [OPTIONS]]   # GPU host (repo + .carry there):
#                                                     # PHASE correctness (default), perf, bench
#                                                     # or dflash-sampled; OPTIONS: --budget S,
#                                                     # --keep-payload (python -m rehearsal.run -h)
# `run` writes OUT/rehearsal.json (schema: rehearsal/result.py) and OUT/logs.tar.gz.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  prepare)
    .venv/bin/python -m rehearsal.carry build .carry ;;
  run)
    out=${2:?"usage: $0 run OUT [correctness|perf|bench|dflash-sampled [OPTIONS]]"}
    py=${REHEARSAL_PYTHON:-/opt/torch/.venv/bin/python}
    PYTHONUNBUFFERED=1 "$py" -m rehearsal.run --carry .carry --out "$out" --phase "${3:-correctness}" "${@:4}" ;;
  *)
    echo "usage: $0 prepare | run OUT [correctness|perf|bench|dflash-sampled [OPTIONS]]" >&2; exit 2 ;;
esac

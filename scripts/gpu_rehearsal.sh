#!/usr/bin/env bash
# The GPU rehearsal (not CI: CI has no GPU). Two halves of one command:
#   bash scripts/gpu_rehearsal.sh prepare             # workstation: build the carry set in .carry/
#   bash scripts/gpu_rehearsal.sh run OUT [PHASE]     # GPU host (repo + .carry copied there):
#                                                     # PHASE correctness (default), perf or
#                                                     # dflash-sampled
# `run` writes OUT/rehearsal.json (schema: rehearsal/result.py) and OUT/logs.tar.gz.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  prepare)
    .venv/bin/python -m rehearsal.carry build .carry ;;
  run)
    out=${2:?"usage: $0 run OUT [correctness|perf]"}
    py=${REHEARSAL_PYTHON:-/opt/torch/.venv/bin/python}
    PYTHONUNBUFFERED=1 "$py" -m rehearsal.run --carry .carry --out "$out" --phase "${3:-correctness}" ;;
  *)
    echo "usage: $0 prepare | run OUT [correctness|perf]" >&2; exit 2 ;;
esac

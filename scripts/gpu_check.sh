#!/usr/bin/env bash
# One-shot GPU check (< 8 minutes): every GPU path present here against the CPU reference; writes gpu_check.json
# to $OUT (or the current folder). See scripts/gpu_check.py and docs/gpu-path.md.
#   scripts/gpu_check.sh            # full check (on a machine without a GPU: the CPU parts, tiny model)
#   scripts/gpu_check.sh --quick    # tiny model everywhere (a smoke test of the script)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-.}"
mkdir -p "$OUT_DIR"
PYTHON="${PYTHON:-python3}"
# The python side stops starting new sections after --budget-s and always writes its report; `timeout` is the
# hard stop (SIGTERM at 470 s, SIGKILL 10 s later) so the whole run stays under 8 minutes.
timeout -k 10 470 "$PYTHON" scripts/gpu_check.py --out "$OUT_DIR" --budget-s 400 "$@"
rc=$?
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
  echo "gpu_check: hard time limit reached; partial output above" >&2
fi
exit $rc

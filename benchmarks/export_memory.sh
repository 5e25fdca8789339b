#!/usr/bin/env bash
# Peak resident memory of a streaming fp16 export (issue 4 goal: < 3 GB for the SDAR-1.7B shape, so SDAR-8B
# exports on a 32 GB Orin). Not run in CI: the 1.7B-shaped checkpoint is 4.06 GB and takes minutes to write.
#
#   benchmarks/export_memory.sh                      # SDAR-1.7B shape in /tmp/spot-export-memory
#   SHAPE=tiny WORK=/tmp/x benchmarks/export_memory.sh   # smoke test in seconds
#   LAYERS=1 benchmarks/export_memory.sh             # 1.7B embedding/lm_head (the largest tensors), 1 layer
#
# Prints one JSON line: shape, checkpoint bytes, export seconds, peak RSS (KiB/GB), goal, pass.
set -euo pipefail
cd "$(dirname "$0")/.."
SHAPE=${SHAPE:-sdar-1.7b}
WORK=${WORK:-/tmp/spot-export-memory}
GOAL_GB=${GOAL_GB:-3}
LAYERS=${LAYERS:-}
tag="$SHAPE${LAYERS:+-L$LAYERS}"
ckpt="$WORK/ckpt-$tag"
out="$WORK/onnx-$tag-fp16"
mkdir -p "$WORK"
if [ ! -f "$ckpt/model.safetensors.index.json" ]; then
  python scripts/make_random_checkpoint.py --shape "$SHAPE" ${LAYERS:+--layers "$LAYERS"} --out "$ckpt" >&2
fi
if command -v spot-export >/dev/null 2>&1; then
  cmd=(spot-export)
else
  cmd=(python -m spot.cli export)
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
log="$WORK/time-$tag.txt"
start=$(date +%s.%N)
/usr/bin/time -v "${cmd[@]}" "$ckpt" --dtype fp16 --no-validate --quiet --overwrite --out "$out" 2> "$log" \
  || { cat "$log" >&2; exit 1; }
end=$(date +%s.%N)
rss_kib=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$log")
ckpt_bytes=$(du -sb "$ckpt" | cut -f1)
python - "$tag" "$ckpt_bytes" "$start" "$end" "$rss_kib" "$GOAL_GB" <<'EOF'
import json, sys
shape, ckpt_bytes, start, end, rss_kib, goal = sys.argv[1:]
gb = int(rss_kib) * 1024 / 1e9
print(json.dumps({"shape": shape, "checkpoint_bytes": int(ckpt_bytes), "export_seconds": round(float(end) - float(start), 1),
                  "peak_rss_kib": int(rss_kib), "peak_rss_gb": round(gb, 3), "goal_gb": float(goal),
                  "pass": gb < float(goal)}))
EOF

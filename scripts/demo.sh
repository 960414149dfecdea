#!/usr/bin/env bash
# Set up everything and run the example pipeline unchanged under torchrun and on an embedded
# Ray cluster (plus the in-process reference), then print the per-step losses side by side.
# Idempotent: the environment is reused when it is up to date.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

ensure_env full --torch ./twinkle_core ./twinkle_local ./twinkle_ray ./twinkle_notify_dingtalk
BIN="$VENVS/full/bin"
OUT="$PWD/.demo"
mkdir -p "$OUT"
unset RAY_ADDRESS
export RAY_USAGE_STATS_ENABLED=0

log "mode local: torchrun --standalone --nproc_per_node=2 examples/rl_pipeline.py"
"$BIN/torchrun" --standalone --nproc_per_node=2 examples/rl_pipeline.py \
  --mode local --out "$OUT/local.json" 2>&1 | tee "$OUT/local.log"

log "mode ray: python examples/rl_pipeline.py --mode ray (embedded local cluster)"
"$BIN/python" examples/rl_pipeline.py --mode ray --out "$OUT/ray.json" 2>&1 | tee "$OUT/ray.log"

log "mode inprocess (the reference semantics)"
"$BIN/python" examples/rl_pipeline.py --mode inprocess --out "$OUT/inprocess.json" \
  > "$OUT/inprocess.log" 2>&1

log "per-step losses"
"$BIN/python" examples/compare_losses.py "$OUT/local.json" "$OUT/ray.json" "$OUT/inprocess.json"
echo
echo "logs and tables: $OUT/{local,ray,inprocess}.{log,json}"

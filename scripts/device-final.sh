#!/usr/bin/env bash
# One GPU call for the record: `orchestrate run phase1` on the CUDA device, then the full
# benchmark grid, then the mma.sync ceilings (kdtree.tools.mma_ceiling). Everything to keep
# lands in $OUT (the new run record, the rendered plan, the bench report, mma_ceiling.json).
set -u
source "$(dirname "$0")/device-env.sh"
OUT=${OUT:-/tmp/kdtree-out}; mkdir -p "$OUT/bench"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
timeout 300 python3 -m kdtree.orchestrator --repo . run phase1 --device cuda 2>&1 | tail -14
newest=$(ls -t plans/results/phase1/2*.json 2>/dev/null | head -1)
[ -n "$newest" ] && cp "$newest" "$OUT/"
cp plans/0002-sm120-verify-kernel-defrag.md "$OUT/" 2>/dev/null
timeout 330 python3 -m kdtree.tools.bench --out "$OUT/bench" --budget-s 280 2>&1 | tail -30
timeout 60 python3 -m kdtree.tools.mma_ceiling --out "$OUT" 2>&1 | tail -25

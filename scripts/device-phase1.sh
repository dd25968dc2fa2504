#!/usr/bin/env bash
# On the GPU machine (no network, no .git): the kernel's correctness table, then
# `orchestrate run phase1` on the CUDA device; the run record and the rendered plan go to $OUT.
#   bash scripts/device-phase1.sh            (carry .whl: pydantic & co. for python 3.12)
set -u
source "$(dirname "$0")/device-env.sh"
OUT=${OUT:-/tmp/kdtree-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout 120 python3 -m kdtree.tools.devcheck --out "$OUT" --variants ws,base16,base32 --impl none 2>&1 | grep -E "BAD|build" 
timeout 540 python3 -m kdtree.orchestrator --repo . run phase1 --device cuda 2>&1 | tail -40
cp plans/results/phase1/*.json "$OUT/" 2>/dev/null
cp plans/0002-sm120-verify-kernel-defrag.md "$OUT/" 2>/dev/null
ls "$OUT"

#!/usr/bin/env bash
# On the GPU machine (no network, no .git): phase 4's GPU tests, then `orchestrate run phase4` on
# the CUDA device (forced: earlier phases need not have passed); run record, log and plan to $OUT.
# At most ~300 s: 110 s of tests, 180 s of the phase run (the last H200 run took 41 s).
#   bash scripts/device-phase4.sh            (carry .whl: pydantic & co. for python 3.12)
set -u
source "$(dirname "$0")/device-env.sh"
OUT=${OUT:-/tmp/kdtree-out}; mkdir -p "$OUT"
LOG="$OUT/phase4.log"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv
  if python3 -c "import pytest" 2>/dev/null; then
    # the GPU tests of the gates (no_slowdown, benefit's interference); the property tests need
    # hypothesis, which this machine lacks
    timeout 110 python3 -m pytest -q -p no:cacheprovider tests/phases/test_phase4_gates.py -m gpu 2>&1 | tail -15
  else
    echo "pytest is not installed here: GPU tests not run"
  fi
  timeout 180 python3 -m kdtree.orchestrator --repo . run phase4 --device cuda --force 2>&1 | tail -60
} 2>&1 | tee "$LOG"
newest=$(ls -t plans/results/phase4/2*.json 2>/dev/null | head -1); [ -n "$newest" ] && cp "$newest" "$OUT/"
cp plans/0002-sm120-verify-kernel-defrag.md "$OUT/" 2>/dev/null
ls "$OUT"

#!/usr/bin/env bash
# On the GPU machine (no network, no .git), one call (<= 560 s): install the carried wheels,
# `orchestrate run phase3` on the CUDA device (--force: earlier phases need not have passed here),
# copy its record and the rendered plan to $OUT, then phase 3's GPU tests with the time left.
# $OUT gets: phase3.log (run + tests), the run record (plans/results/phase3/*.json), the plan.
#   bash scripts/device-phase3.sh        (carry .whl: pydantic & co., pytest, the sglang wheel)
set -u
source "$(dirname "$0")/device-env.sh"
ln -sfn ../integrations "$(dirname "$0")/../kdtree/integrations"
OUT=${OUT:-/tmp/kdtree-out}; mkdir -p "$OUT"
LOG="$OUT/phase3.log"
START=$(date +%s)
BUDGET=${PHASE3_BUDGET:-560}  # seconds for the whole call; the run gets up to 330 of them
RUN_LIMIT=$(( BUDGET - 60 < 330 ? BUDGET - 60 : 330 ))
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$LOG"

# the run first, so its record comes back whatever the tests do
timeout "$RUN_LIMIT" python3 -m kdtree.orchestrator --repo . run phase3 --device cuda --force 2>&1 | tail -60 | tee -a "$LOG"
newest=$(ls -t plans/results/phase3/2*.json 2>/dev/null | head -1)
[ -n "$newest" ] && cp "$newest" "$OUT/"
cp plans/0002-sm120-verify-kernel-defrag.md "$OUT/" 2>/dev/null

# then phase 3's GPU tests with what is left of the budget
LEFT=$(( BUDGET - ($(date +%s) - START) - 10 ))
if [ "$LEFT" -lt 30 ]; then
  echo "no time left for the GPU tests ($LEFT s)" | tee -a "$LOG"
elif python3 -c "import pytest" 2>/dev/null; then
  timeout "$LEFT" python3 -m pytest -q -rs -p no:cacheprovider \
    tests/engine/test_engine_graph_gpu.py tests/integrations/test_sglang_graph_gpu.py \
    tests/gates/test_gate_graph_safety.py tests/phases/test_phase3_gates.py \
    "tests/integrations/test_sglang_gpu.py::test_sglang_kit_mla_eagle_verify_cuda_graph_runs_on_our_kernel" \
    2>&1 | tail -60 | tee -a "$LOG"
else
  echo "pytest is not importable here: carry pytest, pluggy, iniconfig (and packaging) wheels in .whl" | tee -a "$LOG"
fi
echo "total $(( $(date +%s) - START )) s" | tee -a "$LOG"
ls "$OUT"

#!/usr/bin/env bash
# On the GPU machine (no network, no .git), one call: install the carried wheels (sglang 0.5.23
# with --no-deps, pydantic & co.), `orchestrate run phase2` on the CUDA device (--force: phase 1
# has not passed), then phase 2's GPU tests (pytest, if carried). Everything to keep lands in $OUT: phase2.log
# (tests + run), the run record, the rendered plan, sglang-imports.txt (what of SGLang imports here).
#   bash scripts/device-phase2.sh        (carry .whl: the sglang wheel and the small wheels next to it)
set -u
source "$(dirname "$0")/device-env.sh"
ln -sfn ../integrations "$(dirname "$0")/../kdtree/integrations"
OUT=${OUT:-/tmp/kdtree-out}; mkdir -p "$OUT"
LOG="$OUT/phase2.log"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  ls .whl 2>/dev/null | tr '\n' ' '; echo
} 2>&1 | tee "$LOG"

# Which parts of SGLang import on this machine (the kit's imports are reported exactly).
timeout 45 python3 - > "$OUT/sglang-imports.txt" 2>&1 <<'PY'
import importlib, traceback
for name in ["sglang", "sglang.kernels.ops.attention.extend_attention",
             "sglang.srt.layers.attention.triton_backend", "sglang.srt.layers.attention.attention_registry",
             "sglang.test.kits.attention_unittest.attention_methods.mla_attention",
             "sglang.test.kits.attention_unittest.runner_modes.speculative_target_verify_runner"]:
    try:
        importlib.import_module(name); print(f"ok      {name}")
    except BaseException as err:  # noqa: BLE001
        print(f"FAILED  {name}: {type(err).__name__}: {err}")
import sys
sys.path.insert(0, "tests/integrations")
from sglang_kit_imports import import_with_stubs
try:
    _, stubbed = import_with_stubs(["sglang.test.kits.attention_unittest.runner_modes.speculative_target_verify_runner",
                                    "sglang.srt.layers.attention.triton_backend"])
    print("with stubs for missing non-attention modules: ok; stubbed:", stubbed)
except BaseException as err:  # noqa: BLE001
    print(f"with stubs: FAILED: {type(err).__name__}: {err}")
from kdtree.integrations.sglang.sglang_kernels import load_extend_attention
try:
    print("extend_attention_fwd:", load_extend_attention()[1])
except ImportError as err:
    print("extend_attention_fwd: not loadable:", err)
PY
cat "$OUT/sglang-imports.txt" | tee -a "$LOG"

# where an eager verify step spends its time (host vs GPU), per backend, before the run
timeout 120 python3 -m kdtree.tools.step_profile --context 4096 --context 32768 --json "$OUT/step_profile.json" 2>&1 \
  | grep -v Warning | tee -a "$LOG"

# the run first, so its record comes back whatever the tests do
timeout 380 python3 -m kdtree.orchestrator --repo . run phase2 --device cuda --force 2>&1 | tail -40 | tee -a "$LOG"
newest=$(ls -t plans/results/phase2/2*.json 2>/dev/null | head -1)
[ -n "$newest" ] && cp "$newest" "$OUT/"
cp plans/0002-sm120-verify-kernel-defrag.md "$OUT/" 2>/dev/null
# then phase 2's GPU tests with the time left (the device call stops at 600 s).
if python3 -c "import pytest" 2>/dev/null; then
  timeout 130 python3 -m pytest -q -rs -s -p no:cacheprovider \
    tests/integrations/test_sglang_gpu.py tests/integrations/test_sglang_converter.py \
    tests/engine/test_engine_gpu.py -k "not triton_kernels_under_the_interpreter" 2>&1 | tail -40 | tee -a "$LOG"
else
  echo "pytest is not importable here: carry pytest, pluggy, iniconfig (and packaging) wheels in .whl to run the GPU tests" | tee -a "$LOG"
fi

ls "$OUT"

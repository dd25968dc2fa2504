#!/usr/bin/env bash
# One GPU call for the kernel's run-length KV metadata path: its GPU tests (bitwise equal to
# the kv_indices path for every variant, split counts 1 and 3, three layouts; the accuracy suite's
# cuda-runs cases against the fp64 oracle; phase 4's GPU gate tests), then phase 4's no_slowdown
# check at B=8, L=32k with its runs-path figures printed as JSON into $OUT/runs-figures.json.
#   bash scripts/device-runs-check.sh      (carry .whl)
set -u
source "$(dirname "$0")/device-env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/machine.txt"
timeout ${TEST_BUDGET:-300} python3 -m pytest -q -p no:cacheprovider tests/kernels/test_kernel_runs.py \
  tests/kernels/test_kernel_accuracy.py tests/phases/test_phase4_gates.py -m gpu \
  -k "runs or no_slowdown or benefit" --junitxml="$OUT/gpu-runs.xml" 2>&1 | tail -20
timeout ${GATE_BUDGET:-200} python3 - <<'PY' 2>&1 | grep -v Warning | tail -30
import json, os
from kdtree.gates.base import GateContext, run_check
from kdtree.phases import phase4
from kdtree.phases.phase4 import checks as phase4_checks
spec = phase4.SPEC.gate("no_slowdown")
r = run_check(spec, lambda s, c: phase4_checks.check_no_slowdown(s, c, layers=8, repeats=30),
              GateContext(device="cuda"))
figs = {f.name: f.value for f in r.figures}
print(r.outcome, r.summary)
keep = {k: v for k, v in figs.items() if k.startswith(("runs_", "kernel_"))}
print(json.dumps(keep, indent=1))
json.dump({"outcome": str(r.outcome), "summary": r.summary, "figures": figs},
          open(os.path.join(os.environ["OUT"], "runs-figures.json"), "w"), indent=1)
PY

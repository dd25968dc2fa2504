#!/usr/bin/env bash
# The GPU-marked tests on the GPU machine, in two halves that each fit one device call (<= 560 s):
#   bash scripts/device-gpu-suite.sh kernels   kernel variants (wgmma dispatched on 9.0), the phase-1
#                                              gates (accuracy, token_exact with its decision screen,
#                                              speed, sanitizer) and the tools      (carry .whl)
#   bash scripts/device-gpu-suite.sh serving   the engine, SGLang's backend and its attention test kit,
#                                              graph capture, phases 2-4           (carry .whl and .whl-sglang)
# JUnit XML and the summary land in $OUT (suite-<half>.xml, suite-<half>.log).
set -u
HALF=${1:?kernels or serving}
source "$(dirname "$0")/device-env.sh"
START=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/suite-$HALF.log"
python3 -c "import torch; from kdtree.kernels.cuda_op import device_state; device_state(0); print('extension built')" \
  2>&1 | tail -2 | tee -a "$OUT/suite-$HALF.log"
case "$HALF" in
  kernels) TESTS=(tests/kernels tests/phases/test_phase1_gates.py tests/phases/test_phase1_tokens.py
                  tests/phases/test_phase1_coverage.py tests/tools tests/gates) ;;
  serving) TESTS=(tests/engine tests/integrations tests/phases/test_phase2_gates.py tests/phases/test_phase3_gates.py
                  tests/phases/test_phase3_plan.py tests/phases/test_phase4_gates.py) ;;
  *) echo "unknown half '$HALF': kernels or serving"; exit 2 ;;
esac
LEFT=$(( ${SUITE_BUDGET:-560} - ($(date +%s) - START) ))
timeout "$LEFT" python3 -m pytest -q -rs -m gpu -p no:cacheprovider "${TESTS[@]}" --junitxml="$OUT/suite-$HALF.xml" \
  2>&1 | tail -45 | tee -a "$OUT/suite-$HALF.log"
echo "pytest rc=${PIPESTATUS[0]}, $(( $(date +%s) - START )) s" | tee -a "$OUT/suite-$HALF.log"

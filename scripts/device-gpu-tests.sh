#!/usr/bin/env bash
# One GPU call: the kernel's GPU tests after the clean-up (every variant forced through
# cuda_op.launch, forced split counts, the KD_BREAK builds per variant, the smem records against
# the extension), the phase-1 accuracy gate with its coverage cases (every variant, split counts
# of a 188-SM card, a pool past 2^31 elements), and the sanitizer driver. Results land in $OUT.
#   bash scripts/device-gpu-tests.sh          (carry .whl: pydantic & co. for python 3.12)
set -u
source "$(dirname "$0")/device-env.sh"
OUT=${OUT:-/tmp/kdtree-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m kdtree.kernels.build --arch sm_90 --arch sm_120 --sass > "$OUT/build.txt" 2>&1; echo "build rc=$?"
grep -E "==|Used|spill|dynamic|SASS" "$OUT/build.txt"
timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels tests/tools \
  tests/phases/test_phase1_gates.py -k "not token_exact" --junitxml="$OUT/gpu-tests.xml" 2>&1 | tail -25
echo "pytest rc=${PIPESTATUS[0]}"
timeout 120 python3 -m kdtree.tools.sanitize_driver > "$OUT/sanitize_driver.txt" 2>&1; echo "sanitize_driver rc=$?"
grep -c " ok$" "$OUT/sanitize_driver.txt"; grep WRONG "$OUT/sanitize_driver.txt" | head

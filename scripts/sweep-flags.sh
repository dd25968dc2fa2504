#!/usr/bin/env bash
# One GPU call: time the kernel built with each set of experiment flags (KDTREE_NVCC_FLAGS; the
# knobs are in kernels/csrc/knobs.cuh, e.g. -DWS_BN=16 -DWS_STAGES=4 or -DKD_SKIP=8) and each
# variant, on the same configs.
#   CONFIGS="64,16,8,32768;8,16,1,131072" VARIANTS="ws base16" bash scripts/sweep-flags.sh "" "-DKD_SKIP=8"
# Every flag set is built first, in parallel (the JIT cache keys on the flags); "" is the
# production build; VARIANTS empty = the dispatcher's choice. Timing is devcheck's (the tools' queued timer).
set -u
source "$(dirname "$0")/device-env.sh"
OUT=${OUT:-.}
cap=$(python3 -c "import torch; print('sm_%d%d' % torch.cuda.get_device_capability())")
t0=$(date +%s)
for f in "$@"; do
  KDTREE_NVCC_FLAGS="$f" python3 -c "from kdtree.kernels.jit import build_extension; build_extension(['$cap'])" &
done
wait
echo "built $# flag sets in $(( $(date +%s) - t0 )) s"
for v in ${VARIANTS:-auto}; do
  for f in "$@"; do
    echo "==== variant $v  flags '$f'"
    forced=(); [ "$v" = auto ] || forced=(--variant "$v")
    KDTREE_NVCC_FLAGS="$f" python3 -m kdtree.tools.devcheck --time-only --impl cuda "${forced[@]}" \
      ${CONFIGS:+--configs "$CONFIGS"} --quick --out "$OUT/sweep" 2>&1 | grep -E "^H|rror"
  done
done

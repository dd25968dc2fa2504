#!/usr/bin/env bash
# One GPU call that decides between builds of the Hopper wgmma variant: every flag set
# is built for sm_90a in parallel through the JIT loader, checked against the fp64 oracle (devcheck,
# wgmma forced; KD_SKIP builds are measurement builds and skip this), and timed interleaved with
# the ws kernel on tensor-core-bound and bandwidth-bound configs (ratio wgmma / ws per config);
# then compute-sanitizer (racecheck, memcheck) over the sanitizer driver with the first flag set,
# and, when .peers-carry is carried, ours (wgmma forced, first flag set) against FlashInfer
# 0.7.2's FA2/FA3 MLA on the field's shapes (design.md 3b). Logs land in $OUT/hopper-sweep.tgz; the call stays within
# SWEEP_BUDGET seconds (default 560).
#   bash scripts/device-hopper-sweep.sh "" "-DKD_SKIP=8"
# (carry .whl; .peers-carry too for the peers step.) CONFIGS="H,T,B,L;..." overrides the configs.
set -u
BUDGET=${SWEEP_BUDGET:-560}
START=$(date +%s)
source "$(dirname "$0")/device-env.sh"
OUT=${OUT:-/tmp/kdtree-out}; mkdir -p "$OUT"
LOGS=/tmp/hopper-sweep; rm -rf "$LOGS"; mkdir -p "$LOGS"  # packed into $OUT/hopper-sweep.tgz at the end
export KDTREE_CACHE_DIR=${KDTREE_CACHE_DIR:-/tmp/kdtree-jit}
CONFIGS=${CONFIGS:-"64,64,1,32768;64,16,8,32768;16,512,1,32768;128,16,1,32768;8,1024,1,32768;16,64,1,131072;8,16,1,32768"}
[ $# -gt 0 ] || set -- ""
source "$(dirname "$0")/device-steps.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
i=0
for f in "$@"; do
  KDTREE_NVCC_FLAGS="$f" build_sm90a "$i" "$ROOT" &
  i=$((i + 1))
done
wait
echo "built $# flag sets in $(( $(date +%s) - START )) s"

i=0
for f in "$@"; do
  echo "######## flags '$f'"
  KDTREE_NVCC_FLAGS="$f" check_and_time "$i" "$ROOT"
  i=$((i + 1))
done

export KDTREE_NVCC_FLAGS="$1"
for tool in racecheck memcheck; do
  step "$tool" 150 compute-sanitizer --tool "$tool" --error-exitcode 86 python3 -m kdtree.tools.sanitize_driver
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|WRONG|done" "$LOGS/$tool.log" | tail -3
  grep -E "Error|Race|hazard" "$LOGS/$tool.log" | head -4
done

_carry="$(cd "$(dirname "$0")/.." && pwd)/.peers-carry"
if [ -d "$_carry" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fi-tvm "$_carry"/apache_tvm_ffi-*.whl
  python3 -c "import zipfile; zipfile.ZipFile('$_carry/flashinfer-trim.zip').extractall('/tmp/fi-site')"
  export FLASHINFER_JIT_VERBOSE=0 MAX_JOBS=16 PYTHONPATH="/tmp/fi-site:/tmp/fi-tvm:$PYTHONPATH"
  step peers 300 python3 -m kdtree.tools.peers --out "$LOGS" --shapes issue --budget-s 200 --variant wgmma --tag wgmma
  tail -14 "$LOGS/peers.log"
fi
tar czf "$OUT/hopper-sweep.tgz" -C "$LOGS" .
echo "done in $(( $(date +%s) - START ))s"
ls "$OUT"

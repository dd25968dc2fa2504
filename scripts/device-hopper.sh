#!/usr/bin/env bash
# One GPU call for the Hopper (sm_90a, wgmma) variant, on a 9.0 GPU (no network; torch
# cu130, nvcc through the JIT). Every step is bounded by `timeout`, logs land in $OUT, and the
# whole call stays within HOPPER_BUDGET seconds (default 540).
#   bash scripts/device-hopper.sh            build + GPU tests with the variant forced + timing table
#   bash scripts/device-hopper.sh gate       build + phase-1 gates build_sm90a, accuracy, sanitizer
#   bash scripts/device-hopper.sh peers      build + ours (wgmma forced) vs FlashInfer FA2/FA3 MLA
#                                            (also carry .peers-carry, see device-peers.sh)
# (carry .whl: pydantic & co. for python 3.12.) Diagnosis: HOPPER_NVCC_FLAGS=-DWG_V_DESC_SWAP=1
# builds the variant with V's descriptor offsets swapped (if its upper columns come out wrong).
set -u
MODE=${1:-check}
BUDGET=${HOPPER_BUDGET:-540}
START=$(date +%s)
source "$(dirname "$0")/device-env.sh"
OUT=${OUT:-/tmp/kdtree-out}; mkdir -p "$OUT"
export KDTREE_CACHE_DIR=${KDTREE_CACHE_DIR:-/tmp/kdtree-jit}
[ -n "${HOPPER_NVCC_FLAGS:-}" ] && export KDTREE_NVCC_FLAGS="$HOPPER_NVCC_FLAGS"
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
# step NAME CAP CMD...: runs CMD under min(CAP, time left - 10 s), output to $OUT/NAME.log
step() {
  local name=$1 cap=$2; shift 2
  local t=$(( $(left) - 10 )); [ "$t" -gt "$cap" ] && t=$cap
  if [ "$t" -lt 20 ]; then echo "== $name: skipped (budget spent)"; return 99; fi
  echo "== $name (<= ${t}s)"
  timeout --kill-after=5 "$t" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc  ($(( $(date +%s) - START ))s into the call)"
  return $rc
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"

# 1. the JIT loader's build for this device (sm_90a on 9.0), and the variant's resources
step build 240 python3 - <<'PY'
import time, torch
from kdtree.kernels import jit
from kdtree.kernels.cuda_op import device_state
from kdtree.kernels.launch_plan import VARIANTS, runnable_variants
cap = torch.cuda.get_device_capability()
t0 = time.time()
state = device_state(torch.cuda.current_device())
print(f"device {torch.cuda.get_device_name()} cap {cap} -> {jit.arch_for_capability(cap)}, built/loaded in {time.time() - t0:.1f}s")
print("runnable variants:", runnable_variants(cap))
print("shared bytes per variant:", {n: state.ext.shared_bytes(v) for n, v in VARIANTS.items()})
assert "wgmma" in runnable_variants(cap), "not a 9.0 device: the wgmma variant cannot run here"
assert state.ext.shared_bytes(VARIANTS["wgmma"]) > 0, "the loaded extension has no wgmma variant"
PY
BUILD_RC=$?
cat "$OUT/build.log" | tail -8
if [ "$BUILD_RC" != 0 ]; then echo "build failed: see $OUT/build.log"; ls "$OUT"; exit 1; fi

# a first small launch of the variant, so that a hang (a pipeline deadlock) costs 60 s, not the call
step smoke 60 python3 - <<'PY'
import torch
from kdtree.bench.forced import forced_kernel
from kdtree.bench.cases import call, make_case, oracle
for H, reqs, splits in [(8, [(16, 1000)], 1), (16, [(33, 5000)], 3), (3, [(17, 77), (3, 1), (2, 0)], None)]:
    case = make_case(H, reqs, "random", seed=5)
    out = call(forced_kernel("wgmma", splits), case)
    torch.cuda.synchronize()
    ref, _ = oracle(case)
    o = out.double()
    rel = float((o - ref).norm() / ref.norm())
    lo = float((o - ref)[..., :256].norm() / ref[..., :256].norm())
    hi = float((o - ref)[..., 256:].norm() / ref[..., 256:].norm())
    print(f"wgmma H{H} {reqs} splits={splits}: rel-L2 {rel:.2e} (columns <256: {lo:.2e}, >=256: {hi:.2e})",
          "ok" if rel < 1e-2 else "WRONG", flush=True)
PY
SMOKE_RC=$?
cat "$OUT/smoke.log" | tail -5
if [ "$SMOKE_RC" != 0 ]; then echo "the wgmma smoke launch failed or hung (rc $SMOKE_RC): see $OUT/smoke.log"; ls "$OUT"; exit 1; fi

if [ "$MODE" = gate ]; then
  # partial runs (recorded, never deciding the phase's state); the sanitizer last, as time allows
  step gates 420 python3 -m kdtree.orchestrator --repo . run phase1 --device cuda --force \
    --gate build_sm90a --gate accuracy
  tail -30 "$OUT/gates.log"
  step sanitizer 400 python3 -m kdtree.orchestrator --repo . run phase1 --device cuda --force --gate sanitizer
  tail -12 "$OUT/sanitizer.log"
  cp plans/results/phase1/*.json "$OUT/" 2>/dev/null
  ls "$OUT"; exit 0
fi

# 2. the variant against the fp64 oracle (devcheck's table: fresh inputs, NaN-poisoned outputs)
step correctness 120 python3 -m kdtree.tools.devcheck --out "$OUT" --variants wgmma --impl none
grep -E "^(ok |BAD)" "$OUT/correctness.log" | awk '{print $1}' | sort | uniq -c
grep -E "^BAD" "$OUT/correctness.log" | head -12
if [ "$MODE" = peers ]; then
  _carry="$(cd "$(dirname "$0")/.." && pwd)/.peers-carry"
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fi-tvm "$_carry"/apache_tvm_ffi-*.whl
  python3 -c "import zipfile; zipfile.ZipFile('$_carry/flashinfer-trim.zip').extractall('/tmp/fi-site')"
  export FLASHINFER_JIT_VERBOSE=0 MAX_JOBS=16 PYTHONPATH="/tmp/fi-site:/tmp/fi-tvm:$PYTHONPATH"
  step peers 420 python3 -m kdtree.tools.peers --out "$OUT" --shapes issue --budget-s 240 --variant wgmma --tag wgmma
  tail -16 "$OUT/peers.log"; ls "$OUT"; exit 0
fi

# 3. timing: wgmma vs ws vs base32 on the phase-1 speed grid (L >= 32k), interleaved, GPU time
CONFIGS=$(python3 -c "from kdtree.phases.phase1.checks import SPEED_CONFIGS as c; print(';'.join(','.join(map(str, x)) for x in c))")
step timing 180 python3 -m kdtree.tools.devcheck --out "$OUT/timing" --time-only --impl none \
  --compare-variants wgmma,ws,base32 --configs "$CONFIGS"
sed -n '/^config /,$p' "$OUT/timing.log"
grep -iE "error|Traceback" "$OUT/timing.log" | head -5

# 4. the GPU tests with the variant forced (accuracy suite, the sm_90a extension), then its
#    deliberately broken build (KD_BREAK 16: a fresh extension) as time allows
step gpu-tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/kernels/test_kernel_accuracy.py tests/kernels/test_kernel_jit.py -k "wgmma or sm_90a" \
  --junitxml="$OUT/gpu-tests.xml"
tail -6 "$OUT/gpu-tests.log"
step broken-build 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_kernel_broken_builds.py \
  -k "wgmma or correct_build"
tail -4 "$OUT/broken-build.log"
echo "done in $(( $(date +%s) - START ))s"
ls "$OUT"

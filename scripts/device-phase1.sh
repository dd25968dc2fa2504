#!/usr/bin/env bash
# On the GPU machine (no network, no .git): the kernel's correctness table, then
# `orchestrate run phase1` on the CUDA device; the run record and the rendered plan go to $OUT.
#   bash scripts/device-phase1.sh            (carry .whl and .peers-carry: pydantic & co. for
#                                             python 3.12; FlashInfer 0.7.2.post1 trimmed + tvm-ffi)
# With .peers-carry, the speed gate times both dispatches (this GPU's and the sm_120 path) against
# FlashInfer FA2 as built here, FA2 built as on sm_120 (102400 B per SM: a second JIT module in the
# same process, kdtree.bench.flashinfer_peer) and FA3, then measures the mma.sync ceiling; the
# first run on a fresh machine also JIT-builds the three FlashInfer modules (MAX_JOBS=16); with the
# sgl-flash-mla wheel there too, the default dispatch against FlashMLA's dense decode (reported).
# Without it, FlashInfer's targets read "not measured".
set -u
source "$(dirname "$0")/device-env.sh"
OUT=${OUT:-/tmp/kdtree-out}; mkdir -p "$OUT"
_carry="$(cd "$(dirname "$0")/.." && pwd)/.peers-carry"
if [ -d "$_carry" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fi-tvm "$_carry"/apache_tvm_ffi-*.whl
  python3 -c "import zipfile; zipfile.ZipFile('$_carry/flashinfer-trim.zip').extractall('/tmp/fi-site')"
  export PYTHONPATH="/tmp/fi-site:/tmp/fi-tvm:$PYTHONPATH" MAX_JOBS=16 FLASHINFER_JIT_VERBOSE=0
  if ls "$_carry"/sgl_flash_mla-*.whl >/dev/null 2>&1; then  # FlashMLA: phase 1's second Hopper peer
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fmla-site "$_carry"/sgl_flash_mla-*.whl
    export PYTHONPATH="/tmp/fmla-site:$PYTHONPATH"
    python3 -c "from kdtree.bench import flashmla_peer as p; print('flashmla:', p.unavailable_reason() or 'loads')"
  fi
else
  echo "no .peers-carry: FlashInfer's targets will read 'not measured'"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout 120 python3 -m kdtree.tools.devcheck --out "$OUT" --variants ws,base16,base32 --impl none 2>&1 | grep -E "BAD|build" 
timeout "${PHASE1_TIMEOUT_S:-560}" python3 -m kdtree.orchestrator --repo . run phase1 --device cuda 2>&1 | tail -40
cp plans/results/phase1/*.json "$OUT/" 2>/dev/null
cp plans/0002-sm120-verify-kernel-defrag.md "$OUT/" 2>/dev/null
ls "$OUT"

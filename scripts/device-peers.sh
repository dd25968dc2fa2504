#!/usr/bin/env bash
# On the GPU machine: ours (tree) vs FlashInfer 0.7.2 FA2/FA3 MLA (chain), GPU time, one process.
# Carry `.whl` (pydantic & co.) and `.peers-carry` (flashinfer-trim.zip: FlashInfer 0.7.2.post1's
# wheel without data/csrc/*.cu other than batch_mla*, experimental/ and moe_ep/kernel_src/;
# apache_tvm_ffi-0.1.15 cp312 wheel; the sgl-flash-mla 1.0.0 wheel, timed with --flashmla).
#   bash scripts/device-peers.sh [issue|grid|quick] [budget_s] [timeout_s]
# With PEER_SM120_SMEM=1, FA2 is also built as it runs on an sm_120 card: FlashInfer picks its
# tile from the device's shared memory per SM, so the unpacked copy (in /tmp, never this repo)
# is told 102400 B (sm_120's) instead of the H200's 233472 B: 1 stage of 16 keys, not 2 of 64.
# (Phase 1's speed gate needs none of this: it builds that FA2 as a second module in its own
# process, kdtree.bench.flashinfer_peer's smem_per_sm; scripts/device-phase1.sh.)
set -u
# PEER_DEFAULT=0 skips the pass with FlashInfer as the H200 builds it.
source "$(dirname "$0")/device-env.sh"
OUT=${OUT:-/tmp/kdtree-out}; mkdir -p "$OUT"
_carry="$(cd "$(dirname "$0")/.." && pwd)/.peers-carry"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fi-tvm "$_carry"/apache_tvm_ffi-*.whl
python3 -c "import zipfile; zipfile.ZipFile('$_carry/flashinfer-trim.zip').extractall('/tmp/fi-site')"
export FLASHINFER_JIT_VERBOSE=0 MAX_JOBS=16
_fmla=""
if ls "$_carry"/sgl_flash_mla-*.whl >/dev/null 2>&1; then  # FlashMLA's dense decode too (--flashmla)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fmla-site "$_carry"/sgl_flash_mla-*.whl
  export PYTHONPATH="/tmp/fmla-site:$PYTHONPATH"; _fmla=--flashmla
fi
_base="$PYTHONPATH"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
[ "${PEER_DEFAULT:-1}" = 1 ] && PYTHONPATH="/tmp/fi-site:/tmp/fi-tvm:$_base" timeout "${3:-560}" python3 -m kdtree.tools.peers \
  --out "$OUT" --shapes "${1:-issue}" --budget-s "${2:-300}" $_fmla 2>&1 | tail -100
if [ "${PEER_SM120_SMEM:-0}" = 1 ]; then
  python3 -c "import zipfile; zipfile.ZipFile('$_carry/flashinfer-trim.zip').extractall('/tmp/fi-sm120')"
  _h=/tmp/fi-sm120/flashinfer/data/include/flashinfer/attention/mla.cuh
  sed -i 's/cudaDeviceGetAttribute(&smem_limit_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);/smem_limit_per_sm = 102400;/' "$_h"
  grep -c "smem_limit_per_sm = 102400;" "$_h"
  FLASHINFER_WORKSPACE_BASE=/tmp/fiws-sm120 PYTHONPATH="/tmp/fi-sm120:/tmp/fi-tvm:$_base" \
    timeout "${3:-560}" python3 -m kdtree.tools.peers --out "$OUT" --shapes "${1:-issue}" \
    --budget-s "${2:-300}" --backends fa2 --tag sm120smem 2>&1 | tail -40
fi

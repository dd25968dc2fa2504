#!/usr/bin/env bash
# On the GPU machine, one call: `orchestrate run phase1` (with FlashInfer FA2 on the path, so the
# speed gate records the FA2 targets' figures) and `orchestrate run phase4`; records, logs and
# the rendered plan go to $OUT. Carry `.whl` and `.peers-carry` (see scripts/device-peers.sh).
#   bash scripts/device-records.sh [phase1_timeout_s] [phase4_timeout_s]
set -u
source "$(dirname "$0")/device-env.sh"
OUT=${OUT:-/tmp/kdtree-out}; mkdir -p "$OUT"
_carry="$(cd "$(dirname "$0")/.." && pwd)/.peers-carry"
if [ -d "$_carry" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fi-tvm "$_carry"/apache_tvm_ffi-*.whl
  python3 -c "import zipfile; zipfile.ZipFile('$_carry/flashinfer-trim.zip').extractall('/tmp/fi-site')"
  export PYTHONPATH="/tmp/fi-site:/tmp/fi-tvm:$PYTHONPATH" MAX_JOBS=16
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/machine.txt"
timeout "${1:-330}" python3 -m kdtree.orchestrator --repo . run phase1 --device cuda 2>&1 | tail -30 | tee "$OUT/phase1.log"
timeout "${2:-230}" python3 -m kdtree.orchestrator --repo . run phase4 --device cuda --force 2>&1 | tail -30 | tee "$OUT/phase4.log"
for p in phase1 phase4; do
  newest=$(ls -t plans/results/$p/2*.json 2>/dev/null | head -1); [ -n "$newest" ] && cp "$newest" "$OUT/"
done
ls "$OUT"

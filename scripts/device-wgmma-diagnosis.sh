#!/usr/bin/env bash
# Is a token divergence with the wgmma variant dispatched a near-tie or a defect? One device call
# (carry .whl):
#   1. kdtree.tools.variant_audit: teacher-forced logit drift of ws and wgmma against the fp64
#      oracle on phase 2's token_exact prompts, and bitwise reruns (races);
#   2. the recorded phase 1 token_exact trial whose seed the `replay` lines below name, replayed
#      with ws and with wgmma dispatched (plans/results/hopper/20261204-wgmma-near-tie.md);
#   3. phase 2's token_exact gate with wgmma dispatched on fresh seeds (recorded in the output).
# Everything lands in $OUT (variant_audit.json, replay-*.json, diagnosis.log).
# `source scripts/device-wgmma-diagnosis.sh lib` only defines `replay` and `log` for other steps:
#   replay NAME WGMMA(0|1) PHASE GATE SEED...   (orchestrate replay, wgmma dispatched or not)
set -u
source "$(dirname "${BASH_SOURCE[0]}")/device-env.sh"
OUT=${OUT:-/tmp/kdtree-out}; mkdir -p "$OUT"
export KDTREE_CACHE_DIR=${KDTREE_CACHE_DIR:-/tmp/kdtree-jit}
AUDIT_SEEDS=${AUDIT_SEEDS:-6}; PHASE2_TRIALS=${PHASE2_TRIALS:-3}
log() { tee -a "$OUT/diagnosis.log"; }
replay() {  # replay NAME WGMMA(0/1) PHASE GATE SEED...
  local name=$1 wgmma=$2 phase=$3 gate=$4; shift 4
  local args=(); for s in "$@"; do args+=(--seed "$s"); done
  python3 - "$wgmma" replay "$phase" "$gate" "${args[@]}" --device cuda --json > "$OUT/replay-$name.json" 2>>"$OUT/replay-stderr.log" <<'PY'
import sys
import kdtree.kernels.launch_plan as lp
lp.HOPPER_WGMMA_DEFAULT = sys.argv[1] == "1"
from kdtree.orchestrator.cli import main
main(sys.argv[2:])
PY
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], r['outcome'], r['summary'][:300], r['details'].get('seeds_drawn'))" \
    "$OUT/replay-$name.json" "$name" 2>&1 | log
}
[ "${1:-}" = lib ] && return 0
python3 -m kdtree.tools.variant_audit --variants ws,wgmma --seeds "$AUDIT_SEEDS" --repeats 3 --out "$OUT" 2>&1 | grep -v "^prompt\|^oracle" | log
replay phase1-decoy-ws 0 phase1 token_exact 2586297672
replay phase1-decoy-wgmma 1 phase1 token_exact 2586297672
for i in $(seq 1 "$PHASE2_TRIALS"); do
  replay "phase2-wgmma-$i" 1 phase2 token_exact $(od -An -N4 -tu4 /dev/urandom) $(od -An -N4 -tu4 /dev/urandom)
done

#!/usr/bin/env bash
# One GPU call: where each kernel variant's warps wait. For every variant named, ncu reads the
# stall reasons per issued instruction, the tensor-pipe and shared-memory-pipe utilisation and the
# duration of one call of the phase-1 shape H,T,B,L (default 64,16,8,32768: tensor-core bound).
#   bash scripts/profile-stalls.sh [H,T,B,L] [variant ...]      (default variants: ws base16)
# Full reports land in $OUT/stalls_<variant>.txt. Clocks are left alone (--clock-control none).
set -u
source "$(dirname "$0")/device-env.sh"
OUT=${OUT:-.}
shape=${1:-64,16,8,32768}
shift || true
variants=${*:-ws base16}
metrics="regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio"
metrics+=",sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
metrics+=",l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed"
metrics+=",smsp__inst_executed.sum,gpu__time_duration.sum"
for v in $variants; do
  echo "---- $v  (H,T,B,L = $shape)"
  timeout 150 ncu --clock-control none -k regex:tree_verify_mla -c 1 --metrics "$metrics" \
    python3 -m kdtree.tools.devcheck --profile "$shape" --variant "$v" > "$OUT/stalls_$v.txt" 2>&1
  echo "ncu rc=$?"
  # the stall reasons that cost at least 0.05 cycles per issued instruction, then the totals
  grep -E "ratio" "$OUT/stalls_$v.txt" | awk '$NF + 0 >= 0.05'
  grep -E "pct_of_peak|inst_executed|gpu__time_duration" "$OUT/stalls_$v.txt"
done

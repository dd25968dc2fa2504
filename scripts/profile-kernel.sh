#!/usr/bin/env bash
# One GPU call: check every kernel variant against the oracle, profile the compute-bound shape
# with ncu (base and ws variants), then time variants and baselines. Every step has a timeout so a
# hung kernel cannot eat the lease. Run on the GPU machine: bash scripts/profile-kernel.sh
set -u
source "$(dirname "$0")/device-env.sh"
OUT=${OUT:-.}
timeout 150 python3 -m kdtree.tools.devcheck --out "$OUT/chk" --variants base16,base32,ws --impl none 2>&1 | grep -E "BAD|build|Error|error|ok  ws" | head -40
echo "correctness rc=${PIPESTATUS[0]}"
NCU="ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section Occupancy --section MemoryWorkloadAnalysis --section SchedulerStats -k regex:tree_verify_mla -c 1"
timeout 120 $NCU python3 -m kdtree.tools.devcheck --profile 64,64,8,32768 --variant base32 > "$OUT/ncu_base32.txt" 2>&1
timeout 120 $NCU python3 -m kdtree.tools.devcheck --profile 64,64,8,32768 --variant ws > "$OUT/ncu_ws.txt" 2>&1
for f in base32 ws; do echo "---- ncu $f"; grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Warp Cycles Per Issued|Issued Warp|Eligible Warps|No Eligible|Achieved Occupancy|L2 Hit|Registers Per|Stall|pipe" "$OUT/ncu_$f.txt" | head -30; done
timeout 240 python3 -m kdtree.tools.devcheck --out "$OUT" --time-only --time-variants base32,ws 2>&1 | grep -v "^ok "

#!/usr/bin/env bash
# Where does the tree-verify kernel's time go? ncu on a compute-bound and a bandwidth-bound
# shape, then the KD_SKIP variants timed (QK, softmax, PV or loads left out). Run on the GPU machine.
set -u
source "$(dirname "$0")/device-env.sh"
OUT=${OUT:-.}
NCU="ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section Occupancy --section MemoryWorkloadAnalysis --section SchedulerStats -k regex:tree_verify_mla_kernel -c 1"
$NCU python3 -m kdtree.kernels.devcheck --profile 64,64,8,32768 > "$OUT/ncu_compute.txt" 2>&1
KDTREE_VARIANT=ws $NCU python3 -m kdtree.kernels.devcheck --profile 64,64,8,32768 > "$OUT/ncu_ws.txt" 2>&1
grep -E "Duration|Throughput|Pipe|Stall|Warp Cycles|Issued|Eligible|Active Warps|Achieved|L2 Hit|L1/TEX Hit|Registers|Block Limit" "$OUT/ncu_compute.txt" | head -60
echo ----; grep -E "Duration|Throughput|Pipe|Stall|Warp Cycles|Issued|Eligible|Achieved|L2 Hit" "$OUT/ncu_ws.txt" | head -40
for f in ""; do
  KDTREE_NVCC_FLAGS="$f" python3 -m kdtree.kernels.devcheck --out "$OUT" --time-variants base32,ws 2>&1 | grep -v "^ok "
done

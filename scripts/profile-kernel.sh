#!/usr/bin/env bash
# Where does the tree-verify kernel's time go? ncu on a compute-bound and a bandwidth-bound
# shape, then the KD_SKIP variants timed (QK, softmax, PV or loads left out). Run on the GPU machine.
set -u
source "$(dirname "$0")/device-env.sh"
OUT=${OUT:-.}
NCU="ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section Occupancy --section MemoryWorkloadAnalysis --section SchedulerStats -k regex:tree_verify_mla_kernel -c 1"
$NCU python3 -m kdtree.kernels.devcheck --profile 64,64,8,32768 > "$OUT/ncu_compute.txt" 2>&1
$NCU python3 -m kdtree.kernels.devcheck --profile 8,16,1,131072 > "$OUT/ncu_bandwidth.txt" 2>&1
grep -E "Duration|Throughput|Pipe|Stall|Warp Cycles|Issued|Eligible|Active Warps|Achieved|L2 Hit|L1/TEX Hit|Registers|Block Limit" "$OUT/ncu_compute.txt" | head -60
echo ----; grep -E "Duration|DRAM Throughput|Memory Throughput|Stall|Warp Cycles|Eligible|L2 Hit" "$OUT/ncu_bandwidth.txt" | head -20
for f in "" -DKD_SKIP=1 -DKD_SKIP=2 -DKD_SKIP=4 -DKD_SKIP=8 -DKD_SKIP=7; do
  KDTREE_NVCC_FLAGS="$f" python3 -m kdtree.kernels.devcheck --time-only --quick --impl cuda --pool-gb 4 2>&1 | grep -E "nvcc flags|^H"
done

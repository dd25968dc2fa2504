// Host-side launch of the tree-verify kernels. No allocation, no synchronisation: the caller's
// stream, the caller's buffers, so the launch can be captured in a CUDA graph.
#include <cuda_runtime.h>

#include "combine_splits.cuh"
#include "tree_verify_mla_base.cuh"
#include "tree_verify_mla_launch.h"
#include "tree_verify_mla_ws.cuh"
#if KDTREE_SM90A
#include "tree_verify_mla_sm90a.cuh"  // the wgmma variant: sm_90a builds only (kdtree.kernels.jit sets KDTREE_SM90A)
#endif

namespace kdtree {
namespace {

using KernelFn = void (*)(TreeVerifyParams);

// The launchable variants, by id (kdtree.kernels.launch_plan.VARIANTS): kernel, block size and
// the dynamic shared memory it is launched with.
struct Variant {
  KernelFn kernel;
  VariantInfo info;
  int threads() const { return info.threads; }
  int smem() const { return info.smem; }
};
#if KDTREE_SM90A
constexpr int kNumVariants = 5;
#else
constexpr int kNumVariants = 4;
#endif
const Variant kVariants[kNumVariants] = {
    {nullptr, {"", 0, 0, 0, 0}},
    {tree_verify_mla_kernel<1>, {"base16", 1, base::Smem<1>::BM, base::kThreads, base::Smem<1>::total}},
    {tree_verify_mla_kernel<2>, {"base32", 2, base::Smem<2>::BM, base::kThreads, base::Smem<2>::total}},
    // ws: sm_90+ (bulk copy + mbarrier)
    {tree_verify_mla_ws_kernel, {"ws", 3, ws::kGroups * ws::kRows, ws::kThreadsWS, ws::Smem::total}},
#if KDTREE_SM90A
    {tree_verify_mla_wgmma_kernel, {"wgmma", 4, wg::kBM, wg::kThreads, wg::Smem::total}},  // sm_90a only
#endif
};

constexpr int kMaxDevices = 64;
bool configured[kNumVariants][kMaxDevices] = {};  // max dynamic smem raised for (variant, device)

cudaError_t launch_variant(const Variant& v, bool (&done)[kMaxDevices], const TreeVerifyParams& p,
                           cudaStream_t stream) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev >= kMaxDevices || !done[dev]) {
    err = cudaFuncSetAttribute(v.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, v.smem());
    if (err != cudaSuccess) return err;
    if (dev < kMaxDevices) done[dev] = true;
  }
  dim3 grid(p.num_splits, p.grid_y, p.batch);
  v.kernel<<<grid, v.threads(), v.smem(), stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess || p.num_splits == 1 || hooks::kSkipCombine) return err;
  combine_splits_kernel<<<dim3(static_cast<unsigned>(p.total_rows), kCombineQuarters), kCombineThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

constexpr int kMaxGridYZ = 65535;  // CUDA's limit on grid dimensions y and z

cudaError_t launch_tree_verify_mla(const TreeVerifyParams& p, cudaStream_t stream) {
  if (p.total_rows <= 0 || p.batch <= 0 || p.grid_y <= 0 || p.num_splits <= 0 || p.num_splits > kMaxSplits)
    return cudaErrorInvalidValue;
  if (p.grid_y > kMaxGridYZ || p.batch > kMaxGridYZ) return cudaErrorInvalidConfiguration;
  if (p.variant <= 0 || p.variant >= kNumVariants) return cudaErrorInvalidValue;
  return launch_variant(kVariants[p.variant], configured[p.variant], p, stream);
}

int shared_bytes(int variant) { return variant > 0 && variant < kNumVariants ? kVariants[variant].smem() : -1; }

int num_variants() { return kNumVariants - 1; }

VariantInfo variant_info(int variant) {
  return variant > 0 && variant < kNumVariants ? kVariants[variant].info : VariantInfo{"", 0, 0, 0, 0};
}

LaunchLimits launch_limits() { return {kBlockN, kMaxSplits, kMaxGridYZ}; }

// The dynamic shared memory of every kernel in this translation unit, as data in the object
// file: kdtree.kernels.jit reads these records from the compiled binary for the build gate, so
// each kernel is held to the shared memory it is launched with. The names are the kernels'
// mangled names; jit refuses a binary whose records and ptxas' kernels do not match one to one.
struct SmemRecord {
  char tag[16];
  int32_t variant;  // 0: a kernel launched without dynamic shared memory
  int32_t threads;
  int32_t bytes;
  char kernel[116];
};
extern "C" __attribute__((used)) const SmemRecord kdtree_smem_records[] = {
    {"kdtree-smem-v1", 1, base::kThreads, base::Smem<1>::total,
     "_ZN6kdtree22tree_verify_mla_kernelILi1EEEvNS_16TreeVerifyParamsE"},
    {"kdtree-smem-v1", 2, base::kThreads, base::Smem<2>::total,
     "_ZN6kdtree22tree_verify_mla_kernelILi2EEEvNS_16TreeVerifyParamsE"},
    {"kdtree-smem-v1", 3, ws::kThreadsWS, ws::Smem::total, "_ZN6kdtree25tree_verify_mla_ws_kernelENS_16TreeVerifyParamsE"},
#if KDTREE_SM90A
    {"kdtree-smem-v1", 4, wg::kThreads, wg::Smem::total, "_ZN6kdtree28tree_verify_mla_wgmma_kernelENS_16TreeVerifyParamsE"},
#endif
    {"kdtree-smem-v1", 0, kCombineThreads, 0, "_ZN6kdtree21combine_splits_kernelENS_16TreeVerifyParamsE"},
};

}  // namespace kdtree

// Host-side launch of the tree-verify kernels. No allocation, no synchronisation: the caller's
// stream, the caller's buffers, so the launch can be captured in a CUDA graph.
#include <cuda_runtime.h>

#include "tree_verify_mla.cuh"
#include "tree_verify_mla_ws.cuh"
#include "tree_verify_mla_g64.cuh"
#include "tree_verify_mla_launch.h"

namespace kdtree {
namespace {

template <typename Kernel>
cudaError_t launch_kernel(Kernel kernel, int smem, int threads, const TreeVerifyParams& p, int grid_y,
                          cudaStream_t stream, bool (&configured)[64]) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev >= 64 || !configured[dev]) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err != cudaSuccess) return err;
    if (dev < 64) configured[dev] = true;
  }
  dim3 grid(p.num_splits, grid_y, p.batch);
  kernel<<<grid, threads, smem, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess || p.num_splits == 1 || (KD_SKIP & 16)) return err;
  combine_splits_kernel<<<dim3(static_cast<unsigned>(p.total_rows), kCombineQuarters), kCombineThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <int MT>
cudaError_t launch_mt(const TreeVerifyParams& p, int grid_y, cudaStream_t stream) {
  static bool configured[64] = {false};
  return launch_kernel(tree_verify_mla_kernel<MT>, SmemLayout<MT>::total, kThreads, p, grid_y, stream, configured);
}

cudaError_t launch_ws(const TreeVerifyParams& p, int grid_y, cudaStream_t stream) {
  static bool configured[64] = {false};
  return launch_kernel(tree_verify_mla_ws_kernel, ws::Smem::total, ws::kThreadsWS, p, grid_y, stream, configured);
}

cudaError_t launch_g64(const TreeVerifyParams& p, int grid_y, cudaStream_t stream) {
  static bool configured[64] = {false};
  return launch_kernel(tree_verify_mla_g64_kernel, g64::Smem::total, g64::kThreads, p, grid_y, stream, configured);
}

}  // namespace

cudaError_t launch_tree_verify_mla(const TreeVerifyParams& p, int grid_y, int m_tiles, cudaStream_t stream) {
  if (p.total_rows <= 0 || p.batch <= 0 || grid_y <= 0 || p.num_splits <= 0 || p.num_splits > kMaxSplits)
    return cudaErrorInvalidValue;
  if (grid_y > 65535 || p.batch > 65535) return cudaErrorInvalidConfiguration;
  switch (m_tiles) {
    case 1:
      return launch_mt<1>(p, grid_y, stream);
    case 2:
      return launch_mt<2>(p, grid_y, stream);
    case 3:  // warp-specialised, 32 rows per CTA, sm_90+ (bulk copy + mbarrier)
      return launch_ws(p, grid_y, stream);
    case 4:  // 64 rows per CTA in two 32-row groups, sm_90+ (bulk copy + mbarrier)
      return launch_g64(p, grid_y, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

int shared_bytes(int m_tiles) {
  switch (m_tiles) {
    case 1:
      return SmemLayout<1>::total;
    case 2:
      return SmemLayout<2>::total;
    case 3:
      return ws::Smem::total;
    case 4:
      return g64::Smem::total;
    default:
      return -1;
  }
}

}  // namespace kdtree

// The kernel's parameters and the launcher's declaration: host-safe (no device code), shared by
// the CUDA translation unit and the pybind11 bindings.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace kdtree {

struct TreeVerifyParams {
  const __nv_bfloat16* q;     // [Nq, H, 576]
  const __nv_bfloat16* kv;    // [S, 576]
  const int32_t* qo_indptr;   // [B + 1]
  const int32_t* kv_indptr;   // [B + 1]
  const int32_t* kv_indices;  // [sum(L_b + T_b)]
  const int32_t* tree_mask;   // [Nq, W]
  __nv_bfloat16* out;         // [Nq, H, 512]
  float* lse;                 // [Nq, H] or nullptr
  float* ws_o;                // [splits, Nq * H, 512] when splits > 1
  float* ws_lse;              // [splits, Nq * H] when splits > 1
  int64_t total_rows;         // Nq * H
  int num_heads;
  int batch;
  int mask_words;
  int num_splits;
  float scale_log2;  // sm_scale * log2(e)
  // Run-length KV metadata instead of kv_indices (all three set, or all null): request b's keys
  // are its runs kv_run_indptr[b] .. kv_run_indptr[b + 1] - 1 in token order; run r holds keys
  // kv_run_pos[r] .. (the next run's pos) - 1 of its request in slots kv_run_start[r] onwards.
  const int32_t* kv_run_indptr;  // [B + 1]
  const int32_t* kv_run_start;   // [R]
  const int32_t* kv_run_pos;     // [R], 0 for each request's first run, increasing
  // The plan (kdtree.kernels.LaunchPlan), last so that the kernels' view of the fields above is
  // unchanged: row blocks per request (an upper bound from shapes) and the variant's id.
  int grid_y;
  int variant;
};

// Launch p.variant on `stream` with grid (p.num_splits, p.grid_y, p.batch): no allocation, no
// synchronisation. Variants: 1 and 2 the base kernel with 16 or 32 rows per CTA, 3 the
// warp-specialised kernel (32 rows per CTA, sm_90+), 4 the wgmma kernel (64 rows per CTA; only in
// builds for sm_90a, where KDTREE_SM90A is defined; elsewhere 4 is an invalid variant).
cudaError_t launch_tree_verify_mla(const TreeVerifyParams& p, cudaStream_t stream);

// Dynamic shared memory per block of a variant (-1 for an unknown one).
int shared_bytes(int variant);

// One launchable variant as this build has it: what kdtree.kernels.launch_plan plans with.
struct VariantInfo {
  const char* name;  // launch_plan.VARIANTS' key
  int id;            // launch_plan.VARIANTS' value
  int block_m;       // query rows (node x head) per CTA
  int threads;
  int smem;          // dynamic shared memory per block, bytes
};

// The variants this build launches have ids 1 .. num_variants(); variant_info of any other id
// has id 0.
int num_variants();
VariantInfo variant_info(int variant);

// The limits the planner must respect, from the kernels' own constants.
struct LaunchLimits {
  int block_n;      // keys per tile: splits are cut at multiples of it
  int max_splits;   // the most KV splits one launch combines
  int max_grid_yz;  // the most grid_y and batch of one launch
};
LaunchLimits launch_limits();

}  // namespace kdtree

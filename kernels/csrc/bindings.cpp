// Thin pybind11 bindings over raw device pointers: tensors, validation and the choice of
// splits live in Python (kdtree/kernels/cuda_op.py); this file only forwards to the launcher.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "tree_verify_mla_launch.h"

namespace py = pybind11;

namespace {

template <typename T>
T* ptr(std::uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

void launch(kdtree::TreeVerifyParams& p, std::uintptr_t q, std::uintptr_t kv, std::uintptr_t qo_indptr,
            std::uintptr_t kv_indptr, std::uintptr_t kv_indices, std::uintptr_t tree_mask, std::uintptr_t out,
            std::uintptr_t lse, std::uintptr_t ws_o, std::uintptr_t ws_lse, std::int64_t total_rows, int num_heads,
            int batch, int mask_words, int num_splits, int grid_y, int variant, double sm_scale,
            std::uintptr_t stream) {
  p.q = ptr<const __nv_bfloat16>(q);
  p.kv = ptr<const __nv_bfloat16>(kv);
  p.qo_indptr = ptr<const int32_t>(qo_indptr);
  p.kv_indptr = ptr<const int32_t>(kv_indptr);
  p.kv_indices = ptr<const int32_t>(kv_indices);
  p.tree_mask = ptr<const int32_t>(tree_mask);
  p.out = ptr<__nv_bfloat16>(out);
  p.lse = ptr<float>(lse);
  p.ws_o = ptr<float>(ws_o);
  p.ws_lse = ptr<float>(ws_lse);
  p.total_rows = total_rows;
  p.num_heads = num_heads;
  p.batch = batch;
  p.mask_words = mask_words;
  p.num_splits = num_splits;
  p.scale_log2 = static_cast<float>(sm_scale * 1.4426950408889634);
  cudaError_t err = kdtree::launch_tree_verify_mla(p, grid_y, variant, reinterpret_cast<cudaStream_t>(stream));
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("tree_verify_mla launch failed: ") + cudaGetErrorName(err) + ": " +
                             cudaGetErrorString(err));
  }
}

void run(std::uintptr_t q, std::uintptr_t kv, std::uintptr_t qo_indptr, std::uintptr_t kv_indptr,
         std::uintptr_t kv_indices, std::uintptr_t tree_mask, std::uintptr_t out, std::uintptr_t lse,
         std::uintptr_t ws_o, std::uintptr_t ws_lse, std::int64_t total_rows, int num_heads, int batch,
         int mask_words, int num_splits, int grid_y, int variant, double sm_scale, std::uintptr_t stream) {
  kdtree::TreeVerifyParams p{};
  launch(p, q, kv, qo_indptr, kv_indptr, kv_indices, tree_mask, out, lse, ws_o, ws_lse, total_rows, num_heads, batch,
         mask_words, num_splits, grid_y, variant, sm_scale, stream);
}

// The same launch reading run-length KV metadata (kv_indices unused, 0).
void run_runs(std::uintptr_t q, std::uintptr_t kv, std::uintptr_t qo_indptr, std::uintptr_t kv_indptr,
              std::uintptr_t kv_indices, std::uintptr_t tree_mask, std::uintptr_t out, std::uintptr_t lse,
              std::uintptr_t ws_o, std::uintptr_t ws_lse, std::int64_t total_rows, int num_heads, int batch,
              int mask_words, int num_splits, int grid_y, int variant, double sm_scale, std::uintptr_t stream,
              std::uintptr_t kv_run_indptr, std::uintptr_t kv_run_start, std::uintptr_t kv_run_pos) {
  if (!kv_run_indptr || !kv_run_start || !kv_run_pos) throw std::invalid_argument("run_runs: null run metadata");
  kdtree::TreeVerifyParams p{};
  p.kv_run_indptr = ptr<const int32_t>(kv_run_indptr);
  p.kv_run_start = ptr<const int32_t>(kv_run_start);
  p.kv_run_pos = ptr<const int32_t>(kv_run_pos);
  launch(p, q, kv, qo_indptr, kv_indptr, kv_indices, tree_mask, out, lse, ws_o, ws_lse, total_rows, num_heads, batch,
         mask_words, num_splits, grid_y, variant, sm_scale, stream);
}

}  // namespace

PYBIND11_MODULE(_tree_verify_mla, m) {
  m.doc() = "MLA tree-verify attention (raw-pointer launcher; see kdtree.kernels.cuda_op)";
  m.def("run", &run, "Launch tree-verify attention on the given stream (no allocation, no sync)");
  m.def("run_runs", &run_runs, "The same launch reading run-length KV metadata (kv_run_indptr, start, pos)");
  m.def("shared_bytes", &kdtree::shared_bytes, "Dynamic shared memory per block of a variant (-1: unknown)");
  m.attr("block_n") = 32;
}

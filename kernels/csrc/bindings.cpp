// Thin pybind11 bindings over raw device pointers: tensors, validation and the launch plan live
// in Python (kdtree/kernels/cuda_op.py); this file unpacks one parameters struct and forwards it
// to the launcher.
//
// `run(params)` takes the fields of kLaunchFields, in that order, as one tuple (cuda_op's
// `LaunchParams` named tuple); the module publishes the names as `launch_fields`, which cuda_op
// compares with its own when it loads the extension, as it does the variant table (`variants`:
// name, id, rows per CTA, threads, shared memory) and the limits (`block_n`, `max_splits`,
// `max_grid_yz`). The KV layout is whichever is set: kv_indices
// (run pointers 0) or the three run pointers (kv_indices 0).
#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "tree_verify_mla_launch.h"
#include "timeline.cuh"  // the timeline build's buffers (kdtree.bench.timeline reads them)

namespace py = pybind11;

namespace {

enum LaunchField : std::size_t {
  kQ, kKv, kQoIndptr, kKvIndptr, kKvIndices, kTreeMask, kOut, kLse, kWsO, kWsLse,
  kTotalRows, kNumHeads, kBatch, kMaskWords, kNumSplits, kGridY, kVariant, kSmScale, kStream,
  kKvRunIndptr, kKvRunStart, kKvRunPos,
  kNumLaunchFields
};

constexpr const char* kLaunchFields[kNumLaunchFields] = {
    "q", "kv", "qo_indptr", "kv_indptr", "kv_indices", "tree_mask", "out", "lse", "ws_o", "ws_lse",
    "total_rows", "num_heads", "batch", "mask_words", "num_splits", "grid_y", "variant", "sm_scale", "stream",
    "kv_run_indptr", "kv_run_start", "kv_run_pos"};

template <typename T>
T* ptr(const py::tuple& a, LaunchField f) {
  return reinterpret_cast<T*>(a[f].cast<std::uintptr_t>());
}

template <typename T>
T num(const py::tuple& a, LaunchField f) {
  return a[f].cast<T>();
}

void run(const py::tuple& a) {
  if (a.size() != kNumLaunchFields) {
    throw std::invalid_argument("run: expected the " + std::to_string(kNumLaunchFields) +
                                " fields of launch_fields (kdtree.kernels.cuda_op.LaunchParams), got " +
                                std::to_string(a.size()));
  }
  kdtree::TreeVerifyParams p{};
  p.q = ptr<const __nv_bfloat16>(a, kQ);
  p.kv = ptr<const __nv_bfloat16>(a, kKv);
  p.qo_indptr = ptr<const int32_t>(a, kQoIndptr);
  p.kv_indptr = ptr<const int32_t>(a, kKvIndptr);
  p.kv_indices = ptr<const int32_t>(a, kKvIndices);
  p.tree_mask = ptr<const int32_t>(a, kTreeMask);
  p.out = ptr<__nv_bfloat16>(a, kOut);
  p.lse = ptr<float>(a, kLse);
  p.ws_o = ptr<float>(a, kWsO);
  p.ws_lse = ptr<float>(a, kWsLse);
  p.total_rows = num<std::int64_t>(a, kTotalRows);
  p.num_heads = num<int>(a, kNumHeads);
  p.batch = num<int>(a, kBatch);
  p.mask_words = num<int>(a, kMaskWords);
  p.num_splits = num<int>(a, kNumSplits);
  p.scale_log2 = static_cast<float>(num<double>(a, kSmScale) * 1.4426950408889634);
  p.kv_run_indptr = ptr<const int32_t>(a, kKvRunIndptr);
  p.kv_run_start = ptr<const int32_t>(a, kKvRunStart);
  p.kv_run_pos = ptr<const int32_t>(a, kKvRunPos);
  p.grid_y = num<int>(a, kGridY);
  p.variant = num<int>(a, kVariant);
  const int runs_set = (p.kv_run_indptr != nullptr) + (p.kv_run_start != nullptr) + (p.kv_run_pos != nullptr);
  if (runs_set != 0 && runs_set != 3) {
    throw std::invalid_argument("run: kv_run_indptr, kv_run_start and kv_run_pos are set together or not at all");
  }
  if (runs_set == 3 && p.kv_indices != nullptr) {
    throw std::invalid_argument("run: kv_indices must be 0 when the KV runs are set (one KV layout per launch)");
  }
  cudaError_t err =
      kdtree::launch_tree_verify_mla(p, reinterpret_cast<cudaStream_t>(num<std::uintptr_t>(a, kStream)));
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("tree_verify_mla launch failed: ") + cudaGetErrorName(err) + ": " +
                             cudaGetErrorString(err));
  }
}

}  // namespace

PYBIND11_MODULE(_tree_verify_mla, m) {
  m.doc() = "MLA tree-verify attention (raw-pointer launcher; see kdtree.kernels.cuda_op)";
  m.def("run", &run, py::arg("params"),
        "Launch tree-verify attention from the launch_fields tuple, on its stream (no allocation, no sync)");
  m.def("shared_bytes", &kdtree::shared_bytes, "Dynamic shared memory per block of a variant (-1: unknown)");
  namespace tl = kdtree::timeline;
  int shape[6];
  tl::shape(shape);
  m.attr("timeline_shape") = py::make_tuple(shape[0], shape[1], shape[2], shape[3], shape[4], shape[5]);
  m.def("timeline_enabled", &tl::enabled, "Whether this is a timeline build (KD_TIMELINE=1)");
  m.def("timeline_reset", [] {
    const cudaError_t err = tl::reset();
    if (err != cudaSuccess) throw std::runtime_error(std::string("timeline_reset: ") + cudaGetErrorString(err));
  }, "Clear the timeline buffers (before the launch to record)");
  m.def("timeline_read", [shape] {
    const std::size_t hb = 8ull * shape[0] * shape[4], sb = 8ull * shape[0] * shape[1] * (shape[2] + 1) * shape[3];
    std::string header(hb, '\0'), stamps(sb, '\0');
    const cudaError_t err = tl::read(header.data(), hb, stamps.data(), sb);
    if (err != cudaSuccess) throw std::runtime_error(std::string("timeline_read: ") + cudaGetErrorString(err));
    return py::make_tuple(py::bytes(header), py::bytes(stamps));
  }, "(header, stamps) bytes of the timeline buffers (synchronises with the device)");
  py::tuple fields(static_cast<std::size_t>(kNumLaunchFields));
  for (std::size_t i = 0; i < kNumLaunchFields; ++i) fields[i] = py::str(kLaunchFields[i]);
  m.attr("launch_fields") = fields;
  // The variant table and the limits, as this build has them: cuda_op holds launch_plan's copy to
  // them when it loads the extension.
  const int count = kdtree::num_variants();
  py::tuple variants(static_cast<std::size_t>(count));
  for (int v = 1; v <= count; ++v) {
    const kdtree::VariantInfo info = kdtree::variant_info(v);
    variants[v - 1] = py::make_tuple(info.name, info.id, info.block_m, info.threads, info.smem);
  }
  m.attr("variants") = variants;
  const kdtree::LaunchLimits limits = kdtree::launch_limits();
  m.attr("block_n") = limits.block_n;
  m.attr("max_splits") = limits.max_splits;
  m.attr("max_grid_yz") = limits.max_grid_yz;
}

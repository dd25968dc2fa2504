// The split-combine pass: merges the KV splits' fp32 partials of every variant by their
// log-sum-exp into bf16 out (and lse).
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <math_constants.h>

#include "tree_verify_mla_common.cuh"

namespace kdtree {

// Merge the splits' normalised partials by their log-sum-exp. Grid (rows, kCombineQuarters):
// a CTA owns 128 value dims of one row; its four warps take every fourth split (a lane four
// dims, so a warp reads 512 contiguous bytes per split) with kCombineUnroll loads in flight, and
// meet in shared memory. The weights exp(lse_s - max) are computed once per CTA. One CTA per row
// with one load in flight per thread is latency-bound: with many splits it took longer than the
// main kernel.
constexpr int kCombineThreads = 32 * KD_COMBINE_WARPS;  // KD_COMBINE_WARPS, KD_COMBINE_UNROLL: knobs.cuh
constexpr int kCombineQuarters = kValueDim / 128;
constexpr int kCombineUnroll = KD_COMBINE_UNROLL;
constexpr int kMaxSplits = 1024;

__global__ void __launch_bounds__(kCombineThreads) combine_splits_kernel(const TreeVerifyParams p) {
  __shared__ float s_w[kMaxSplits];
  __shared__ float s_red[kCombineThreads / 32];
  __shared__ float4 s_o[kCombineThreads / 32][32];
  const int64_t row = blockIdx.x;
  if (row >= p.total_rows) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  constexpr int kWarps = kCombineThreads / 32;
  const int S = min(p.num_splits, kMaxSplits);

  float mx = -CUDART_INF_F;
  for (int s = tid; s < S; s += kCombineThreads) {
    const float v = p.ws_lse[s * p.total_rows + row];
    s_w[s] = v;
    mx = fmaxf(mx, v);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  if (lane == 0) s_red[warp] = mx;
  __syncthreads();
  mx = s_red[0];
#pragma unroll
  for (int k = 1; k < kWarps; ++k) mx = fmaxf(mx, s_red[k]);
  float wpart = 0.f;
  for (int s = tid; s < S; s += kCombineThreads) {
    const float v = s_w[s];
    const float w = (v == -CUDART_INF_F || mx == -CUDART_INF_F) ? 0.f : __expf(v - mx);
    s_w[s] = w;
    wpart += w;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) wpart += __shfl_xor_sync(0xffffffffu, wpart, off);
  __syncthreads();  // everyone has read s_red (the max) and written its weights
  if (lane == 0) s_red[warp] = wpart;
  __syncthreads();
  float wsum = 0.f;
#pragma unroll
  for (int k = 0; k < kWarps; ++k) wsum += s_red[k];

  const int d = blockIdx.y * 128 + lane * 4;
  const float* base = p.ws_o + row * kValueDim + d;
  const int64_t stride = p.total_rows * kValueDim;
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = warp; s0 < S; s0 += kWarps * kCombineUnroll) {
    // All loads of the round are issued before the first use. They are unconditional (a split
    // past S re-reads split s0); an empty split's partial was never written and may hold
    // anything, so its contribution is selected away, never multiplied by a zero weight.
    float4 v[kCombineUnroll];
#pragma unroll
    for (int u = 0; u < kCombineUnroll; ++u) {
      const int s = s0 + u * kWarps;
      v[u] = *reinterpret_cast<const float4*>(base + (s < S ? s : s0) * stride);
    }
#pragma unroll
    for (int u = 0; u < kCombineUnroll; ++u) {
      const int s = s0 + u * kWarps;
      const float w = s < S ? s_w[s] : 0.f;
      if (w > 0.f) {
        o.x += w * v[u].x;
        o.y += w * v[u].y;
        o.z += w * v[u].z;
        o.w += w * v[u].w;
      }
    }
  }
  s_o[warp][lane] = o;
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int k = 1; k < kWarps; ++k) {
    const float4 x = s_o[k][lane];
    o.x += x.x;
    o.y += x.y;
    o.z += x.z;
    o.w += x.w;
  }
  const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
  uint2 packed;
  packed.x = pack_bf16x2(o.x * inv, o.y * inv);
  packed.y = pack_bf16x2(o.z * inv, o.w * inv);
  *reinterpret_cast<uint2*>(p.out + row * kValueDim + d) = packed;
  if (blockIdx.y == 0 && lane == 0 && p.lse) p.lse[row] = wsum > 0.f ? mx + __logf(wsum) : -CUDART_INF_F;
}

}  // namespace kdtree

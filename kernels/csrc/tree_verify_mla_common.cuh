// What every tree-verify kernel variant shares: the problem's constants, the CTA's work range,
// the tree-mask visibility test, the query fragments, the online softmax and the epilogue.
// The variants (tree_verify_mla_base.cuh, tree_verify_mla_ws.cuh) differ only in how they load
// KV tiles and lay out their warps; the numerics live here, once.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <math_constants.h>

#include "mma_sm80.cuh"
#include "knobs.cuh"
#include "timeline.cuh"
#include "tree_verify_mla_launch.h"

namespace kdtree {

constexpr int kHeadDim = 576;
constexpr int kValueDim = 512;
constexpr int kBlockN = 32;          // splits are cut at multiples of this many keys
constexpr int kKRow = kHeadDim + 8;  // padded smem row (1168 B): conflict-free ldmatrix
constexpr int kDimSlices = 4;        // QK k-split: four warps each own 144 of the 576 dims
constexpr int kStepsPerSlice = kHeadDim / 16 / kDimSlices;  // 9 MMA k-steps per slice
constexpr int kMaxSharedBytes = 101376;                     // sm_120's per-block limit

// What one CTA works on: its request's query rows [row0, row0 + bm) and its KV split
// [kbeg, kend) of the request's N = Lp + T slots.
struct BlockRange {
  int qo0, T, rows, row0, kv0, Lp, kbeg, kend;
  int64_t grow0;  // global index of row0
};

// False when the CTA has nothing to do: no rows, a malformed request, or an empty split (whose
// partial lse it marks massless, so combine_splits skips it).
__device__ __forceinline__ bool block_range(const TreeVerifyParams& p, int split, int rb, int b, int bm,
                                            BlockRange& r) {
  r.qo0 = p.qo_indptr[b];
  r.T = p.qo_indptr[b + 1] - r.qo0;
  r.rows = r.T * p.num_heads;
  r.row0 = rb * bm;
  if (r.T <= 0 || r.row0 >= r.rows) return false;
  r.kv0 = p.kv_indptr[b];
  const int N = p.kv_indptr[b + 1] - r.kv0;
  r.Lp = N - r.T;
  if (r.Lp < 0) return false;
  int chunk = (N + p.num_splits - 1) / p.num_splits;
  chunk = (chunk + kBlockN - 1) / kBlockN * kBlockN;
  r.kbeg = split * chunk;
  r.kend = min(N, r.kbeg + chunk);
  r.grow0 = static_cast<int64_t>(r.qo0) * p.num_heads + r.row0;
  if (r.kbeg >= r.kend) {
    const int t = threadIdx.x;
    if (t < bm && r.row0 + t < r.rows) p.ws_lse[split * p.total_rows + r.grow0 + t] = -CUDART_INF_F;
    return false;
  }
  return true;
}

// Where one request's slot ids come from: its kv_indices (one id per key), or its runs when the
// call passes run-length metadata (TreeVerifyParams::kv_run_indptr set).
struct SlotSource {
  const int32_t* idx;    // this request's kv_indices, or nullptr for runs
  const int32_t* start;  // this request's runs: first slot
  const int32_t* pos;    // and first key
  int runs;
};

__device__ __forceinline__ SlotSource slot_source(const TreeVerifyParams& p, int b, int kv0) {
  if (p.kv_run_indptr == nullptr) return SlotSource{p.kv_indices + kv0, nullptr, nullptr, 0};
  const int r0 = __ldg(p.kv_run_indptr + b);
  return SlotSource{nullptr, p.kv_run_start + r0, p.kv_run_pos + r0, __ldg(p.kv_run_indptr + b + 1) - r0};
}

// Slot of key j of the request (0 <= j < N): one load from kv_indices, or a binary search for the
// last run that starts at or before j (log2(runs) dependent loads; none for a single run).
__device__ __forceinline__ int slot_at(const SlotSource& s, int j) {
  if (s.idx != nullptr) return __ldg(s.idx + j);
  int lo = 0, hi = s.runs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (__ldg(s.pos + mid) <= j) lo = mid;
    else hi = mid - 1;
  }
  return __ldg(s.start + lo) + (j - __ldg(s.pos + lo));
}

// Visibility of keys j0 .. j0 + n - 1 (n <= 32) for a query row whose packed tree-mask row is
// `mask_row`: bit k set = key j0 + k visible. Prefix keys (j < Lp) are always visible; tree key
// j is visible when bit j - Lp of the row is set.
__device__ __forceinline__ uint64_t tree_visible_bits(const int32_t* mask_row, int mask_words, int j0, int n,
                                                      int Lp) {
  uint64_t bits = ~0ull;
  if (j0 + n > Lp) {
    const int tj = max(j0 - Lp, 0);
    const int w = tj >> 5;
    const uint32_t lo = static_cast<uint32_t>(__ldg(mask_row + w));
    const uint32_t hi = (w + 1 < mask_words) ? static_cast<uint32_t>(__ldg(mask_row + w + 1)) : 0u;
    const uint64_t word = (static_cast<uint64_t>(hi) << 32 | lo) >> (tj & 31);
    const int shift = j0 - Lp;  // may be negative: the first -shift keys are prefix
    bits = shift >= 0 ? word : ((word << (-shift)) | ((1ull << (-shift)) - 1));
  }
  return hooks::visible_bits(bits, j0, n, Lp);
}

// Whether a tile of keys j0 .. j0 + n - 1 needs the mask test at all: it reaches the tree (keys
// >= Lp) or the split's end (keys >= kend, the partial tail). Prefix tiles inside the split are
// all visible, so most tiles skip the test; the answer is the same for every thread of the CTA (a
// uniform branch). Rows past the request compute finite scores there (their q is zeros) that are
// never stored.
__device__ __forceinline__ bool tile_needs_mask(int j0, int n, int Lp, int kend) {
  return hooks::kMaskEveryTile || j0 + n > min(Lp, kend);
}

// The same test one key at a time: key j for a query row whose packed tree-mask row is
// `mask_row`, where `in_range` says the row exists and j is inside the CTA's split.
__device__ __forceinline__ bool tree_key_visible(const int32_t* mask_row, int j, int Lp, bool in_range) {
  bool vis = in_range && !(hooks::kHidePrefix && j < Lp);
  if (vis && j >= Lp) {
    const int tj = hooks::tree_bit(j - Lp);
    vis = (__ldg(mask_row + (tj >> 5)) >> (tj & 31)) & 1;
  }
  return vis;
}

// This thread's A fragments of one 16-row MMA tile of q over QK dim slice `ks`, held in
// registers for the whole kernel: global rows `grow_g` (valid: `a_valid`) and `grow_g + 8`
// (`b_valid`); rows past the request are zeros.
__device__ __forceinline__ void load_q_slice(uint32_t (&qf)[kStepsPerSlice][4], const __nv_bfloat16* q,
                                             int64_t grow_g, bool a_valid, bool b_valid, int ks, int t4) {
  const uint32_t* qa = reinterpret_cast<const uint32_t*>(q + grow_g * kHeadDim);
  const uint32_t* qb = qa + 8 * kHeadDim / 2;
#pragma unroll
  for (int kk = 0; kk < kStepsPerSlice; ++kk) {
    const int d = (ks * kStepsPerSlice + kk) * 16 + 2 * t4;
    qf[kk][0] = a_valid ? __ldg(qa + d / 2) : 0u;
    qf[kk][1] = b_valid ? __ldg(qb + d / 2) : 0u;
    qf[kk][2] = a_valid ? __ldg(qa + d / 2 + 4) : 0u;
    qf[kk][3] = b_valid ? __ldg(qb + d / 2 + 4) : 0u;
  }
}

// -inf, for the class templates below (nvcc's host pass does not see CUDART_INF_F's intrinsic).
__device__ __forceinline__ float minus_infinity() { return -CUDART_INF_F; }

// The online softmax (running max and sum, log2 units) of one query row whose keys are spread
// over TPR neighbouring lanes, KPT consecutive keys each. With kLazyLog2 > 0 the running max
// moves only when a tile's max exceeds it by more than kLazyLog2 (log2 units), so most tiles need
// no O rescale (P <= 2^kLazyLog2 stays exact enough in bf16, l in fp32); with 0 it is the tile's
// max every time and O is rescaled on every tile (FlashAttention-2's form).
//
// kMaskWindow: the tree mask is read as one window of bits for the thread's keys
// (tree_visible_bits), else key by key (tree_key_visible); the two give the same visibility.
// The max is taken over the raw scores and scaled once (scale > 0, so it is the max of the scaled
// scores, rounding included); each P is then one FFMA (s * scale - m) and one ex2.approx.
template <int KPT, int TPR, int kLazyLog2, bool kMaskWindow>
struct OnlineSoftmax {
  float m;  // the row's running max
  float l;  // this thread's share of the row sum (alpha is the row's): summed at the end

  __device__ __forceinline__ OnlineSoftmax() : m(minus_infinity()), l(0.f) {}

  // Mask and scale the raw scores `s` of keys j0 .. j0 + KPT - 1 and turn them into P (in place).
  // `masked`: the tile needs the mask test (tile_needs_mask; the same for the whole CTA).
  // Returns the factor the row's O accumulator must be rescaled by (exactly 1 when m stayed).
  __device__ __forceinline__ float update(float (&s)[KPT], const int32_t* mask_row, int mask_words, int j0,
                                          int Lp, int kend, bool row_valid, float scale_log2, bool masked) {
    float tmax = minus_infinity();
    if (masked) {
      uint64_t bits = 0;
      if constexpr (kMaskWindow) bits = tree_visible_bits(mask_row, mask_words, j0, KPT, Lp);
#pragma unroll
      for (int k = 0; k < KPT; ++k) {
        const int j = j0 + k;
        bool vis;
        if constexpr (kMaskWindow)
          vis = row_valid && j < kend && ((bits >> k) & 1);
        else
          vis = tree_key_visible(mask_row, j, Lp, row_valid && j < kend);
        s[k] = vis ? s[k] : minus_infinity();
        tmax = fmaxf(tmax, s[k]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < KPT; ++k) tmax = fmaxf(tmax, s[k]);
    }
#pragma unroll
    for (int off = TPR / 2; off > 0; off >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
    const float scale = scale_log2 * hooks::kScoreScale;
    const float m_new = fmaxf(m, tmax * scale);
    float alpha = 1.f;
    float m_use;
    if constexpr (kLazyLog2 > 0) {
      if (m_new > m + kLazyLog2) {
        alpha = fast_exp2(m - m_new);
        m = m_new;
      }
      m_use = m == minus_infinity() ? 0.f : m;
    } else {
      m_use = m_new == minus_infinity() ? 0.f : m_new;
      alpha = fast_exp2(m - m_use);
      m = m_new;
    }
    float psum = 0.f;
#pragma unroll
    for (int k = 0; k < KPT; ++k) {
      s[k] = fast_exp2(fmaf(s[k], scale, -m_use));
      psum += s[k];
    }
    l = l * alpha + psum;
    return alpha;
  }

  // The row's sum over its TPR lanes (call once, after the last tile).
  __device__ __forceinline__ float row_sum() const {
    float sum = l;
#pragma unroll
    for (int off = TPR / 2; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    return sum;
  }
};

// P of KPT consecutive keys, as bf16, to its row of sP.
template <int KPT>
__device__ __forceinline__ void store_p(__nv_bfloat16* dst, const float (&s)[KPT]) {
  if constexpr (KPT == 4) {
    uint2 pk;
    pk.x = pack_bf16x2(s[0], s[1]);
    pk.y = pack_bf16x2(s[2], s[3]);
    *reinterpret_cast<uint2*>(dst) = pk;
  } else {
#pragma unroll
    for (int k = 0; k < KPT; k += 2) *reinterpret_cast<uint32_t*>(dst + k) = pack_bf16x2(s[k], s[k + 1]);
  }
}

// O *= alpha for this thread's two rows of an accumulator tile (a0: row g, a1: row g + 8).
template <int NT>
__device__ __forceinline__ void rescale_rows(float (&acc)[NT][4], float a0, float a1) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    acc[nt][0] *= a0;
    acc[nt][1] *= a0;
    acc[nt][2] *= a1;
    acc[nt][3] *= a1;
  }
}

// The epilogue's store of one row: this thread's 2 x NT values of row `grow` (columns
// col + 8 nt, col + 8 nt + 1 of the accumulator fragment's `half`), normalised by 1 / l, as bf16
// into out (one split) or as this split's fp32 partial into ws_o; with `with_lse` also the row's
// natural log-sum-exp (m is the running max in log2 units, read only then).
template <int NT>
__device__ __forceinline__ void store_row(const TreeVerifyParams& p, int split, int64_t grow, int col,
                                          const float (&acc)[NT][4], int half, const float* m, float l,
                                          bool with_lse) {
  const float inv = l > 0.f ? 1.f / l : 0.f;
  if (p.num_splits == 1) {
    __nv_bfloat16* o = p.out + grow * kValueDim + col;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      *reinterpret_cast<uint32_t*>(o + nt * 8) = pack_bf16x2(acc[nt][2 * half] * inv, acc[nt][2 * half + 1] * inv);
  } else {
    float* o = p.ws_o + (split * p.total_rows + grow) * kValueDim + col;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      *reinterpret_cast<float2*>(o + nt * 8) = make_float2(acc[nt][2 * half] * inv, acc[nt][2 * half + 1] * inv);
  }
  if (!with_lse) return;
  constexpr float kLn2 = 0.6931471805599453f;
  const float lse = l > 0.f ? (*m + log2f(l)) * kLn2 : -CUDART_INF_F;
  if (p.num_splits == 1) {
    if (p.lse) p.lse[grow] = lse;
  } else {
    p.ws_lse[split * p.total_rows + grow] = lse;
  }
}

// The epilogue of one 16-row accumulator tile: rows rt + g and rt + g + 8 of a block of query
// rows whose first row is request row `row0` (global row `grow0`), skipping rows at or past the
// request's `rows`; sM / sL hold the block's rows' running max and sum. `last_tile`: the tile
// holds the CTA's last row (for hooks::drops_row).
template <int NT>
__device__ __forceinline__ void store_tile(const TreeVerifyParams& p, int split, int64_t grow0, int row0, int rows,
                                           int rt, int g, int col, const float (&acc)[NT][4], const float* sM,
                                           const float* sL, bool with_lse, bool last_tile) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = rt + g + half * 8;
    if (row0 + r >= rows || hooks::drops_row(last_tile && r == rt + 15)) continue;
    store_row(p, split, grow0 + r, col, acc, half, sM + r, sL[r], with_lse);
  }
}

}  // namespace kdtree

// MLA tree-verify attention: the kernel, on raw pointers (no torch, no pybind11).
//
// One CTA owns BM = 16*MT query rows of one request (rows = tree node x head, contiguous in q)
// and one split of the request's KV list. KV tiles of BN = 32 latent rows (576 bf16 each) are
// gathered by slot id with cp.async into a two-stage shared-memory ring, and each tile serves
// every row of the CTA: the latent is read once per row block, never once per head.
//
// Per tile, 8 warps:
//   QK   warp (ks, kh) multiplies its 32 query rows, dims [144 ks, 144 ks + 144), held in
//        registers for the whole kernel, with keys [16 kh, 16 kh + 16); the four dim slices'
//        partial scores meet in shared memory (sRed).
//   soft every row is owned by 256/BM threads: sum the partials, scale, apply the prefix /
//        tree-bit mask, online softmax (running max and sum in registers), P as bf16 -> sP.
//   PV   warp w accumulates O[:, 64 w : 64 w + 64] += P V with V = the tile's first 512 dims,
//        read transposed from the same shared-memory tile.
// With one split the CTA writes bf16 out (and lse); with several it writes fp32 partials and a
// second pass (combine_splits) merges them by their log-sum-exp.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <math_constants.h>

#include "mma_sm80.cuh"
#include "tree_verify_mla_launch.h"

// Measurement-only switch (never set in a real build): KD_SKIP bit 1 drops the QK MMAs, 2 the
// softmax, 4 the PV MMAs, 8 the tile loads, 16 the split-combine pass (what combining inside
// the kernel could save at most); timing the variants apportions the kernel's time.
#ifndef KD_SKIP
#define KD_SKIP 0
#endif
// Deliberately broken builds for the gates' own tests (never set in a real build): KD_BREAK bit 1
// reads the wrong tree-mask bit, 2 hides the prefix, 4 scales the scores wrongly, 8 leaves the
// last row of every CTA unwritten.
#ifndef KD_BREAK
#define KD_BREAK 0
#endif

namespace kdtree {

constexpr int kHeadDim = 576;
constexpr int kValueDim = 512;
constexpr int kBlockN = 32;
constexpr int kThreads = 256;
constexpr int kKRow = kHeadDim + 8;  // padded smem row (1168 B): conflict-free ldmatrix
constexpr int kRedStride = 40;       // floats per sRed row
constexpr int kPStride = 40;         // bf16 per sP row (80 B)
constexpr int kDimSlices = 4;        // QK k-split
constexpr int kStepsPerSlice = kHeadDim / 16 / kDimSlices;  // 9
constexpr int kChunksPerRow = kHeadDim / 8;                 // 72 x 16 B
constexpr int kChunksPerThread = kBlockN * kChunksPerRow / kThreads;  // 9
static_assert(kBlockN * kChunksPerRow % kThreads == 0, "tile load must split evenly");

template <int MT>
struct SmemLayout {
  static constexpr int BM = 16 * MT;
  static constexpr int k_bytes = 2 * kBlockN * kKRow * 2;
  static constexpr int red_bytes = kDimSlices * BM * kRedStride * 4;
  static constexpr int p_bytes = BM * kPStride * 2;
  static constexpr int stats_bytes = 3 * BM * 4;
  static constexpr int total = k_bytes + red_bytes + p_bytes + stats_bytes;
};
static_assert(SmemLayout<2>::total <= 101376, "must fit sm_120's per-block shared memory");

// What one CTA works on: its request's query rows [row0, row0 + bm) and its KV split
// [kbeg, kend) of the request's N = Lp + T slots. Shared by every variant.
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

// Fill a bulk-copy ring before the main loop. Normally zeros: rows past the split's end are
// never copied and must hold finite values (P = 0). KD_SKIP 8 builds never copy at all, so they
// get small pseudo-random values instead, keeping the tensor cores' data (and power) realistic.
__device__ __forceinline__ void init_ring(void* ring, int bytes, int tid, int nthreads) {
  uint4* r = reinterpret_cast<uint4*>(ring);
  for (int i = tid; i < bytes / 16; i += nthreads) {
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (KD_SKIP & 8) {
      uint32_t h = static_cast<uint32_t>(i) * 2654435761u;
      v.x = (h & 0x807f807fu) | 0x3c003c00u;  // bf16 pairs with |x| in [0.0078, 0.016)
      v.y = v.x ^ 0x80008000u;
      v.z = ((h >> 7) & 0x807f807fu) | 0x3c003c00u;
      v.w = v.z ^ 0x00008000u;
    }
    r[i] = v;
  }
}

// Visibility of keys j0 .. j0 + n - 1 (n <= 32) for a query row whose packed tree-mask row is
// `mask_row`: bit k set = key j0 + k visible. Prefix keys (j < Lp) are always visible; tree key
// j is visible when bit j - Lp of the row is set. KD_BREAK 1 and 2 corrupt it (gate tests only).
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
    if (KD_BREAK & 1) bits = ((bits >> 1) & 0x5555555555555555ull) | ((bits << 1) & 0xAAAAAAAAAAAAAAAAull);
  }
  if (KD_BREAK & 2) {
    for (int k = 0; k < n; ++k)
      if (j0 + k < Lp) bits &= ~(1ull << k);
  }
  return bits;
}

// The epilogue's store of one row: this thread's 2 x NT values of row `grow` (columns
// col + 8 nt, col + 8 nt + 1 of the accumulator fragment's `half`), normalised by 1 / l, as bf16
// into out (one split) or as this split's fp32 partial into ws_o; with `with_lse` also the row's
// natural log-sum-exp (m is the running max in log2 units, read only then). Shared by every variant.
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

template <int MT>
__global__ void __launch_bounds__(kThreads, 1) tree_verify_mla_kernel(const TreeVerifyParams p) {
  constexpr int BM = 16 * MT;
  constexpr int TPR = kThreads / BM;  // threads per row in the softmax phase
  constexpr int KPT = kBlockN / TPR;  // keys per thread in the softmax phase
  using L = SmemLayout<MT>;

  extern __shared__ __align__(16) uint8_t smem[];
  __nv_bfloat16* sK = reinterpret_cast<__nv_bfloat16*>(smem);
  float* sRed = reinterpret_cast<float*>(smem + L::k_bytes);
  __nv_bfloat16* sP = reinterpret_cast<__nv_bfloat16*>(smem + L::k_bytes + L::red_bytes);
  float* sAlpha = reinterpret_cast<float*>(smem + L::k_bytes + L::red_bytes + L::p_bytes);
  float* sL = sAlpha + BM;
  float* sM = sL + BM;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int split = blockIdx.x, rb = blockIdx.y, b = blockIdx.z;

  BlockRange br;
  if (!block_range(p, split, rb, b, BM, br)) return;
  const int qo0 = br.qo0, T = br.T, rows = br.rows, row0 = br.row0, kv0 = br.kv0, Lp = br.Lp;
  const int kbeg = br.kbeg, kend = br.kend;
  const int64_t grow0 = br.grow0;

  // ---- query fragments for this warp's dim slice, for the whole kernel ----
  const int ks = warp & 3, kh = warp >> 2;
  uint32_t qf[MT][kStepsPerSlice][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int ra = row0 + mt * 16 + g, rb8 = ra + 8;
    const uint32_t* qa = reinterpret_cast<const uint32_t*>(p.q + (grow0 + mt * 16 + g) * kHeadDim);
    const uint32_t* qb = qa + 8 * kHeadDim / 2;
#pragma unroll
    for (int kk = 0; kk < kStepsPerSlice; ++kk) {
      const int d = (ks * kStepsPerSlice + kk) * 16 + 2 * t4;
      qf[mt][kk][0] = ra < rows ? __ldg(qa + d / 2) : 0u;
      qf[mt][kk][1] = rb8 < rows ? __ldg(qb + d / 2) : 0u;
      qf[mt][kk][2] = ra < rows ? __ldg(qa + d / 2 + 4) : 0u;
      qf[mt][kk][3] = rb8 < rows ? __ldg(qb + d / 2 + 4) : 0u;
    }
  }

  // ---- softmax-phase ownership: row sr, keys [sc * KPT, sc * KPT + KPT) ----
  const int sr = tid / TPR, sc = tid % TPR;
  const bool srow_valid = row0 + sr < rows;
  const int snode = (row0 + sr) / p.num_heads;
  const int32_t* mask_row = p.tree_mask + static_cast<int64_t>(qo0 + min(snode, T - 1)) * p.mask_words;
  float m_run = -CUDART_INF_F, l_run = 0.f;

  // ---- tile loader: slot ids are fetched one tile ahead of the copy that needs them ----
  const int32_t* idx = p.kv_indices + kv0;
  int slot_next[kChunksPerThread];
  auto fetch_slots = [&](int tile_base) {
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
      const int key = (tid + i * kThreads) / kChunksPerRow;
      const int j = tile_base + key;
      slot_next[i] = j < kend ? __ldg(idx + j) : -1;
    }
  };
  auto issue_tile = [&](int buf) {
    __nv_bfloat16* dst = sK + buf * kBlockN * kKRow;
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
      const int c = tid + i * kThreads;
      const int key = c / kChunksPerRow, seg = c % kChunksPerRow;
      const int s = slot_next[i];
      const __nv_bfloat16* src = s >= 0 ? p.kv + static_cast<int64_t>(s) * kHeadDim + seg * 8 : p.kv;
      cp_async_16(dst + key * kKRow + seg * 8, src, s >= 0 ? 16 : 0);
    }
    cp_async_commit();
  };

  float acc[MT][8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;

  const int num_tiles = (kend - kbeg + kBlockN - 1) / kBlockN;
  fetch_slots(kbeg);
  issue_tile(0);
  if (num_tiles > 1) fetch_slots(kbeg + kBlockN);

  for (int it = 0; it < num_tiles; ++it) {
    const int buf = it & 1;
    const int tile_base = kbeg + it * kBlockN;
    cp_async_wait<0>();
    __syncthreads();  // tile `it` landed; everyone is done with tile it-1 (buffer buf^1, sP, sRed)
    if (it + 1 < num_tiles && !(KD_SKIP & 8)) {
      issue_tile(buf ^ 1);
      if (it + 2 < num_tiles) fetch_slots(tile_base + 2 * kBlockN);
    }
    const __nv_bfloat16* tK = sK + buf * kBlockN * kKRow;

    // ---- QK: partial scores over this warp's dim slice ----
    {
      float sacc[MT][2][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) sacc[mt][nt][e] = 0.f;
      const int mi = lane >> 3;
      const __nv_bfloat16* kbase =
          tK + (kh * 16 + (mi >> 1) * 8 + (lane & 7)) * kKRow + ks * kStepsPerSlice * 16 + (mi & 1) * 8;
#pragma unroll
      for (int kk = 0; kk < kStepsPerSlice && !(KD_SKIP & 1); ++kk) {
        uint32_t bf[4];
        ldmatrix_x4(bf, kbase + kk * 16);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_bf16_16816(sacc[mt][0], qf[mt][kk], bf[0], bf[1]);
          mma_bf16_16816(sacc[mt][1], qf[mt][kk], bf[2], bf[3]);
        }
      }
      float* red = sRed + ks * BM * kRedStride;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int col = kh * 16 + nt * 8 + 2 * t4;
          const int r = mt * 16 + g;
          *reinterpret_cast<float2*>(red + r * kRedStride + col) = make_float2(sacc[mt][nt][0], sacc[mt][nt][1]);
          *reinterpret_cast<float2*>(red + (r + 8) * kRedStride + col) =
              make_float2(sacc[mt][nt][2], sacc[mt][nt][3]);
        }
    }
    __syncthreads();

    // ---- softmax over the tile: mask, running max / sum, P in bf16 ----
    if (!(KD_SKIP & 2)) {
      float s[KPT];
#pragma unroll
      for (int k = 0; k < KPT; ++k) s[k] = 0.f;
#pragma unroll
      for (int sl = 0; sl < kDimSlices; ++sl) {
        const float* src = sRed + sl * BM * kRedStride + sr * kRedStride + sc * KPT;
#pragma unroll
        for (int k = 0; k < KPT; ++k) s[k] += src[k];
      }
      float tmax = -CUDART_INF_F;
#pragma unroll
      for (int k = 0; k < KPT; ++k) {
        const int j = tile_base + sc * KPT + k;
        bool vis = srow_valid && j < kend && !((KD_BREAK & 2) && j < Lp);
        if (vis && j >= Lp) {
          const int tj = (KD_BREAK & 1) ? (j - Lp) ^ 1 : j - Lp;
          vis = (__ldg(mask_row + (tj >> 5)) >> (tj & 31)) & 1;
        }
        s[k] = vis ? s[k] * p.scale_log2 * ((KD_BREAK & 4) ? 1.25f : 1.f) : -CUDART_INF_F;
        tmax = fmaxf(tmax, s[k]);
      }
#pragma unroll
      for (int off = TPR / 2; off > 0; off >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
      const float m_new = fmaxf(m_run, tmax);
      const float m_use = m_new == -CUDART_INF_F ? 0.f : m_new;
      const float alpha = exp2f(m_run - m_use);
      float psum = 0.f;
#pragma unroll
      for (int k = 0; k < KPT; ++k) {
        s[k] = exp2f(s[k] - m_use);
        psum += s[k];
      }
      // l_run is this thread's share of the row sum (alpha is the row's): summed once, at the end.
      l_run = l_run * alpha + psum;
      m_run = m_new;
      __nv_bfloat16* pdst = sP + sr * kPStride + sc * KPT;
#pragma unroll
      for (int k = 0; k < KPT; k += 2) *reinterpret_cast<uint32_t*>(pdst + k) = pack_bf16x2(s[k], s[k + 1]);
      if (sc == 0) sAlpha[sr] = alpha;
    }
    __syncthreads();

    // ---- PV: O[:, 64 w : 64 w + 64] = alpha * O + P V ----
    {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const float a0 = sAlpha[mt * 16 + g], a1 = sAlpha[mt * 16 + g + 8];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          acc[mt][nt][0] *= a0;
          acc[mt][nt][1] *= a0;
          acc[mt][nt][2] *= a1;
          acc[mt][nt][3] *= a1;
        }
      }
      const int mi = lane >> 3;
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16 && !(KD_SKIP & 4); ++kk) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          ldmatrix_x4(pa[mt], sP + (mt * 16 + (mi & 1) * 8 + (lane & 7)) * kPStride + kk * 16 + (mi >> 1) * 8);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, tK + (kk * 16 + (mi & 1) * 8 + (lane & 7)) * kKRow + warp * 64 + np * 16 + (mi >> 1) * 8);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_bf16_16816(acc[mt][2 * np], pa[mt], vb[0], vb[1]);
            mma_bf16_16816(acc[mt][2 * np + 1], pa[mt], vb[2], vb[3]);
          }
        }
      }
    }
  }

  // ---- epilogue: normalise, write out (+ lse) or this split's partial ----
#pragma unroll
  for (int off = TPR / 2; off > 0; off >>= 1) l_run += __shfl_xor_sync(0xffffffffu, l_run, off);
  if (sc == 0) {
    sL[sr] = l_run;
    sM[sr] = m_run;
  }
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = mt * 16 + g + half * 8;
      if (row0 + r >= rows || ((KD_BREAK & 8) && r == 16 * MT - 1)) continue;
      store_row(p, split, grow0 + r, warp * 64 + 2 * t4, acc[mt], half, sM + r, sL[r], warp == 0 && t4 == 0);
    }
  }
}

// Merge the splits' normalised partials by their log-sum-exp. Grid (rows, kCombineQuarters):
// a CTA owns 128 value dims of one row; its four warps take every fourth split (a lane four
// dims, so a warp reads 512 contiguous bytes per split) with kCombineUnroll loads in flight, and
// meet in shared memory. The weights exp(lse_s - max) are computed once per CTA. One CTA per row
// with one load in flight per thread was latency-bound: 28.6 us for 32 rows x 132 splits on the
// H200 (ncu), against the main kernel's 21 us.
#ifndef KD_COMBINE_WARPS
#define KD_COMBINE_WARPS 4
#endif
constexpr int kCombineThreads = 32 * KD_COMBINE_WARPS;
constexpr int kCombineQuarters = kValueDim / 128;
#ifndef KD_COMBINE_UNROLL
#define KD_COMBINE_UNROLL 8
#endif
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

// MLA tree-verify attention, base variant: 8 warps, every warp loads tiles (cp.async).
//
// One CTA owns BM = 16*MT query rows of one request (rows = tree node x head, contiguous in q)
// and one split of the request's KV list. KV tiles of BN = 32 latent rows (576 bf16 each) are
// gathered by slot id with cp.async into a two-stage shared-memory ring, and each tile serves
// every row of the CTA: the latent is read once per row block, never once per head.
//
// Per tile, 8 warps:
//   QK   warp (ks, kh) multiplies its query rows, dims [144 ks, 144 ks + 144), held in
//        registers for the whole kernel, with keys [16 kh, 16 kh + 16); the four dim slices'
//        partial scores meet in shared memory (sRed).
//   soft every row is owned by 256/BM threads: sum the partials, then the shared online
//        softmax (tree_verify_mla_common.cuh); P as bf16 -> sP.
//   PV   warp w accumulates O[:, 64 w : 64 w + 64] += P V with V = the tile's first 512 dims,
//        read transposed from the same shared-memory tile.
// With one split the CTA writes bf16 out (and lse); with several it writes fp32 partials and a
// second pass (combine_splits.cuh) merges them by their log-sum-exp.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <math_constants.h>

#include "tree_verify_mla_common.cuh"

namespace kdtree {

namespace base {
constexpr int kThreads = 256;
constexpr int kRedStride = 40;  // floats per sRed row
constexpr int kPStride = 40;    // bf16 per sP row (80 B)
constexpr int kChunksPerRow = kHeadDim / 8;                           // 72 x 16 B
constexpr int kChunksPerThread = kBlockN * kChunksPerRow / kThreads;  // 9
static_assert(kBlockN * kChunksPerRow % kThreads == 0, "tile load must split evenly");

template <int MT>
struct Smem {
  static constexpr int BM = 16 * MT;
  static constexpr int k_bytes = 2 * kBlockN * kKRow * 2;
  static constexpr int red_bytes = kDimSlices * BM * kRedStride * 4;
  static constexpr int p_bytes = BM * kPStride * 2;
  static constexpr int stats_bytes = 3 * BM * 4;
  static constexpr int total = k_bytes + red_bytes + p_bytes + stats_bytes;
};
static_assert(Smem<2>::total <= kMaxSharedBytes, "must fit sm_120's per-block shared memory");
}  // namespace base

template <int MT>
__global__ void __launch_bounds__(base::kThreads, 1) tree_verify_mla_kernel(const TreeVerifyParams p) {
  using namespace base;
  constexpr int BM = 16 * MT;
  constexpr int TPR = kThreads / BM;  // threads per row in the softmax phase
  constexpr int KPT = kBlockN / TPR;  // keys per thread in the softmax phase
  using L = Smem<MT>;

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
    const int ra = row0 + mt * 16 + g;
    load_q_slice(qf[mt], p.q, grow0 + mt * 16 + g, ra < rows, ra + 8 < rows, ks, t4);
  }

  // ---- softmax-phase ownership: row sr, keys [sc * KPT, sc * KPT + KPT) ----
  const int sr = tid / TPR, sc = tid % TPR;
  const bool srow_valid = row0 + sr < rows;
  const int snode = (row0 + sr) / p.num_heads;
  const int32_t* mask_row = p.tree_mask + static_cast<int64_t>(qo0 + min(snode, T - 1)) * p.mask_words;
  OnlineSoftmax<KPT, TPR, 0, false> softmax;

  // ---- tile loader: slot ids are fetched one tile ahead of the copy that needs them ----
  const SlotSource slots = slot_source(p, b, kv0);
  int slot_next[kChunksPerThread];
  auto fetch_slots = [&](int tile_base) {
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
      const int key = (tid + i * kThreads) / kChunksPerRow;
      const int j = tile_base + key;
      slot_next[i] = j < kend ? slot_at(slots, j) : -1;
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
  KD_STAMP_CTA_BEGIN(num_tiles);
  KD_STAMP_LANE(kLaneBegin);
  fetch_slots(kbeg);
  issue_tile(0);
  if (num_tiles > 1) fetch_slots(kbeg + kBlockN);

  for (int it = 0; it < num_tiles; ++it) {
    const int buf = it & 1;
    const int tile_base = kbeg + it * kBlockN;
    KD_STAMP(kTileWait, it);
    cp_async_wait<0>();
    __syncthreads();  // tile `it` landed; everyone is done with tile it-1 (buffer buf^1, sP, sRed)
    KD_STAMP(kTileReady, it);
    if (it + 1 < num_tiles && !hooks::kSkipLoads) {
      issue_tile(buf ^ 1);
      if (it + 2 < num_tiles) fetch_slots(tile_base + 2 * kBlockN);
    }
    KD_STAMP(kLoadIssued, it + 1);
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
      for (int kk = 0; kk < kStepsPerSlice && !hooks::kSkipQK; ++kk) {
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
    KD_STAMP(kSIssued, it);
    __syncthreads();
    KD_STAMP(kSDone, it);

    // ---- softmax over the tile: sum the slices' partial scores, then mask, max / sum, P ----
    if (!hooks::kSkipSoftmax) {
      float s[KPT];
#pragma unroll
      for (int k = 0; k < KPT; ++k) s[k] = 0.f;
#pragma unroll
      for (int sl = 0; sl < kDimSlices; ++sl) {
        const float* src = sRed + sl * BM * kRedStride + sr * kRedStride + sc * KPT;
#pragma unroll
        for (int k = 0; k < KPT; ++k) s[k] += src[k];
      }
      const float alpha = softmax.update(s, mask_row, p.mask_words, tile_base + sc * KPT, Lp, kend, srow_valid,
                                         p.scale_log2, tile_needs_mask(tile_base, kBlockN, Lp, kend));
      KD_STAMP(kSoftmaxDone, it);
      store_p(sP + sr * kPStride + sc * KPT, s);
      if (sc == 0) sAlpha[sr] = alpha;
    }
    __syncthreads();
    KD_STAMP(kPStored, it);

    // ---- PV: O[:, 64 w : 64 w + 64] = alpha * O + P V ----
    {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) rescale_rows(acc[mt], sAlpha[mt * 16 + g], sAlpha[mt * 16 + g + 8]);
      KD_STAMP(kPVIssued, it);
      const int mi = lane >> 3;
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16 && !hooks::kSkipPV; ++kk) {
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
    KD_STAMP(kPVDone, it);
  }

  // ---- epilogue: normalise, write out (+ lse) or this split's partial ----
  const float l_row = softmax.row_sum();
  if (sc == 0) {
    sL[sr] = l_row;
    sM[sr] = softmax.m;
  }
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    store_tile(p, split, grow0, row0, rows, mt * 16, g, warp * 64 + 2 * t4, acc[mt], sM, sL, warp == 0 && t4 == 0,
               mt == MT - 1);
  KD_STAMP_LANE(kLaneEnd);
  KD_STAMP_CTA_END();
}

}  // namespace kdtree

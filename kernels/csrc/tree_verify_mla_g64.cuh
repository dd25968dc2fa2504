// MLA tree-verify attention, 64-row variant ("g64") for shapes with many rows (H * T >= 64),
// where the op is tensor-core bound.
//
// One CTA of 8 warps owns 64 query rows as two groups of four warps, 32 rows each. Both groups
// read the same KV tiles (16 latent rows, gathered by slot id with the bulk copy engine into a
// four-stage ring completing on mbarriers), so each latent row is read from L2 into shared memory
// once per 64 query rows. (16-key tiles keep the four partial-score slices of both groups inside
// sm_120's 101376 bytes next to a 64-key-deep ring.) Within a group every warp covers all 32 rows, which halves the
// shared-memory operand traffic per MMA against 16-row warps:
//   QK   warp ks multiplies rows x dims [144 ks, 144 ks + 144) (query fragments in registers
//        for the whole kernel) with the tile's keys; the four partial scores meet in sRed;
//   soft four threads per row sum the partials, scale, mask, update the running max lazily and
//        write P (bf16) and the rescale factor;
//   PV   warp ks accumulates O[32 rows, 128 ks : 128 ks + 128] += P V in registers.
// Groups synchronise only among their own 128 threads (named barriers). There is no producer
// warp (it would cap every thread's registers below what 32-row warps need): the last warp to
// finish a stage, counted with a shared-memory atomic, issues the copies that refill it.
// The epilogue and split partials match the other variants, so combine_splits_kernel merges it.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <math_constants.h>

#include "mma_sm80.cuh"
#include "tree_verify_mla.cuh"
#include "tree_verify_mla_launch.h"

namespace kdtree {

namespace g64 {
constexpr int kGroups = 2;
constexpr int kGroupThreads = 128;
constexpr int kThreads = kGroups * kGroupThreads;  // 256
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 32;                          // per group
constexpr int kBM = kGroups * kRows;               // per CTA
constexpr int kMT = kRows / 16;                    // 16-row MMA tiles per warp
constexpr int kBN = 16;                            // keys per tile
constexpr int kStages = 4;
constexpr int kTPR = kGroupThreads / kRows;        // 4 softmax threads per row
constexpr int kKPT = kBN / kTPR;                   // 4 keys each
constexpr int kRedS = kBN + 4;                     // floats per sRed row (80 B)
constexpr int kPS = kBN + 8;                       // bf16 per sP row (48 B): conflict-free ldmatrix
constexpr int kStageBytes = kBN * kKRow * 2;
constexpr float kRescaleLog2 = 8.f;
struct Smem {
  static constexpr int k_off = 0;
  static constexpr int red_off = kStages * kStageBytes;
  static constexpr int red_group = kDimSlices * kRows * kRedS * 4;
  static constexpr int p_off = red_off + kGroups * red_group;
  static constexpr int p_group = kRows * kPS * 2;
  static constexpr int stats_off = p_off + kGroups * p_group;
  static constexpr int bar_off = stats_off + kGroups * 3 * kRows * 4;
  static constexpr int cnt_off = bar_off + kStages * 8;
  static constexpr int total = cnt_off + kStages * 4;
};
static_assert(kBlockN % kBN == 0, "splits are cut at kBlockN keys");
static_assert(Smem::total <= 101376, "must fit sm_120's per-block shared memory");
static_assert(Smem::bar_off % 8 == 0, "mbarriers need 8-byte alignment");
}  // namespace g64

__global__ void __launch_bounds__(g64::kThreads, 1) tree_verify_mla_g64_kernel(const TreeVerifyParams p) {
  using namespace g64;
  extern __shared__ __align__(128) uint8_t smem[];
  __nv_bfloat16* sK = reinterpret_cast<__nv_bfloat16*>(smem + Smem::k_off);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Smem::bar_off);
  int* done_count = reinterpret_cast<int*>(smem + Smem::cnt_off);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int split = blockIdx.x, rb = blockIdx.y, b = blockIdx.z;

  BlockRange br;
  if (!block_range(p, split, rb, b, kBM, br)) return;
  const int qo0 = br.qo0, T = br.T, rows = br.rows, row0 = br.row0, kv0 = br.kv0, Lp = br.Lp;
  const int kbeg = br.kbeg, kend = br.kend;
  const int64_t grow0 = br.grow0;
  const int num_tiles = (kend - kbeg + kBN - 1) / kBN;
  const int32_t* idx = p.kv_indices + kv0;

  init_ring(sK, kStages * kStageBytes, tid, g64::kThreads);
  if (tid < kStages) {
    mbar_init(&full[tid], 1);
    done_count[tid] = 0;
  }
  fence_mbarrier_init();
  fence_proxy_async_shared();
  __syncthreads();

  // One warp fills a stage: lane l < 16 copies latent row l of the tile (1152 bytes).
  auto issue_tile = [&](int it, int slot) {
    const int st = it % kStages;
    const int base = kbeg + it * kBN;
    const int valid = min(kBN, kend - base);
    if (KD_SKIP & 8) {  // measurement only: the stage is "full" without any copy
      if (lane == 0) mbar_arrive(&full[st]);
      return;
    }
    if (lane == 0) mbar_arrive_expect_tx(&full[st], valid * kHeadDim * 2);
    __syncwarp();
    if (lane < valid)
      bulk_copy_g2s(sK + st * kBN * kKRow + lane * kKRow, p.kv + static_cast<int64_t>(slot) * kHeadDim,
                    kHeadDim * 2, &full[st]);
  };
  auto slot_of = [&](int it) {
    const int j = kbeg + it * kBN + lane;
    return (it < num_tiles && lane < kBN && j < kend) ? __ldg(idx + j) : -1;
  };
  if (warp < kStages && warp < num_tiles) issue_tile(warp, slot_of(warp));

  const int grp = warp >> 2, ks = warp & 3;
  const int gt = tid & (kGroupThreads - 1);
  const int g = lane >> 2, t4 = lane & 3, mi = lane >> 3;
  const int grow_base = row0 + grp * kRows;  // first request-local row of this group
  const bool group_active = grow_base < rows;
  float* sRed = reinterpret_cast<float*>(smem + Smem::red_off + grp * Smem::red_group);
  __nv_bfloat16* sP = reinterpret_cast<__nv_bfloat16*>(smem + Smem::p_off + grp * Smem::p_group);
  float* sAlpha = reinterpret_cast<float*>(smem + Smem::stats_off) + grp * 3 * kRows;
  float* sL = sAlpha + kRows;
  float* sM = sL + kRows;
  const int bar_id = 1 + grp;
  const uint32_t sK_addr = smem_addr(sK);
  // Per-lane byte offsets of the ldmatrix row addresses (QK: keys x dims; PV: keys x values).
  const uint32_t k_lane_off = (((mi >> 1) * 8 + (lane & 7)) * kKRow + ks * kStepsPerSlice * 16 + (mi & 1) * 8) * 2;
  const uint32_t v_lane_off = (((mi & 1) * 8 + (lane & 7)) * kKRow + ks * 128 + (mi >> 1) * 8) * 2;
  const uint32_t p_lane_addr = smem_addr(sP) + (((mi & 1) * 8 + (lane & 7)) * kPS + (mi >> 1) * 8) * 2;

  uint32_t qf[kMT][kStepsPerSlice][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    const int ra = grow_base + mt * 16 + g, rb8 = ra + 8;
    const uint32_t* qa = reinterpret_cast<const uint32_t*>(p.q + (grow0 + grp * kRows + mt * 16 + g) * kHeadDim);
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

  // Softmax ownership: warp ks of the group holds rows [8 ks, 8 ks + 8); lanes l, l+8, l+16, l+24
  // share row 8 ks + (l & 7) (keys [4 sc, 4 sc + 4)), so a quarter-warp reads 8 rows at once.
  const int sr = ks * 8 + (lane & 7), sc = lane >> 3;
  const int key_end = grow_base + sr < rows ? kend : 0;  // a row past the request sees no key
  const int snode = (grow_base + sr) / p.num_heads;
  const int mask_off = (qo0 + min(snode, T - 1)) * p.mask_words;  // < 2^31: Nq * W int32 words
  float m_run = -CUDART_INF_F, l_run = 0.f;

  float acc[kMT][16][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < 16; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;

  for (int it = 0; it < num_tiles; ++it) {
    const int st = it % kStages;
    const int tile_base = kbeg + it * kBN;
    const uint32_t tK = sK_addr + st * kStageBytes;  // shared-memory address of the stage
    const int slot_refill = slot_of(it + kStages);
    mbar_wait(&full[st], (it / kStages) & 1);

    if (group_active) {
      // ---- QK over this warp's 144-dim slice: 32 rows x 16 keys ----
      {
        float sacc[kMT][2][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) sacc[mt][nt][e] = 0.f;
        const uint32_t kb = tK + k_lane_off;
        uint32_t bf[2][4];  // step kk + 1 loads while step kk multiplies
        ldmatrix_x4_s(bf[0], kb);
#pragma unroll
        for (int kk = 0; kk < kStepsPerSlice; ++kk) {
          if (kk + 1 < kStepsPerSlice) ldmatrix_x4_s(bf[(kk + 1) & 1], kb + (kk + 1) * 32);
          if (!(KD_SKIP & 1)) {
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
              mma_bf16_16816(sacc[mt][0], qf[mt][kk], bf[kk & 1][0], bf[kk & 1][1]);
              mma_bf16_16816(sacc[mt][1], qf[mt][kk], bf[kk & 1][2], bf[kk & 1][3]);
            }
          }
        }
        float* red = sRed + ks * kRows * kRedS;
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            const int col = nt * 8 + 2 * t4;
            const int r = mt * 16 + g;
            *reinterpret_cast<float2*>(red + r * kRedS + col) = make_float2(sacc[mt][nt][0], sacc[mt][nt][1]);
            *reinterpret_cast<float2*>(red + (r + 8) * kRedS + col) = make_float2(sacc[mt][nt][2], sacc[mt][nt][3]);
          }
      }
      named_barrier_sync(bar_id, kGroupThreads);

      // ---- softmax: 4 threads per row, 4 keys each ----
      bool rescale = false;
      if (!(KD_SKIP & 2)) {
        float s[kKPT] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int sl = 0; sl < kDimSlices; ++sl) {
          const float4 v = *reinterpret_cast<const float4*>(sRed + (sl * kRows + sr) * kRedS + sc * kKPT);
          s[0] += v.x, s[1] += v.y, s[2] += v.z, s[3] += v.w;
        }
        const int j0 = tile_base + sc * kKPT;
        const uint64_t bits = tree_visible_bits(p.tree_mask + mask_off, p.mask_words, j0, kKPT, Lp);
        float tmax = -CUDART_INF_F;
#pragma unroll
        for (int k = 0; k < kKPT; ++k) {
          const bool vis = j0 + k < key_end && ((bits >> k) & 1);
          s[k] = vis ? s[k] * p.scale_log2 * ((KD_BREAK & 4) ? 1.25f : 1.f) : -CUDART_INF_F;
          tmax = fmaxf(tmax, s[k]);
        }
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 8));
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 16));
        // Lazy rescaling: the running max moves only when it grew by more than 2^8, so most
        // tiles need no O rescale; P <= 256 stays exact enough in bf16 and l in fp32.
        const float m_new = fmaxf(m_run, tmax);
        float alpha = 1.f;
        if (m_new > m_run + kRescaleLog2) {
          alpha = exp2f(m_run - m_new);
          m_run = m_new;
        }
        const float m_use = m_run == -CUDART_INF_F ? 0.f : m_run;
        float psum = 0.f;
#pragma unroll
        for (int k = 0; k < kKPT; ++k) {
          s[k] = exp2f(s[k] - m_use);
          psum += s[k];
        }
        psum += __shfl_xor_sync(0xffffffffu, psum, 8);
        psum += __shfl_xor_sync(0xffffffffu, psum, 16);
        l_run = l_run * alpha + psum;
        uint2 pk;
        pk.x = pack_bf16x2(s[0], s[1]);
        pk.y = pack_bf16x2(s[2], s[3]);
        *reinterpret_cast<uint2*>(sP + sr * kPS + sc * kKPT) = pk;
        if (sc == 0) sAlpha[sr] = alpha;
        rescale = alpha != 1.f;
      }
      rescale = named_barrier_sync_or(bar_id, kGroupThreads, rescale);

      // ---- PV: O[32 rows, 128 ks : 128 ks + 128] = alpha O + P V ----
      if (rescale) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          const float a0 = sAlpha[mt * 16 + g], a1 = sAlpha[mt * 16 + g + 8];
#pragma unroll
          for (int nt = 0; nt < 16; ++nt) {
            acc[mt][nt][0] *= a0;
            acc[mt][nt][1] *= a0;
            acc[mt][nt][2] *= a1;
            acc[mt][nt][3] *= a1;
          }
        }
      }
      {
        uint32_t pa[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
          ldmatrix_x4_s(pa[mt], p_lane_addr + mt * 16 * kPS * 2);
        const uint32_t vrow = tK + v_lane_off;
        uint32_t vb[2][4];
        ldmatrix_x4_trans_s(vb[0], vrow);
#pragma unroll
        for (int np = 0; np < 8; ++np) {
          if (np + 1 < 8) ldmatrix_x4_trans_s(vb[(np + 1) & 1], vrow + (np + 1) * 32);
          if (!(KD_SKIP & 4)) {
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
              mma_bf16_16816(acc[mt][2 * np], pa[mt], vb[np & 1][0], vb[np & 1][1]);
              mma_bf16_16816(acc[mt][2 * np + 1], pa[mt], vb[np & 1][2], vb[np & 1][3]);
            }
          }
        }
      }
    }

    // ---- release the stage; the last of the 8 warps to finish refills it ----
    __syncwarp();
    int last = 0;
    if (lane == 0) {
      __threadfence_block();
      last = atomicAdd(&done_count[st], 1) == kWarps - 1;
    }
    last = __shfl_sync(0xffffffffu, last, 0);
    if (last) {
      if (lane == 0) done_count[st] = 0;
      __threadfence_block();
      if (it + kStages < num_tiles) {
        fence_proxy_async_shared();
        issue_tile(it + kStages, slot_refill);
      }
    }
  }
  if (!group_active) return;

  // ---- epilogue: normalise, write out (+ lse) or this split's partial ----
  // The row bounds are re-derived here behind an opaque pointer, so the compiler does not keep
  // them live (or spill them) across the main loop.
  const int32_t* qo = p.qo_indptr;
  asm volatile("" : "+l"(qo));
  const int rows_e = (qo[blockIdx.z + 1] - qo[blockIdx.z]) * p.num_heads;
  const int64_t grow_e = static_cast<int64_t>(qo[blockIdx.z]) * p.num_heads + blockIdx.y * kBM + grp * kRows;
  const int rbase_e = blockIdx.y * kBM + grp * kRows;
  int lane_e = threadIdx.x & 31;
  asm volatile("" : "+r"(lane_e));
  const int g_e = lane_e >> 2, t4_e = lane_e & 3;
  if (sc == 0) {
    sL[sr] = l_run;
    sM[sr] = m_run;
  }
  named_barrier_sync(bar_id, kGroupThreads);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = mt * 16 + g_e + half * 8;
      if (rbase_e + r >= rows_e || ((KD_BREAK & 8) && grp == kGroups - 1 && r == kRows - 1)) continue;
      store_row(p, split, grow_e + r, ks * 128 + 2 * t4_e, acc[mt], half, sM + r, sL[r], ks == 0 && t4_e == 0);
    }
  }
}

}  // namespace kdtree

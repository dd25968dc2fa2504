// MLA tree-verify attention, warp-specialised variant ("ws"): one producer warp gathers KV rows
// with the bulk copy engine (cp.async.bulk, one 1152-byte row per lane, completing on an
// mbarrier) into a ring (two stages of 32 keys; WS_BN / WS_STAGES select others, slower: more barriers
// and softmax passes per MMA); two consumer groups of four warps each own 16 query rows and
// run QK -> softmax -> PV on every tile with only group-local named barriers, so one group's
// softmax overlaps the other's tensor-core work. Same tiling of the 576 dims as the base kernel
// (four 144-dim QK slices per group, four 128-dim PV slices per group), same epilogue and split
// partials, so combine_splits_kernel merges either; the online softmax is the shared one with
// lazy rescaling (tree_verify_mla_common.cuh).
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <math_constants.h>

#include "mbarrier_sm90.cuh"
#include "tree_verify_mla_common.cuh"

namespace kdtree {

namespace ws {
constexpr int kBN = WS_BN;  // WS_BN, WS_STAGES, WS_QK_AHEAD: knobs.cuh
constexpr int kStages = WS_STAGES;
constexpr int kGroups = 2;
constexpr int kGroupThreads = 128;
constexpr int kConsumers = kGroups * kGroupThreads;  // 256
constexpr int kThreadsWS = kConsumers + 32;          // + producer warp
constexpr int kRows = 16;                            // per group
constexpr int kTPR = kGroupThreads / kRows;          // 8 softmax threads per row
constexpr int kKPT = kBN / kTPR;                     // keys each
constexpr int kRedS = kBN + 8;                       // floats per sRed row
constexpr int kPS = kBN + 8;                         // bf16 per sP row: conflict-free ldmatrix
constexpr int kStageBytes = kBN * kKRow * 2;
constexpr int kRescaleLog2 = 8;  // the running max moves when a tile's max exceeds it by 2^8
struct Smem {
  static constexpr int k_off = 0;
  static constexpr int red_off = kStages * kStageBytes;
  static constexpr int red_group = kDimSlices * kRows * kRedS * 4;
  static constexpr int p_off = red_off + kGroups * red_group;
  static constexpr int p_group = kRows * kPS * 2;
  static constexpr int stats_off = p_off + kGroups * p_group;
  static constexpr int bar_off = stats_off + kGroups * 3 * kRows * 4;
  static constexpr int total = bar_off + 2 * kStages * 8;
};
static_assert(kBN == 16 || kBN == 32, "tiles of 16 or 32 keys");
static_assert(kBlockN % kBN == 0, "splits are cut at kBlockN keys");
static_assert(Smem::total <= kMaxSharedBytes, "must fit sm_120's per-block shared memory");
static_assert(Smem::bar_off % 8 == 0, "mbarriers need 8-byte alignment");

// Fill the ring before the main loop: rows past the split's end are never copied and must hold
// finite values (P = 0 there).
__device__ __forceinline__ void init_ring(void* ring, int bytes, int tid, int nthreads) {
  uint4* r = reinterpret_cast<uint4*>(ring);
  for (int i = tid; i < bytes / 16; i += nthreads) r[i] = hooks::ring_fill(i);
}
}  // namespace ws

__global__ void __launch_bounds__(ws::kThreadsWS, 1) tree_verify_mla_ws_kernel(const TreeVerifyParams p) {
  using namespace ws;
  extern __shared__ __align__(128) uint8_t smem[];
  __nv_bfloat16* sK = reinterpret_cast<__nv_bfloat16*>(smem + Smem::k_off);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Smem::bar_off);
  uint64_t* empty = full + kStages;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int split = blockIdx.x, rb = blockIdx.y, b = blockIdx.z;
  constexpr int BM = kGroups * kRows;

  BlockRange br;
  if (!block_range(p, split, rb, b, BM, br)) return;
  const int qo0 = br.qo0, T = br.T, rows = br.rows, row0 = br.row0, kv0 = br.kv0, Lp = br.Lp;
  const int kbeg = br.kbeg, kend = br.kend;
  const int64_t grow0 = br.grow0;
  const int num_tiles = (kend - kbeg + kBN - 1) / kBN;

  init_ring(sK, kStages * kStageBytes, tid, kThreadsWS);
  if (tid < kStages) {
    mbar_init(&full[tid], 1);
    mbar_init(&empty[tid], kConsumers);
  }
  if (tid == 0) fence_mbarrier_init();
  fence_proxy_async_shared();
  __syncthreads();
  KD_STAMP_CTA_BEGIN(num_tiles);
  KD_STAMP_LANE(kLaneBegin);

  if (warp == kConsumers / 32) {
    // ---------------- producer warp ----------------
    const SlotSource slots = slot_source(p, b, kv0);
    int slot = lane < kBN && kbeg + lane < kend ? slot_at(slots, kbeg + lane) : -1;
    for (int it = 0; it < num_tiles; ++it) {
      const int buf = it % kStages;
      const int base = kbeg + it * kBN;
      const int next = base + kBN + lane;
      const int slot_next = (lane < kBN && it + 1 < num_tiles && next < kend) ? slot_at(slots, next) : -1;
      KD_STAMP(kLoadWaitFree, it);
      if (it >= kStages) mbar_wait(&empty[buf], ((it / kStages) - 1) & 1);
      KD_STAMP(kLoadFree, it);
      const int valid = min(kBN, kend - base);
      if (hooks::kSkipLoads) {
        if (lane == 0) mbar_arrive(&full[buf]);
        continue;
      }
      if (lane == 0) mbar_arrive_expect_tx(&full[buf], valid * kHeadDim * 2);
      __syncwarp();
      if (lane < valid)
        bulk_copy_g2s(sK + buf * kBN * kKRow + lane * kKRow, p.kv + static_cast<int64_t>(slot) * kHeadDim,
                      kHeadDim * 2, &full[buf]);
      KD_STAMP(kLoadIssued, it);
      slot = slot_next;
    }
    KD_STAMP_LANE(kLaneEnd);
    return;
  }

  // ---------------- consumer groups ----------------
  const int grp = warp >> 2, ks = warp & 3;
  const int gt = tid & (kGroupThreads - 1);
  const int g = lane >> 2, t4 = lane & 3, mi = lane >> 3;
  const int grow_base = row0 + grp * kRows;  // first row of this group (request-local)
  float* sRed = reinterpret_cast<float*>(smem + Smem::red_off + grp * Smem::red_group);
  __nv_bfloat16* sP = reinterpret_cast<__nv_bfloat16*>(smem + Smem::p_off + grp * Smem::p_group);
  float* sAlpha = reinterpret_cast<float*>(smem + Smem::stats_off) + grp * 3 * kRows;
  float* sL = sAlpha + kRows;
  float* sM = sL + kRows;
  const int bar_id = 1 + grp;

  uint32_t qf[kStepsPerSlice][4];
  load_q_slice(qf, p.q, grow0 + grp * kRows + g, grow_base + g < rows, grow_base + g + 8 < rows, ks, t4);

  const int sr = gt / kTPR, sc = gt % kTPR;
  const bool srow_valid = grow_base + sr < rows;
  const int snode = (grow_base + sr) / p.num_heads;
  const int32_t* mask_row = p.tree_mask + static_cast<int64_t>(qo0 + min(snode, T - 1)) * p.mask_words;
  OnlineSoftmax<kKPT, kTPR, kRescaleLog2, true> softmax;

  float acc[16][4];
#pragma unroll
  for (int nt = 0; nt < 16; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;

  for (int it = 0; it < num_tiles; ++it) {
    const int buf = it % kStages;
    const int tile_base = kbeg + it * kBN;
    const __nv_bfloat16* tK = sK + buf * kBN * kKRow;
    KD_STAMP(kTileWait, it);
    mbar_wait(&full[buf], (it / kStages) & 1);
    KD_STAMP(kTileReady, it);

    // QK over this warp's 144-dim slice, all keys of the tile.
    {
      constexpr int kNT = kBN / 8;  // 8-key MMA tiles; one ldmatrix.x4 covers two
      float sacc[kNT][4];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sacc[nt][e] = 0.f;
      const __nv_bfloat16* kb = tK + ((mi >> 1) * 8 + (lane & 7)) * kKRow + ks * kStepsPerSlice * 16 + (mi & 1) * 8;
      // Fragments of steps kk + 1 .. kk + kAhead load while step kk multiplies: with two warps
      // per scheduler, one step ahead left the tensor pipe waiting on ldmatrix latency.
      constexpr int kAhead = WS_QK_AHEAD;
      uint32_t b0[kAhead + 1][4], b1[kAhead + 1][4];
#pragma unroll
      for (int a = 0; a < kAhead; ++a) {
        ldmatrix_x4(b0[a], kb + a * 16);
        if (kNT == 4) ldmatrix_x4(b1[a], kb + 16 * kKRow + a * 16);
      }
#pragma unroll
      for (int kk = 0; kk < kStepsPerSlice; ++kk) {
        const int cur = kk % (kAhead + 1);
        if (kk + kAhead < kStepsPerSlice) {
          const int nxt = (kk + kAhead) % (kAhead + 1);
          ldmatrix_x4(b0[nxt], kb + (kk + kAhead) * 16);
          if (kNT == 4) ldmatrix_x4(b1[nxt], kb + 16 * kKRow + (kk + kAhead) * 16);
        }
        mma_bf16_16816(sacc[0], qf[kk], b0[cur][0], b0[cur][1]);
        mma_bf16_16816(sacc[1], qf[kk], b0[cur][2], b0[cur][3]);
        if (kNT == 4) {
          mma_bf16_16816(sacc[kNT / 2], qf[kk], b1[cur][0], b1[cur][1]);
          mma_bf16_16816(sacc[kNT - 1], qf[kk], b1[cur][2], b1[cur][3]);
        }
      }
      KD_STAMP(kSIssued, it);
      float* red = sRed + ks * kRows * kRedS;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const int col = nt * 8 + 2 * t4;
        *reinterpret_cast<float2*>(red + g * kRedS + col) = make_float2(sacc[nt][0], sacc[nt][1]);
        *reinterpret_cast<float2*>(red + (g + 8) * kRedS + col) = make_float2(sacc[nt][2], sacc[nt][3]);
      }
    }
    named_barrier_sync(bar_id, kGroupThreads);
    KD_STAMP(kSDone, it);

    // softmax: 8 threads per row, kKPT keys each.
    bool rescale = false;
    {
      float s[kKPT];
      {
        const float* src = sRed + sr * kRedS + sc * kKPT;
        if constexpr (kKPT == 4) {
          const float4 v0 = *reinterpret_cast<const float4*>(src + 0 * kRows * kRedS);
          const float4 v1 = *reinterpret_cast<const float4*>(src + 1 * kRows * kRedS);
          const float4 v2 = *reinterpret_cast<const float4*>(src + 2 * kRows * kRedS);
          const float4 v3 = *reinterpret_cast<const float4*>(src + 3 * kRows * kRedS);
          s[0] = (v0.x + v1.x) + (v2.x + v3.x);
          s[1] = (v0.y + v1.y) + (v2.y + v3.y);
          s[2] = (v0.z + v1.z) + (v2.z + v3.z);
          s[3] = (v0.w + v1.w) + (v2.w + v3.w);
        } else {
          const float2 v0 = *reinterpret_cast<const float2*>(src + 0 * kRows * kRedS);
          const float2 v1 = *reinterpret_cast<const float2*>(src + 1 * kRows * kRedS);
          const float2 v2 = *reinterpret_cast<const float2*>(src + 2 * kRows * kRedS);
          const float2 v3 = *reinterpret_cast<const float2*>(src + 3 * kRows * kRedS);
          s[0] = (v0.x + v1.x) + (v2.x + v3.x);
          s[1] = (v0.y + v1.y) + (v2.y + v3.y);
        }
      }
      const float alpha = softmax.update(s, mask_row, p.mask_words, tile_base + sc * kKPT, Lp, kend, srow_valid,
                                         p.scale_log2, tile_needs_mask(tile_base, kBN, Lp, kend));
      KD_STAMP(kSoftmaxDone, it);
      store_p(sP + sr * kPS + sc * kKPT, s);
      if (sc == 0) sAlpha[sr] = alpha;
      rescale = alpha != 1.f;
    }
    rescale = named_barrier_sync_or(bar_id, kGroupThreads, rescale);
    KD_STAMP(kPStored, it);

    // PV: O[16 rows, 128 ks : 128 ks + 128] = alpha O + P V.
    {
      if (rescale) rescale_rows(acc, sAlpha[g], sAlpha[g + 8]);
      KD_STAMP(kPVIssued, it);
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        uint32_t pa[4];
        ldmatrix_x4(pa, sP + ((mi & 1) * 8 + (lane & 7)) * kPS + kk * 16 + (mi >> 1) * 8);
        const __nv_bfloat16* vrow = tK + (kk * 16 + (mi & 1) * 8 + (lane & 7)) * kKRow + ks * 128 + (mi >> 1) * 8;
        // All eight V fragments of the step are requested before the first MMA needs one.
        uint32_t vb[8][4];
#pragma unroll
        for (int np = 0; np < 8; ++np) ldmatrix_x4_trans(vb[np], vrow + np * 16);
#pragma unroll
        for (int np = 0; np < 8; ++np) {
          mma_bf16_16816(acc[2 * np], pa, vb[np][0], vb[np][1]);
          mma_bf16_16816(acc[2 * np + 1], pa, vb[np][2], vb[np][3]);
        }
      }
    }
    // Every consumer thread releases the stage itself (its reads, then its release-arrive; the
    // producer acquires before the next bulk copy), as CUTLASS's TMA pipelines do. A proxy fence
    // here cost 6 % on tensor-core-bound shapes (it waited for the warp's in-flight MMAs);
    // racecheck is clean without it.
    KD_STAMP(kPVDone, it);
    mbar_arrive(&empty[buf]);
  }

  // epilogue
  const float l_row = softmax.row_sum();
  if (sc == 0) {
    sL[sr] = l_row;
    sM[sr] = softmax.m;
  }
  named_barrier_sync(bar_id, kGroupThreads);
  store_tile(p, split, grow0 + grp * kRows, grow_base, rows, 0, g, ks * 128 + 2 * t4, acc, sM, sL,
             ks == 0 && t4 == 0, grp == kGroups - 1);
  KD_STAMP_LANE(kLaneEnd);
  KD_STAMP_CTA_END();
}

}  // namespace kdtree

// MLA tree-verify attention, Hopper variant ("wgmma", sm_90a only): warpgroup MMAs with their
// operands in 128-byte-swizzled shared memory, a producer warpgroup gathering KV rows with
// cp.async into a two-stage ring guarded by mbarriers, and two consumer warpgroups.
//
// Same op contract, packed tree mask, online softmax numerics (log2 units, lazy rescale),
// epilogue, lse and split-KV partials as the other variants (tree_verify_mla_common.cuh), so
// combine_splits_kernel merges its partials unchanged.
//
// One CTA: 64 query rows (tree node x head) of one request, one KV split, 384 threads (three
// warpgroups: Hopper allocates registers per warpgroup, and setmaxnreg moves them from the
// producer to the consumers: 40 + 2 x 232 per thread).
//   producer       per 64-key tile: eight lanes copy one 128-byte piece of a latent row (slot id
//   warpgroup      from kv_indices) with 16-byte cp.async straight into the swizzled layout, so every
//                  warp instruction reads whole 32-byte sectors of four rows (a bulk copy cannot
//                  swizzle and a TMA tensor map cannot gather rows of page size 1); the copies
//                  arrive on the stage's `full` mbarrier as they land (cp.async.mbarrier.arrive
//                  .noinc) while the producer loads the next tile's slot ids and waits for the next
//                  free stage. Rows past the split's end are zero-filled.
//   consumers      the tiles in pairs (the "seesaw" schedule FlashMLA published for its Hopper
//   warpgroups     kernel): warpgroup 0 computes S = Q K^T of tile a = 2i of each pair (36 x wgmma
//                  m64n64k16, A = Q and B = K from shared memory), its mask + online softmax and
//                  P_a; warpgroup 1 those of tile b = 2i + 1, against tile a's running max. Each
//                  warpgroup owns 256 output columns and runs both tiles' PV on them (4 x wgmma
//                  m64n256k16 per tile, B = V read MN-major from the tile): its own tile's with P
//                  from registers, the other's with P from shared memory. So one warpgroup's
//                  softmax runs while the other's MMAs keep the tensor pipe busy.
//   Both release a stage on its `empty` mbarrier once their MMAs on it have completed, and fence
//   the producer's bytes into the async proxy after each `full` wait. The running max, the rescale
//   factors and P go between the warpgroups through shared memory, ordered by named barriers
//   synced on both sides (racecheck-clean); row sums are kept per warpgroup and added at the end.
// The consumers' stages (QK, mask + online softmax, P to registers and to shared memory, O's
// rescale, the two PV forms) are the named functions below, the schedule `consume`.
//
// What bounds it (per 64-key tile and CTA): FLOPs 2 x 64 x 64 x (576 + 512) = 8.9 M, i.e.
// 2176 clocks of one SM's dense bf16 tensor rate (4096 FLOP/clk); bytes gathered 64 x 1152 =
// 72 KiB, from L2 for all but the first of a request's row blocks (the row blocks of one request
// read the same rows). Arithmetic intensity against the pool is 64 x 1088 x 2 / 1152 = 121 FLOP/B
// per CTA, below a Hopper card's ridge (H200: 788 TFLOP/s / 4.3 TB/s = 183 FLOP/B), so a request needs >= 2
// row blocks sharing rows through L2 to be tensor-core bound; with H x T >= 128 rows per request it
// is, and the bound is then the tensor pipe (2176 clk/tile) and, as close, shared memory's 128
// B/clk: per tile QK reads 144 KiB of operands (4 KiB per 32-clock m64n64k16), PV 72 KiB (V's
// 512 columns, 32 KiB per warpgroup, and P from shared memory for one warpgroup) and the gather
// writes 72 KiB: 288 KiB, 2304 clocks. The pair schedule exists to keep the softmax (~10-15 % of a
// tile) off that path.
// Few rows per request (H x T <= 32) stay bandwidth bound (2 x 1152 B per key), which the ws
// variant serves as well with less waste (64-row tiles for 16 rows waste 3/4 of the MMAs).
//
// Shared memory: Q 72 KiB + 2 stages x 72 KiB + P 8 KiB + stats + barriers + 1 KiB alignment
// slack = 231200 B <= 232448 B (sm_90's per-block opt-in maximum). Registers: O is 64 x 256 fp32
// per warpgroup (128 per thread) + S (32) + P (16): within the 232 setmaxnreg gives a consumer.
//
// KD_BREAK (knobs.cuh) applies as in the other variants; of KD_SKIP only 8 (no tile loads) and 16
// (no combine) are honoured here.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <math_constants.h>

#include "mbarrier_sm90.cuh"
#include "tree_verify_mla_common.cuh"
#include "wgmma_sm90a.cuh"

namespace kdtree {

namespace wg {
constexpr int kBM = 64;  // query rows per CTA (wgmma's M)
constexpr int kBN = 64;  // keys per tile
constexpr int kStages = 2;
constexpr int kConsumers = 256;              // two warpgroups
constexpr int kProducers = 128;              // one warpgroup
constexpr int kThreads = kConsumers + kProducers;
constexpr int kProducerRegs = 40, kConsumerRegs = 232;  // setmaxnreg: 128 x 40 + 256 x 232 <= 65536
constexpr int kChunks = kHeadDim / 8;        // 72 x 16 bytes per latent row
constexpr int kTileBytes = kBN * kHeadDim * 2;
constexpr int kQBytes = kBM * kHeadDim * 2;
constexpr int kBlockBytes = kBN * 128;  // one 64-column block of a tile (see wgmma_sm90a.cuh)
constexpr int kRescaleLog2 = 8;         // as the ws variant: the running max moves by > 2^8 only
constexpr int kValueHalf = kValueDim / 2;  // output columns per consumer warpgroup
// Named barriers (0 is __syncthreads).
constexpr int kBarQ = 1, kBarEpilogue = 4;
constexpr int kBarMA = 5, kBarSB = 6, kBarPB = 7;  // tile a's stats and P, tile b's stats, P_b
struct Smem {
  static constexpr int q_off = 0;
  static constexpr int k_off = q_off + kQBytes;
  static constexpr int p_off = k_off + kStages * kTileBytes;
  static constexpr int alpha_off = p_off + kBM * kBN * 2;
  static constexpr int m_off = alpha_off + kBM * 4;
  static constexpr int l_off = m_off + kBM * 4;
  static constexpr int bar_off = l_off + kBM * 4;
  static constexpr int used = bar_off + 2 * kStages * 8;
  static constexpr int total = used + 1024;  // the dynamic window is aligned to 1024 bytes in the kernel
};
static_assert(kBM == kBN, "the QK k-step offsets are shared by Q and K (same row count)");
static_assert(Smem::k_off % 1024 == 0 && Smem::p_off % 1024 == 0 && kTileBytes % 1024 == 0,
              "swizzle atoms start 1024-byte aligned");
static_assert(Smem::bar_off % 8 == 0, "mbarriers need 8-byte alignment");
static_assert(Smem::total <= 232448, "must fit sm_90's per-block shared memory (227 KiB)");
static_assert(kBlockN % 32 == 0 && kHeadDim % 64 == 0, "tile geometry");
}  // namespace wg

// V (the tile's first 512 columns) as PV's MN-major B operand: LBO = one 64-column block, SBO =
// 8 keys (WG_V_DESC_SWAP=1, knobs.cuh, swaps the two).
__device__ __forceinline__ uint64_t make_v_desc(uint32_t addr) {
  return WG_V_DESC_SWAP ? sm90a::make_desc(addr, 1024, wg::kBlockBytes) : sm90a::make_desc(addr, wg::kBlockBytes, 1024);
}

namespace wg {
using namespace sm90a;

// What every stage of one CTA reads: its shared memory and its work range.
struct Cta {
  uint8_t* smem;        // the dynamic window, 1024-byte aligned
  uint32_t sbase;       // its shared-memory address
  uint64_t* full;       // per stage: the producer's bytes have landed
  uint64_t* empty;      // per stage: both consumer warpgroups are done with it
  float* sAlpha;        // rows' rescale factors, handed to warpgroup 1 with P
  float* sM;            // rows' running max (at the end: for the epilogue)
  float* sL;            // rows' sums (at the end: for the epilogue)
  BlockRange br;
  int split;
  int num_tiles;
};

// A consumer thread's place: warpgroup, warp in it (rows 16 w .. 16 w + 15), and the two rows
// r_lo, r_lo + 8 and keys 8 j + 2 t4 + {0, 1} of a tile's scores it holds (wgmma's accumulator
// layout).
struct ConsumerThread {
  int wgi, w, g, t4, r_lo;
};

// The tree-mask rows of this thread's two query rows (ok: the row exists).
struct RowMasks {
  bool ok[2];
  const int32_t* row[2];
};

// The shared-memory address of a ring stage.
__device__ __forceinline__ uint32_t stage_addr(uint32_t sbase, int stage) {
  return sbase + Smem::k_off + stage * kTileBytes;
}

// ---------------- consumer stages ----------------

// Q into shared memory, swizzled, by both consumer warpgroups.
__device__ __forceinline__ void load_q(const TreeVerifyParams& p, const Cta& c, int tid) {
  const uint4* qg = reinterpret_cast<const uint4*>(p.q + c.br.grow0 * kHeadDim);
  for (int i = tid; i < kBM * kChunks; i += kConsumers) {
    const int r = i / kChunks, ch = i % kChunks;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (c.br.row0 + r < c.br.rows) v = __ldg(qg + static_cast<int64_t>(r) * kChunks + ch);
    const int off = Smem::q_off + (ch >> 3) * (kBM * 128) + r * 128 + (((ch & 7) ^ (r & 7)) << 4);
    *reinterpret_cast<uint4*>(c.smem + off) = v;
  }
  fence_proxy_async_shared();
  named_barrier_sync(kBarQ, kConsumers);
}

__device__ __forceinline__ RowMasks row_masks(const TreeVerifyParams& p, const Cta& c, const ConsumerThread& t) {
  RowMasks rm;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = c.br.row0 + t.r_lo + 8 * h;
    rm.ok[h] = r < c.br.rows;
    rm.row[h] = p.tree_mask + static_cast<int64_t>(c.br.qo0 + min(r / p.num_heads, c.br.T - 1)) * p.mask_words;
  }
  return rm;
}

// S = Q K^T of the tile at `kaddr` (9 column blocks of 64, 4 k-steps of 16 each: 36 x
// m64n64k16, both operands in shared memory), committed. dq is made opaque per tile: otherwise
// the compiler keeps all 36 loop-invariant Q descriptors in registers (72 of them) and spills.
__device__ __forceinline__ void issue_qk(float (&s)[32], uint64_t dq, uint32_t kaddr) {
  const uint64_t dk = make_desc(kaddr, 16, 1024);
  wgmma_fence();
  uint64_t dq_t = dq;
  asm volatile("" : "+l"(dq_t));
#pragma unroll
  for (int ks = 0; ks < kHeadDim / 16; ++ks) {
    const uint32_t off = (ks >> 2) * kBlockBytes + (ks & 3) * 32;
    wgmma_m64n64k16_ss<0>(s, desc_advance(dq_t, off), desc_advance(dk, off), ks > 0);
  }
  wgmma_commit();
}

// Mask, scale and exponentiate row h's scores of a tile in place (h = 0, 1: this thread's rows
// r_lo, r_lo + 8; row_ok: the row exists, mask_row: its tree-mask row) against the row's running
// max m_in (lazy rescale, as the other variants): m_out gets the new max, scale the factor O and
// the row sum must be scaled by; returns this thread's share of the new P's row sum. m_in may be
// m_out. Only tiles that reach the tree or the split's end test the mask (tile_needs_mask); the
// max is taken raw and scaled once, each P is one FFMA and one ex2.approx (OnlineSoftmax's form).
__device__ __forceinline__ float softmax_row(const TreeVerifyParams& p, float (&s)[32], int h, bool row_ok,
                                             const int32_t* mask_row, int t4, int tile_base, int kend, int Lp,
                                             float m_in, float& m_out, float& scale) {
  float tmax = minus_infinity();
  if (tile_needs_mask(tile_base, kBN, Lp, kend)) {
    const int nvalid = kend - tile_base;
    uint64_t vis = 0;
    if (row_ok) {
      vis = tree_visible_bits(mask_row, p.mask_words, tile_base, 32, Lp) & 0xffffffffull;
      if (nvalid > 32) vis |= (tree_visible_bits(mask_row, p.mask_words, tile_base + 32, 32, Lp) & 0xffffffffull) << 32;
      if (nvalid < 64) vis &= (1ull << nvalid) - 1;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[4 * j + 2 * h + e];
        x = ((vis >> (8 * j + 2 * t4 + e)) & 1) ? x : minus_infinity();
        tmax = fmaxf(tmax, x);
      }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) tmax = fmaxf(tmax, s[4 * j + 2 * h + e]);
  }
  tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
  tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
  const float c = p.scale_log2 * hooks::kScoreScale;
  float m = m_in, a = 1.f;
  const float m_new = fmaxf(m, tmax * c);
  if (m_new > m + kRescaleLog2) {
    a = fast_exp2(m - m_new);
    m = m_new;
  }
  const float m_use = m == minus_infinity() ? 0.f : m;
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float& x = s[4 * j + 2 * h + e];
      x = fast_exp2(fmaf(x, c, -m_use));
      sum += x;
    }
  m_out = m;
  scale = a;
  return sum;
}

// P as the bf16 A fragments of the PV MMAs (keys 16 kk .. 16 kk + 15 per k-step).
__device__ __forceinline__ void pack_p(const float (&s)[32], uint32_t (&pa)[4][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int q = 0; q < 4; ++q) pa[kk][q] = pack_bf16x2(s[8 * kk + 2 * q], s[8 * kk + 2 * q + 1]);
}

// P into shared memory (128-byte swizzle), for the other warpgroup's PV, one stmatrix.x4 per
// 16 keys (the four 8x8 blocks of pa[kk]: rows r, r + 8 by keys 16 kk, 16 kk + 8; lane l gives
// row l % 8 of block l / 8); the caller fences it into the async proxy.
__device__ __forceinline__ void store_p(uint8_t* smem, const uint32_t (&pa)[4][4], const ConsumerThread& t) {
  const int lane = 4 * t.g + t.t4, blk = lane >> 3;
  const int row = 16 * t.w + (blk & 1) * 8 + (lane & 7);
  const uint32_t base = smem_addr(smem + Smem::p_off);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    stmatrix_x4_s(base + swizzle128_offset(kBM, row, 16 * kk + (blk >> 1) * 8), pa[kk][0], pa[kk][1], pa[kk][2],
                  pa[kk][3]);
}

// O's rows scaled by the softmax's rescale factors (skipped when no row of the warp moved).
__device__ __forceinline__ void rescale_o(float (&o)[128], const float (&f)[2]) {
  if (__any_sync(0xffffffffu, f[0] != 1.f || f[1] != 1.f)) {
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      o[4 * j + 0] *= f[0];
      o[4 * j + 1] *= f[0];
      o[4 * j + 2] *= f[1];
      o[4 * j + 3] *= f[1];
    }
  }
}

// O (+)= P V[:, 256 columns from vaddr], P from registers (4 x m64n256k16), committed.
__device__ __forceinline__ void issue_pv_rs(float (&o)[128], uint32_t (&pa)[4][4], uint32_t vaddr) {
  fence_operands(pa[0]);
  fence_operands(pa[1]);
  fence_operands(pa[2]);
  fence_operands(pa[3]);
  const uint64_t dv = make_v_desc(vaddr);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wgmma_m64n256k16_rs<1>(o, pa[kk], desc_advance(dv, kk * 16 * 128), 1);
  wgmma_commit();
}

// The same with P from shared memory (descriptor dp).
__device__ __forceinline__ void issue_pv_ss(float (&o)[128], uint64_t dp, uint32_t vaddr) {
  const uint64_t dv = make_v_desc(vaddr);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    wgmma_m64n256k16_ss<1>(o, desc_advance(dp, kk * 32), desc_advance(dv, kk * 16 * 128), 1);
  wgmma_commit();
}

// Waits until at most N of this warpgroup's MMA groups are in flight, then lets O be touched.
template <int N>
__device__ __forceinline__ void wait_mma(float (&o)[128]) {
  wgmma_wait<N>();
  fence_operands(o);
}

// The sum over the quad of lanes that share a row.
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

// Both warpgroups write their 256 columns of O (and warpgroup 0 the rows' lse).
__device__ __forceinline__ void store_o(const TreeVerifyParams& p, const Cta& c, const ConsumerThread& t,
                                        const float (&o)[128]) {
  store_tile(p, c.split, c.br.grow0, c.br.row0, c.br.rows, 16 * t.w, t.g, t.wgi * kValueHalf + 2 * t.t4,
             *reinterpret_cast<const float(*)[32][4]>(o), c.sM, c.sL, t.wgi == 0 && t.t4 == 0, t.w == 3);
}

// ---------------- the consumers' schedule ----------------
// The consumers take tiles in pairs, as FlashMLA's published "seesaw" schedule
// (docs/20250422-new-kernel-deep-dive.md there): warpgroup 0 computes S, the softmax and P of tile
// a = 2 i, warpgroup 1 those of tile b = 2 i + 1, each applying the other's max and rescale
// factors through shared memory, so one warpgroup's softmax runs while the other's MMAs keep the
// tensor pipe busy; P goes to the other warpgroup through the one P buffer (P_a, then P_b once
// warpgroup 1's P_a V_a is done). Row sums are kept per warpgroup in the common frame (l_part)
// and added at the end. Per pair, tile a's rescale factors go through sAlpha (warpgroup 0 writes)
// and tile b's through sL (warpgroup 1 writes; sL gets the row sums at the end).

// Warpgroup 0: tile a of each pair (stage 0), output columns 0..255.
__device__ __forceinline__ void consume_pairs_wg0(const TreeVerifyParams& p, const Cta& c, const ConsumerThread& t,
                                                   const RowMasks& rm, uint64_t dq, uint64_t dp, uint32_t v_half,
                                                   float (&o)[128], float (&l_part)[2]) {
  float* sScaleA = c.sAlpha;
  float* sScaleB = c.sL;
  const int num_pairs = (c.num_tiles + 1) / 2;
  for (int i = 0; i < num_pairs; ++i) {
    const bool has_b = 2 * i + 1 < c.num_tiles;
    float s[32];  // per pair, as the other schedule: nothing of it lives across pairs
    uint32_t pa[4][4];
    KD_STAMP(kTileWait, 2 * i);
    mbar_wait(&c.full[0], i & 1);
    KD_STAMP(kTileReady, 2 * i);
    fence_proxy_async_shared();
    issue_qk(s, dq, stage_addr(c.sbase, 0));
    KD_STAMP(kSIssued, 2 * i);
    wgmma_wait<0>();  // S_a
    KD_STAMP(kSDone, 2 * i);
    fence_operands(s);
    fence_operands(o);
    float m_in[2], m_a[2], sa[2], psum[2], sb[2] = {1.f, 1.f};
#pragma unroll
    for (int h = 0; h < 2; ++h) m_in[h] = i == 0 ? minus_infinity() : c.sM[t.r_lo + 8 * h];
#pragma unroll
    for (int h = 0; h < 2; ++h)
      psum[h] = softmax_row(p, s, h, rm.ok[h], rm.row[h], t.t4, c.br.kbeg + 2 * i * kBN, c.br.kend, c.br.Lp,
                            m_in[h], m_a[h], sa[h]);
    pack_p(s, pa);
    KD_STAMP(kSoftmaxDone, 2 * i);
    store_p(c.smem, pa, t);  // P_a for warpgroup 1's half of P_a V_a
    fence_proxy_async_shared();
    KD_STAMP(kPStored, 2 * i);
    __syncwarp();  // the quad's reads of sM above come before its first lane overwrites them
    if (t.t4 == 0) {
      c.sM[t.r_lo] = m_a[0];
      c.sM[t.r_lo + 8] = m_a[1];
      sScaleA[t.r_lo] = sa[0];
      sScaleA[t.r_lo + 8] = sa[1];
    }
    rescale_o(o, sa);
    issue_pv_rs(o, pa, stage_addr(c.sbase, 0) + v_half);
    KD_STAMP(kPVIssued, 2 * i);
    // bar.sync on both sides (compute-sanitizer's racecheck does not take a bar.arrive as
    // ordering the arriving side's reads before the other side's later writes)
    KD_STAMP(kBarWait0, 2 * i);
    named_barrier_sync(kBarMA, kConsumers);
    KD_STAMP(kBarDone0, 2 * i);
#pragma unroll
    for (int h = 0; h < 2; ++h) l_part[h] = l_part[h] * sa[h] + psum[h];
    if (has_b) {
      KD_STAMP(kBarWait1, 2 * i + 1);
      named_barrier_sync(kBarSB, kConsumers);  // tile b's max and factor
      KD_STAMP(kBarDone1, 2 * i + 1);
      sb[0] = sScaleB[t.r_lo];
      sb[1] = sScaleB[t.r_lo + 8];
    }
    wait_mma<0>(o);  // P_a V_a done: stage 0 is free of this warpgroup
    KD_STAMP(kPVDone, 2 * i);
    mbar_arrive(&c.empty[0]);
    KD_STAMP(kStageFreed, 2 * i);
    if (has_b) {
      rescale_o(o, sb);
#pragma unroll
      for (int h = 0; h < 2; ++h) l_part[h] *= sb[h];
      KD_STAMP(kBarWait2, 2 * i + 1);
      named_barrier_sync(kBarPB, kConsumers);  // P_b in shared memory
      KD_STAMP(kBarDone2, 2 * i + 1);
      issue_pv_ss(o, dp, stage_addr(c.sbase, 1) + v_half);
      KD_STAMP(kPVIssued, 2 * i + 1);
      // done before the next pair's S_a is issued (it would queue behind it on the tensor pipe
      // anyway): stage 1 goes back to the producer at once, so tile b's next load is not held
      // up by the next S_a, and P's buffer is free for the next P_a
      wait_mma<0>(o);
      KD_STAMP(kPVDone, 2 * i + 1);
      mbar_arrive(&c.empty[1]);
      KD_STAMP(kStageFreed, 2 * i + 1);
    }
  }
}

// Warpgroup 1: tile b of each pair (stage 1), output columns 256..511.
__device__ __forceinline__ void consume_pairs_wg1(const TreeVerifyParams& p, const Cta& c, const ConsumerThread& t,
                                                   const RowMasks& rm, uint64_t dq, uint64_t dp, uint32_t v_half,
                                                   float (&o)[128], float (&l_part)[2]) {
  float* sScaleA = c.sAlpha;
  float* sScaleB = c.sL;
  const int num_pairs = (c.num_tiles + 1) / 2;
  for (int i = 0; i < num_pairs; ++i) {
    const bool has_b = 2 * i + 1 < c.num_tiles;
    float s[32];
    uint32_t pa[4][4];
    if (has_b) {
      KD_STAMP(kTileWait, 2 * i + 1);
      mbar_wait(&c.full[1], i & 1);
      KD_STAMP(kTileReady, 2 * i + 1);
      fence_proxy_async_shared();
      issue_qk(s, dq, stage_addr(c.sbase, 1));
      KD_STAMP(kSIssued, 2 * i + 1);
    }
    KD_STAMP(kBarWait0, 2 * i);
    named_barrier_sync(kBarMA, kConsumers);  // tile a's max, factor and P
    KD_STAMP(kBarDone0, 2 * i);
    float m_a[2], sa[2], sb[2] = {1.f, 1.f}, m_b[2], psum[2] = {0.f, 0.f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m_a[h] = c.sM[t.r_lo + 8 * h];
      sa[h] = sScaleA[t.r_lo + 8 * h];
    }
    mbar_wait(&c.full[0], i & 1);  // (done: warpgroup 0 read the same stage) for this thread's view of the bytes
    fence_proxy_async_shared();
    wgmma_wait<0>();  // S_b, done by now (it ran during warpgroup 0's softmax): O is not touched while it flies
    KD_STAMP(kSDone, 2 * i + 1);
    fence_operands(s);  // (unconditional: the compiler does not pair this with the branch that issued S_b)
    // The softmax of b runs while warpgroup 0's P_a V_a keeps the tensor pipe busy. (Issuing this
    // warpgroup's P_a V_a before it makes ptxas serialise every wgmma of the kernel, C7515: it
    // will not let S's registers be written while an MMA of this warpgroup is in flight.)
    if (has_b) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
        psum[h] = softmax_row(p, s, h, rm.ok[h], rm.row[h], t.t4, c.br.kbeg + (2 * i + 1) * kBN, c.br.kend,
                              c.br.Lp, m_a[h], m_b[h], sb[h]);
      KD_STAMP(kSoftmaxDone, 2 * i + 1);
      __syncwarp();
      if (t.t4 == 0) {
        c.sM[t.r_lo] = m_b[0];
        c.sM[t.r_lo + 8] = m_b[1];
        sScaleB[t.r_lo] = sb[0];
        sScaleB[t.r_lo + 8] = sb[1];
      }
    }
    rescale_o(o, sa);
    issue_pv_ss(o, dp, stage_addr(c.sbase, 0) + v_half);  // O_R = sa O_R + P_a V_a[:, 256:512]
    KD_STAMP(kPVIssued, 2 * i);
    // bar.sync on both sides, as the other schedule's P hand-off: this warpgroup's reads of
    // tile a's max and factor also come before warpgroup 0 overwrites them for the next pair
    KD_STAMP(kBarWait1, 2 * i + 1);
    if (has_b) named_barrier_sync(kBarSB, kConsumers);
    KD_STAMP(kBarDone1, 2 * i + 1);
#pragma unroll
    for (int h = 0; h < 2; ++h) l_part[h] = l_part[h] * sa[h] * sb[h] + psum[h];
    wait_mma<0>(o);  // P_a V_a done: stage 0 and P's buffer are free of this warpgroup
    KD_STAMP(kPVDone, 2 * i);
    mbar_arrive(&c.empty[0]);
    KD_STAMP(kStageFreed, 2 * i);
    if (has_b) {
      rescale_o(o, sb);
      pack_p(s, pa);
      store_p(c.smem, pa, t);  // P_b for warpgroup 0's half of P_b V_b
      fence_proxy_async_shared();
      KD_STAMP(kPStored, 2 * i + 1);
      issue_pv_rs(o, pa, stage_addr(c.sbase, 1) + v_half);
      KD_STAMP(kPVIssued, 2 * i + 1);
      KD_STAMP(kBarWait2, 2 * i + 1);
      named_barrier_sync(kBarPB, kConsumers);  // both sides: P_a's reads and P_b's writes before the next P_a
      KD_STAMP(kBarDone2, 2 * i + 1);
      wait_mma<0>(o);
      KD_STAMP(kPVDone, 2 * i + 1);
      mbar_arrive(&c.empty[1]);
      KD_STAMP(kStageFreed, 2 * i + 1);
    }
  }
}

// The pair schedule, then the row sums of both warpgroups added into sL for the epilogue.
__device__ __forceinline__ void consume(const TreeVerifyParams& p, const Cta& c, const ConsumerThread& t,
                                               float (&o)[128]) {
  const RowMasks rm = row_masks(p, c, t);
  const uint64_t dq = make_desc(c.sbase + Smem::q_off, 16, 1024);
  const uint64_t dp = make_desc(c.sbase + Smem::p_off, 16, 1024);
  const uint32_t v_half = (hooks::kWgmmaWrongHalf ? 0 : t.wgi) * (kValueHalf / 64) * kBlockBytes;
  float l_part[2] = {0.f, 0.f};  // this thread's share of its rows' sums, in the running frame
  if (t.wgi == 0) consume_pairs_wg0(p, c, t, rm, dq, dp, v_half, o, l_part);
  else consume_pairs_wg1(p, c, t, rm, dq, dp, v_half, o, l_part);

  wait_mma<0>(o);  // (every MMA is done on every path; said here so that the compiler sees it)
#pragma unroll
  for (int h = 0; h < 2; ++h) l_part[h] = quad_sum(l_part[h]);
  float* sPartB = c.sAlpha;  // warpgroup 1's row sums, once every read of the rescale factors is done
  named_barrier_sync(kBarEpilogue, kConsumers);
  if (t.wgi == 1 && t.t4 == 0) {
    sPartB[t.r_lo] = l_part[0];
    sPartB[t.r_lo + 8] = l_part[1];
  }
  named_barrier_sync(kBarEpilogue, kConsumers);
  if (t.wgi == 0 && t.t4 == 0) {
    c.sL[t.r_lo] = l_part[0] + sPartB[t.r_lo];
    c.sL[t.r_lo + 8] = l_part[1] + sPartB[t.r_lo + 8];
  }
}

}  // namespace wg

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KD_WGMMA_BODY 0  // a device pass for another arch: the kernel exists but traps
#else
#define KD_WGMMA_BODY 1
#endif

// The kernel: the producer warpgroup's gather loop, then the consumers' pair schedule (`consume`).
__global__ void __launch_bounds__(wg::kThreads, 1) tree_verify_mla_wgmma_kernel(const TreeVerifyParams p) {
#if KD_WGMMA_BODY && defined(__CUDA_ARCH__)
  using namespace wg;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  uint8_t* smem = smem_raw + ((1024u - (raw_addr & 1023u)) & 1023u);
  const uint32_t sbase = smem_addr(smem);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Smem::bar_off);
  uint64_t* empty = full + kStages;
  float* sAlpha = reinterpret_cast<float*>(smem + Smem::alpha_off);
  float* sM = reinterpret_cast<float*>(smem + Smem::m_off);
  float* sL = reinterpret_cast<float*>(smem + Smem::l_off);

  const int tid = threadIdx.x, lane = tid & 31;
  const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);  // warp-uniform to the compiler (wgmma's .aligned)
  const int split = blockIdx.x, rb = blockIdx.y, b = blockIdx.z;

  BlockRange br;
  if (!block_range(p, split, rb, b, kBM, br)) return;
  const int kbeg = br.kbeg, kend = br.kend;
  const int num_tiles = (kend - kbeg + kBN - 1) / kBN;

  if (hooks::kSkipLoads) {  // measurement builds never copy: the ring holds finite stand-ins
    uint4* ring = reinterpret_cast<uint4*>(smem + Smem::k_off);
    for (int i = tid; i < kStages * kTileBytes / 16; i += kThreads) ring[i] = hooks::ring_fill(i);
    fence_proxy_async_shared();
  }
  if (tid < kStages) {
    mbar_init(&full[tid], kProducers);
    mbar_init(&empty[tid], kConsumers);
  }
  if (tid == 0) fence_mbarrier_init();
  __syncthreads();
  KD_STAMP_CTA_BEGIN(num_tiles);
  KD_STAMP_LANE(kLaneBegin);

  if (warp >= kConsumers / 32) {
    // ---------------- producer warpgroup ----------------
    // Eight lanes copy one 128-byte piece of a row (whole 32-byte sectors, one row's 64-column
    // block per lane group), so a warp instruction moves four rows' pieces; the warpgroup covers
    // 16 rows per instruction and this thread rows 16 r + 4 pw + rr (r < 4) of every tile.
    // (Kept inline: moved into a function, it changes how nvcc allocates the whole kernel.)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    const int pt = tid - kConsumers;
    const SlotSource slots = slot_source(p, b, br.kv0);
    const int pw = pt >> 5, rr = lane >> 3, cc = lane & 7;
    constexpr int kRowsPerThread = kBN / 16;
    const uint32_t chunk_dst = static_cast<uint32_t>((cc ^ ((4 * pw + rr) & 7)) << 4);
    int slot[kRowsPerThread];
    auto fetch_slots = [&](int it) {  // tile it's slot ids of this thread's rows; -1: past the split's end
      const int base = kbeg + it * kBN;
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) {
        const int j = 16 * r + 4 * pw + rr;
        slot[r] = base + j < kend ? slot_at(slots, base + j) : -1;
      }
    };
    if (!hooks::kSkipLoads && num_tiles > 0) fetch_slots(0);
    for (int it = 0; it < num_tiles; ++it) {
      const int stage = it % kStages;
      KD_STAMP(kLoadWaitFree, it);
      if (it >= kStages) mbar_wait(&empty[stage], ((it / kStages) - 1) & 1);
      KD_STAMP(kLoadFree, it);
      if (hooks::kSkipLoads) {
        mbar_arrive(&full[stage]);
        continue;
      }
      const uint32_t dst0 = stage_addr(sbase, stage) + chunk_dst;
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) {
        const int j = 16 * r + 4 * pw + rr;
        const bool valid = slot[r] >= 0;  // else zero-fill: keys past the split's end
        const __nv_bfloat16* src = p.kv + static_cast<int64_t>(valid ? slot[r] : 0) * kHeadDim + cc * 8;
#pragma unroll
        for (int kb = 0; kb < kHeadDim / 64; ++kb)
          cp_async_16_s(dst0 + kb * kBlockBytes + j * 128, src + kb * 64, valid ? 16 : 0);
      }
      if (it + 1 < num_tiles) fetch_slots(it + 1);  // the next tile's slot ids load while these copies fly
      cp_async_mbar_arrive_noinc(smem_addr(&full[stage]));  // the consumers fence the bytes into the async proxy
      KD_STAMP(kLoadIssued, it);
    }
    cp_async_wait<0>();
    KD_STAMP_LANE(kLaneEnd);
    return;
  }

  // ---------------- consumers ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
  const Cta c{smem, sbase, full, empty, sAlpha, sM, sL, br, split, num_tiles};
  load_q(p, c, tid);
  const int wgi = warp >> 2, w = warp & 3;
  const int g = lane >> 2, t4 = lane & 3;
  const int r_lo = 16 * w + g;
  const ConsumerThread t{wgi, w, g, t4, r_lo};

  float o[128];  // O[64 rows, 256 columns of this warpgroup], wgmma accumulator layout
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;

  consume(p, c, t, o);

  // ---------------- epilogue: both warpgroups, their own 256 columns ----------------
  named_barrier_sync(kBarEpilogue, kConsumers);
  store_o(p, c, t, o);
  KD_STAMP_LANE(kLaneEnd);
  KD_STAMP_CTA_END();
#elif defined(__CUDA_ARCH__)
  __trap();  // built for an arch without wgmma: never launched (launch_plan dispatches it on sm_90a only)
#endif
}

}  // namespace kdtree

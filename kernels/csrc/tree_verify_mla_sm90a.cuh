// MLA tree-verify attention, Hopper variant ("wgmma", sm_90a only): warpgroup MMAs with their
// operands in 128-byte-swizzled shared memory, a producer warp gathering KV rows with cp.async
// into a two-stage ring guarded by mbarriers, and two consumer warpgroups.
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
//                  free stage. Rows past the split's end are zero-filled. (v1, KD_WG_PRODUCER=0:
//                  a thread pair per row, half-used sectors, each thread waiting for its copies:
//                  2.3x slower on the H200.)
//   warpgroup 0    S = Q K^T (36 x wgmma m64n64k16, A = Q and B = K from shared memory), mask +
//                  online softmax in registers, P (bf16) and the rows' rescale factors to shared
//                  memory for warpgroup 1, then O[:, 0:256] = alpha O + P V (4 x wgmma m64n256k16,
//                  A = P from registers, B = V read MN-major from the same tile).
//   warpgroup 1    O[:, 256:512] = alpha O + P V (4 x wgmma m64n256k16, A = P from shared memory).
//   Both release the stage on its `empty` mbarrier once their MMAs on it have completed, and
//   fence the producer's bytes into the async proxy after each `full` wait. P and its rescale
//   factors are handed over with named barriers synced on both sides (racecheck-clean).
//
// What bounds it (per 64-key tile and CTA): FLOPs 2 x 64 x 64 x (576 + 512) = 8.9 M, i.e.
// 2176 clocks of one SM's dense bf16 tensor rate (4096 FLOP/clk); bytes gathered 64 x 1152 =
// 72 KiB, from L2 for all but the first of a request's row blocks (the row blocks of one request
// read the same rows). Arithmetic intensity against the pool is 64 x 1088 x 2 / 1152 = 121 FLOP/B
// per CTA, below the H200's ridge (788 TFLOP/s / 4.3 TB/s = 183 FLOP/B), so a request needs >= 2
// row blocks sharing rows through L2 to be tensor-core bound; with H x T >= 128 rows per request it
// is, and the bound is then the tensor pipe (2176 clk/tile) plus what is not overlapped: warpgroup
// 0's softmax between its QK and PV (~10-15 % of a tile) and shared-memory operand bandwidth (QK
// with A and B from shared memory reads 4 KiB per 32-clock m64n64k16: at the 128 B/clk limit).
// Few rows per request (H x T <= 32) stay bandwidth bound (2 x 1152 B per key), which the ws
// variant serves as well with less waste (64-row tiles for 16 rows waste 3/4 of the MMAs).
//
// Shared memory: Q 72 KiB + 2 stages x 72 KiB + P 8 KiB + stats + barriers + 1 KiB alignment
// slack = 231200 B <= 232448 B (sm_90's per-block opt-in maximum). Registers: O is 64 x 256 fp32
// per warpgroup (128 per thread) + S (32) + P (16): within the 232 setmaxnreg gives a consumer.
//
// KD_BREAK (test_hooks.cuh) applies as in the other variants; of KD_SKIP only 8 (no tile loads)
// and 16 (no combine) are honoured here. KD_WG_SEESAW=1 swaps in an experimental pair schedule for
// the consumers (see there; not yet run on a GPU).
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
constexpr int kBarQ = 1, kBarPFull = 2, kBarPFree = 3, kBarEpilogue = 4;
constexpr int kBarMA = 5, kBarSB = 6, kBarPB = 7;  // KD_WG_SEESAW: tile a's stats and P, tile b's stats, P_b
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
// 8 keys. WG_V_DESC_SWAP=1 swaps the two (a diagnosis build, in case a device disagrees with this
// reading of the descriptor format; a correct build defines nothing).
__device__ __forceinline__ uint64_t make_v_desc(uint32_t addr) {
  return WG_V_DESC_SWAP ? sm90a::make_desc(addr, 1024, wg::kBlockBytes) : sm90a::make_desc(addr, wg::kBlockBytes, 1024);
}

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KD_WGMMA_BODY 0  // a device pass for another arch: the kernel exists but traps
#else
#define KD_WGMMA_BODY 1
#endif

__global__ void __launch_bounds__(wg::kThreads, 1) tree_verify_mla_wgmma_kernel(const TreeVerifyParams p) {
#if KD_WGMMA_BODY && defined(__CUDA_ARCH__)
  using namespace wg;
  using namespace sm90a;
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
  const int qo0 = br.qo0, T = br.T, rows = br.rows, row0 = br.row0, kv0 = br.kv0, Lp = br.Lp;
  const int kbeg = br.kbeg, kend = br.kend;
  const int64_t grow0 = br.grow0;
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

  if (warp >= kConsumers / 32) {
    // ---------------- producer warpgroup: thread pair (2 j, 2 j + 1) gathers key j's row ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    const int pt = tid - kConsumers;
    const SlotSource slots = slot_source(p, b, kv0);
    // Eight lanes copy one 128-byte piece of a row (whole 32-byte sectors, one row's 64-column
    // block per lane group), so a warp instruction moves four rows' pieces; the warpgroup covers
    // 16 rows per instruction and this thread rows 16 r + 4 pw + rr (r < 4) of every tile.
    const int pw = pt >> 5, rr = lane >> 3, cc = lane & 7;
    constexpr int kRowsPerThread = kBN / 16;
    const uint32_t chunk_dst = static_cast<uint32_t>((cc ^ ((4 * pw + rr) & 7)) << 4);
    int slot[kRowsPerThread];
    auto fetch_slots = [&](int it) {
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
      if (it >= kStages) mbar_wait(&empty[stage], ((it / kStages) - 1) & 1);
      if (hooks::kSkipLoads) {
        mbar_arrive(&full[stage]);
        continue;
      }
      const uint32_t dst0 = sbase + Smem::k_off + stage * kTileBytes + chunk_dst;
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
    }
    cp_async_wait<0>();
    return;
  }

  // ---------------- consumers: Q into shared memory, swizzled ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
  {
    const uint4* qg = reinterpret_cast<const uint4*>(p.q + grow0 * kHeadDim);
    for (int i = tid; i < kBM * kChunks; i += kConsumers) {
      const int r = i / kChunks, c = i % kChunks;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (row0 + r < rows) v = __ldg(qg + static_cast<int64_t>(r) * kChunks + c);
      *reinterpret_cast<uint4*>(smem + Smem::q_off + (c >> 3) * (kBM * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4)) = v;
    }
    fence_proxy_async_shared();
    named_barrier_sync(kBarQ, kConsumers);
  }

#if KD_WG_SEESAW
  const int wgi = warp >> 2;        // consumer warpgroup 0 or 1
  const int w = warp & 3;           // warp within it: rows 16 w .. 16 w + 15
  const int g = lane >> 2, t4 = lane & 3;
  const int r_lo = 16 * w + g;      // this thread's rows of the block: r_lo and r_lo + 8

  float o[128];  // O[64 rows, 256 columns of this warpgroup], wgmma accumulator layout
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;

  bool row_ok[2];
  const int32_t* mask_row[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row0 + r_lo + 8 * h;
    row_ok[h] = r < rows;
    mask_row[h] = p.tree_mask + static_cast<int64_t>(qo0 + min(r / p.num_heads, T - 1)) * p.mask_words;
  }
  const uint64_t dq = make_desc(sbase + Smem::q_off, 16, 1024);
  const uint64_t dp = make_desc(sbase + Smem::p_off, 16, 1024);
  const uint32_t v_half = (hooks::kWgmmaWrongHalf ? 0 : wgi) * (kValueHalf / 64) * kBlockBytes;
  float* sScaleA = sAlpha;  // per pair: tile a's rescale factors (warpgroup 0 writes), ...
  float* sScaleB = sL;      // ... tile b's (warpgroup 1 writes); sL gets the row sums at the end
  float l_part[2] = {0.f, 0.f};  // this thread's share of its rows' sums, in the running frame

  // S = Q K^T of the tile in `stage` (36 x m64n64k16, both operands in shared memory), committed.
  auto issue_qk = [&](float (&sc)[32], int stage) {
    const uint64_t dk = make_desc(sbase + Smem::k_off + stage * kTileBytes, 16, 1024);
    uint64_t dq_t = dq;
    asm volatile("" : "+l"(dq_t));
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      const uint32_t off = (ks >> 2) * kBlockBytes + (ks & 3) * 32;
      wgmma_m64n64k16_ss<0>(sc, desc_advance(dq_t, off), desc_advance(dk, off), ks > 0);
    }
    wgmma_commit();
  };
  // Mask, scale and exponentiate a tile's scores in place against the running max m_in (lazy
  // rescale, as the other variants): the new max, the factor O and the row sums must be scaled
  // by, and this thread's share of the new P's row sums.
  auto softmax = [&](float (&sc)[32], int tile_base, const float (&m_in)[2], float (&m_out)[2],
                     float (&scale)[2], float (&psum)[2]) {
    const int nvalid = kend - tile_base;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint64_t vis = 0;
      if (row_ok[h]) {
        vis = tree_visible_bits(mask_row[h], p.mask_words, tile_base, 32, Lp) & 0xffffffffull;
        if (nvalid > 32)
          vis |= (tree_visible_bits(mask_row[h], p.mask_words, tile_base + 32, 32, Lp) & 0xffffffffull) << 32;
        if (nvalid < 64) vis &= (1ull << nvalid) - 1;
      }
      float tmax = minus_infinity();
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = sc[4 * j + 2 * h + e];
          x = ((vis >> (8 * j + 2 * t4 + e)) & 1) ? x * p.scale_log2 * hooks::kScoreScale : minus_infinity();
          tmax = fmaxf(tmax, x);
        }
      tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
      tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
      float m = m_in[h], a = 1.f;
      const float m_new = fmaxf(m, tmax);
      if (m_new > m + kRescaleLog2) {
        a = exp2f(m - m_new);
        m = m_new;
      }
      const float m_use = m == minus_infinity() ? 0.f : m;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = sc[4 * j + 2 * h + e];
          x = exp2f(x - m_use);
          sum += x;
        }
      m_out[h] = m;
      scale[h] = a;
      psum[h] = sum;
    }
  };
  // P as bf16 A fragments of the PV MMAs (keys 16 kk .. 16 kk + 15 per k-step), and into shared memory.
  auto pack = [&](const float (&sc)[32], uint32_t (&pa)[4][4]) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int q = 0; q < 4; ++q) pa[kk][q] = pack_bf16x2(sc[8 * kk + 2 * q], sc[8 * kk + 2 * q + 1]);
  };
  auto store_p = [&](const uint32_t (&pa)[4][4]) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const int c0 = 16 * kk + 2 * t4;
      *reinterpret_cast<uint32_t*>(smem + Smem::p_off + swizzle128_offset(kBM, r_lo, c0)) = pa[kk][0];
      *reinterpret_cast<uint32_t*>(smem + Smem::p_off + swizzle128_offset(kBM, r_lo + 8, c0)) = pa[kk][1];
      *reinterpret_cast<uint32_t*>(smem + Smem::p_off + swizzle128_offset(kBM, r_lo, c0 + 8)) = pa[kk][2];
      *reinterpret_cast<uint32_t*>(smem + Smem::p_off + swizzle128_offset(kBM, r_lo + 8, c0 + 8)) = pa[kk][3];
    }
    fence_proxy_async_shared();
  };
  auto rescale = [&](const float (&f)[2]) {
    if (__any_sync(0xffffffffu, f[0] != 1.f || f[1] != 1.f)) {
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        o[4 * j + 0] *= f[0];
        o[4 * j + 1] *= f[0];
        o[4 * j + 2] *= f[1];
        o[4 * j + 3] *= f[1];
      }
    }
  };
  auto issue_pv_smem_p = [&](int stage) {  // O (+)= P V[:, this warpgroup's half], P from shared memory
    const uint64_t dv = make_v_desc(sbase + Smem::k_off + stage * kTileBytes + v_half);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_m64n256k16_ss<1>(o, desc_advance(dp, kk * 32), desc_advance(dv, kk * 16 * 128), 1);
    wgmma_commit();
  };
  auto issue_pv_reg_p = [&](const uint32_t (&pa)[4][4], int stage) {  // the same, P from registers
    const uint64_t dv = make_v_desc(sbase + Smem::k_off + stage * kTileBytes + v_half);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_m64n256k16_rs<1>(o, pa[kk], desc_advance(dv, kk * 16 * 128), 1);
    wgmma_commit();
  };
  const int num_pairs = (num_tiles + 1) / 2;

  if (wgi == 0) {
    // ---------------- warpgroup 0: tile a = 2 i of each pair (stage 0), columns 0..255 ----------------
    for (int i = 0; i < num_pairs; ++i) {
      const bool has_b = 2 * i + 1 < num_tiles;
      float s[32];  // per pair, as the other schedule: nothing of it lives across pairs
      uint32_t pa[4][4];
      mbar_wait(&full[0], i & 1);
      fence_proxy_async_shared();
      issue_qk(s, 0);
      wgmma_wait<0>();  // S_a
      fence_operands(s);
      fence_operands(o);
      float m_in[2], m_a[2], sa[2], psum[2], sb[2] = {1.f, 1.f};
#pragma unroll
      for (int h = 0; h < 2; ++h) m_in[h] = i == 0 ? minus_infinity() : sM[r_lo + 8 * h];
      softmax(s, kbeg + 2 * i * kBN, m_in, m_a, sa, psum);
      pack(s, pa);
      store_p(pa);  // P_a for warpgroup 1's half of P_a V_a
      __syncwarp();  // the quad's reads of sM above come before its first lane overwrites them
      if (t4 == 0) {
        sM[r_lo] = m_a[0];
        sM[r_lo + 8] = m_a[1];
        sScaleA[r_lo] = sa[0];
        sScaleA[r_lo + 8] = sa[1];
      }
      rescale(sa);
      fence_operands(pa[0]);
      fence_operands(pa[1]);
      fence_operands(pa[2]);
      fence_operands(pa[3]);
      issue_pv_reg_p(pa, 0);
      // bar.sync on both sides (compute-sanitizer's racecheck does not take a bar.arrive as
      // ordering the arriving side's reads before the other side's later writes)
      named_barrier_sync(kBarMA, kConsumers);
#pragma unroll
      for (int h = 0; h < 2; ++h) l_part[h] = l_part[h] * sa[h] + psum[h];
      if (has_b) {
        named_barrier_sync(kBarSB, kConsumers);  // tile b's max and factor
        sb[0] = sScaleB[r_lo];
        sb[1] = sScaleB[r_lo + 8];
      }
      wgmma_wait<0>();  // P_a V_a done: stage 0 is free of this warpgroup
      fence_operands(o);
      mbar_arrive(&empty[0]);
      if (has_b) {
        rescale(sb);
#pragma unroll
        for (int h = 0; h < 2; ++h) l_part[h] *= sb[h];
        named_barrier_sync(kBarPB, kConsumers);  // P_b in shared memory
        issue_pv_smem_p(1);
        // done before the next pair's S_a is issued (it would queue behind it on the tensor pipe
        // anyway): stage 1 goes back to the producer at once, so tile b's next load is not held
        // up by the next S_a, and P's buffer is free for the next P_a
        wgmma_wait<0>();
        fence_operands(o);
        mbar_arrive(&empty[1]);
      }
    }
  } else {
    // ---------------- warpgroup 1: tile b = 2 i + 1 of each pair (stage 1), columns 256..511 ----------------
    for (int i = 0; i < num_pairs; ++i) {
      const bool has_b = 2 * i + 1 < num_tiles;
      float s[32];
      uint32_t pa[4][4];
      if (has_b) {
        mbar_wait(&full[1], i & 1);
        fence_proxy_async_shared();
        issue_qk(s, 1);
      }
      named_barrier_sync(kBarMA, kConsumers);  // tile a's max, factor and P
      float m_a[2], sa[2], sb[2] = {1.f, 1.f}, m_b[2], psum[2] = {0.f, 0.f};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        m_a[h] = sM[r_lo + 8 * h];
        sa[h] = sScaleA[r_lo + 8 * h];
      }
      mbar_wait(&full[0], i & 1);  // (done: warpgroup 0 read the same stage) for this thread's view of the bytes
      fence_proxy_async_shared();
      wgmma_wait<0>();  // S_b, done by now (it ran during warpgroup 0's softmax): O is not touched while it flies
      fence_operands(s);  // (unconditional: the compiler does not pair this with the branch that issued S_b)
      // The softmax of b runs while warpgroup 0's P_a V_a keeps the tensor pipe busy. (Issuing this
      // warpgroup's P_a V_a before it makes ptxas serialise every wgmma of the kernel, C7515: it
      // will not let S's registers be written while an MMA of this warpgroup is in flight.)
      if (has_b) {
        softmax(s, kbeg + (2 * i + 1) * kBN, m_a, m_b, sb, psum);
        __syncwarp();
        if (t4 == 0) {
          sM[r_lo] = m_b[0];
          sM[r_lo + 8] = m_b[1];
          sScaleB[r_lo] = sb[0];
          sScaleB[r_lo + 8] = sb[1];
        }
      }
      rescale(sa);
      issue_pv_smem_p(0);  // O_R = sa O_R + P_a V_a[:, 256:512]
      // bar.sync on both sides, as the other schedule's P hand-off: this warpgroup's reads of
      // tile a's max and factor also come before warpgroup 0 overwrites them for the next pair
      if (has_b) named_barrier_sync(kBarSB, kConsumers);
#pragma unroll
      for (int h = 0; h < 2; ++h) l_part[h] = l_part[h] * sa[h] * sb[h] + psum[h];
      wgmma_wait<0>();  // P_a V_a done: stage 0 and P's buffer are free of this warpgroup
      fence_operands(o);
      mbar_arrive(&empty[0]);
      if (has_b) {
        rescale(sb);
        pack(s, pa);
        store_p(pa);  // P_b for warpgroup 0's half of P_b V_b
        fence_operands(pa[0]);
        fence_operands(pa[1]);
        fence_operands(pa[2]);
        fence_operands(pa[3]);
        issue_pv_reg_p(pa, 1);
        named_barrier_sync(kBarPB, kConsumers);  // both sides: P_a's reads and P_b's writes before the next P_a
        wgmma_wait<0>();
        fence_operands(o);
        mbar_arrive(&empty[1]);
      }
    }
  }

  // ---------------- epilogue: row sums of both warpgroups, then each its 256 columns ----------------
  wgmma_wait<0>();  // (every MMA is done on every path; said here so that the compiler sees it)
  fence_operands(o);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_part[h] += __shfl_xor_sync(0xffffffffu, l_part[h], 1);
    l_part[h] += __shfl_xor_sync(0xffffffffu, l_part[h], 2);
  }
  named_barrier_sync(kBarEpilogue, kConsumers);  // every read of sScaleA / sScaleB is done
  if (wgi == 1 && t4 == 0) {
    sScaleA[r_lo] = l_part[0];
    sScaleA[r_lo + 8] = l_part[1];
  }
  named_barrier_sync(kBarEpilogue, kConsumers);
  if (wgi == 0 && t4 == 0) {
    sL[r_lo] = l_part[0] + sScaleA[r_lo];
    sL[r_lo + 8] = l_part[1] + sScaleA[r_lo + 8];
  }
  named_barrier_sync(kBarEpilogue, kConsumers);
  store_tile(p, split, grow0, row0, rows, 16 * w, g, wgi * kValueHalf + 2 * t4,
             *reinterpret_cast<const float(*)[32][4]>(o), sM, sL, wgi == 0 && t4 == 0, w == 3);
#else
  const int wgi = warp >> 2;        // consumer warpgroup 0 or 1
  const int w = warp & 3;           // warp within it: rows 16 w .. 16 w + 15
  const int g = lane >> 2, t4 = lane & 3;
  const int r_lo = 16 * w + g;      // this thread's rows of the block: r_lo and r_lo + 8

  float o[128];  // O[64 rows, 256 columns of this warpgroup], wgmma accumulator layout
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;

  if (wgi == 0) {
    // ---------------- warpgroup 0: QK, softmax, P, low half of PV ----------------
    bool row_ok[2];
    const int32_t* mask_row[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row0 + r_lo + 8 * h;
      row_ok[h] = r < rows;
      mask_row[h] = p.tree_mask + static_cast<int64_t>(qo0 + min(r / p.num_heads, T - 1)) * p.mask_words;
    }
    float m[2] = {minus_infinity(), minus_infinity()};
    float l[2] = {0.f, 0.f};
    const uint64_t dq = make_desc(sbase + Smem::q_off, 16, 1024);
    int prev_stage = 0;
    for (int it = 0; it < num_tiles; ++it) {
      const int stage = it % kStages;
      const int tile_base = kbeg + it * kBN;
      const uint32_t kaddr = sbase + Smem::k_off + stage * kTileBytes;
      mbar_wait(&full[stage], (it / kStages) & 1);
      fence_proxy_async_shared();  // the producer's cp.async bytes, for the MMAs

      float s[32];
      const uint64_t dk = make_desc(kaddr, 16, 1024);
      wgmma_fence();
      // 9 column blocks of 64, 4 k-steps of 16 each. dq is made opaque per tile: otherwise the
      // compiler keeps all 36 loop-invariant Q descriptors in registers (72 of them) and spills.
      uint64_t dq_t = dq;
      asm volatile("" : "+l"(dq_t));
#pragma unroll
      for (int ks = 0; ks < kHeadDim / 16; ++ks) {
        const uint32_t off = (ks >> 2) * kBlockBytes + (ks & 3) * 32;
        wgmma_m64n64k16_ss<0>(s, desc_advance(dq_t, off), desc_advance(dk, off), ks > 0);
      }
      wgmma_commit();
      if (it > 0) {  // the previous tile's PV (committed before this QK) is done: release its stage
        wgmma_wait<1>();
        fence_operands(o);
        mbar_arrive(&empty[prev_stage]);
      }
      wgmma_wait<0>();  // this tile's S
      fence_operands(s);
      fence_operands(o);

      // mask + online softmax: this thread holds keys 8 j + 2 t4 + {0, 1} (j < 8) of its two rows
      float alpha[2];
      const int nvalid = kend - tile_base;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint64_t vis = 0;
        if (row_ok[h]) {
          vis = tree_visible_bits(mask_row[h], p.mask_words, tile_base, 32, Lp) & 0xffffffffull;
          if (nvalid > 32)
            vis |= (tree_visible_bits(mask_row[h], p.mask_words, tile_base + 32, 32, Lp) & 0xffffffffull) << 32;
          if (nvalid < 64) vis &= (1ull << nvalid) - 1;
        }
        float tmax = minus_infinity();
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = s[4 * j + 2 * h + e];
            x = ((vis >> (8 * j + 2 * t4 + e)) & 1) ? x * p.scale_log2 * hooks::kScoreScale : minus_infinity();
            tmax = fmaxf(tmax, x);
          }
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
        const float m_new = fmaxf(m[h], tmax);
        float a = 1.f;
        if (m_new > m[h] + kRescaleLog2) {
          a = exp2f(m[h] - m_new);
          m[h] = m_new;
        }
        const float m_use = m[h] == minus_infinity() ? 0.f : m[h];
        float psum = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = s[4 * j + 2 * h + e];
            x = exp2f(x - m_use);
            psum += x;
          }
        l[h] = l[h] * a + psum;
        alpha[h] = a;
      }
      // P as the A fragments of the PV MMAs (keys 16 kk .. 16 kk + 15 per k-step)
      uint32_t pa[4][4];
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int q = 0; q < 4; ++q) pa[kk][q] = pack_bf16x2(s[8 * kk + 2 * q], s[8 * kk + 2 * q + 1]);

      // hand P and alpha to warpgroup 1 (once it is done with the previous tile's)
      if (it > 0) named_barrier_sync(kBarPFree, kConsumers);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const int c0 = 16 * kk + 2 * t4;
        *reinterpret_cast<uint32_t*>(smem + Smem::p_off + swizzle128_offset(kBM, r_lo, c0)) = pa[kk][0];
        *reinterpret_cast<uint32_t*>(smem + Smem::p_off + swizzle128_offset(kBM, r_lo + 8, c0)) = pa[kk][1];
        *reinterpret_cast<uint32_t*>(smem + Smem::p_off + swizzle128_offset(kBM, r_lo, c0 + 8)) = pa[kk][2];
        *reinterpret_cast<uint32_t*>(smem + Smem::p_off + swizzle128_offset(kBM, r_lo + 8, c0 + 8)) = pa[kk][3];
      }
      if (t4 == 0) {
        sAlpha[r_lo] = alpha[0];
        sAlpha[r_lo + 8] = alpha[1];
      }
      fence_proxy_async_shared();
      named_barrier_arrive(kBarPFull, kConsumers);

      if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          o[4 * j + 0] *= alpha[0];
          o[4 * j + 1] *= alpha[0];
          o[4 * j + 2] *= alpha[1];
          o[4 * j + 3] *= alpha[1];
        }
      }
      fence_operands(pa[0]);
      fence_operands(pa[1]);
      fence_operands(pa[2]);
      fence_operands(pa[3]);
      const uint64_t dv = make_v_desc(kaddr);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) wgmma_m64n256k16_rs<1>(o, pa[kk], desc_advance(dv, kk * 16 * 128), 1);
      wgmma_commit();
      prev_stage = stage;
    }
    wgmma_wait<0>();
    fence_operands(o);
    mbar_arrive(&empty[prev_stage]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = l[h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (t4 == 0) {
        sL[r_lo + 8 * h] = sum;
        sM[r_lo + 8 * h] = m[h];
      }
    }
  } else {
    // ---------------- warpgroup 1: high half of PV, P from shared memory ----------------
    const uint64_t dp = make_desc(sbase + Smem::p_off, 16, 1024);
    for (int it = 0; it < num_tiles; ++it) {
      const int stage = it % kStages;
      const uint32_t kaddr = sbase + Smem::k_off + stage * kTileBytes;
      mbar_wait(&full[stage], (it / kStages) & 1);
      fence_proxy_async_shared();  // the producer's cp.async bytes, for the MMAs
      named_barrier_sync(kBarPFull, kConsumers);
      const float a0 = sAlpha[r_lo], a1 = sAlpha[r_lo + 8];
      if (__any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) {
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          o[4 * j + 0] *= a0;
          o[4 * j + 1] *= a0;
          o[4 * j + 2] *= a1;
          o[4 * j + 3] *= a1;
        }
      }
      const uint32_t v_half = hooks::kWgmmaWrongHalf ? 0 : (kValueHalf / 64) * kBlockBytes;
      const uint64_t dv = make_v_desc(kaddr + v_half);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wgmma_m64n256k16_ss<1>(o, desc_advance(dp, kk * 32), desc_advance(dv, kk * 16 * 128), 1);
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(o);
      if (it + 1 < num_tiles) {
        named_barrier_sync(kBarPFree, kConsumers);
      }
      mbar_arrive(&empty[stage]);
    }
  }

  // ---------------- epilogue: both warpgroups, their own 256 columns ----------------
  named_barrier_sync(kBarEpilogue, kConsumers);
  store_tile(p, split, grow0, row0, rows, 16 * w, g, wgi * kValueHalf + 2 * t4,
             *reinterpret_cast<const float(*)[32][4]>(o), sM, sL, wgi == 0 && t4 == 0, w == 3);
#endif  // KD_WG_SEESAW
#elif defined(__CUDA_ARCH__)
  __trap();  // built for an arch without wgmma: never launched (launch_plan dispatches it on sm_90a only)
#endif
}

}  // namespace kdtree

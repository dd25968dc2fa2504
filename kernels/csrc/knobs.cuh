// Every -D build switch of the kernels, all in one place. A real build defines none of them:
// each then takes its default below, and the test hooks are compile-time constants or
// identities, so the kernels compile to exactly what they would without hooks. Builds set them through KDTREE_NVCC_FLAGS (kdtree.kernels.jit); the figures behind each
// default are in plans/0002-sm120-verify-kernel-defrag.md's kernel versions table.
//
// Test hooks:
// KD_BREAK: deliberately broken kernels, for the gates' own tests (tests/phases, tests/kernels).
//   1 reads the wrong tree-mask bits, 2 hides the prefix, 4 scales the scores wrongly,
//   8 leaves the last row of every CTA unwritten, 16 breaks the wgmma variant only (sm_90a): its
//   second warpgroup multiplies P by V's low half (a wrong operand descriptor), so columns
//   256..511 of every row are wrong.
// KD_SKIP: measurement builds that apportion the kernel's time by leaving work out.
//   1 drops the QK MMAs, 2 the softmax, 4 the PV MMAs, 8 the tile loads, 16 the split-combine
//   pass (what combining inside the kernel could save at most).
//
// Measurement knobs (tree_verify_mla_ws.cuh, combine_splits.cuh):
// WS_QK_AHEAD: how many QK steps of key fragments the ws variant keeps in flight ahead of its MMAs.
// WS_BN, WS_STAGES: the ws variant's keys per tile and ring depth (32 x 2 or 16 x 4 fit sm_120's
//   101376 bytes).
// KD_COMBINE_WARPS, KD_COMBINE_UNROLL: the split-combine pass's warps per CTA and loads in flight.
//
// The wgmma variant (tree_verify_mla_sm90a.cuh, sm_90a only):
// WG_V_DESC_SWAP: 1 swaps the LBO and SBO of PV's V descriptor (a diagnosis build, in case a device
//   disagrees with this reading of the descriptor format).
//
// The timeline build (timeline.cuh, kdtree.bench.timeline):
// KD_TIMELINE: 1 makes every variant's lane leaders stamp the SM clock at each stage boundary of
//   each tile into a global buffer; 0 (the default) compiles every stamp to nothing.
// KD_TIMELINE_CTAS, KD_TIMELINE_TILES, KD_TIMELINE_TILE0: CTAs recorded (the launch's first, by
//   linear block index), tiles recorded per CTA, and the first tile recorded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>

#ifndef KD_BREAK
#define KD_BREAK 0
#endif
#ifndef KD_SKIP
#define KD_SKIP 0
#endif
#ifndef WS_QK_AHEAD
#define WS_QK_AHEAD 3
#endif
#ifndef WS_BN
#define WS_BN 32
#endif
#ifndef WS_STAGES
#define WS_STAGES 2
#endif
#ifndef KD_COMBINE_WARPS
#define KD_COMBINE_WARPS 4
#endif
#ifndef KD_COMBINE_UNROLL
#define KD_COMBINE_UNROLL 8
#endif
#ifndef WG_V_DESC_SWAP
#define WG_V_DESC_SWAP 0
#endif
#ifndef KD_TIMELINE
#define KD_TIMELINE 0
#endif
#ifndef KD_TIMELINE_CTAS
#define KD_TIMELINE_CTAS 264
#endif
#ifndef KD_TIMELINE_TILES
#define KD_TIMELINE_TILES 32
#endif
#ifndef KD_TIMELINE_TILE0
#define KD_TIMELINE_TILE0 0
#endif

namespace kdtree {
namespace hooks {

constexpr bool kSkipQK = (KD_SKIP & 1) != 0;
constexpr bool kSkipSoftmax = (KD_SKIP & 2) != 0;
constexpr bool kSkipPV = (KD_SKIP & 4) != 0;
constexpr bool kSkipLoads = (KD_SKIP & 8) != 0;
constexpr bool kSkipCombine = (KD_SKIP & 16) != 0;
constexpr bool kTimeline = KD_TIMELINE != 0;

// KD_BREAK 2 hides prefix keys, so no tile may skip the mask test (tile_needs_mask).
constexpr bool kMaskEveryTile = (KD_BREAK & 2) != 0;

// KD_BREAK 16: the wgmma variant reads the wrong half of V for its upper output columns.
constexpr bool kWgmmaWrongHalf = (KD_BREAK & 16) != 0;

// Factor on every score (KD_BREAK 4: 1.25, a wrong softmax scale).
constexpr float kScoreScale = (KD_BREAK & 4) ? 1.25f : 1.f;

// KD_BREAK 1 and 2 in the two forms of the mask test (tree_verify_mla_common.cuh): a window
// of visibility bits of keys j0 .. j0 + n - 1 (1 swaps neighbouring bits of a window that reaches
// the tree, 2 clears the prefix keys' bits), and one key at a time (1 reads the neighbouring tree
// bit, 2 hides every prefix key).
__device__ __forceinline__ uint64_t visible_bits(uint64_t bits, int j0, int n, int Lp) {
  if ((KD_BREAK & 1) && j0 + n > Lp)
    bits = ((bits >> 1) & 0x5555555555555555ull) | ((bits << 1) & 0xAAAAAAAAAAAAAAAAull);
  if (KD_BREAK & 2) {
    for (int k = 0; k < n; ++k)
      if (j0 + k < Lp) bits &= ~(1ull << k);
  }
  return bits;
}
constexpr bool kHidePrefix = (KD_BREAK & 2) != 0;
__device__ __forceinline__ int tree_bit(int tj) { return (KD_BREAK & 1) ? tj ^ 1 : tj; }

// KD_BREAK 8: the CTA's last row is not stored.
__device__ __forceinline__ bool drops_row(bool last_row_of_cta) { return (KD_BREAK & 8) && last_row_of_cta; }

// What a ring slot holds before the main loop: zeros, except in KD_SKIP 8 builds, which never
// copy and get small pseudo-random bf16 values instead (realistic tensor-core data and power).
__device__ __forceinline__ uint4 ring_fill(int i) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if (kSkipLoads) {
    const uint32_t h = static_cast<uint32_t>(i) * 2654435761u;
    v.x = (h & 0x807f807fu) | 0x3c003c00u;  // bf16 pairs with |x| in [0.0078, 0.016)
    v.y = v.x ^ 0x80008000u;
    v.z = ((h >> 7) & 0x807f807fu) | 0x3c003c00u;
    v.w = v.z ^ 0x00008000u;
  }
  return v;
}

// KD_TIMELINE: the timeline build's buffers, which timeline.cuh writes and reads through these
// (only a timeline build has them: a default build's module holds no trace of them).
constexpr int kTimelineLanes = 4, kTimelineEvents = 24, kTimelineHeaderFields = 12;
#if KD_TIMELINE
__device__ unsigned long long timeline_header_buf[KD_TIMELINE_CTAS][kTimelineHeaderFields];
__device__ unsigned long long timeline_stamps_buf[KD_TIMELINE_CTAS][kTimelineLanes][KD_TIMELINE_TILES + 1][kTimelineEvents];
__device__ __forceinline__ unsigned long long* timeline_header(int cta) { return timeline_header_buf[cta]; }
__device__ __forceinline__ unsigned long long* timeline_stamps(int cta, int lane, int row) {
  return timeline_stamps_buf[cta][lane][row];
}
// The buffers' device addresses and sizes (host).
inline cudaError_t timeline_buffers(void** header, std::size_t* header_bytes, void** stamps, std::size_t* stamps_bytes) {
  *header_bytes = sizeof(timeline_header_buf);
  *stamps_bytes = sizeof(timeline_stamps_buf);
  const cudaError_t err = cudaGetSymbolAddress(header, timeline_header_buf);
  return err != cudaSuccess ? err : cudaGetSymbolAddress(stamps, timeline_stamps_buf);
}
#else
__device__ __forceinline__ unsigned long long* timeline_header(int) { return nullptr; }
__device__ __forceinline__ unsigned long long* timeline_stamps(int, int, int) { return nullptr; }
inline cudaError_t timeline_buffers(void**, std::size_t*, void**, std::size_t*) { return cudaErrorNotSupported; }
#endif

}  // namespace hooks
}  // namespace kdtree

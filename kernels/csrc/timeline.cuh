// The timeline build (KD_TIMELINE=1, knobs.cuh, set through KDTREE_NVCC_FLAGS): each recorded
// CTA's lane leaders (thread 0 of every 128: a warpgroup of the wgmma variant, a consumer group or
// the producer warp of ws, a half of base) write the SM's clock at each stage boundary of each tile
// into a global buffer (hooks::timeline_*, knobs.cuh: a timeline build's only), which the host reads
// back (read; kdtree.bench.timeline decodes it). In a default build every KD_STAMP is a call whose
// body is discarded (if constexpr) and no buffer exists: the kernels compile to what they were
// without it.
//
// Layout, all uint64 (zero: not recorded; the host clears the buffers before a launch):
//   header[cta][kHeaderFields]   smid, block x, y, z, grid x, y, z, tiles, globaltimer and clock at
//                                the CTA's start (thread 0), clock and globaltimer at its end
//   stamps[cta][lane][tile][ev]  clock64 of event `ev` of tile `tile` (counted from
//                                KD_TIMELINE_TILE0; row kTiles holds the lane's begin and end)
// CTA c is the launch's block of linear index c (x fastest), recorded while c < kCtas. The event
// slot is fixed by (lane, tile, event), so a stamp is one clock read and one store, no counter.
#pragma once

#include <cstddef>
#include <cuda_runtime.h>

namespace kdtree {
namespace timeline {

// Host side, defined in the kernels' translation unit (tree_verify_mla.cu includes this file
// through the kernels), called by the bindings.
bool enabled();                      // a timeline build?
void shape(int (&s)[6]);             // ctas, lanes, tiles, events, header fields, first tile
cudaError_t reset();                 // clear the buffers (cudaErrorNotSupported: not a timeline build)
cudaError_t read(void* header, std::size_t header_bytes, void* stamps, std::size_t stamps_bytes);

}  // namespace timeline
}  // namespace kdtree

#ifdef __CUDACC__
#include "knobs.cuh"

namespace kdtree {
namespace timeline {

constexpr bool kOn = hooks::kTimeline;
constexpr int kCtas = KD_TIMELINE_CTAS;
constexpr int kLanes = hooks::kTimelineLanes;
constexpr int kTiles = KD_TIMELINE_TILES;
constexpr int kTile0 = KD_TIMELINE_TILE0;
constexpr int kEvents = hooks::kTimelineEvents;
constexpr int kHeaderFields = hooks::kTimelineHeaderFields;
constexpr int kLaneRow = kTiles;  // the tile row of a lane's begin and end

// Event ids (kdtree.bench.timeline.EVENTS names them in this order).
enum Event : int {
  kLoadWaitFree = 0,  // producer: starts waiting for the stage to be freed
  kLoadFree,          // producer: the stage is free
  kLoadIssued,        // producer: the tile's copies are issued
  kTileWait,          // consumer: starts waiting for the tile's bytes
  kTileReady,         // consumer: the tile's bytes have landed
  kSIssued,           // consumer: S = Q K^T issued
  kSDone,             // consumer: S complete (the wait returned)
  kSoftmaxDone,       // consumer: mask + online softmax done, P in registers
  kPStored,           // consumer: P stored to shared memory (and fenced)
  kPVIssued,          // consumer: P V issued (this lane's PV of the tile)
  kPVDone,            // consumer: P V complete (the wait returned)
  kStageFreed,        // consumer: the stage released to the producer
  kBarWait0,          // consumer: waits at hand-off barrier k (kBarWait0 + 2k; done: + 2k + 1)
  kBarDone0,
  kBarWait1,
  kBarDone1,
  kBarWait2,
  kBarDone2,
  kBarWait3,
  kBarDone3,
  kLaneBegin = 0,  // in row kLaneRow
  kLaneEnd = 1,
};

__device__ __forceinline__ unsigned long long clock_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
  return t;
}
__device__ __forceinline__ unsigned long long globaltimer_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}
__device__ __forceinline__ unsigned smid() {
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}
__device__ __forceinline__ int cta_slot() {
  return static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
}

// Event `ev` of tile `tile` (the CTA's own count from 0) for this thread's lane, by lane leaders.
__device__ __forceinline__ void stamp(int ev, int tile) {
  if constexpr (kOn) {
    const int t = tile - kTile0;
    if ((threadIdx.x & 127) != 0 || t < 0 || t >= kTiles) return;
    const int c = cta_slot();
    if (c >= kCtas) return;
    hooks::timeline_stamps(c, threadIdx.x >> 7, t)[ev] = clock_now();
  }
}
// A lane's begin or end (kLaneBegin, kLaneEnd).
__device__ __forceinline__ void stamp_lane(int ev) {
  if constexpr (kOn) {
    if ((threadIdx.x & 127) != 0) return;
    const int c = cta_slot();
    if (c >= kCtas) return;
    hooks::timeline_stamps(c, threadIdx.x >> 7, kLaneRow)[ev] = clock_now();
  }
}
// The CTA's header (thread 0, at its start), with its tile count.
__device__ __forceinline__ void cta_begin(int tiles) {
  if constexpr (kOn) {
    const int c = cta_slot();
    if (threadIdx.x != 0 || c >= kCtas) return;
    unsigned long long* h = hooks::timeline_header(c);
    h[0] = smid();
    h[1] = blockIdx.x;
    h[2] = blockIdx.y;
    h[3] = blockIdx.z;
    h[4] = gridDim.x;
    h[5] = gridDim.y;
    h[6] = gridDim.z;
    h[7] = static_cast<unsigned long long>(tiles);
    h[8] = globaltimer_now();
    h[9] = clock_now();
  }
}
__device__ __forceinline__ void cta_end() {
  if constexpr (kOn) {
    const int c = cta_slot();
    if (threadIdx.x != 0 || c >= kCtas) return;
    unsigned long long* h = hooks::timeline_header(c);
    h[10] = clock_now();
    h[11] = globaltimer_now();
  }
}

bool enabled() { return kOn; }
void shape(int (&s)[6]) {
  s[0] = kCtas;
  s[1] = kLanes;
  s[2] = kTiles;
  s[3] = kEvents;
  s[4] = kHeaderFields;
  s[5] = kTile0;
}
cudaError_t reset() {
  void *h, *s;
  std::size_t hb, sb;
  cudaError_t err = hooks::timeline_buffers(&h, &hb, &s, &sb);
  if (err == cudaSuccess) err = cudaMemset(h, 0, hb);
  if (err == cudaSuccess) err = cudaMemset(s, 0, sb);
  return err == cudaSuccess ? cudaDeviceSynchronize() : err;
}
cudaError_t read(void* header, std::size_t header_bytes, void* stamps, std::size_t stamps_bytes) {
  void *h, *s;
  std::size_t hb, sb;
  cudaError_t err = hooks::timeline_buffers(&h, &hb, &s, &sb);
  if (err != cudaSuccess) return err;
  if (header_bytes != hb || stamps_bytes != sb) return cudaErrorInvalidValue;
  err = cudaMemcpy(header, h, hb, cudaMemcpyDeviceToHost);
  return err == cudaSuccess ? cudaMemcpy(stamps, s, sb, cudaMemcpyDeviceToHost) : err;
}

}  // namespace timeline
}  // namespace kdtree

#define KD_STAMP(ev, tile) ::kdtree::timeline::stamp(::kdtree::timeline::ev, (tile))
#define KD_STAMP_LANE(ev) ::kdtree::timeline::stamp_lane(::kdtree::timeline::ev)
#define KD_STAMP_CTA_BEGIN(tiles) ::kdtree::timeline::cta_begin(tiles)
#define KD_STAMP_CTA_END() ::kdtree::timeline::cta_end()
#endif

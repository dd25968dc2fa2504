// The timeline build (-DKD_TIMELINE=1 through KDTREE_NVCC_FLAGS): each recorded CTA's lane
// leaders (thread 0 of every 128: a warpgroup of the wgmma variant, a consumer group or the
// producer warp of ws, a half of base) write the SM's clock at each stage boundary of each tile
// into a global buffer, which the host reads back (timeline_read, kdtree.bench.timeline decodes).
// A default build defines KD_TIMELINE 0: every KD_STAMP is empty and the kernels compile to what
// they were without it.
//
// Layout, all uint64 (zero: not recorded; the host clears the buffers before a launch):
//   header[cta][kHeaderFields]   smid, block x, y, z, grid x, y, z, tiles, globaltimer and clock at
//                                the CTA's start (thread 0), clock at thread 0's exit
//   stamps[cta][lane][tile][ev]  clock64 of event `ev` of tile `tile` (relative to KD_TIMELINE_TILE0;
//                                row kTiles holds the lane's begin and end)
// CTA c is the launch's block of linear index c (x fastest), recorded while c < kCtas. The event
// slot is fixed by (lane, tile, event), so a stamp is one clock read and one store, no counter.
#pragma once

#include <cstdint>

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
namespace timeline {

constexpr int kCtas = KD_TIMELINE_CTAS;
constexpr int kLanes = 4;
constexpr int kTiles = KD_TIMELINE_TILES;
constexpr int kTile0 = KD_TIMELINE_TILE0;
constexpr int kEvents = 24;
constexpr int kHeaderFields = 12;
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
  kBarWait0,          // consumer: waits at hand-off barrier k (events kBarWait0 + 2k, done + 2k + 1)
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

}  // namespace timeline
}  // namespace kdtree

#if KD_TIMELINE && defined(__CUDACC__)
#include <cuda_runtime.h>

namespace kdtree {
namespace timeline {

__device__ unsigned long long g_header[kCtas][kHeaderFields];
__device__ unsigned long long g_stamps[kCtas][kLanes][kTiles + 1][kEvents];

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
  const int t = tile - kTile0;
  if ((threadIdx.x & 127) != 0 || t < 0 || t >= kTiles) return;
  const int c = cta_slot();
  if (c >= kCtas) return;
  g_stamps[c][threadIdx.x >> 7][t][ev] = clock_now();
}
// A lane's begin or end (kLaneBegin, kLaneEnd).
__device__ __forceinline__ void stamp_lane(int ev) {
  if ((threadIdx.x & 127) != 0) return;
  const int c = cta_slot();
  if (c >= kCtas) return;
  g_stamps[c][threadIdx.x >> 7][kLaneRow][ev] = clock_now();
}
// The CTA's header (thread 0, at its start), with its tile count.
__device__ __forceinline__ void cta_begin(int tiles) {
  const int c = cta_slot();
  if (threadIdx.x != 0 || c >= kCtas) return;
  unsigned long long* h = g_header[c];
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
__device__ __forceinline__ void cta_end() {
  const int c = cta_slot();
  if (threadIdx.x != 0 || c >= kCtas) return;
  g_header[c][10] = clock_now();
  g_header[c][11] = globaltimer_now();
}

// Host side (this translation unit holds the buffers): clear them before a launch, copy them out
// after it (sizes: header_bytes(), stamps_bytes()).
size_t header_bytes() { return sizeof(g_header); }
size_t stamps_bytes() { return sizeof(g_stamps); }
cudaError_t reset() {
  static const unsigned long long zeros[4096] = {};
  cudaError_t err = cudaSuccess;
  for (size_t off = 0; off < sizeof(g_header) && err == cudaSuccess; off += sizeof(zeros))
    err = cudaMemcpyToSymbol(g_header, zeros, sizeof(g_header) - off < sizeof(zeros) ? sizeof(g_header) - off : sizeof(zeros), off);
  for (size_t off = 0; off < sizeof(g_stamps) && err == cudaSuccess; off += sizeof(zeros))
    err = cudaMemcpyToSymbol(g_stamps, zeros, sizeof(g_stamps) - off < sizeof(zeros) ? sizeof(g_stamps) - off : sizeof(zeros), off);
  return err;
}
cudaError_t read(void* header, void* stamps) {
  cudaError_t err = cudaMemcpyFromSymbol(header, g_header, sizeof(g_header));
  if (err == cudaSuccess) err = cudaMemcpyFromSymbol(stamps, g_stamps, sizeof(g_stamps));
  return err;
}

}  // namespace timeline
}  // namespace kdtree

#define KD_STAMP(ev, tile) ::kdtree::timeline::stamp(::kdtree::timeline::ev, (tile))
#define KD_STAMP_LANE(ev) ::kdtree::timeline::stamp_lane(::kdtree::timeline::ev)
#define KD_STAMP_CTA_BEGIN(tiles) ::kdtree::timeline::cta_begin(tiles)
#define KD_STAMP_CTA_END() ::kdtree::timeline::cta_end()
#elif KD_TIMELINE
// The host-only translation unit (bindings.cpp): the functions above, defined in the kernels' unit.
#include <cstddef>
#include <cuda_runtime.h>
namespace kdtree {
namespace timeline {
size_t header_bytes();
size_t stamps_bytes();
cudaError_t reset();
cudaError_t read(void* header, void* stamps);
}  // namespace timeline
}  // namespace kdtree
#else
#define KD_STAMP(ev, tile) ((void)0)
#define KD_STAMP_LANE(ev) ((void)0)
#define KD_STAMP_CTA_BEGIN(tiles) ((void)0)
#define KD_STAMP_CTA_END() ((void)0)
#endif

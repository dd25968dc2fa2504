// Ceilings of an mma.sync design on the GPU it runs on (no wgmma, nothing sm_120 lacks):
//   - the m16n8k16 bf16 -> fp32 MMA rate with every operand already in registers;
//   - the ldmatrix rate from shared memory (bytes per SM clock);
//   - the MMA rate when every MMA also needs B bytes of ldmatrix operands, B = 0..512: the
//     tree-verify kernels need 130-400 B of shared-memory operands per MMA, so this curve is
//     the ceiling a given tiling can reach, whatever else it does.
// One warp issues eight independent accumulator chains per step; `lpe` ldmatrix.x4 (512 B a
// warp) are issued per eight MMAs and feed them. Prints one JSON object per line.
//   nvcc -O3 -arch=sm_90 -o mma_sync_ceiling mma_sync_ceiling.cu && ./mma_sync_ceiling
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define CHECK(x)                                                                    \
  do {                                                                              \
    cudaError_t e = (x);                                                            \
    if (e != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

constexpr int kSmemBytes = 32768;

// LPE: ldmatrix.x4 per eight MMAs (0..8); DO_MMA = 0 times ldmatrix alone.
template <int LPE, bool DO_MMA>
__global__ void ceiling_kernel(int iters, float* sink, long long* cycles) {
  __shared__ __align__(16) uint16_t sm[kSmemBytes / 2];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int i = tid; i < kSmemBytes / 2; i += blockDim.x) sm[i] = static_cast<uint16_t>(0x3c00 + (i * 37 & 0x3ff));
  __syncthreads();
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(sm));
  // Conflict-free rows: lane l reads row l (16 B) of a 512-byte block, blocks rotate per step.
  uint32_t addr = base + ((warp * 512 + lane * 16) & (kSmemBytes - 1));
  uint32_t a[4] = {0x3c003c00u + lane, 0x3c003c01u + tid, 0x3c013c00u, 0x3bff3c00u + warp};
  uint32_t b[2][4] = {{0x3c003c00u, 0x3c003c00u + lane, 0x3c003c00u, 0x3c003c00u},
                      {0x3c003c00u, 0x3c003c00u, 0x3c003c00u + tid, 0x3c003c00u}};
  float acc[8][4] = {};
  long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (j < LPE) {
        ldsm_x4(b[j & 1], addr);
        addr = base + ((addr - base + 4096) & (kSmemBytes - 1));
      }
      if (DO_MMA) mma16816(acc[j], a, b[j & 1][0], b[j & 1][1]);
      else acc[j][0] += __uint_as_float(b[j & 1][0] ^ b[j & 1][3]);
    }
  }
  long long t1 = clock64();
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
  if (s == 1234.5f) sink[blockIdx.x * blockDim.x + tid] = s;  // keeps the work alive
  if (tid == 0) cycles[blockIdx.x] = t1 - t0;
}

template <int LPE, bool DO_MMA>
void run(int sms, int warps_per_sm, int iters, float* sink, long long* cycles) {
  const int threads = 32 * (warps_per_sm < 16 ? warps_per_sm : 16);
  const int blocks = sms * (warps_per_sm * 32 / threads);
  auto kernel = ceiling_kernel<LPE, DO_MMA>;
  kernel<<<blocks, threads>>>(iters / 10, sink, cycles);  // warm-up
  CHECK(cudaGetLastError());
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  float best_ms = 1e30f;
  for (int rep = 0; rep < 5; ++rep) {
    CHECK(cudaEventRecord(e0));
    kernel<<<blocks, threads>>>(iters, sink, cycles);
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float ms = 0.f;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (ms < best_ms) best_ms = ms;
  }
  CHECK(cudaGetLastError());
  long long cyc = 0;
  CHECK(cudaMemcpy(&cyc, cycles, sizeof(cyc), cudaMemcpyDeviceToHost));
  const double mmas = static_cast<double>(blocks) * (threads / 32) * iters * 8.0 * (DO_MMA ? 1 : 0);
  const double ldsm_bytes = static_cast<double>(blocks) * (threads / 32) * iters * LPE * 512.0;
  const double sec = best_ms * 1e-3;
  const double clk_hz = cyc / sec;  // SM clock seen by block 0 over the timed launch
  std::printf(
      "{\"warps_per_sm\": %d, \"ldsm_bytes_per_mma\": %d, \"mma\": %s, \"ms\": %.4f, \"sm_clock_ghz\": %.3f, "
      "\"tflops\": %.1f, \"mma_per_clk_per_sm\": %.3f, \"ldsm_bytes_per_clk_per_sm\": %.1f}\n",
      warps_per_sm, DO_MMA ? LPE * 64 : -1, DO_MMA ? "true" : "false", best_ms, clk_hz / 1e9,
      mmas * 4096.0 / sec / 1e12, mmas / (sec * clk_hz * sms), ldsm_bytes / (sec * clk_hz * sms));
  std::fflush(stdout);
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
}

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 20000;
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("{\"device\": \"%s\", \"sm\": %d%d, \"sms\": %d}\n", prop.name, prop.major, prop.minor, sms);
  float* sink = nullptr;
  long long* cycles = nullptr;
  CHECK(cudaMalloc(&sink, sizeof(float) * sms * 64 * 32));
  CHECK(cudaMalloc(&cycles, sizeof(long long) * sms * 64));
  for (int w : {4, 8, 12, 16, 32}) run<0, true>(sms, w, iters, sink, cycles);
  for (int w : {8, 16, 32}) run<8, false>(sms, w, iters, sink, cycles);
  for (int w : {8, 16}) {
    run<1, true>(sms, w, iters, sink, cycles);
    run<2, true>(sms, w, iters, sink, cycles);
    run<3, true>(sms, w, iters, sink, cycles);
    run<4, true>(sms, w, iters, sink, cycles);
    run<6, true>(sms, w, iters, sink, cycles);
    run<8, true>(sms, w, iters, sink, cycles);
  }
  CHECK(cudaFree(sink));
  CHECK(cudaFree(cycles));
  return 0;
}

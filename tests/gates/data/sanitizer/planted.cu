// A driver with planted faults for the sanitizer gate: `planted clean|oob|race`.
#include <cstdio>
#include <cstring>
#include <cuda_runtime.h>

__global__ void clean_kernel(float* out) {
  __shared__ float s[64];
  s[threadIdx.x] = threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = s[63 - threadIdx.x];
}

__global__ void oob_kernel(float* out, int n) { out[threadIdx.x + n] = 1.f; }  // writes past the end

__global__ void race_kernel(float* out) {  // two warps write and read shared memory with no barrier
  __shared__ float s[32];
  s[threadIdx.x % 32] = threadIdx.x;
  out[threadIdx.x] = s[(threadIdx.x + 1) % 32];
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "clean";
  float* d = nullptr;
  cudaMalloc(&d, 64 * sizeof(float));
  if (!strcmp(mode, "oob")) oob_kernel<<<1, 64>>>(d, 64);
  else if (!strcmp(mode, "race")) race_kernel<<<1, 64>>>(d);
  else clean_kernel<<<1, 64>>>(d);
  cudaError_t err = cudaDeviceSynchronize();
  cudaFree(d);
  printf("%s: %s\nDRIVER OK\n", mode, cudaGetErrorString(err));
  return 0;
}

// Deliberately over the limits when compiled with -maxrregcount=32:
// `spilly` keeps 96 live floats (register spills), `stacky` indexes a local array at run time
// (a 1 KiB stack frame without spills).
__constant__ float bias[64];

extern "C" __global__ void spilly(float* out, int n) {
  float acc[96];
#pragma unroll
  for (int j = 0; j < 96; ++j) acc[j] = out[j * n + threadIdx.x];
#pragma unroll
  for (int r = 0; r < 8; ++r) {
#pragma unroll
    for (int j = 0; j < 96; ++j) acc[j] = acc[j] * acc[(j + 7) % 96] + bias[j % 64];
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 96; ++j) s += acc[j];
  out[threadIdx.x] = s;
}

extern "C" __global__ void stacky(float* out, const int* idx, int n) {
  float local[256];
  for (int j = 0; j < 256; ++j) local[j] = out[j * n + threadIdx.x] * (j + 1);
  out[threadIdx.x] = local[idx[threadIdx.x] & 255];
}

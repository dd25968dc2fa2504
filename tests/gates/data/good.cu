// Kernels within every limit: static and dynamic shared memory, no spills, no stack.
extern "C" __global__ void scale_rows(float* out, const float* in, int n) {
  __shared__ float tile[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  tile[threadIdx.x] = i < n ? in[i] : 0.f;
  __syncthreads();
  if (i < n) out[i] = tile[255 - threadIdx.x] * 2.f;
}

extern "C" __global__ void dyn_copy(float* out, const float* in) {
  extern __shared__ float buf[];
  buf[threadIdx.x] = in[threadIdx.x];
  __syncthreads();
  out[threadIdx.x] = buf[blockDim.x - 1 - threadIdx.x];
}

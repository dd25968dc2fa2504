// Does not compile.
extern "C" __global__ void broken(float* out) { out[threadIdx.x] = undeclared_name; }

// A HIP C++ program built with the real hipcc (ROCm 5.2.3): a kernel, the C++ templated
// hipMalloc, a launch. Under the hook an over-limit allocation is refused before the
// runtime; the others reach the real runtime, whose error codes come back unchanged.
#include <hip/hip_runtime.h>
#include <cstdio>
#include <cstdlib>

__global__ void fill(float* p, float v) { p[threadIdx.x] = v; }

int main(int argc, char** argv) {
  size_t big = argc > 1 ? strtoull(argv[1], nullptr, 0) : (2u << 20);
  float* p = nullptr;
  printf("malloc %d\n", hipMalloc(&p, big));
  printf("malloc %d\n", hipMalloc(&p, 4096));
  hipLaunchKernelGGL(fill, dim3(1), dim3(64), 0, 0, p, 1.0f);
  printf("launch %d\n", hipGetLastError());
  return 0;
}

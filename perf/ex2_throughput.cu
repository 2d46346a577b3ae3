// Is ex2.approx.f16x2 (or .bf16x2) one MUFU operation for two exponentials on Hopper, which
// would halve the d64 softmax's exponential cost? Each kernel runs chains of dependent ex2 (8
// independent chains per thread, a subtraction between links keeps the values in range) and
// prints exponentials per clock per SM; `cuobjdump --dump-sass` shows what ptxas made of them.
// On the H200 (2026-11-30, 5f7372f): 15.9 per clock per SM for all three, and each packed ex2 is two
// MUFU.EX2.F16 / MUFU.EX2.BF16 instructions, one per half: no gain over fp32 ex2.
//   nvcc -arch=sm_90a -O3 -o /tmp/ex2_throughput perf/ex2_throughput.cu && /tmp/ex2_throughput
//   cuobjdump --dump-sass /tmp/ex2_throughput | grep MUFU
#include <cstdio>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
constexpr int ITER = 2048, VALS = 8;
__global__ void ex2_f32(float* out) {
  float x[VALS];
  for (int v = 0; v < VALS; ++v) x[v] = -0.25f - 0.01f * v - 1e-6f * threadIdx.x;
  for (int it = 0; it < ITER; ++it)
#pragma unroll
    for (int v = 0; v < VALS; ++v) {
      float y;
      asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x[v]));
      x[v] = y - 1.5f;
    }
  float s = 0; for (int v = 0; v < VALS; ++v) s += x[v];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
// The packed forms: the same chains on pairs, one ex2 instruction per pair.
__device__ unsigned bits(__half2 x) { return *reinterpret_cast<unsigned*>(&x); }
__device__ unsigned bits(__nv_bfloat162 x) { return *reinterpret_cast<unsigned*>(&x); }
template <typename Pair> __device__ Pair from_bits(unsigned x) { return *reinterpret_cast<Pair*>(&x); }
__device__ __half2 packed_ex2(__half2 x) {
  unsigned y;
  asm volatile("ex2.approx.f16x2 %0, %1;" : "=r"(y) : "r"(bits(x)));
  return from_bits<__half2>(y);
}
__device__ __nv_bfloat162 packed_ex2(__nv_bfloat162 x) {
  unsigned y;
  asm volatile("ex2.approx.ftz.bf16x2 %0, %1;" : "=r"(y) : "r"(bits(x)));
  return from_bits<__nv_bfloat162>(y);
}
template <typename Pair> __device__ Pair pair(float low, float high);
template <> __device__ __half2 pair<__half2>(float low, float high) { return __floats2half2_rn(low, high); }
template <> __device__ __nv_bfloat162 pair<__nv_bfloat162>(float low, float high) {
  return __floats2bfloat162_rn(low, high);
}
template <typename Pair> __global__ void ex2_packed(float* out) {
  Pair x[VALS];
  for (int v = 0; v < VALS; ++v) x[v] = pair<Pair>(-0.25f - 0.01f * v, -0.3f);
  const Pair offset = pair<Pair>(1.5f, 1.5f);
  for (int it = 0; it < ITER; ++it)
#pragma unroll
    for (int v = 0; v < VALS; ++v) x[v] = packed_ex2(x[v]) - offset;
  float s = 0;
  for (int v = 0; v < VALS; ++v) s += __low2float(x[v]) + __high2float(x[v]);
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
template <typename K> void time(const char* name, K kernel, int per_op, float* out, int sms) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  int blocks = sms * 8, threads = 256;
  for (int w = 0; w < 3; ++w) kernel<<<blocks, threads>>>(out);
  float best = 1e30f;
  for (int r = 0; r < 20; ++r) {
    cudaEventRecord(a); kernel<<<blocks, threads>>>(out); cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b); if (ms < best) best = ms;
  }
  double exps = double(blocks) * threads * ITER * VALS * per_op;
  printf("%-10s %8.3f ms  %.3e exp/s  %.2f exp/clk/SM at 1.98 GHz\n", name, best, exps / best * 1e3,
         exps / (best * 1e-3) / sms / 1.98e9);
}
int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  float* out; cudaMalloc(&out, sms * 8 * 256 * sizeof(float));
  time("f32", ex2_f32, 1, out, sms);
  time("f16x2", ex2_packed<__half2>, 2, out, sms);
  time("bf16x2", ex2_packed<__nv_bfloat162>, 2, out, sms);
  printf("%s\n", cudaGetErrorString(cudaGetLastError()));
}

// What a stage boundary of a decode step costs on an NVIDIA GPU (sm_90+), three ways, and how many bytes a
// thread must keep in flight for a stage to stream its weights (issue 12; docs/benchmarks.md cites it):
//   nvcc -O3 -arch=sm_90 -DDEEP=8 -o /tmp/boundary scripts/gpu/measure_stage_boundary.cu && /tmp/boundary
// DEEP: independent 16-byte loads in flight per thread (default 1). The three ways:
//   graph+PDL: K launches of a stage kernel captured in a CUDA graph, programmatic dependent launches
//              (the stage waits with griddepcontrol.wait first), as rocmforge's decode step runs;
//   graph:     the same without programmatic launches;
//   persistent: one launch of K stages with a grid-wide barrier between them (an atomic counter, 2 blocks
//              per SM, all co-resident).
// A stage: each of `blocks` blocks reads its share of that stage's own weights (DRAM: every stage its own
// bytes), adds 64 values the previous stage wrote, and writes one float. Printed: µs per stage.
#include <cuda_runtime.h>
#include <cstdio>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__device__ __forceinline__ float block_sum(float s, float* sh) {
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = s;
  __syncthreads();
  float t = threadIdx.x < blockDim.x / 32 ? sh[threadIdx.x] : 0.0f;
  if (threadIdx.x < 32) for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return t;
}

#ifndef DEEP
#define DEEP 1
#endif
__device__ __forceinline__ float stage_body(const float4* w, const float* x, int n_vec4) {
  float s = x[threadIdx.x & 63];
  int i = threadIdx.x;
  // DEEP loads in flight per thread (independent 16-byte loads issued before any is used)
  for (; i + (DEEP - 1) * (int)blockDim.x < n_vec4; i += DEEP * blockDim.x) {
    float4 v[DEEP];
#pragma unroll
    for (int d = 0; d < DEEP; ++d) v[d] = w[i + d * blockDim.x];
#pragma unroll
    for (int d = 0; d < DEEP; ++d) s += v[d].x + v[d].y + v[d].z + v[d].w;
  }
  for (; i < n_vec4; i += blockDim.x) {
    const float4 v = w[i];
    s += v.x + v.y + v.z + v.w;
  }
  return s;
}

__global__ void __launch_bounds__(256, 2) stage(const float4* W, const float* x, float* y, int n_vec4, int pdl) {
  __shared__ float sh[8];
  const float4* w = W + (size_t)blockIdx.x * n_vec4;
  if (pdl) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
  const float t = block_sum(stage_body(w, x, n_vec4), sh);
  if (threadIdx.x == 0) y[blockIdx.x] = t * 1e-9f;
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__global__ void __launch_bounds__(256, 2) persistent(const float4* W, float* a, float* b, int n_vec4, int stages,
                                                     size_t stage_vec4, unsigned* counter) {
  __shared__ float sh[8];
  for (int k = 0; k < stages; ++k) {
    const float* x = (k & 1) ? b : a;
    float* y = (k & 1) ? a : b;
    const float4* w = W + (size_t)k * stage_vec4 + (size_t)blockIdx.x * n_vec4;
    const float t = block_sum(stage_body(w, x, n_vec4), sh);
    if (threadIdx.x == 0) y[blockIdx.x] = t * 1e-9f;
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(counter, 1u);
      const unsigned target = (unsigned)(k + 1) * gridDim.x;
      while (load_acquire(counter) < target) {}
    }
    __syncthreads();
  }
}

int main() {
  int dev = 0, sms = 0;
  CK(cudaSetDevice(dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  const int blocks = 2 * sms, K = 80, reps = 50;
  printf("%s, %d SMs, %d blocks of 256, %d stages, %d loads in flight a thread\n", prop.name, sms, blocks, K, DEEP);
  const size_t stage_bytes_list[] = {0, 2359296, 18874368};  // none; a 1B's o (2.36 MB); its gate|up (18.9 MB)
  for (size_t stage_bytes : stage_bytes_list) {
    const int n_vec4 = (int)(stage_bytes / 16 / blocks);
    const size_t stage_vec4 = (size_t)n_vec4 * blocks;
    float4* W;
    float *a, *b;
    unsigned* counter;
    CK(cudaMalloc(&W, (stage_vec4 * K + 1) * 16));
    CK(cudaMemset(W, 0, (stage_vec4 * K + 1) * 16));
    CK(cudaMalloc(&a, blocks * 4 + 256));
    CK(cudaMalloc(&b, blocks * 4 + 256));
    CK(cudaMemset(a, 0, blocks * 4 + 256));
    CK(cudaMemset(b, 0, blocks * 4 + 256));
    CK(cudaMalloc(&counter, 4));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double us[3] = {0, 0, 0};
    for (int pdl = 1; pdl >= 0; --pdl) {
      cudaGraph_t g;
      cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
      for (int k = 0; k < K; ++k) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(blocks);
        cfg.blockDim = dim3(256);
        cfg.stream = s;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = pdl ? 1 : 0;
        const float* x = (k & 1) ? b : a;
        float* y = (k & 1) ? a : b;
        CK(cudaLaunchKernelEx(&cfg, stage, (const float4*)(W + (size_t)k * stage_vec4), x, y, n_vec4, pdl));
      }
      CK(cudaStreamEndCapture(s, &g));
      CK(cudaGraphInstantiate(&ge, g, 0));
      for (int w = 0; w < 3; ++w) CK(cudaGraphLaunch(ge, s));
      CK(cudaEventRecord(e0, s));
      for (int r = 0; r < reps; ++r) CK(cudaGraphLaunch(ge, s));
      CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      us[pdl ? 0 : 1] = ms * 1000.0 / reps / K;
      CK(cudaGraphExecDestroy(ge));
      CK(cudaGraphDestroy(g));
    }
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent, 256, 0));
    if (per_sm * sms < blocks) { printf("persistent: only %d blocks per SM fit\n", per_sm); return 1; }
    for (int w = 0; w < 3; ++w) {
      CK(cudaMemsetAsync(counter, 0, 4, s));
      persistent<<<blocks, 256, 0, s>>>(W, a, b, n_vec4, K, stage_vec4, counter);
    }
    CK(cudaEventRecord(e0, s));
    for (int r = 0; r < reps; ++r) {
      CK(cudaMemsetAsync(counter, 0, 4, s));
      persistent<<<blocks, 256, 0, s>>>(W, a, b, n_vec4, K, stage_vec4, counter);
    }
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    CK(cudaGetLastError());
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    us[2] = ms * 1000.0 / reps / K;
    printf("stage of %6.2f MB: graph+PDL %.2f us, graph %.2f us, persistent (grid barrier) %.2f us per stage\n",
           stage_bytes / 1e6, us[0], us[1], us[2]);
    CK(cudaFree(W)); CK(cudaFree(a)); CK(cudaFree(b)); CK(cudaFree(counter));
    CK(cudaStreamDestroy(s));
  }
  return 0;
}

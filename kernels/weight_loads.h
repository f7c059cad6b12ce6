// How the decode products read their weights (qmatvec_formats.h and fused_matvec_formats.h include it; hashed
// with every op that includes them: hipcore/runtime/kernels.py source_files).
//
// A decode step reads each weight once, and far more weight bytes than L2 holds (a Llama-3.1-8B in Q4_K_M:
// 4.6 GiB a step; an H100's or H200's L2: 50 MiB). Read with the default policy, the weights push out of L2
// what the step reads again soon: the KV cache, x between the products, the kernels' own code. So on NVIDIA
// (sm_80 on) their lines enter L2 first in line for eviction (an evict_first cache policy); L1 still takes
// them, because the formats read one line in several loads (Q6_K's and Q8_0's 4-byte words: without L1,
// Q6_K's products ran at half speed). Measured on an NVIDIA H200, one-token decode step replayed from its
// graph: Llama-3.1-8B / Llama-3.2-1B shapes in Q4_K_M 2,536 -> 2,330 us and 737 -> 645 us (attention's cost
// inside the step, scripts/bench/measure_step_anatomy.py: 6.0 -> 3.0 and 3.8 -> 2.4 us a launch); the demo
// model (Q4_1, 92 MiB) 587 -> 560 us. Batched steps (8 or more tokens) unchanged. Elsewhere plain loads
// (AMD's nontemporal loads would be the counterpart; unmeasured, so not used).
//
// The loads are volatile asm: they stay where the source puts them (the formats issue a row group's loads
// before the first is used), as the plain loads they replace did. Alignment: as the plain loads' types need.
#pragma once

namespace {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
static __device__ __forceinline__ unsigned long long weight_policy() {
  unsigned long long policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
static __device__ __forceinline__ uint4 load_weights16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(weight_policy()));
  return v;
}
static __device__ __forceinline__ unsigned int load_weights4(const void* p) {
  unsigned int v;
  asm volatile("ld.global.nc.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(v) : "l"(p), "l"(weight_policy()));
  return v;
}
static __device__ __forceinline__ unsigned short load_weights2(const void* p) {
  unsigned short v;
  asm volatile("ld.global.nc.L2::cache_hint.u16 %0, [%1], %2;" : "=h"(v) : "l"(p), "l"(weight_policy()));
  return v;
}
#else
static __device__ __forceinline__ uint4 load_weights16(const void* p) { return *reinterpret_cast<const uint4*>(p); }
static __device__ __forceinline__ unsigned int load_weights4(const void* p) {
  return *reinterpret_cast<const unsigned int*>(p);
}
static __device__ __forceinline__ unsigned short load_weights2(const void* p) {
  return *reinterpret_cast<const unsigned short*>(p);
}
#endif

}  // namespace

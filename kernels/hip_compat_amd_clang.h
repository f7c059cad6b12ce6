// hip_compat_amd_clang.h: hip_compat.h's section for AMD on bare clang (no ROCm headers).
// Included by hip_compat.h only (the doc of what a kernel may use is there).
#pragma once

// ------------------------------------------------------------------------------------------------
// AMD on bare clang: define the HIP kernel language on clang's AMDGPU builtins.
// ------------------------------------------------------------------------------------------------
#if !defined(__HIP__) || !defined(__AMDGCN__)
#error "hip_compat.h: compile as HIP device code (clang -x hip --cuda-device-only) or with nvcc/nvrtc"
#endif
#define RF_AMD 1

// clang implements these attributes natively in HIP mode; HIP's headers only name them.
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#define __constant__ __attribute__((constant))
#define __forceinline__ inline __attribute__((always_inline))
// As in HIP, the optional second argument is the minimum number of waves per SIMD (on CUDA: blocks per
// SM). Both cap the registers a thread may use; kernels pick values sensible under either meaning.
#define RF_LAUNCH_BOUNDS_1(max_threads) __attribute__((amdgpu_flat_work_group_size(1, max_threads)))
#define RF_LAUNCH_BOUNDS_2(max_threads, min_waves_per_simd) \
  __attribute__((amdgpu_flat_work_group_size(1, max_threads), amdgpu_waves_per_eu(min_waves_per_simd)))
#define RF_LAUNCH_BOUNDS_PICK(_1, _2, name, ...) name
#define __launch_bounds__(...) RF_LAUNCH_BOUNDS_PICK(__VA_ARGS__, RF_LAUNCH_BOUNDS_2, RF_LAUNCH_BOUNDS_1, unused)(__VA_ARGS__)

struct rf_uint3 {
  unsigned int x, y, z;
};

// The unused components fold away: these builtins are pure reads of registers or of the dispatch packet.
static __device__ __forceinline__ rf_uint3 rf_thread_idx() {
  return {__builtin_amdgcn_workitem_id_x(), __builtin_amdgcn_workitem_id_y(), __builtin_amdgcn_workitem_id_z()};
}
static __device__ __forceinline__ rf_uint3 rf_block_idx() {
  return {__builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workgroup_id_y(), __builtin_amdgcn_workgroup_id_z()};
}
static __device__ __forceinline__ rf_uint3 rf_block_dim() {
  return {__builtin_amdgcn_workgroup_size_x(), __builtin_amdgcn_workgroup_size_y(), __builtin_amdgcn_workgroup_size_z()};
}
// The dispatch's grid size counts work-items (HSA), HIP's gridDim counts blocks.
static __device__ __forceinline__ rf_uint3 rf_grid_dim() {
  return {__builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x(),
          __builtin_amdgcn_grid_size_y() / __builtin_amdgcn_workgroup_size_y(),
          __builtin_amdgcn_grid_size_z() / __builtin_amdgcn_workgroup_size_z()};
}
#define threadIdx (rf_thread_idx())
#define blockIdx (rf_block_idx())
#define blockDim (rf_block_dim())
#define gridDim (rf_grid_dim())

// A workgroup barrier that also orders the shared (LDS) and global memory operations around it, as
// HIP's __syncthreads does: release before the barrier, acquire after it.
static __device__ __forceinline__ void __syncthreads() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

static __device__ __forceinline__ int rf_lane_id() {
  return (int)__builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
}

// ds_bpermute reads the value of the lane whose byte address is given; a partner outside the
// caller's `width`-lane segment reads the caller's own value, as on CUDA.
static __device__ __forceinline__ int __shfl_xor(int v, int lane_mask, int width = __builtin_amdgcn_wavefrontsize()) {
  const int self = rf_lane_id();
  int partner = self ^ lane_mask;
  partner = partner >= ((self + width) & ~(width - 1)) ? self : partner;
  return __builtin_amdgcn_ds_bpermute(partner << 2, v);
}
static __device__ __forceinline__ unsigned int __shfl_xor(unsigned int v, int lane_mask,
                                                          int width = __builtin_amdgcn_wavefrontsize()) {
  return (unsigned int)__shfl_xor((int)v, lane_mask, width);
}
static __device__ __forceinline__ float __shfl_xor(float v, int lane_mask, int width = __builtin_amdgcn_wavefrontsize()) {
  return __builtin_bit_cast(float, __shfl_xor(__builtin_bit_cast(int, v), lane_mask, width));
}
// Read `src_lane` of the caller's `width`-lane segment.
static __device__ __forceinline__ int __shfl(int v, int src_lane, int width = __builtin_amdgcn_wavefrontsize()) {
  const int self = rf_lane_id();
  const int partner = (src_lane & (width - 1)) + (self & ~(width - 1));
  return __builtin_amdgcn_ds_bpermute(partner << 2, v);
}
static __device__ __forceinline__ unsigned int __shfl(unsigned int v, int src_lane, int width = __builtin_amdgcn_wavefrontsize()) {
  return (unsigned int)__shfl((int)v, src_lane, width);
}
static __device__ __forceinline__ float __shfl(float v, int src_lane, int width = __builtin_amdgcn_wavefrontsize()) {
  return __builtin_bit_cast(float, __shfl(__builtin_bit_cast(int, v), src_lane, width));
}

// Device-wide (agent scope) relaxed atomics, as HIP's atomicAdd / atomicMax / atomicCAS.
static __device__ __forceinline__ int atomicAdd(int* p, int v) {
  return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
static __device__ __forceinline__ unsigned int atomicAdd(unsigned int* p, unsigned int v) {
  return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
static __device__ __forceinline__ float atomicAdd(float* p, float v) {
  return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
static __device__ __forceinline__ int atomicMax(int* p, int v) {
  return __hip_atomic_fetch_max(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
static __device__ __forceinline__ int atomicMin(int* p, int v) {
  return __hip_atomic_fetch_min(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
static __device__ __forceinline__ int atomicCAS(int* p, int expected, int desired) {
  __hip_atomic_compare_exchange_strong(p, &expected, desired, __ATOMIC_RELAXED, __ATOMIC_RELAXED,
                                       __HIP_MEMORY_SCOPE_AGENT);
  return expected;
}
// A device-wide fence, as HIP's __threadfence: this thread's writes before it are visible to the whole
// device before its accesses after it, and reads after it see what other workgroups published before
// their own fence (the "last workgroup finishes the job" pattern: fence, then an atomic counter).
static __device__ __forceinline__ void __threadfence() { __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "agent"); }

// The vector types the kernels load with; 16-byte alignment makes a load of one a single instruction.
struct __attribute__((aligned(16))) float4 {
  float x, y, z, w;
};
struct __attribute__((aligned(16))) uint4 {
  unsigned int x, y, z, w;
};

typedef _Float16 __half;
typedef _Float16 half;
static __device__ __forceinline__ float __half2float(__half h) { return (float)h; }
static __device__ __forceinline__ __half __float2half(float f) { return (__half)f; }

// Math: without the ROCm device libraries only what the AMDGPU backend lowers by itself is available.
// These llvm intrinsics are expanded inline with full float accuracy (exp/log with their denormal and
// range fix-ups, sqrt correctly rounded); none of them becomes a library call.
static __device__ __forceinline__ float expf(float x) { return __builtin_expf(x); }
static __device__ __forceinline__ float exp2f(float x) { return __builtin_exp2f(x); }
static __device__ __forceinline__ float log2f(float x) { return __builtin_log2f(x); }
static __device__ __forceinline__ float sqrtf(float x) { return __builtin_sqrtf(x); }
static __device__ __forceinline__ float fabsf(float x) { return __builtin_fabsf(x); }
static __device__ __forceinline__ float fmaxf(float a, float b) { return __builtin_fmaxf(a, b); }
static __device__ __forceinline__ float fminf(float a, float b) { return __builtin_fminf(a, b); }
static __device__ __forceinline__ float fmaf(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
static __device__ __forceinline__ float rintf(float x) { return __builtin_rintf(x); }
// The fast exponential: one hardware exp2 (v_exp_f32), a few ulp, like CUDA's __expf.
static __device__ __forceinline__ float __expf(float x) { return __builtin_amdgcn_exp2f(x * 1.4426950408889634f); }
static __device__ __forceinline__ int min(int a, int b) { return a < b ? a : b; }
static __device__ __forceinline__ int max(int a, int b) { return a > b ? a : b; }
static __device__ __forceinline__ unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
static __device__ __forceinline__ unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }

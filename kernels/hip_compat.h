// hip_compat.h: the one header every kernel includes. It makes the HIP kernel language available on
// every compiler rocmforge builds with, so that kernels/*.hip are vendor-neutral:
//
//   1. bare clang (Debian's clang-22, no ROCm installed), AMD:
//        clang-22 -x hip --offload-arch=gfx942 --cuda-device-only --no-gpu-bundle-output
//                 -nogpulib -nogpuinc -nohipwrapperinc -O3
//      No HIP header exists here, so this file defines the language on clang builtins (hip_compat_amd_clang.h).
//   2. HIP with ROCm headers (hipcc, hiprtc): the language is already there; only the extras below
//      (WARP_SIZE, 16-bit float conversions, reductions) are added.
//   3. NVIDIA (nvcc, nvrtc): CUDA's built-ins, plus __shfl_xor mapped onto __shfl_xor_sync (hip_compat_nvidia.h).
//      No CUDA header is included, because nvrtc has no include path to the CUDA toolkit on a user's machine.
// What every AMD path shares (wave size, conversions, the matrix-core kind of each target): hip_compat_amd.h.
//
// What a kernel may use, everywhere:
//   threadIdx / blockIdx / blockDim / gridDim (.x .y .z), __syncthreads(), __shfl_xor(v, mask[, width])
//   and __shfl(v, src_lane[, width]) for int / unsigned / float, WARP_SIZE (a compile-time constant: 64
//   on CDNA/GCN, 32 on RDNA and NVIDIA), __global__ __device__ __shared__ __launch_bounds__
//   __forceinline__ __restrict__, float4 / uint4, expf __expf exp2f log2f sqrtf fabsf fmaxf fminf fmaf
//   rintf, rf_dp4a(a, b, c) (four signed-byte products summed into c), int min / max, atomicAdd (int, unsigned, float) atomicMax atomicMin (int) atomicCAS (int) on global
//   or shared memory, __threadfence(), RF_INFINITY, the rf_* helpers at the end (matrix cores: matrix_cores.h).
//   16-bit floats are handled as raw bits (unsigned short) through rf_f16_to_float / rf_float_to_f16 /
//   rf_bf16_to_float / rf_float_to_bf16, because the __half types of cuda_fp16.h and hip_fp16.h need
//   headers that nvrtc cannot see. On bare clang `half` / `__half` (= _Float16) and __half2float /
//   __float2half exist as well, as HIP defines them.
// Block sizes handed to rf_block_* must be multiples of WARP_SIZE; launchers use multiples of 64.

#pragma once


#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#include "hip_compat_nvidia.h"  // warps of 32, CUDA's built-ins, PTX for the rf_* helpers

#elif defined(__HIP__) && (defined(__HIPCC_RTC__) || defined(__CLANG_HIP_RUNTIME_WRAPPER_H__) || \
                           defined(HIP_INCLUDE_HIP_HIP_RUNTIME_H))
// ------------------------------------------------------------------------------------------------
// AMD with ROCm's HIP headers (hipcc, hiprtc): the kernel language exists; add the extras only.
// ------------------------------------------------------------------------------------------------
#define RF_AMD 1

static __device__ __forceinline__ int rf_lane_id() {
  return (int)__builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
}

#else
#include "hip_compat_amd_clang.h"  // the HIP kernel language on clang's AMDGPU builtins
#endif

#if defined(RF_AMD)
#include "hip_compat_amd.h"  // wave size, the rf_* helpers and the matrix-core kind of each AMD target
#endif


// ================================================================================================
// Vendor-neutral from here on: built on the definitions above only. tests/test_kernels_emulated.py
// compiles everything below this line as is, with a host emulation of the language in place of the
// vendor sections, to run the kernels on the CPU.
// ================================================================================================

// +infinity on every compiler (nvrtc has no math.h for INFINITY, nor __builtin_huge_valf).
#define RF_INFINITY rf_uint_as_float(0x7f800000u)

static __device__ __forceinline__ void rf_check_wave_size() {
#if defined(RF_AMD)
  if (__builtin_amdgcn_wavefrontsize() != WARP_SIZE) __builtin_trap();
#endif
}

// Programmatic dependent launch (NVIDIA sm_90 and later; nothing elsewhere): a kernel whose launcher asks
// for it (get_kernel(..., programmatic=True)) may be started while the kernel ahead of it in the stream
// still runs. This waits until that kernel has finished and its writes are visible, then lets the next
// kernel's launch begin (it waits in turn, so at most one kernel runs ahead). Such a kernel calls it in
// every thread before it reads or writes global memory that another kernel touches; what it does
// before (index arithmetic, reads of the weights, which no kernel writes) overlaps the kernel before.
static __device__ __forceinline__ void rf_grid_dependency_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// A hint that the 128-byte line at p will be read soon: fetched into L2 on NVIDIA sm_90 and later, where
// the kernels that issue it before rf_grid_dependency_sync() start early (programmatic launches), nothing
// elsewhere. Without that overlap it only cost (on an NVIDIA H100 with programmatic launches off, one-token
// decode 3-6% slower: the registers it takes). It reads no data, so it may come before the wait.
static __device__ __forceinline__ void rf_prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
  (void)p;
#endif
}

// The first statement of an entry that waits later, in its own code, after reading only what no kernel
// writes (the weights): fused_qmatvec's tile_dot loads its first weights, then calls rf_grid_dependency_sync()
// before it stages x (tests/test_programmatic_launch.py holds such ops and where they wait).
static __device__ __forceinline__ void rf_grid_dependency_deferred() {}

// bfloat16 is the top half of a float32: widening is a shift; narrowing rounds to nearest even and
// keeps NaNs quiet (a NaN whose payload sits in the low bits would otherwise round to infinity).
static __device__ __forceinline__ float rf_bf16_to_float(unsigned short bits) {
  return rf_uint_as_float((unsigned int)bits << 16);
}
static __device__ __forceinline__ unsigned short rf_float_to_bf16(float f) {
  const unsigned int u = rf_float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x0040u);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// ------------------------------------------------------------------------------------------------
// Reductions written in terms of WARP_SIZE, so they are right on wave32 and wave64 alike.
// ------------------------------------------------------------------------------------------------
#define RF_MAX_WARPS_PER_BLOCK (1024 / 32)

// Sum over the lanes of a warp; every lane gets the total.
static __device__ __forceinline__ float rf_warp_sum(float v) {
#pragma unroll
  for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) v += __shfl_xor(v, offset);
  return v;
}

// Sum over the block; every thread gets the total. `scratch` is a __shared__ array of
// RF_MAX_WARPS_PER_BLOCK floats; it may be reused as soon as this returns.
static __device__ __forceinline__ float rf_block_sum(float v, float* scratch) {
  rf_check_wave_size();
  const int lane = (int)threadIdx.x % WARP_SIZE, warp = (int)threadIdx.x / WARP_SIZE;
  const int warps = (int)blockDim.x / WARP_SIZE;
  v = rf_warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  v = rf_warp_sum(v);
  __syncthreads();  // every warp has read scratch before anyone may write it again
  return v;
}

// The matrix-core path (matrix_cores.h), picked by a vendor section above or -DRF_MMA_KIND (the emulation); here
// so that every #if on RF_MMA_KIND compares defined names (an undefined one counts as 0, the FMA path's value).
#define RF_MMA_FMA 0          // no matrix cores (gfx1030, NVIDIA before sm_80, host passes)
#define RF_MMA_NV_M16N8K16 1  // NVIDIA sm_80+: mma.sync.m16n8k16 f32 += f16 x f16, twice per 16x16 tile
#define RF_MMA_CDNA_MFMA 2    // AMD CDNA (gfx908/90a/94x, wave64): v_mfma_f32_16x16x16_f16
#define RF_MMA_RDNA3_WMMA 3   // AMD RDNA3 (gfx11, wave32): v_wmma_f32_16x16x16_f16, A and B replicated
#define RF_MMA_RDNA4_WMMA 4   // AMD RDNA4 (gfx12, wave32): v_wmma_f32_16x16x16_f16, K split across half-waves
#ifndef RF_MMA_KIND
#define RF_MMA_KIND RF_MMA_FMA
#endif

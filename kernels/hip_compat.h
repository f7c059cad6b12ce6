// hip_compat.h: the one header every kernel includes. It makes the HIP kernel language available on
// every compiler rocmforge builds with, so that kernels/*.hip are vendor-neutral:
//
//   1. bare clang (Debian's clang-22, no ROCm installed), AMD:
//        clang-22 -x hip --offload-arch=gfx942 --cuda-device-only --no-gpu-bundle-output
//                 -nogpulib -nogpuinc -nohipwrapperinc -O3
//      No HIP header exists here, so this file defines the language on clang builtins.
//   2. HIP with ROCm headers (hipcc, hiprtc): the language is already there; only the extras below
//      (WARP_SIZE, 16-bit float conversions, reductions) are added.
//   3. NVIDIA (nvcc, nvrtc): CUDA's built-ins, plus __shfl_xor mapped onto __shfl_xor_sync. No header
//      is included, because nvrtc has no include path to the CUDA toolkit on a user's machine.
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
// ------------------------------------------------------------------------------------------------
// NVIDIA: nvcc or nvrtc. The kernel language is CUDA's own; warps are 32 lanes.
// ------------------------------------------------------------------------------------------------
#define RF_NVIDIA 1
#define WARP_SIZE 32

// CUDA 9 removed the mask-less shuffles for sm_70+; ours have every lane of the warp take part. A
// macro, because the host pass of nvcc still declares the old ones under the same name.
static __device__ __forceinline__ int rf_shfl_xor(int v, int lane_mask, int width = WARP_SIZE) {
  return __shfl_xor_sync(0xffffffffu, v, lane_mask, width);
}
static __device__ __forceinline__ unsigned int rf_shfl_xor(unsigned int v, int lane_mask, int width = WARP_SIZE) {
  return __shfl_xor_sync(0xffffffffu, v, lane_mask, width);
}
static __device__ __forceinline__ float rf_shfl_xor(float v, int lane_mask, int width = WARP_SIZE) {
  return __shfl_xor_sync(0xffffffffu, v, lane_mask, width);
}
static __device__ __forceinline__ int rf_shfl(int v, int src_lane, int width = WARP_SIZE) {
  return __shfl_sync(0xffffffffu, v, src_lane, width);
}
static __device__ __forceinline__ unsigned int rf_shfl(unsigned int v, int src_lane, int width = WARP_SIZE) {
  return __shfl_sync(0xffffffffu, v, src_lane, width);
}
static __device__ __forceinline__ float rf_shfl(float v, int src_lane, int width = WARP_SIZE) {
  return __shfl_sync(0xffffffffu, v, src_lane, width);
}
#define __shfl_xor rf_shfl_xor
#define __shfl rf_shfl

static __device__ __forceinline__ int rf_lane_id() {
  unsigned int lane;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
  return (int)lane;
}

// PTX conversions: exact for f16 -> f32, round-to-nearest-even for f32 -> f16.
static __device__ __forceinline__ float rf_f16_to_float(unsigned short bits) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
  return f;
}
static __device__ __forceinline__ unsigned short rf_float_to_f16(float f) {
  unsigned short bits;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(f));
  return bits;
}
// Four int8 products summed into c: a and b each hold four signed bytes (sm_61 and later).
static __device__ __forceinline__ int rf_dp4a(int a, int b, int c) {
  int d;
  asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
static __device__ __forceinline__ unsigned int rf_float_as_uint(float f) { return __float_as_uint(f); }
static __device__ __forceinline__ float rf_uint_as_float(unsigned int u) { return __uint_as_float(u); }
// Bytes of {hi, lo} (0-3 lo's, 4-7 hi's) picked into a word: result byte i is byte ((selector >> 4 i) & 7)
// (PTX prmt's default mode; the selector's nibbles must stay below 8).
static __device__ __forceinline__ unsigned int rf_byte_perm(unsigned int lo, unsigned int hi, unsigned int selector) {
  unsigned int d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(lo), "r"(hi), "r"(selector));
  return d;
}
// Two f16 lanes per 32-bit word (low half first), round to nearest even; a fused multiply-add rounds once.
static __device__ __forceinline__ unsigned int rf_h2_fma(unsigned int a, unsigned int b, unsigned int c) {
  unsigned int d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
static __device__ __forceinline__ unsigned int rf_h2_mul(unsigned int a, unsigned int b) {
  unsigned int d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
static __device__ __forceinline__ unsigned int rf_h2_sub(unsigned int a, unsigned int b) {
  unsigned int d;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// Two floats rounded to an f16 pair (lo in the low half), one instruction (sm_80+: its first operand is the high half).
static __device__ __forceinline__ unsigned int rf_floats_to_h2(float lo, float hi) {
  unsigned int d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

// Tensor cores from sm_80 on. Only the device pass defines __CUDA_ARCH__; the host pass takes the FMA
// path, which it never runs.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define RF_MMA_KIND RF_MMA_NV_M16N8K16
// d[16x8] += a[16x16] * b[16x8], f16 operands in pairs per 32-bit register, f32 accumulators; the fragment
// layouts are PTX ISA's "Matrix Fragments for mma.m16n8k16" (matrix_cores.h's loads follow them).
static __device__ __forceinline__ void rf_mma_m16n8k16_f16(float c[4], const unsigned int a[4], const unsigned int b[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// ldmatrix.sync.aligned.m8n8.x4: four 8x8 matrices of 16-bit values from shared memory; lane 8 i + r gives the
// address of row r of matrix i (16 bytes, 16-byte aligned), register i of lane 4 g + t receives the pair
// 2t, 2t + 1 of row g of matrix i (PTX ISA, "Warp-level matrix load instruction: ldmatrix").
static __device__ __forceinline__ void rf_ldmatrix_x4(unsigned int r[4], const unsigned short* row) {
  unsigned int address;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(address) : "l"(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
#endif

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
#endif

// ------------------------------------------------------------------------------------------------
// Shared by every AMD path.
// ------------------------------------------------------------------------------------------------
#if defined(RF_AMD)
// Wave64 on GCN/CDNA (gfx9: gfx90a, gfx942 ...), wave32 on RDNA (gfx10, gfx11, gfx12). clang no longer
// predefines the wavefront size, and __builtin_amdgcn_wavefrontsize() is not a constant expression, so
// the size comes from the target family; rf_check_wave_size() (folded away when right) traps if a build
// forced the other mode (-mwavefrontsize64) without -DRF_WARP_SIZE.
#if defined(RF_WARP_SIZE)
#define WARP_SIZE RF_WARP_SIZE
#elif defined(__GFX10__) || defined(__GFX11__) || defined(__GFX12__)
#define WARP_SIZE 32
#else
#define WARP_SIZE 64
#endif

// Four int8 products summed into c (signed bytes): v_dot4_i32_iu8 with both operands signed on RDNA3/4,
// v_dot4(c)_i32_i8 on CDNA and RDNA2.
static __device__ __forceinline__ int rf_dp4a(int a, int b, int c) {
#if defined(__GFX11__) || defined(__GFX12__)
  return __builtin_amdgcn_sudot4(true, a, true, b, c, false);
#else
  return __builtin_amdgcn_sdot4(a, b, c, false);
#endif
}
static __device__ __forceinline__ unsigned int rf_float_as_uint(float f) { return __builtin_bit_cast(unsigned int, f); }
static __device__ __forceinline__ float rf_uint_as_float(unsigned int u) { return __builtin_bit_cast(float, u); }
static __device__ __forceinline__ float rf_f16_to_float(unsigned short bits) {
  return (float)__builtin_bit_cast(_Float16, bits);
}
static __device__ __forceinline__ unsigned short rf_float_to_f16(float f) {
  return __builtin_bit_cast(unsigned short, (_Float16)f);
}
// As the NVIDIA section's: v_perm_b32 takes one selector byte per result byte, prmt one nibble (the
// conversion folds away for the constant selectors the kernels pass).
static __device__ __forceinline__ unsigned int rf_byte_perm(unsigned int lo, unsigned int hi, unsigned int selector) {
  const unsigned int bytes = (selector & 7u) | ((selector >> 4) & 7u) << 8 | ((selector >> 8) & 7u) << 16 |
                             ((selector >> 12) & 7u) << 24;
  return __builtin_amdgcn_perm(hi, lo, bytes);
}
typedef _Float16 rf_half2 __attribute__((ext_vector_type(2)));
static __device__ __forceinline__ rf_half2 rf_as_h2(unsigned int w) { return __builtin_bit_cast(rf_half2, w); }
static __device__ __forceinline__ unsigned int rf_h2_fma(unsigned int a, unsigned int b, unsigned int c) {
  return __builtin_bit_cast(unsigned int, __builtin_elementwise_fma(rf_as_h2(a), rf_as_h2(b), rf_as_h2(c)));
}
static __device__ __forceinline__ unsigned int rf_h2_mul(unsigned int a, unsigned int b) {
  return __builtin_bit_cast(unsigned int, rf_as_h2(a) * rf_as_h2(b));
}
static __device__ __forceinline__ unsigned int rf_h2_sub(unsigned int a, unsigned int b) {
  return __builtin_bit_cast(unsigned int, rf_as_h2(a) - rf_as_h2(b));
}
static __device__ __forceinline__ unsigned int rf_floats_to_h2(float lo, float hi) {
  return __builtin_bit_cast(unsigned int, rf_half2{(_Float16)lo, (_Float16)hi});
}

// Matrix cores: MFMA on CDNA, WMMA on RDNA3 and RDNA4 (the builtins of LLVM's BuiltinsAMDGPU.def),
// none on RDNA2 (gfx1030) and older GCN.
#if defined(__gfx908__) || defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__) || \
    defined(__gfx950__)
#define RF_MMA_KIND RF_MMA_CDNA_MFMA
#elif defined(__GFX11__)
#define RF_MMA_KIND RF_MMA_RDNA3_WMMA
#elif defined(__GFX12__)
#define RF_MMA_KIND RF_MMA_RDNA4_WMMA
#endif
typedef _Float16 rf_half4 __attribute__((ext_vector_type(4)));
typedef _Float16 rf_half8 __attribute__((ext_vector_type(8)));
typedef _Float16 rf_half16 __attribute__((ext_vector_type(16)));
typedef float rf_floatx4 __attribute__((ext_vector_type(4)));
typedef float rf_floatx8 __attribute__((ext_vector_type(8)));
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

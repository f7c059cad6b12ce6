// hip_compat_nvidia.h: hip_compat.h's NVIDIA section (nvcc, nvrtc).
// Included by hip_compat.h only (the doc of what a kernel may use is there).
#pragma once

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

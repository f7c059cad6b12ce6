// matrix_cores.h: one warp's 16x16x16 f16 tile on each vendor's matrix cores (rf_mma_load_a / _b, rf_mma,
// rf_mma_acc_row / _col), for the ops that run their products on them (matmul_mma.hip, prompt_attention.hip).
// hip_compat.h's vendor sections say which instruction a target has (RF_MMA_KIND, and the mma.sync / ldmatrix
// and vector types it uses); this file is vendor-neutral on top of them, so tests/kernel_emulation builds it
// as it is, once per path, against its emulated instructions.
#pragma once

#include "hip_compat.h"

// ------------------------------------------------------------------------------------------------
// Matrix cores: D[16x16] += A[16x16] * B^T for one warp, f16 operands, f32 accumulators. A is 16 rows
// of 16 k, B 16 columns (n) of 16 k, both f16 bits in shared memory with k contiguous and a row stride
// of `stride` halves (even, so that a pair of halves is one aligned 32-bit word). hip_compat.h's vendor
// sections choose RF_MMA_KIND; each kind loads its operand fragments in the lane layout its instruction documents
// (PTX ISA "Matrix Fragments for mma.m16n8k16"; AMD's CDNA3 and RDNA3/RDNA4 ISA guides for
// v_mfma_f32_16x16x16_f16 and v_wmma_f32_16x16x16_f16), and says where accumulator i of a lane sits.
// tests/kernel_emulation/emulation.h emulates the instructions from those layouts, so every kind runs
// on the CPU at its warp width.
// ------------------------------------------------------------------------------------------------
#define RF_MMA_ACC (256 / WARP_SIZE)  // accumulators of one 16x16 tile per lane

// The 32-bit word holding halves (col, col + 1) of row `row`.
static __device__ __forceinline__ unsigned int rf_mma_word(const unsigned short* tile, int stride, int row, int col) {
  return *reinterpret_cast<const unsigned int*>(tile + row * stride + col);
}

#if RF_MMA_KIND == RF_MMA_NV_M16N8K16
// Lane = 4 g + t. A: registers (g, 2t), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8), each a pair of k.
// B per 8 columns: (n = g, k = 2t), (n = g, k = 2t + 8). D per 8 columns: (g, 2t + e), (g + 8, 2t + e).
struct RfMmaA {
  unsigned int r[4];
};
struct RfMmaB {
  unsigned int r[4];  // columns 0-7, then 8-15
};
// Both fragments come from one ldmatrix.x4 each (four 8x8 matrices of halves, lane 8 i + r giving the
// address of row r of matrix i; register i of lane 4 g + t is then the pair 2t, 2t + 1 of row g of matrix i),
// a quarter of the shared-memory load instructions of reading the pairs one by one. Rows start 16-byte
// aligned (matmul_mma's strides of 40 and 72 halves, k at multiples of 8).
// A: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
static __device__ __forceinline__ void rf_mma_load_a(RfMmaA& a, const unsigned short* tile, int stride) {
  const int lane = rf_lane_id();
  rf_ldmatrix_x4(a.r, tile + ((lane & 7) + 8 * ((lane >> 3) & 1)) * stride + 8 * (lane >> 4));
}
// B (row n of the tile is column n): matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
static __device__ __forceinline__ void rf_mma_load_b(RfMmaB& b, const unsigned short* tile, int stride) {
  const int lane = rf_lane_id();
  rf_ldmatrix_x4(b.r, tile + ((lane & 7) + 8 * (lane >> 4)) * stride + 8 * ((lane >> 3) & 1));
}
static __device__ __forceinline__ void rf_mma(float acc[RF_MMA_ACC], const RfMmaA& a, const RfMmaB& b) {
  rf_mma_m16n8k16_f16(acc, a.r, b.r);
  rf_mma_m16n8k16_f16(acc + 4, a.r, b.r + 2);
}
static __device__ __forceinline__ int rf_mma_acc_row(int lane, int i) { return (lane >> 2) + 8 * ((i >> 1) & 1); }
static __device__ __forceinline__ int rf_mma_acc_col(int lane, int i) { return 8 * (i >> 2) + 2 * (lane & 3) + (i & 1); }

#elif RF_MMA_KIND == RF_MMA_CDNA_MFMA || RF_MMA_KIND == RF_MMA_RDNA3_WMMA || RF_MMA_KIND == RF_MMA_RDNA4_WMMA
// Every AMD kind: lane l holds row (A) or column (B) l % 16, a run of kHalves consecutive k starting at
// kFirst; accumulator i of lane l is D[row(l, i)][l % 16].
#if RF_MMA_KIND == RF_MMA_CDNA_MFMA
typedef rf_half4 RfMmaHalves;  // wave64: lanes 16 q .. 16 q + 15 hold k = 4 q .. 4 q + 3
typedef rf_floatx4 RfMmaFloats;
#define RF_MMA_HALVES 4
static __device__ __forceinline__ int rf_mma_k_first(int lane) { return 4 * (lane >> 4); }
static __device__ __forceinline__ int rf_mma_acc_row(int lane, int i) { return 4 * (lane >> 4) + i; }
#elif RF_MMA_KIND == RF_MMA_RDNA3_WMMA
typedef rf_half16 RfMmaHalves;  // wave32: all 16 k in every lane, lanes 16-31 repeating lanes 0-15
typedef rf_floatx8 RfMmaFloats;
#define RF_MMA_HALVES 16
static __device__ __forceinline__ int rf_mma_k_first(int) { return 0; }
static __device__ __forceinline__ int rf_mma_acc_row(int lane, int i) { return 2 * i + (lane >> 4); }
#else
typedef rf_half8 RfMmaHalves;  // wave32: lanes 0-15 hold k = 0 .. 7, lanes 16-31 k = 8 .. 15
typedef rf_floatx8 RfMmaFloats;
#define RF_MMA_HALVES 8
static __device__ __forceinline__ int rf_mma_k_first(int lane) { return 8 * (lane >> 4); }
static __device__ __forceinline__ int rf_mma_acc_row(int lane, int i) { return 8 * (lane >> 4) + i; }
#endif
static __device__ __forceinline__ int rf_mma_acc_col(int lane, int) { return lane & 15; }
struct RfMmaWords {
  unsigned int w[RF_MMA_HALVES / 2];
};
struct RfMmaA {
  RfMmaHalves v;
};
typedef RfMmaA RfMmaB;  // both operands are stored k-contiguous, so they load alike
static __device__ __forceinline__ void rf_mma_load_a(RfMmaA& a, const unsigned short* tile, int stride) {
  const int lane = rf_lane_id(), k0 = rf_mma_k_first(lane);
  RfMmaWords words;
#pragma unroll
  for (int i = 0; i < RF_MMA_HALVES / 2; ++i) words.w[i] = rf_mma_word(tile, stride, lane & 15, k0 + 2 * i);
  a.v = __builtin_bit_cast(RfMmaHalves, words);
}
static __device__ __forceinline__ void rf_mma_load_b(RfMmaB& b, const unsigned short* tile, int stride) {
  rf_mma_load_a(b, tile, stride);
}
static __device__ __forceinline__ void rf_mma(float acc[RF_MMA_ACC], const RfMmaA& a, const RfMmaB& b) {
  RfMmaFloats c;
#pragma unroll
  for (int i = 0; i < RF_MMA_ACC; ++i) c[i] = acc[i];
#if RF_MMA_KIND == RF_MMA_CDNA_MFMA
  c = __builtin_amdgcn_mfma_f32_16x16x16f16(a.v, b.v, c, 0, 0, 0);
#elif RF_MMA_KIND == RF_MMA_RDNA3_WMMA
  c = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(a.v, b.v, c);
#else
  c = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32_gfx12(a.v, b.v, c);
#endif
#pragma unroll
  for (int i = 0; i < RF_MMA_ACC; ++i) acc[i] = c[i];
}

#else
// No matrix cores: the same tile by fused multiply-adds from shared memory. Lane l computes D[row][l % 16]
// for row = i * (WARP_SIZE / 16) + l / 16, summing k in order.
struct RfMmaA {
  const unsigned short* tile;
  int stride;
};
typedef RfMmaA RfMmaB;
static __device__ __forceinline__ void rf_mma_load_a(RfMmaA& a, const unsigned short* tile, int stride) {
  a.tile = tile, a.stride = stride;
}
static __device__ __forceinline__ void rf_mma_load_b(RfMmaB& b, const unsigned short* tile, int stride) {
  b.tile = tile, b.stride = stride;
}
static __device__ __forceinline__ int rf_mma_acc_row(int lane, int i) { return i * (WARP_SIZE / 16) + (lane >> 4); }
static __device__ __forceinline__ int rf_mma_acc_col(int lane, int) { return lane & 15; }
static __device__ __forceinline__ void rf_mma(float acc[RF_MMA_ACC], const RfMmaA& a, const RfMmaB& b) {
  const int lane = rf_lane_id();
  const unsigned short* col = b.tile + (lane & 15) * b.stride;
#pragma unroll
  for (int i = 0; i < RF_MMA_ACC; ++i) {
    const unsigned short* row = a.tile + rf_mma_acc_row(lane, i) * a.stride;
    float s = acc[i];
#pragma unroll
    for (int k = 0; k < 16; ++k) s = fmaf(rf_f16_to_float(row[k]), rf_f16_to_float(col[k]), s);
    acc[i] = s;
  }
}
#endif

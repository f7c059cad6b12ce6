// What the block formats' headers (block_formats.h) share: the masks and extractions of packed codes, and the
// whole-block decode. Formats live in namespace rf_blocks, one struct each (rf_blocks::Q4_K):
// kValues elements in kBytes bytes, the offsets of its fields (k...At), and static decode functions.
#pragma once
#include "hip_compat.h"

// Whether a member of a block's Layout struct sits at byte `at`, for the formats' layout checks. nvrtc 13.0
// knows no __builtin_offsetof ("type name is not allowed" in every op that includes the formats; 13.5 has it),
// so a run-time compile on NVIDIA checks the sizes alone; every precompiled build (nvcc, clang) and
// hiprtc check the offsets too.
#if defined(__CUDACC_RTC__)
#define RF_MEMBER_AT(type, member, at) true
#else
#define RF_MEMBER_AT(type, member, at) (__builtin_offsetof(type, member) == (at))
#endif

namespace rf_blocks {

constexpr unsigned int kLowNibbles = 0x0F0F0F0Fu;  // the low nibble of each byte of a word
constexpr unsigned int kByteOnes = 0x01010101u;    // bit 0 of each byte

// Byte i (0..3) of a little-endian word.
static __device__ __forceinline__ unsigned int byte_of(unsigned int word, int i) { return (word >> (8 * i)) & 0xffu; }

// The four codes in the low (high) nibbles of a word's bytes, one per byte: the packed form dp4a and the
// matrix cores' byte permutes take.
static __device__ __forceinline__ unsigned int low_nibbles(unsigned int word) { return word & kLowNibbles; }
static __device__ __forceinline__ unsigned int high_nibbles(unsigned int word) { return (word >> 4) & kLowNibbles; }

// The bytes of a row of F blocks: cols / F::kValues blocks (cols a multiple of it).
template <class F>
static __device__ __forceinline__ unsigned long long row_bytes(int cols) {
  return (unsigned long long)(cols / F::kValues) * F::kBytes;
}

// A whole block to floats, element by element (F::element: element j >= 0 of a row of F blocks, as the reference
// dequantizer gives it; the tests and embedding's lookup use it, the products decode the parts their threads read).
template <class F>
static __device__ __forceinline__ void dequantize_block(const unsigned char* block, float out[]) {
  for (int k = 0; k < F::kValues; ++k) out[k] = F::element(block, k);
}

// How a decode turns a code into a float, for the decode8 primitives: PlainCodes with the conversion instructions
// (matmul, fused_matmul); matmul_mma_formats.h's own without them (its code_to_float).
struct PlainCodes {
  static __device__ __forceinline__ float of(unsigned int v) { return (float)v; }
  static __device__ __forceinline__ float biased(unsigned int v, int bias) { return (float)((int)v - bias); }
  static __device__ __forceinline__ float of_int8(unsigned int byte) { return (float)(signed char)byte; }
};

}  // namespace rf_blocks

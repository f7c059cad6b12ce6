// F16 and BF16 (GGML types 1 and 30): plain 16-bit values, a "block" of one. BF16 is the top half of a float32:
// widening is a shift (or, for the high half of a word, a mask).
#pragma once
#include "block_format_common.h"

namespace rf_blocks {

struct F16 {
  static constexpr int kValues = 1, kBytes = 2;
  static_assert(sizeof(unsigned short) == kBytes, "a half is two bytes");
  static __device__ __forceinline__ float to_float(unsigned short bits) { return rf_f16_to_float(bits); }
  // The low (element 2i) and high (2i + 1) half of a little-endian word of two.
  static __device__ __forceinline__ float low_of(unsigned int word) { return rf_f16_to_float((unsigned short)(word & 0xffffu)); }
  static __device__ __forceinline__ float high_of(unsigned int word) { return rf_f16_to_float((unsigned short)(word >> 16)); }
  static __device__ __forceinline__ float element(const unsigned char* row, int j) {
    return rf_f16_to_float(reinterpret_cast<const unsigned short*>(row)[j]);
  }
};

struct BF16 {
  static constexpr int kValues = 1, kBytes = 2;
  static __device__ __forceinline__ float to_float(unsigned short bits) { return rf_bf16_to_float(bits); }
  static __device__ __forceinline__ float low_of(unsigned int word) { return rf_uint_as_float(word << 16); }
  static __device__ __forceinline__ float high_of(unsigned int word) { return rf_uint_as_float(word & 0xffff0000u); }
  // A word's two values as one f16 pair (for the matrix cores' f16 operands): exact for |w| in f16's normal
  // range (6.1e-5 .. 65,504: bfloat16's 8 bits of mantissa fit f16's 11); smaller values round once as f16
  // subnormals; larger ones overflow (hipcore/model/weights.py stores a matrix holding any as F32 instead).
  static __device__ __forceinline__ unsigned int to_f16_pair(unsigned int word) {
    return rf_floats_to_h2(rf_uint_as_float(word << 16), rf_uint_as_float(word & 0xffff0000u));
  }
  static __device__ __forceinline__ float element(const unsigned char* row, int j) {
    return rf_bf16_to_float(reinterpret_cast<const unsigned short*>(row)[j]);
  }
};

}  // namespace rf_blocks

// Embedding lookup: out[t, :] = the row ids[t] of a [vocab, hidden] table, dequantized to float32.
// The table stays in its GGUF layout, row-major: F32, F16, BF16 elements, or blocks of 32 elements
// (Q4_0 {half d; uint8 qs[16]}, 18 bytes; Q4_1 {half d; half m; uint8 qs[16]}, 20 bytes; Q8_0
// {half d; int8 qs[32]}, 34 bytes). Quant j < 16 of a 4-bit block is the low nibble of qs[j], quant
// j >= 16 the high nibble of qs[j - 16].
//
// Every decoded value is exact in float32, as in the host reference: d * q is a half times an integer
// of at most 8 bits (at most 19 significant bits), so Q4_0 and Q8_0 are exact products and Q4_1's
// d * q + m rounds once whether or not the compiler fuses it.
//
// One thread per element, workgroup-stride over the tokens (any grid covers them). A block is 18 or
// 34 bytes, so only 2-byte loads are aligned for every block; a row is read once per token, and the
// lookup moves a few KiB per token, so simple loads are enough. An id outside [0, vocab) gives a zero
// row (a kernel cannot raise; the host reference refuses such an id and the engine checks them).
#include "hip_compat.h"

namespace rf_embedding {

struct F32Row {
  static __device__ __forceinline__ unsigned long long row_bytes(int hidden) { return (unsigned long long)hidden * 4; }
  static __device__ __forceinline__ float at(const unsigned char* row, int j) {
    return reinterpret_cast<const float*>(row)[j];
  }
};

struct F16Row {
  static __device__ __forceinline__ unsigned long long row_bytes(int hidden) { return (unsigned long long)hidden * 2; }
  static __device__ __forceinline__ float at(const unsigned char* row, int j) {
    return rf_f16_to_float(reinterpret_cast<const unsigned short*>(row)[j]);
  }
};

struct BF16Row {
  static __device__ __forceinline__ unsigned long long row_bytes(int hidden) { return (unsigned long long)hidden * 2; }
  static __device__ __forceinline__ float at(const unsigned char* row, int j) {
    return rf_bf16_to_float(reinterpret_cast<const unsigned short*>(row)[j]);
  }
};

struct Q4_0Row {
  static __device__ __forceinline__ unsigned long long row_bytes(int hidden) { return (unsigned long long)(hidden / 32) * 18; }
  static __device__ __forceinline__ float at(const unsigned char* row, int j) {
    const unsigned char* block = row + (j >> 5) * 18;
    const float d = rf_f16_to_float(*reinterpret_cast<const unsigned short*>(block));
    const int k = j & 31;
    const int byte = block[2 + (k & 15)];
    return (float)((k < 16 ? byte & 15 : byte >> 4) - 8) * d;
  }
};

struct Q4_1Row {
  static __device__ __forceinline__ unsigned long long row_bytes(int hidden) { return (unsigned long long)(hidden / 32) * 20; }
  static __device__ __forceinline__ float at(const unsigned char* row, int j) {
    const unsigned char* block = row + (j >> 5) * 20;
    const unsigned short* halves = reinterpret_cast<const unsigned short*>(block);
    const float d = rf_f16_to_float(halves[0]), m = rf_f16_to_float(halves[1]);
    const int k = j & 31;
    const int byte = block[4 + (k & 15)];
    return fmaf(d, (float)(k < 16 ? byte & 15 : byte >> 4), m);
  }
};

struct Q8_0Row {
  static __device__ __forceinline__ unsigned long long row_bytes(int hidden) { return (unsigned long long)(hidden / 32) * 34; }
  static __device__ __forceinline__ float at(const unsigned char* row, int j) {
    const unsigned char* block = row + (j >> 5) * 34;
    const float d = rf_f16_to_float(*reinterpret_cast<const unsigned short*>(block));
    return d * (float)(signed char)block[2 + (j & 31)];
  }
};

template <class Row>
__device__ __forceinline__ void lookup(float* __restrict__ out, const void* __restrict__ table_,
                                       const int* __restrict__ ids, int n_tokens, int hidden, int vocab) {
  const unsigned char* table = static_cast<const unsigned char*>(table_);
  const unsigned long long row_bytes = Row::row_bytes(hidden);
  for (int t = (int)blockIdx.x; t < n_tokens; t += (int)gridDim.x) {
    const int id = ids[t];
    const bool inside = id >= 0 && id < vocab;
    const unsigned char* row = table + (unsigned long long)(inside ? id : 0) * row_bytes;
    float* dst = out + (unsigned long long)t * (unsigned long long)hidden;
    for (int j = (int)threadIdx.x; j < hidden; j += (int)blockDim.x) dst[j] = inside ? Row::at(row, j) : 0.0f;
  }
}

}  // namespace rf_embedding

#define RF_EMBEDDING_KERNEL(name, Row)                                                                          \
  extern "C" __global__ __launch_bounds__(256) void name(float* __restrict__ out, const void* __restrict__ table, \
                                                         const int* __restrict__ ids, int n_tokens, int hidden,  \
                                                         int vocab) {                                            \
    rf_embedding::lookup<rf_embedding::Row>(out, table, ids, n_tokens, hidden, vocab);                           \
  }

RF_EMBEDDING_KERNEL(embedding_f32, F32Row)
RF_EMBEDDING_KERNEL(embedding_f16, F16Row)
RF_EMBEDDING_KERNEL(embedding_bf16, BF16Row)
RF_EMBEDDING_KERNEL(embedding_q4_0, Q4_0Row)
RF_EMBEDDING_KERNEL(embedding_q4_1, Q4_1Row)
RF_EMBEDDING_KERNEL(embedding_q8_0, Q8_0Row)

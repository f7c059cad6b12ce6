// Embedding lookup: out[t, :] = the row ids[t] of a [vocab, hidden] table, dequantized to float32.
// The table stays in its GGUF layout, row-major: F32, F16, BF16 elements, or blocks of 32 elements
// (Q4_0 {half d; uint8 qs[16]}, 18 bytes; Q4_1 {half d; half m; uint8 qs[16]}, 20 bytes; Q5_0 and Q5_1,
// 22 and 24 bytes, below; Q8_0 {half d; int8 qs[32]}, 34 bytes). Quant j < 16 of a 4-bit block is the low nibble of qs[j], quant
// j >= 16 the high nibble of qs[j - 16]. K-quant super-blocks of 256 elements (Q4_K 144 bytes, Q5_K
// 176, Q6_K 210) are laid out as in kernels/matvec.hip and hipcore/ops/weight_formats.py.
//
// Every decoded value is exact in float32, as in the host reference: d * q is a half times an integer
// of at most 8 bits (at most 19 significant bits), so Q4_0 and Q8_0 are exact products and Q4_1's
// d * q + m rounds once whether or not the compiler fuses it. The K-quants match the host reference
// (weight_formats.dequantize_rows: exact in float64, then one rounding to float32) bit for bit too:
// Q6_K's (d * scale) * (q - 32) is a half times an int8 (at most 18 significant bits) times a code of
// at most 5 (|q - 32| <= 32): at most 23 bits, exact in float32 in that order, as on the host. Q4_K and
// Q5_K's (d * sc) * q - dmin * m has exact products (11 + 6 + 5 and 11 + 6 bits) and one difference:
// fmaf rounds it once, the host rounds it to float64 and then to float32, and rounding twice through a
// format of at least 2 * 24 + 2 bits (float64's 53) gives the once-rounded result. Signed zeros agree
// too: fmaf(a, b, -c) and a * b - c are both a * b + (-c).
//
// One thread per element, workgroup-stride over the tokens (any grid covers them). A block is 18, 22,
// 34 or 210 bytes, so only 2-byte loads are aligned for every block; a row is read once per token, and the
// lookup moves a few KiB per token, so simple byte and 2-byte loads are enough. An id outside
// [0, vocab) gives a zero row (a kernel cannot raise; the host reference refuses such an id and the
// engine checks them).
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

// Q5_0 {half d; uint8 qh[4]; uint8 qs[16]} (22 bytes) and Q5_1 {half d; half m; uint8 qh[4]; uint8 qs[16]}
// (24 bytes): Q4_0 / Q4_1's nibbles with bit k of qh (a little-endian word) as quant k's fifth bit;
// w = d * (q - 16) (exact: a half times 5 bits) and d * q + m (one rounding, as Q4_1's).
template <bool kHasMin>
struct Q5Row {
  static constexpr int kBlockBytes = kHasMin ? 24 : 22;
  static constexpr int kQhAt = kHasMin ? 4 : 2;
  static __device__ __forceinline__ unsigned long long row_bytes(int hidden) {
    return (unsigned long long)(hidden / 32) * kBlockBytes;
  }
  static __device__ __forceinline__ float at(const unsigned char* row, int j) {
    const unsigned char* block = row + (j >> 5) * kBlockBytes;
    const unsigned short* halves = reinterpret_cast<const unsigned short*>(block);
    const float d = rf_f16_to_float(halves[0]);
    const int k = j & 31;
    const int byte = block[kQhAt + 4 + (k & 15)];
    const int q = (k < 16 ? byte & 15 : byte >> 4) | (((block[kQhAt + (k >> 3)] >> (k & 7)) & 1) << 4);
    return kHasMin ? fmaf(d, (float)q, rf_f16_to_float(halves[1])) : (float)(q - 16) * d;
  }
};
typedef Q5Row<false> Q5_0Row;
typedef Q5Row<true> Q5_1Row;

struct Q8_0Row {
  static __device__ __forceinline__ unsigned long long row_bytes(int hidden) { return (unsigned long long)(hidden / 32) * 34; }
  static __device__ __forceinline__ float at(const unsigned char* row, int j) {
    const unsigned char* block = row + (j >> 5) * 34;
    const float d = rf_f16_to_float(*reinterpret_cast<const unsigned short*>(block));
    return d * (float)(signed char)block[2 + (j & 31)];
  }
};

// The 6-bit scale and min of sub-block `sub` (0..7) of a Q4_K / Q5_K super-block from its 12 packed
// bytes: sub < 4 has sc = scales[sub] & 63, m = scales[sub + 4] & 63; sub >= 4 has its low four bits in
// scales[sub + 4] (sc: low nibble, m: high) and its top two in bits 6-7 of scales[sub - 4] (sc) and
// scales[sub] (m). Byte loads: matvec.hip's k_scale_min takes the same bytes as three words.
static __device__ __forceinline__ void k_sub_scale_min(const unsigned char* scales, int sub, float& sc, float& m) {
  const int k = sub & 3;
  const unsigned int a = scales[k], b = scales[k + 4], c = scales[k + 8];
  sc = (float)(sub < 4 ? (a & 63u) : ((c & 15u) | ((a >> 6) << 4)));
  m = (float)(sub < 4 ? (b & 63u) : ((c >> 4) | ((b >> 6) << 4)));
}

// Q4_K {half d; half dmin; uint8 scales[12]; uint8 qs[128]}, w = d * sc * q - dmin * m per sub-block of
// 32: element 64c + l (l < 32) is the low nibble of qs[32c + l] (sub-block 2c), element 64c + 32 + l its
// high nibble (sub-block 2c + 1). Q5_K {half d; half dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]}
// adds bit `sub` of qh[l] as the fifth bit of the code.
template <bool kFifthBit>
struct QK_4_5Row {
  static constexpr int kBlockBytes = kFifthBit ? 176 : 144;
  static __device__ __forceinline__ unsigned long long row_bytes(int hidden) {
    return (unsigned long long)(hidden / 256) * kBlockBytes;
  }
  static __device__ __forceinline__ float at(const unsigned char* row, int j) {
    const unsigned char* block = row + (j >> 8) * kBlockBytes;
    const unsigned short* halves = reinterpret_cast<const unsigned short*>(block);
    const int k = j & 255, chunk = k >> 6, high = (k >> 5) & 1, l = k & 31, sub = 2 * chunk + high;
    float sc, m;
    k_sub_scale_min(block + 4, sub, sc, m);
    const unsigned char* qs = block + (kFifthBit ? 48 : 16);
    unsigned int q = (qs[32 * chunk + l] >> (4 * high)) & 15u;
    if (kFifthBit) q |= ((block[16 + l] >> sub) & 1u) << 4;
    const float d = rf_f16_to_float(halves[0]), dmin = rf_f16_to_float(halves[1]);
    return fmaf(d * sc, (float)q, -(dmin * m));  // products exact; the one rounding is the host's
  }
};
typedef QK_4_5Row<false> Q4_KRow;
typedef QK_4_5Row<true> Q5_KRow;

// Q6_K {uint8 ql[128]; uint8 qh[64]; int8 scales[16]; half d}, w = d * scale * (q - 32) per sub-block of
// 16: in half h (128 elements) element 128h + 32s + l (s 0..3, l 0..31) is nibble s >> 1 of
// ql[64h + 32(s & 1) + l] with bits 2s, 2s + 1 of qh[32h + l] on top; its scale is scales[k / 16] for
// k = the element's index in the super-block.
struct Q6_KRow {
  static __device__ __forceinline__ unsigned long long row_bytes(int hidden) { return (unsigned long long)(hidden / 256) * 210; }
  static __device__ __forceinline__ float at(const unsigned char* row, int j) {
    const unsigned char* block = row + (j >> 8) * 210;
    const int k = j & 255, h = k >> 7, s = (k >> 5) & 3, l = k & 31;
    const unsigned int low = (block[64 * h + 32 * (s & 1) + l] >> (4 * (s >> 1))) & 15u;
    const unsigned int top = (block[128 + 32 * h + l] >> (2 * s)) & 3u;
    const float d = rf_f16_to_float(*reinterpret_cast<const unsigned short*>(block + 208));
    const float scale = (float)(signed char)block[192 + (k >> 4)];
    return (d * scale) * (float)((int)(low | (top << 4)) - 32);  // exact in this order (see the top)
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
    rf_grid_dependency_sync();  /* a programmatic launch (hipcore/ops/embedding.py) */                           \
    rf_embedding::lookup<rf_embedding::Row>(out, table, ids, n_tokens, hidden, vocab);                           \
  }

RF_EMBEDDING_KERNEL(embedding_f32, F32Row)
RF_EMBEDDING_KERNEL(embedding_f16, F16Row)
RF_EMBEDDING_KERNEL(embedding_bf16, BF16Row)
RF_EMBEDDING_KERNEL(embedding_q4_0, Q4_0Row)
RF_EMBEDDING_KERNEL(embedding_q4_1, Q4_1Row)
RF_EMBEDDING_KERNEL(embedding_q5_0, Q5_0Row)
RF_EMBEDDING_KERNEL(embedding_q5_1, Q5_1Row)
RF_EMBEDDING_KERNEL(embedding_q8_0, Q8_0Row)
RF_EMBEDDING_KERNEL(embedding_q4_k, Q4_KRow)
RF_EMBEDDING_KERNEL(embedding_q5_k, Q5_KRow)
RF_EMBEDDING_KERNEL(embedding_q6_k, Q6_KRow)

// Embedding lookup: out[t, :] = the row ids[t] of a [vocab, hidden] table, dequantized to float32.
// The table stays in its GGUF layout, row-major: F32, F16, BF16 elements, or blocks of 32 elements (Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0) or K-quant super-blocks of 256 (Q4_K, Q5_K, Q6_K), laid out and decoded element by element
// as block_formats.h defines them (and hipcore/ops/weight_formats.py on the host).
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
#include "block_formats.h"  // each format's layout and element decode (rf_blocks::F::element)

namespace rf_embedding {

// A row of a block format of block_formats.h: element j decoded as the format's reference (rf_blocks::F::element).
template <class F>
struct BlockRow {
  static __device__ __forceinline__ unsigned long long row_bytes(int hidden) { return rf_blocks::row_bytes<F>(hidden); }
  static __device__ __forceinline__ float at(const unsigned char* row, int j) { return F::element(row, j); }
};

struct F32Row {
  static __device__ __forceinline__ unsigned long long row_bytes(int hidden) { return (unsigned long long)hidden * 4; }
  static __device__ __forceinline__ float at(const unsigned char* row, int j) {
    return reinterpret_cast<const float*>(row)[j];
  }
};
typedef BlockRow<rf_blocks::F16> F16Row;
typedef BlockRow<rf_blocks::BF16> BF16Row;
typedef BlockRow<rf_blocks::Q4_0> Q4_0Row;
typedef BlockRow<rf_blocks::Q4_1> Q4_1Row;
typedef BlockRow<rf_blocks::Q5_0> Q5_0Row;
typedef BlockRow<rf_blocks::Q5_1> Q5_1Row;
typedef BlockRow<rf_blocks::Q8_0> Q8_0Row;
typedef BlockRow<rf_blocks::Q4_K> Q4_KRow;
typedef BlockRow<rf_blocks::Q5_K> Q5_KRow;
typedef BlockRow<rf_blocks::Q6_K> Q6_KRow;

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

// Matrix-matrix product on GGUF weights, for prompt evaluation and large batches:
//   y[t, r] = sum_c W[r, c] * x[t, c]   for r < rows, t < n_tokens
// Same layouts as matvec.hip: W [rows, cols] row-major in its GGUF block format (hipcore/ops/
// weight_formats.py), x float32 [n_tokens, cols], y float32 [n_tokens, rows].
//
// Where matvec decodes W once per 8 tokens, this kernel decodes it once per tile of tokens and turns
// the product into arithmetic on shared memory:
// - A workgroup of 256 threads computes a tile of TILE_TOKENS tokens (16, 32 or 64: the launcher's
//   choice, the `tile_tokens` argument) x 64 rows of W, stepping through the columns 32 at a time. In
//   each step the 64 x 32 weights are decoded once into shared memory as float32 (each thread decodes 8
//   consecutive columns of one row) and the TILE_TOKENS x 32 slice of x is copied beside them; then each
//   thread accumulates TILE_TOKENS/16 x 4 outputs in registers, reading both tiles with 16-byte loads
//   of 4 consecutive columns: a load of x feeds 16 multiply-adds, a load of W 4 per token row (one
//   16-byte shared load per 8 multiply-adds with 64-token tiles, per 3.2 with 16-token ones).
// - Tiles of 64 tokens use shared memory best; smaller ones let small matrices (SmolLM2's 192-row k/v
//   projections) spread over more compute units, and let short batches skip padding.
// - Shared rows are 36 floats (32 + 4): 16-byte aligned, and the rows a quarter-warp reads together
//   (a thread owns rows tm + 16i of x and tn + 16j of W, not 4 adjacent ones) start in different bank
//   groups, so neither the reads nor the decoded stores conflict.
// - The next step's weights and x are loaded into registers before the current step's arithmetic, so
//   their latency hides behind it. The last step reloads itself (the loads stay unconditional and in
//   bounds).
// - Tiles past the last row or token read the last row / token again (in bounds) and write nothing;
//   a grid-stride loop over tiles makes any grid correct.
// - Every output is one float32 sum in column order, one fused multiply-add per column.
// - No warp-level operations: the kernel is the same on wave32 and wave64.
// Requirements the launcher checks: cols % 32 == 0 (% 256 for the K-quants); W aligned as for matvec
// (F32 16 bytes, F16/BF16 16, Q4_1/Q5_1/Q4_K/Q5_K 4, Q8_0/Q4_0/Q5_0/Q6_K 2, MXFP4 1); x 16-byte aligned; blockDim 256.
#include "hip_compat.h"
#include "block_formats.h"  // the layouts and their decode primitives

namespace {
namespace mm {

constexpr int kThreads = 256;
constexpr int kTileRows = 64;                 // rows of W per tile
constexpr int kStepCols = 32;                 // columns per step
constexpr int kShared4 = (kStepCols + 4) / 4; // float4s per shared row (36 floats)
constexpr int kMaxTileTokens = 64;

// Each format: Raw load(row, col) reads what the 8 consecutive weights col .. col+7 (col % 8 == 0) of a
// row need; decode(raw, col, w) turns it into floats. Loading apart from decoding lets the kernel issue
// the next step's loads before the current step's arithmetic.

struct F32 {
  struct Raw {
    float4 a, b;
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)cols * 4; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const float4* p = reinterpret_cast<const float4*>(row + 4 * col);
    return {p[0], p[1]};
  }
  static __device__ __forceinline__ void decode(const Raw r, int, float w[8]) {
    w[0] = r.a.x; w[1] = r.a.y; w[2] = r.a.z; w[3] = r.a.w;
    w[4] = r.b.x; w[5] = r.b.y; w[6] = r.b.z; w[7] = r.b.w;
  }
};

struct F16 {
  typedef uint4 Raw;
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)cols * 2; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    return *reinterpret_cast<const uint4*>(row + 2 * col);
  }
  static __device__ __forceinline__ void decode(const Raw v, int, float w[8]) {
    const unsigned int words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[2 * k] = rf_f16_to_float((unsigned short)(words[k] & 0xffffu));
      w[2 * k + 1] = rf_f16_to_float((unsigned short)(words[k] >> 16));
    }
  }
};

struct BF16 {
  typedef uint4 Raw;
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)cols * 2; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    return *reinterpret_cast<const uint4*>(row + 2 * col);
  }
  static __device__ __forceinline__ void decode(const Raw v, int, float w[8]) {
    const unsigned int words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      w[2 * k] = rf_bf16_to_float((unsigned short)(words[k] & 0xffffu));
      w[2 * k + 1] = rf_bf16_to_float((unsigned short)(words[k] >> 16));
    }
  }
};

// Q8_0 (34 bytes, 2-byte aligned): qs[k .. k+7], k = col % 32.
struct Q8_0 {
  typedef rf_blocks::Q8_0 B;
  struct Raw {
    unsigned short d, q[4];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned short* b = reinterpret_cast<const unsigned short*>(row + (col >> 5) * B::kBytes);
    const unsigned short* q = b + B::kQsAt / 2 + ((col & 31) >> 1);
    return {b[0], {q[0], q[1], q[2], q[3]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int, float w[8]) { B::decode8(rf_f16_to_float(r.d), r.q, w); }
};

// Q4_0 (18 bytes, 2-byte aligned): columns k .. k+7 (k = col % 32) are the low nibbles of qs[k .. k+7] when
// k < 16, else the high nibbles of qs[k-16 .. k-9].
struct Q4_0 {
  typedef rf_blocks::Q4_0 B;
  struct Raw {
    unsigned short d, q[4];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned short* b = reinterpret_cast<const unsigned short*>(row + (col >> 5) * B::kBytes);
    const unsigned short* q = b + B::kQsAt / 2 + ((col & 15) >> 1);
    return {b[0], {q[0], q[1], q[2], q[3]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int col, float w[8]) {
    B::decode8(rf_f16_to_float(r.d), r.q, (col & 16) >> 2, w);
  }
};

// MXFP4 (17 bytes, byte aligned): block_format_mxfp4.h's reading of eight weights, as matmul_mma's.
typedef rf_blocks::MXFP4Eights<> MXFP4;

// Q4_1 block {half d; half m; uint8 qs[16]} (20 bytes, 4-byte aligned): nibbles as in Q4_0.
struct Q4_1 {
  typedef rf_blocks::Q4_1 B;
  struct Raw {
    unsigned int dm, q[2];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned int* b = reinterpret_cast<const unsigned int*>(row + (col >> 5) * B::kBytes);
    const unsigned int* q = b + B::kQsAt / 4 + ((col & 15) >> 2);
    return {b[0], {q[0], q[1]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int col, float w[8]) {
    B::decode8(B::d_of(r.dm), B::m_of(r.dm), r.q, (col & 16) >> 2, w);
  }
};

// Q5_1 (24 bytes, 4-byte aligned): Q4_1's nibbles with bit k of qh on top of column k's code (k = col % 32).
struct Q5_1 {
  typedef rf_blocks::Q5_1 B;
  struct Raw {
    unsigned int dm, h, q[2];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned int* b = reinterpret_cast<const unsigned int*>(row + (col >> 5) * B::kBytes);
    const unsigned int* q = b + B::kQsAt / 4 + ((col & 15) >> 2);
    return {b[0], b[B::kQhAt / 4], {q[0], q[1]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int col, float w[8]) {
    B::decode8(B::d_of(r.dm), B::m_of(r.dm), r.q, (col & 16) >> 2, r.h >> (col & 31), w);
  }
};

// Q5_0 (22 bytes, 2-byte aligned): Q5_1's codes, 2-byte loads.
struct Q5_0 {
  typedef rf_blocks::Q5_0 B;
  struct Raw {
    unsigned short d, h[2], q[4];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned short* b = reinterpret_cast<const unsigned short*>(row + (col >> 5) * B::kBytes);
    const unsigned short* q = b + B::kQsAt / 2 + ((col & 15) >> 1);
    return {b[0], {b[B::kQhAt / 2], b[B::kQhAt / 2 + 1]}, {q[0], q[1], q[2], q[3]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int col, float w[8]) {
    B::decode8(rf_f16_to_float(r.d), r.q, (col & 16) >> 2,
               ((unsigned int)r.h[0] | ((unsigned int)r.h[1] << 16)) >> (col & 31), w);
  }
};

static __device__ __forceinline__ int lesser(int a, int b) { return a < b ? a : b; }

// Q4_K and Q5_K (block_format_q4_k.h, block_format_q5_k.h): column e = col % 256 lies in chunk j = e / 64 of
// qs[32j .. 32j+31]: the low nibbles of qs[32j + l] for e % 64 < 32 (sub-block 2j), else the high nibbles
// (sub-block 2j+1), l = e % 32; Q5_K adds bit `sub` of qh[l] as the fifth bit.
template <bool kFiveBit>
struct QK_4or5 {
  typedef typename rf_blocks::Q4or5_K<kFiveBit>::type B;
  static constexpr int kBlockBytes = B::kBytes;
  static constexpr int kQsWord = B::kQsAt / 4;  // where qs starts, in words
  struct Raw {
    unsigned int dm, s0, s1, s2, q[2], h[2];
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) {
    return (unsigned long long)(cols / 256) * kBlockBytes;
  }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned int* b = reinterpret_cast<const unsigned int*>(row + (col >> 8) * kBlockBytes);
    const int e = col & 255, l4 = (e & 31) >> 2;
    const unsigned int* q = b + kQsWord + 8 * (e >> 6) + l4;
    const unsigned int* h = b + rf_blocks::Q5_K::kQhAt / 4 + l4;  // qh[l .. l+7], Q5_K only
    return {b[0], b[1], b[2], b[3], {q[0], q[1]}, {kFiveBit ? h[0] : 0u, kFiveBit ? h[1] : 0u}};
  }
  static __device__ __forceinline__ void decode(const Raw r, int col, float w[8]) {
    const int e = col & 255, sub = e >> 5, shift = 4 * (sub & 1);
    float sc, m;
    B::scale_min(r.s0, r.s1, r.s2, sub, sc, m);
    const float d = rf_f16_to_float((unsigned short)(r.dm & 0xffffu)) * sc;  // exact: 11 x 6 bits
    const float neg_min = -(rf_f16_to_float((unsigned short)(r.dm >> 16)) * m);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      unsigned int q = (r.q[k >> 2] >> (8 * (k & 3) + shift)) & 15u;
      if (kFiveBit) q |= ((r.h[k >> 2] >> (8 * (k & 3) + sub)) & 1u) << 4;
      w[k] = fmaf(d, (float)q, neg_min);
    }
  }
};
typedef QK_4or5<false> Q4_K;
typedef QK_4or5<true> Q5_K;

// Q6_K (block_format_q6_k.h; 210 bytes, 2-byte aligned). Column e = col % 256: half h = e / 128, quarter s = (e % 128) / 32, l = e % 32; the code is nibble
// s >> 1 of ql[64h + 32(s & 1) + l] with bits 2s, 2s+1 of qh[32h + l] on top, minus 32; the scale is
// scales[e / 16].
struct Q6_K {
  typedef rf_blocks::Q6_K B;
  struct Raw {
    unsigned short ql[4], qh[4], sc, d;
  };
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return rf_blocks::row_bytes<B>(cols); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int col) {
    const unsigned short* b = reinterpret_cast<const unsigned short*>(row + (col >> 8) * B::kBytes);
    const int e = col & 255, h = e >> 7, s = (e >> 5) & 3, l2 = (e & 31) >> 1;
    const unsigned short* ql = b + 32 * h + 16 * (s & 1) + l2;
    const unsigned short* qh = b + B::kQhAt / 2 + 16 * h + l2;
    return {{ql[0], ql[1], ql[2], ql[3]}, {qh[0], qh[1], qh[2], qh[3]}, b[B::kScalesAt / 2 + (e >> 5)], b[B::kDAt / 2]};
  }
  static __device__ __forceinline__ void decode(const Raw r, int col, float w[8]) {
    const int e = col & 255, s = (e >> 5) & 3;
    const float scale = rf_f16_to_float(r.d) * (float)(signed char)(r.sc >> (8 * ((e >> 4) & 1)));  // exact
    const int nibble_shift = 4 * (s >> 1), high_shift = 2 * s;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const unsigned int lo = (r.ql[k >> 1] >> (8 * (k & 1) + nibble_shift)) & 15u;
      const unsigned int hi = (r.qh[k >> 1] >> (8 * (k & 1) + high_shift)) & 3u;
      w[k] = scale * (float)((int)(lo | (hi << 4)) - 32);
    }
  }
};

// The tiles of y with TM * 16 tokens (TM = 1, 2, 4), computed by one workgroup in turn.
// xs, ws: shared [kMaxTileTokens][kShared4] and [kTileRows][kShared4] float4s.
template <class Format, int TM>
__device__ __forceinline__ void matmul_tiles(float* __restrict__ y, const unsigned char* __restrict__ W,
                                             const float* __restrict__ x, int rows, int cols, int n_tokens, float4* xs,
                                             float4* ws) {
  constexpr int kTileTokens = 16 * TM;
  constexpr int kXLoads = (kTileTokens * (kStepCols / 4) + kThreads - 1) / kThreads;  // float4s of x per thread
  const int tid = (int)threadIdx.x;
  const int tn = tid & 15, tm = tid >> 4;           // outputs: rows tn + 16j, tokens tm + 16i of the tile
  const int w_row = tid >> 2, w_col = 8 * (tid & 3);  // the 8 weights this thread decodes in each step
  const unsigned long long row_bytes = Format::row_bytes(cols);
  const int row_tiles = (rows + kTileRows - 1) / kTileRows;
  const int tiles = row_tiles * ((n_tokens + kTileTokens - 1) / kTileTokens);  // the launcher keeps it < 2^31

  for (int tile = (int)blockIdx.x; tile < tiles; tile += (int)gridDim.x) {  // uniform across the workgroup
    const int r0 = (tile % row_tiles) * kTileRows, t0 = (tile / row_tiles) * kTileTokens;
    const unsigned char* w_src = W + (unsigned long long)lesser(r0 + w_row, rows - 1) * row_bytes;
    const float* x_src[kXLoads];
    int x_dst[kXLoads];
    bool x_live[kXLoads];
#pragma unroll
    for (int p = 0; p < kXLoads; ++p) {
      const int v = tid + kThreads * p;  // float4 v of the tile's x slice: token v / 8, columns 4 (v % 8) ..
      x_live[p] = v < kTileTokens * (kStepCols / 4);
      const int token = x_live[p] ? v >> 3 : 0;
      x_src[p] = x + (unsigned long long)lesser(t0 + token, n_tokens - 1) * cols + 4 * (v & 7);
      x_dst[p] = token * kShared4 + (v & 7);
    }

    float acc[TM][4];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    typename Format::Raw raw = Format::load(w_src, w_col);
    float4 xv[kXLoads];
#pragma unroll
    for (int p = 0; p < kXLoads; ++p) xv[p] = *reinterpret_cast<const float4*>(x_src[p]);

    for (int c0 = 0; c0 < cols; c0 += kStepCols) {
      __syncthreads();  // every thread is done reading the previous step's tiles
      float w[8];
      Format::decode(raw, c0 + w_col, w);
      ws[w_row * kShared4 + (w_col >> 2)] = float4{w[0], w[1], w[2], w[3]};
      ws[w_row * kShared4 + (w_col >> 2) + 1] = float4{w[4], w[5], w[6], w[7]};
#pragma unroll
      for (int p = 0; p < kXLoads; ++p)
        if (x_live[p]) xs[x_dst[p]] = xv[p];
      __syncthreads();

      const int next = lesser(c0 + kStepCols, cols - kStepCols);
      raw = Format::load(w_src, next + w_col);
#pragma unroll
      for (int p = 0; p < kXLoads; ++p) {
        // Member by member: a whole-struct copy into the array kept it in scratch memory on AMD (clang-22).
        const float4 v = *reinterpret_cast<const float4*>(x_src[p] + next);
        xv[p].x = v.x, xv[p].y = v.y, xv[p].z = v.z, xv[p].w = v.w;
      }

#pragma unroll
      for (int k4 = 0; k4 < kStepCols / 4; ++k4) {
        float4 a[TM], b[4];
#pragma unroll
        for (int i = 0; i < TM; ++i) a[i] = xs[(tm + 16 * i) * kShared4 + k4];
#pragma unroll
        for (int j = 0; j < 4; ++j) b[j] = ws[(tn + 16 * j) * kShared4 + k4];
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            float s = fmaf(a[i].x, b[j].x, acc[i][j]);
            s = fmaf(a[i].y, b[j].y, s);
            s = fmaf(a[i].z, b[j].z, s);
            acc[i][j] = fmaf(a[i].w, b[j].w, s);
          }
      }
    }

#pragma unroll
    for (int i = 0; i < TM; ++i) {
      const int t = t0 + tm + 16 * i;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = r0 + tn + 16 * j;
        if (t < n_tokens && r < rows) y[(unsigned long long)t * rows + r] = acc[i][j];
      }
    }
  }
}

template <class Format>
__device__ __forceinline__ void matmul(float* __restrict__ y, const void* __restrict__ W, const float* __restrict__ x,
                                       int rows, int cols, int n_tokens, int tile_tokens, float4* xs, float4* ws) {
  rf_check_wave_size();
  const unsigned char* w = static_cast<const unsigned char*>(W);
  switch (tile_tokens) {  // uniform: a kernel argument
    case 16: matmul_tiles<Format, 1>(y, w, x, rows, cols, n_tokens, xs, ws); break;
    case 32: matmul_tiles<Format, 2>(y, w, x, rows, cols, n_tokens, xs, ws); break;
    default: matmul_tiles<Format, 4>(y, w, x, rows, cols, n_tokens, xs, ws); break;
  }
}

}  // namespace mm
}  // namespace

// One entry point per format: matmul_<format>(y, W, x, rows, cols, n_tokens, tile_tokens); blockDim 256.
// The shared tiles are declared here, once, so that the three tile shapes share them.
#define RF_MATMUL_ENTRY(name, Format)                                                                              \
  extern "C" __global__ __launch_bounds__(256) void name(float* __restrict__ y, const void* __restrict__ W,          \
                                                         const float* __restrict__ x, int rows, int cols, int n_tokens, \
                                                         int tile_tokens) {                                         \
    __shared__ float4 xs[mm::kMaxTileTokens * mm::kShared4];                                                     \
    __shared__ float4 ws[mm::kTileRows * mm::kShared4];                                                          \
    mm::matmul<mm::Format>(y, W, x, rows, cols, n_tokens, tile_tokens, xs, ws);                                  \
  }

RF_MATMUL_ENTRY(matmul_q4_0, Q4_0)
RF_MATMUL_ENTRY(matmul_q4_1, Q4_1)
RF_MATMUL_ENTRY(matmul_q5_0, Q5_0)
RF_MATMUL_ENTRY(matmul_q5_1, Q5_1)
RF_MATMUL_ENTRY(matmul_q8_0, Q8_0)
RF_MATMUL_ENTRY(matmul_q4_k, Q4_K)
RF_MATMUL_ENTRY(matmul_q5_k, Q5_K)
RF_MATMUL_ENTRY(matmul_q6_k, Q6_K)
RF_MATMUL_ENTRY(matmul_f16, F16)
RF_MATMUL_ENTRY(matmul_bf16, BF16)
RF_MATMUL_ENTRY(matmul_f32, F32)
RF_MATMUL_ENTRY(matmul_mxfp4, MXFP4)

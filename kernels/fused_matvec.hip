// Fused matrix-vector products for decoding: the layer's small ops folded into the products that
// surround them, so a llama layer is 4 of these launches (plus kv_store and attention) instead of 14
// launches, and the activations between them never go through memory.
//
//   matvec_norm_rope_<fmt>   q|k|v = W_qkv · rmsnorm(x) * g, RoPE applied to q and k, written to three
//                            separate outputs (q [b, q_rows], k and v [b, kv_rows])
//                            (freq_factors: rope_dim / 2 per-pair frequency divisors as rope.hip, or null)
//   matvec_norm_swiglu_<fmt> h = silu(W_gate · n) * (W_up · n), n = rmsnorm(x) * g, W = [gate; up]
//   matvec_add_<fmt>         y += W · x (the residual connection in the epilogue)
//   matvec_norm_<fmt>        y = W · rmsnorm(x) * g (the output head)
//
// <fmt>: q4_1, q5_0, q5_1, q8_0, f16, bf16, f32, W in its GGUF block layout, row-major (rows back to back).
//
// The loop is matvec.hip's: a warp owns a pair of rows at a time, lanes walk the row in items of 8
// weights, x is read with 16-byte loads. What the fusions add:
// - The norm: y = sum_c W[r,c] (x[c] g[c] s) = s * sum_c W[r,c] x[c] g[c], s = 1/sqrt(mean(x^2) + eps).
//   The lanes of a warp together read every x[c] of a row exactly once, so the sum of squares costs
//   one more FMA per x value and one warp sum; no separate norm kernel, no normalized copy of x.
// - The row pair is chosen so the epilogue has what it needs: for RoPE the pair (2i, 2i+1) of a head
//   (the NORM-mode rotation mixes exactly these two), for SwiGLU gate row r with up row r.
// - Batches: at most 4 batch rows per pass over W (two rows of W times 4 batch rows of accumulators
//   and sums of squares fit the register budget without spills; matvec.hip takes 8 with one row).
// - The *_split_* entries: a block's kSplit warps share one row pair, each taking every kSplit-th step of
//   its columns; their sums meet in shared memory and are added in a fixed order. For the small matrices
//   of small models (the demo's 576 x 1536 down has 288 row pairs: two warps per SM of an H100), whose
//   batched passes otherwise run too few warps to hide the memory latency.
// The format decoders (fused_matvec_formats.h) and the RoPE sin/cos are copies of matvec.hip's and
// rope.hip's; the emulated tests hold these kernels to the same numpy references as those.
// Requirements the launcher checks: cols % 32 == 0; W aligned as matvec.hip needs; x and g 16-byte
// aligned; for RoPE q_rows and kv_rows multiples of head_dim, head_dim and rope_dim even.
#include "hip_compat.h"

// A named namespace inside the anonymous one: internal linkage, and no clash with matvec.hip's
// helpers of the same names when a harness compiles several kernel files into one program.
namespace {
namespace fused {

constexpr int kMaxBatchPerPass = 4;
constexpr int kSplit = 4;  // warps per row pair in the *_split_* entries

}  // namespace fused
}  // namespace

#include "fused_matvec_formats.h"  // the GGUF block formats: load an item of 8 weights, decode it to floats

namespace {
namespace fused {

// rope.hip's sin/cos (Cody-Waite reduction, Cephes polynomials), so that the fused RoPE rotates
// exactly as the rope_f32 kernel does.
static __device__ __forceinline__ void fused_rope_sincos(float angle, float* sin_out, float* cos_out) {
  const float k = rintf(angle * 0.636619772f);
  float r = fmaf(-k, 1.57079637050628662109375f, angle);
  r = fmaf(-k, -4.37113882867379e-08f, r);
  r = fmaf(-k, -1.71512451e-15f, r);
  const float z = r * r;
  const float s = fmaf(fmaf(fmaf(-1.9515295891e-4f, z, 8.3321608736e-3f), z, -1.6666654611e-1f), z * r, r);
  const float c = fmaf(fmaf(fmaf(fmaf(2.443315711809948e-5f, z, -1.388731625493765e-3f), z, 4.166664568298827e-2f), z,
                            -0.5f),
                       z, 1.0f);
  const int quadrant = (int)k & 3;
  const float s_q = (quadrant & 1) ? c : s;
  const float c_q = (quadrant & 1) ? s : c;
  *sin_out = (quadrant & 2) ? -s_q : s_q;
  *cos_out = ((quadrant + 1) & 2) ? -c_q : c_q;
}

static __device__ __forceinline__ float4 mul4(const float4 a, const float4 b) {
  return {a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w};
}

static __device__ __forceinline__ float squares4(const float4 a, float acc) {
  acc = fmaf(a.x, a.x, acc);
  acc = fmaf(a.y, a.y, acc);
  acc = fmaf(a.z, a.z, acc);
  return fmaf(a.w, a.w, acc);
}

static __device__ __forceinline__ float dot8(const float w[8], const float4 a, const float4 b, float acc) {
  acc = fmaf(w[0], a.x, acc);
  acc = fmaf(w[1], a.y, acc);
  acc = fmaf(w[2], a.z, acc);
  acc = fmaf(w[3], a.w, acc);
  acc = fmaf(w[4], b.x, acc);
  acc = fmaf(w[5], b.y, acc);
  acc = fmaf(w[6], b.z, acc);
  return fmaf(w[7], b.w, acc);
}

enum Epilogue { kStore, kAdd, kRope, kSwiglu };

// Everything a variant may need; each entry point fills what its epilogue reads.
struct Args {
  float* y0;
  float* y1;
  float* y2;
  const unsigned char* W;
  const float* x;
  const float* norm;  // null: no norm
  const int* positions;
  int rows;    // rows of W (kSwiglu: rows of gate, W has twice as many)
  int cols;
  int split1;  // kRope: rows [0, split1) go to y0, [split1, split2) to y1, the rest to y2
  int split2;
  int head_dim, rope_dim;
  float eps, theta, freq_scale;
  const float* freq_factors = nullptr;  // kRope: rope_dim / 2 per-pair divisors of the frequency, or null
};

// acc0/acc1[b] += the item's weights of the two rows times x[b] (times g when normalizing); ss[b] +=
// x[b]^2 over the item's columns. `live` selects instead of branching (see matvec.hip).
template <class Format, int NB, bool NORM>
__device__ __forceinline__ void accumulate(const typename Format::Raw raw0, const typename Format::Raw raw1, int item,
                                           const float* __restrict__ x, const float* __restrict__ g, int cols,
                                           float acc0[NB], float acc1[NB], float ss[NB], bool live) {
  float wa[8], wb[8];
  int col_a, col_b;
  Format::decode(raw0, item, wa, col_a, col_b);
  Format::decode(raw1, item, wb, col_a, col_b);
  float4 ga = {1.0f, 1.0f, 1.0f, 1.0f}, gb = ga;
  if (NORM) {
    ga = *reinterpret_cast<const float4*>(g + col_a);
    gb = *reinterpret_cast<const float4*>(g + col_b);
  }
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    const float* xb = x + (unsigned long long)b * cols;
    float4 xa = *reinterpret_cast<const float4*>(xb + col_a);
    float4 xc = *reinterpret_cast<const float4*>(xb + col_b);
    if (NORM) {
      const float sq = squares4(xc, squares4(xa, ss[b]));
      ss[b] = live ? sq : ss[b];
      xa = mul4(xa, ga);
      xc = mul4(xc, gb);
    }
    const float sum0 = dot8(wa, xa, xc, acc0[b]);
    const float sum1 = dot8(wb, xa, xc, acc1[b]);
    acc0[b] = live ? sum0 : acc0[b];
    acc1[b] = live ? sum1 : acc1[b];
  }
}

template <Epilogue E>
__device__ __forceinline__ void finish(const Args& a, int b, int r0, int r1, bool has_second, float s0, float s1) {
  if (E == kStore || E == kAdd) {
    float* y = a.y0 + (unsigned long long)b * a.rows;
    if (E == kAdd) {
      s0 += y[r0];
      if (has_second) s1 += y[r1];
    }
    y[r0] = s0;
    if (has_second) y[r1] = s1;
  } else if (E == kSwiglu) {
    a.y0[(unsigned long long)b * a.rows + r0] = s0 / (1.0f + expf(-s0)) * s1;
  } else {  // kRope: r0 even, r1 = r0 + 1, both in the same head
    const int in_head = r0 % a.head_dim;
    if (r0 < a.split2 && in_head < a.rope_dim) {
      const float log2_step = -2.0f * log2f(a.theta) / (float)a.rope_dim;
      float freq = a.freq_scale * exp2f((float)(in_head / 2) * log2_step);
      if (a.freq_factors) freq = freq / a.freq_factors[in_head / 2];
      const float angle = (float)a.positions[b] * freq;
      float sn, cs;
      fused_rope_sincos(angle, &sn, &cs);
      const float p = s0, q = s1;
      s0 = p * cs - q * sn;
      s1 = p * sn + q * cs;
    }
    float* y;
    int width, col;
    if (r0 < a.split1) {
      y = a.y0, width = a.split1, col = r0;
    } else if (r0 < a.split2) {
      y = a.y1, width = a.split2 - a.split1, col = r0 - a.split1;
    } else {
      y = a.y2, width = a.rows - a.split2, col = r0 - a.split2;
    }
    y += (unsigned long long)b * width + col;
    y[0] = s0;
    y[1] = s1;
  }
}

// One pass over W for NB batch rows starting at batch row b0. KS == 1: each warp owns its row pairs; KS > 1: a
// block of KS warps owns one row pair at a time (every warp of the block runs the same groups, so the barriers
// below are reached by all), warp w taking steps w, w + KS, ... of its columns.
template <class Format, int NB, bool NORM, Epilogue E, int KS>
__device__ __forceinline__ void fused_pass(const Args& a, int b0) {
  const int lane = (int)threadIdx.x % WARP_SIZE;
  const int warp = (int)threadIdx.x / WARP_SIZE;
  const int warps_per_block = (int)blockDim.x / WARP_SIZE;
  const int first_group = KS == 1 ? (int)blockIdx.x * warps_per_block + warp : (int)blockIdx.x;
  const int group_stride = KS == 1 ? (int)gridDim.x * warps_per_block : (int)gridDim.x;
  const int part = KS == 1 ? 0 : warp;
  const int groups = E == kSwiglu ? a.rows : (a.rows + 1) / 2;
  const int items = a.cols / 8;
  const unsigned long long row_bytes = Format::row_bytes(a.cols);
  const float* x = a.x + (unsigned long long)b0 * a.cols;

  for (int group = first_group; group < groups; group += group_stride) {  // uniform across the warp
    const int r0 = E == kSwiglu ? group : 2 * group;
    const int r1 = E == kSwiglu ? group + a.rows : r0 + 1;
    const bool has_second = E == kSwiglu || r1 < a.rows;
    const unsigned char* w0 = a.W + (unsigned long long)r0 * row_bytes;
    const unsigned char* w1 = has_second ? a.W + (unsigned long long)r1 * row_bytes : w0;

    float acc0[NB], acc1[NB], ss[NB];
#pragma unroll
    for (int b = 0; b < NB; ++b) acc0[b] = acc1[b] = ss[b] = 0.0f;

    // One row of x: two items per lane and step, both items' loads in flight before the first is used.
    constexpr int kItemsPerStep = NB == 1 ? 2 : 1;
    for (int item = lane + part * kItemsPerStep * WARP_SIZE; item < items; item += KS * kItemsPerStep * WARP_SIZE) {
      const bool has_item2 = kItemsPerStep == 2 && item + WARP_SIZE < items;
      const int item2 = has_item2 ? item + WARP_SIZE : item;
      const typename Format::Raw raw0 = Format::load(w0, item);
      const typename Format::Raw raw1 = Format::load(w1, item);
      const typename Format::Raw next0 = kItemsPerStep == 2 ? Format::load(w0, item2) : raw0;
      const typename Format::Raw next1 = kItemsPerStep == 2 ? Format::load(w1, item2) : raw1;
      accumulate<Format, NB, NORM>(raw0, raw1, item, x, a.norm, a.cols, acc0, acc1, ss, true);
      if (kItemsPerStep == 2)
        accumulate<Format, NB, NORM>(next0, next1, item2, x, a.norm, a.cols, acc0, acc1, ss, has_item2);
    }

    if constexpr (KS == 1) {
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        float s0 = rf_warp_sum(acc0[b]);
        float s1 = rf_warp_sum(acc1[b]);
        if (NORM) {
          const float scale = 1.0f / sqrtf(rf_warp_sum(ss[b]) / (float)a.cols + a.eps);
          s0 *= scale;
          s1 *= scale;
        }
        if (lane == 0) finish<E>(a, b0 + b, r0, r1, has_second, s0, s1);
      }
    } else {  // each warp's sums to shared memory; lane b of warp 0 adds batch row b's in warp order
      __shared__ float partial[KS][NB][3];
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const float s0 = rf_warp_sum(acc0[b]);
        const float s1 = rf_warp_sum(acc1[b]);
        const float sq = NORM ? rf_warp_sum(ss[b]) : 0.0f;
        if (lane == 0) {
          partial[part][b][0] = s0;
          partial[part][b][1] = s1;
          partial[part][b][2] = sq;
        }
      }
      __syncthreads();
      if (warp == 0 && lane < NB) {
        float s0 = 0.0f, s1 = 0.0f, sq = 0.0f;
#pragma unroll
        for (int w = 0; w < KS; ++w) {
          s0 += partial[w][lane][0];
          s1 += partial[w][lane][1];
          sq += partial[w][lane][2];
        }
        if (NORM) {
          const float scale = 1.0f / sqrtf(sq / (float)a.cols + a.eps);
          s0 *= scale;
          s1 *= scale;
        }
        finish<E>(a, b0 + lane, r0, r1, has_second, s0, s1);
      }
      __syncthreads();  // partial is written again for the next group
    }
  }
}

// The lines of the warp's first step (its first row pair's first items: the weights' bytes of its first
// 64 items) fetched into L2 before a one-token launch waits for the kernel ahead, one prefetch a lane (half
// the lanes a row), so that the first DRAM round trip overlaps that kernel's end instead of following it,
// as fused_qmatvec's tile_dot does. Reads only the weights, which no kernel writes. Measured on an NVIDIA
// H200 (docs/history/2026-11-28-qkv-tiles-attention-prefetch.md), the demo model's shapes (Q4_1): tg128 1,844 ->
// 1,906 t/s. Not for batches (8 sequences of the demo lost 3% with it) nor for the formats whose kPrefetch
// is false (fused_matvec_formats.h).
template <class Format, Epilogue E, int KS>
__device__ __forceinline__ void prefetch_first_step(const Args& a) {
  const int lane = (int)threadIdx.x % WARP_SIZE;
  const int warp = (int)threadIdx.x / WARP_SIZE;
  const int group = KS == 1 ? (int)blockIdx.x * ((int)blockDim.x / WARP_SIZE) + warp : (int)blockIdx.x;
  const int groups = E == kSwiglu ? a.rows : (a.rows + 1) / 2;
  if (group >= groups) return;
  const int r0 = E == kSwiglu ? group : 2 * group;
  const int r1 = E == kSwiglu ? group + a.rows : (r0 + 1 < a.rows ? r0 + 1 : r0);
  constexpr int step_items = 2 * WARP_SIZE;  // a one-token pass's step: kItemsPerStep items a lane
  const int part = KS == 1 ? 0 : warp;
  const int first_col = part * step_items * 8, end_col = min(a.cols, first_col + step_items * 8);
  if (first_col >= end_col) return;
  const unsigned long long row_bytes = Format::row_bytes(a.cols);
  const unsigned long long begin = Format::row_bytes(first_col);  // whole blocks: a step is 512 columns
  const unsigned long long end = Format::row_bytes(end_col);
  const int lines = (int)((end - begin + 127) / 128) + 1;  // +1: begin need not start a line
  const int half = WARP_SIZE / 2, line = lane % half;
  const int row = lane < half ? r0 : r1;
  if (line < lines) rf_prefetch_l2(a.W + (unsigned long long)row * row_bytes + begin + 128ull * line);
}

// The entries defer their wait to here (rf_grid_dependency_deferred): the prefetch reads no data.
template <class Format, bool NORM, Epilogue E, int KS>
__device__ __forceinline__ void fused_matvec(const Args& a, int batch) {
  rf_check_wave_size();
  if (Format::kPrefetch && batch == 1) prefetch_first_step<Format, E, KS>(a);
  rf_grid_dependency_sync();  // x, y and everything but the weights: written by the kernel ahead
  for (int b0 = 0; b0 < batch; b0 += kMaxBatchPerPass) {
    const int left = batch - b0;
    switch (left < kMaxBatchPerPass ? left : kMaxBatchPerPass) {
      case 1: fused_pass<Format, 1, NORM, E, KS>(a, b0); break;
      case 2: fused_pass<Format, 2, NORM, E, KS>(a, b0); break;
      case 3: fused_pass<Format, 3, NORM, E, KS>(a, b0); break;
      default: fused_pass<Format, 4, NORM, E, KS>(a, b0); break;
    }
  }
}

template <class Format, int KS = 1>
__device__ __forceinline__ void norm_rope(float* q, float* k, float* v, const void* W, const float* x, const float* g,
                                          const int* positions, const float* freq_factors, int q_rows, int kv_rows,
                                          int cols, int batch, int head_dim, int rope_dim, float eps, float theta,
                                          float freq_scale) {
  const Args a = {q, k, v, static_cast<const unsigned char*>(W), x, g, positions, q_rows + 2 * kv_rows, cols,
                  q_rows, q_rows + kv_rows, head_dim, rope_dim, eps, theta, freq_scale, freq_factors};
  fused_matvec<Format, true, kRope, KS>(a, batch);
}

template <class Format, int KS = 1>
__device__ __forceinline__ void norm_swiglu(float* y, const void* W, const float* x, const float* g, int rows, int cols,
                                            int batch, float eps) {
  const Args a = {y, y, y, static_cast<const unsigned char*>(W), x, g, nullptr, rows, cols, 0, 0, 2, 0, eps, 1.0f, 1.0f};
  fused_matvec<Format, true, kSwiglu, KS>(a, batch);
}

template <class Format, int KS = 1>
__device__ __forceinline__ void add(float* y, const void* W, const float* x, int rows, int cols, int batch) {
  const Args a = {y, y, y, static_cast<const unsigned char*>(W), x, nullptr, nullptr, rows, cols, 0, 0, 2, 0, 0.0f, 1.0f, 1.0f};
  fused_matvec<Format, false, kAdd, KS>(a, batch);
}

template <class Format>
__device__ __forceinline__ void norm_store(float* y, const void* W, const float* x, const float* g, int rows, int cols,
                                           int batch, float eps) {
  const Args a = {y, y, y, static_cast<const unsigned char*>(W), x, g, nullptr, rows, cols, 0, 0, 2, 0, eps, 1.0f, 1.0f};
  fused_matvec<Format, true, kStore, 1>(a, batch);
}

}  // namespace fused
}  // namespace

#define RF_FUSED_MATVEC_ENTRIES(suffix, Format)                                                                        \
  extern "C" __global__ __launch_bounds__(256) void matvec_norm_rope_##suffix(                                         \
      float* q, float* k, float* v, const void* W, const float* x, const float* g, const int* positions,               \
      const float* freq_factors, int q_rows, int kv_rows, int cols, int batch, int head_dim, int rope_dim, float eps,  \
      float theta, float freq_scale) {                                                                                  \
    rf_grid_dependency_deferred(); /* waits in fused_matvec() (hipcore/ops/fused_matvec.py) */                         \
    fused::norm_rope<Format>(q, k, v, W, x, g, positions, freq_factors, q_rows, kv_rows, cols, batch, head_dim,         \
                             rope_dim, eps, theta, freq_scale);                                                         \
  }                                                                                                                     \
  extern "C" __global__ __launch_bounds__(256) void matvec_norm_swiglu_##suffix(                                       \
      float* y, const void* W, const float* x, const float* g, int rows, int cols, int batch, float eps) {             \
    rf_grid_dependency_deferred(); /* waits in fused_matvec() (hipcore/ops/fused_matvec.py) */                         \
    fused::norm_swiglu<Format>(y, W, x, g, rows, cols, batch, eps);                                                            \
  }                                                                                                                     \
  extern "C" __global__ __launch_bounds__(256) void matvec_add_##suffix(float* y, const void* W, const float* x,       \
                                                                        int rows, int cols, int batch) {                \
    rf_grid_dependency_deferred(); /* waits in fused_matvec() (hipcore/ops/fused_matvec.py) */                         \
    fused::add<Format>(y, W, x, rows, cols, batch);                                                                          \
  }                                                                                                                     \
  extern "C" __global__ __launch_bounds__(256) void matvec_norm_##suffix(                                              \
      float* y, const void* W, const float* x, const float* g, int rows, int cols, int batch, float eps) {             \
    rf_grid_dependency_deferred(); /* waits in fused_matvec() (hipcore/ops/fused_matvec.py) */                         \
    fused::norm_store<Format>(y, W, x, g, rows, cols, batch, eps);                                                             \
  }

// The split entries (see the top): q|k|v, gate|up and the residual product; the head's matrix is never small.
#define RF_FUSED_MATVEC_SPLIT_ENTRIES(suffix, Format)                                                                  \
  extern "C" __global__ __launch_bounds__(256) void matvec_norm_rope_split_##suffix(                                   \
      float* q, float* k, float* v, const void* W, const float* x, const float* g, const int* positions,               \
      const float* freq_factors, int q_rows, int kv_rows, int cols, int batch, int head_dim, int rope_dim, float eps,  \
      float theta, float freq_scale) {                                                                                  \
    rf_grid_dependency_deferred();                                                                                      \
    fused::norm_rope<Format, fused::kSplit>(q, k, v, W, x, g, positions, freq_factors, q_rows, kv_rows, cols, batch,   \
                                            head_dim, rope_dim, eps, theta, freq_scale);                                \
  }                                                                                                                     \
  extern "C" __global__ __launch_bounds__(256) void matvec_norm_swiglu_split_##suffix(                                 \
      float* y, const void* W, const float* x, const float* g, int rows, int cols, int batch, float eps) {             \
    rf_grid_dependency_deferred();                                                                                      \
    fused::norm_swiglu<Format, fused::kSplit>(y, W, x, g, rows, cols, batch, eps);                                      \
  }                                                                                                                     \
  extern "C" __global__ __launch_bounds__(256) void matvec_add_split_##suffix(float* y, const void* W, const float* x, \
                                                                              int rows, int cols, int batch) {          \
    rf_grid_dependency_deferred();                                                                                      \
    fused::add<Format, fused::kSplit>(y, W, x, rows, cols, batch);                                                      \
  }

RF_FUSED_MATVEC_ENTRIES(q4_1, fused::Q4_1Format)
RF_FUSED_MATVEC_ENTRIES(q5_0, fused::Q5_0Format)
RF_FUSED_MATVEC_ENTRIES(q5_1, fused::Q5_1Format)
RF_FUSED_MATVEC_ENTRIES(q8_0, fused::Q8_0Format)
RF_FUSED_MATVEC_ENTRIES(f16, fused::F16Format)
RF_FUSED_MATVEC_ENTRIES(bf16, fused::BF16Format)
RF_FUSED_MATVEC_ENTRIES(f32, fused::F32Format)
RF_FUSED_MATVEC_SPLIT_ENTRIES(q4_1, fused::Q4_1Format)
RF_FUSED_MATVEC_SPLIT_ENTRIES(q5_0, fused::Q5_0Format)
RF_FUSED_MATVEC_SPLIT_ENTRIES(q5_1, fused::Q5_1Format)
RF_FUSED_MATVEC_SPLIT_ENTRIES(q8_0, fused::Q8_0Format)
RF_FUSED_MATVEC_SPLIT_ENTRIES(f16, fused::F16Format)
RF_FUSED_MATVEC_SPLIT_ENTRIES(bf16, fused::BF16Format)
RF_FUSED_MATVEC_SPLIT_ENTRIES(f32, fused::F32Format)

// Fused matrix-matrix products for prompt evaluation and batched decoding: the layer's small ops folded
// into the products around them, as fused_matvec.hip does for a few tokens, with matmul.hip's tiling.
//
//   matmul_norm_rope_<fmt>   q|k|v = rmsnorm(x) * g · W_qkv^T, RoPE on q and k, three separate outputs
//                            (freq_factors: rope_dim / 2 per-pair frequency divisors as rope.hip, or null)
//   matmul_norm_swiglu_<fmt> h = silu(n · W_gate^T) * (n · W_up^T), n = rmsnorm(x) * g, W = [gate; up]
//   matmul_add_<fmt>         y += x · W^T (the residual connection in the epilogue)
//   matmul_norm_<fmt>        y = rmsnorm(x) * g · W^T (the output head)
//
// <fmt>: q4_1, q5_0, q5_1, q8_0, f16, bf16, f32, W in its GGUF block layout, row-major (rows back to back); x float32
// [n_tokens, cols]; outputs float32 [n_tokens, their rows].
//
// The tile loop is matmul.hip's: a workgroup of 256 threads computes a tile of 64 rows of W x
// tile_tokens tokens (32 or 64), stepping through the columns 32 at a time; each step decodes the
// 64 x 32 weights once into shared memory as float32 beside the tile_tokens x 32 slice of x, and every
// thread accumulates tile_tokens/16 x 4 outputs in registers. The next step's loads are issued before
// the current step's arithmetic. What this kernel adds:
// - Split-K. With few tiles (the decode batches of a small model: 9 tiles of 64 rows for a 576-row
//   projection) the workgroups of a tile take `splits` disjoint ranges of whole steps, so a product
//   of a few microseconds spreads over the whole GPU. Each writes its partial tile to the workspace
//   and counts itself in the tile's counter; the last to arrive sums the partials in split order
//   (the same order whichever arrives last: deterministic, a replay equals its eager twin bit for
//   bit), applies the epilogue and sets the counter back to zero for the next launch.
// - The norm: y = s_t * sum_c W[r,c] (x[t,c] g[c]), s_t = 1/sqrt(mean_c x[t,c]^2 + eps). x is scaled by
//   g as it goes into shared memory; the 8 threads that load a token's slice of each step sum its
//   squares on the way (per split, summed with the partials), so no separate norm kernel runs.
// - Epilogues on the finished tile in shared memory (one short loop each, coalesced stores): RoPE
//   rotates rows 2i and 2i+1 of a head; SwiGLU pairs gate row r with up row r: a SwiGLU tile is 32
//   gate rows and the same 32 rows of up.
// Every output is a float32 sum of products in column order within a split, the splits added in order.
// Requirements the launcher checks: cols % 32 == 0; W aligned (F32/F16 16 bytes, Q4_1/Q5_1 4, Q8_0/Q5_0 2);
// x and g 16-byte aligned; splits <= cols / 32; tiles * splits < 2^31; with splits > 1, at most
// kCounterBytes / 4 tiles and a workspace of kCounterBytes (zeroed once, left zeroed by every launch)
// + tiles * splits * tile_tokens * 65 floats; blockDim 256.
#include "hip_compat.h"
#include "fused_matmul_formats.h"  // the constants and the weight formats (F32 .. Q5_0)

namespace {
namespace fmm {

// rope.hip's sin/cos (Cody-Waite reduction, Cephes polynomials), as fused_matvec.hip copies it, so that
// the fused RoPE rotates as the rope_f32 kernel does.
static __device__ __forceinline__ void rope_sincos(float angle, float* sin_out, float* cos_out) {
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

static __device__ __forceinline__ int lesser(int a, int b) { return a < b ? a : b; }

// Partials other workgroups of this launch wrote: read from L2, past the SM's L1, which NVIDIA does not
// keep coherent (the fence orders the writes but invalidates nothing there). On AMD the acquire side of
// __threadfence() invalidates the compute unit's cache, so plain loads see the writes.
static __device__ __forceinline__ float4 load_partial4(const float* p) {
#if defined(RF_NVIDIA)
  float4 v;
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
#else
  return *reinterpret_cast<const float4*>(p);
#endif
}
static __device__ __forceinline__ float load_partial(const float* p) {
#if defined(RF_NVIDIA)
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
#else
  return *p;
#endif
}

static __device__ __forceinline__ float squares4(const float4 a, float acc) {
  acc = fmaf(a.x, a.x, acc);
  acc = fmaf(a.y, a.y, acc);
  acc = fmaf(a.z, a.z, acc);
  return fmaf(a.w, a.w, acc);
}

enum Epilogue { kStore, kAdd, kRope, kSwiglu };

// Everything a variant may need; each entry point fills what its epilogue reads.
struct Args {
  float* y0;
  float* y1;
  float* y2;
  const unsigned char* W;
  const float* x;
  const float* g;  // the norm's weight (unused by kAdd)
  const int* positions;
  unsigned char* workspace;
  int rows;  // rows of W (kSwiglu: rows of gate; W has twice as many)
  int cols;
  int n_tokens;
  int splits;
  int split1, split2;  // kRope: rows [0, split1) go to y0, [split1, split2) to y1, the rest to y2
  int head_dim, rope_dim;
  float eps, theta, freq_scale;
  const float* freq_factors = nullptr;  // kRope: rope_dim / 2 per-pair divisors of the frequency, or null
};

// The step tiles while the products run; the finished tile (one row of kOutStride floats per token)
// for the epilogue, in the same memory.
struct Shared {
  union {
    struct {
      float4 xs[kMaxTileTokens * kShared4];
      float4 ws[kTileRows * kShared4];
    } step;
    float out[kMaxTileTokens * kOutStride];
  } tile;
  float norm[kMaxTileTokens];  // per token of the tile: the sum of squares over every column, then the scale
  int last;                    // this workgroup is the last of its tile's splits to arrive
};

// Apply the epilogue to a finished tile and store it. acc holds the thread's outputs (rows tn + 16j,
// tokens tm + 16i of the tile); sh.norm each token's sum of squares (norm variants). The tile goes
// through shared memory so that the epilogue is one short loop whatever it needs to pair up (RoPE:
// rows 2i and 2i+1; SwiGLU: gate row r and up row r) and the stores are coalesced.
template <Epilogue E, int TM>
__device__ __forceinline__ void finish(const Args& a, Shared& sh, const float acc[TM][4], int row_tile, int t0, int tid) {
  constexpr bool kNorm = E != kAdd;
  constexpr int kTileTokens = 16 * TM;
  const int tn = tid & 15, tm = tid >> 4;
  __syncthreads();  // the step tiles are no longer read; sh.norm holds every sum of squares
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) sh.tile.out[(tm + 16 * i) * kOutStride + tn + 16 * j] = acc[i][j];
  if (kNorm && tid < kTileTokens) sh.norm[tid] = 1.0f / sqrtf(sh.norm[tid] / (float)a.cols + a.eps);
  __syncthreads();

  const float* out = sh.tile.out;
  if (E == kSwiglu) {  // the tile's 32 gate rows, then the same 32 rows of up
    for (int idx = tid; idx < kTileTokens * kHalfRows; idx += kThreads) {
      const int tl = idx / kHalfRows, c = idx % kHalfRows;
      const int t = t0 + tl, r = row_tile * kHalfRows + c;
      if (t < a.n_tokens && r < a.rows) {
        const float gate = out[tl * kOutStride + c] * sh.norm[tl], up = out[tl * kOutStride + kHalfRows + c] * sh.norm[tl];
        a.y0[(unsigned long long)t * a.rows + r] = gate / (1.0f + expf(-gate)) * up;
      }
    }
  } else if (E == kRope) {  // row pairs (2i, 2i+1): a pair never straddles q, k and v (whole heads)
    const float log2_step = -2.0f * log2f(a.theta) / (float)a.rope_dim;
    for (int idx = tid; idx < kTileTokens * kHalfRows; idx += kThreads) {
      const int tl = idx / kHalfRows, rl = 2 * (idx % kHalfRows);
      const int t = t0 + tl, r = row_tile * kTileRows + rl;
      if (t >= a.n_tokens || r >= a.rows) continue;
      float p = out[tl * kOutStride + rl] * sh.norm[tl], q = out[tl * kOutStride + rl + 1] * sh.norm[tl];
      const int in_head = r % a.head_dim;
      if (r < a.split2 && in_head < a.rope_dim) {
        float freq = a.freq_scale * exp2f((float)(in_head / 2) * log2_step);
        if (a.freq_factors) freq = freq / a.freq_factors[in_head / 2];
        const float angle = (float)a.positions[t] * freq;
        float sn, cs;
        rope_sincos(angle, &sn, &cs);
        const float p0 = p;
        p = p0 * cs - q * sn;
        q = p0 * sn + q * cs;
      }
      float* y;
      int width, col;
      if (r < a.split1) {
        y = a.y0, width = a.split1, col = r;
      } else if (r < a.split2) {
        y = a.y1, width = a.split2 - a.split1, col = r - a.split1;
      } else {
        y = a.y2, width = a.rows - a.split2, col = r - a.split2;
      }
      y += (unsigned long long)t * width + col;
      y[0] = p;
      y[1] = q;
    }
  } else {
    for (int idx = tid; idx < kTileTokens * kTileRows; idx += kThreads) {
      const int tl = idx / kTileRows, rl = idx % kTileRows;
      const int t = t0 + tl, r = row_tile * kTileRows + rl;
      if (t < a.n_tokens && r < a.rows) {
        float* y = a.y0 + (unsigned long long)t * a.rows + r;
        *y = E == kAdd ? *y + out[tl * kOutStride + rl] : out[tl * kOutStride + rl] * sh.norm[tl];
      }
    }
  }
}

// Sum the tile's partials in split order into acc (and the tokens' sums of squares into shared memory).
// Each thread reads back its own outputs (TM float4s per split, adjacent to its neighbours': coalesced);
// several splits' loads are issued before they are added, so their latencies overlap. Plain loads are
// right on AMD (the acquire fence after the counter invalidates the compute unit's cache); on NVIDIA
// load_partial* reads from L2.
template <int TM, bool kNorm>
__device__ __forceinline__ void combine(const float* partials, int splits, Shared& sh, float acc[TM][4], int tid) {
  constexpr int kTileTokens = 16 * TM;
  constexpr unsigned long long kPartFloats = (unsigned long long)kTileTokens * (kTileRows + 1);
  constexpr int kUnroll = 8 / TM;  // splits loaded at once: 8 float4s in flight per thread
#pragma unroll
  for (int i = 0; i < TM; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
  for (int s0 = 0; s0 < splits; s0 += kUnroll) {
    float4 v[kUnroll][TM];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const float* part = partials + (unsigned long long)lesser(s0 + u, splits - 1) * kPartFloats + 4 * tid * TM;
#pragma unroll
      for (int i = 0; i < TM; ++i) v[u][i] = load_partial4(part + 4 * i);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (s0 + u < splits) {
#pragma unroll
        for (int i = 0; i < TM; ++i) {
          acc[i][0] += v[u][i].x;
          acc[i][1] += v[u][i].y;
          acc[i][2] += v[u][i].z;
          acc[i][3] += v[u][i].w;
        }
      }
    }
  }
  if (kNorm && tid < kTileTokens) {
    float total = 0.0f;
    for (int s = 0; s < splits; ++s) total += load_partial(partials + (unsigned long long)s * kPartFloats + kTileTokens * kTileRows + tid);
    sh.norm[tid] = total;
  }
}

template <class Format, int TM, Epilogue E>
__device__ __forceinline__ void fused_tiles(const Args& a, Shared& sh) {
  constexpr bool kNorm = E != kAdd;
  constexpr int kTileTokens = 16 * TM;
  constexpr int kXLoads = kTileTokens * (kStepCols / 4) / kThreads;  // float4s of x per thread and step
  constexpr unsigned long long kPartFloats = (unsigned long long)kTileTokens * (kTileRows + 1);
  static_assert(kXLoads * kThreads == kTileTokens * (kStepCols / 4), "every thread loads whole float4s of x");
  const int tid = (int)threadIdx.x;
  const int tn = tid & 15, tm = tid >> 4;             // outputs: rows tn + 16j, tokens tm + 16i of the tile
  const int w_row = tid >> 2, w_col = 8 * (tid & 3);  // the 8 weights this thread decodes in each step
  const int x_token = tid >> 3, x_col = 4 * (tid & 7);  // x: tokens x_token + 32p, columns x_col .. +3
  const unsigned long long row_bytes = Format::row_bytes(a.cols);
  const int row_tiles = E == kSwiglu ? (a.rows + kHalfRows - 1) / kHalfRows : (a.rows + kTileRows - 1) / kTileRows;
  const int tiles = row_tiles * ((a.n_tokens + kTileTokens - 1) / kTileTokens);  // the launcher keeps it < 2^31
  const int steps = a.cols / kStepCols;
  const int items = tiles * a.splits;
  int* counters = reinterpret_cast<int*>(a.workspace);
  float* partials = reinterpret_cast<float*>(a.workspace + kCounterBytes);

  for (int item = (int)blockIdx.x; item < items; item += (int)gridDim.x) {  // uniform across the workgroup
    const int tile = item / a.splits, split = item - tile * a.splits;
    const int row_tile = tile % row_tiles, t0 = (tile / row_tiles) * kTileTokens;
    const int c_begin = (int)((long long)split * steps / a.splits) * kStepCols;
    const int c_end = (int)((long long)(split + 1) * steps / a.splits) * kStepCols;

    int w_src_row;
    if (E == kSwiglu) {  // tile rows 0..31: gate rows; 32..63: the same rows of up
      const int r = lesser(row_tile * kHalfRows + (w_row & (kHalfRows - 1)), a.rows - 1);
      w_src_row = w_row < kHalfRows ? r : a.rows + r;
    } else {
      w_src_row = lesser(row_tile * kTileRows + w_row, a.rows - 1);
    }
    const unsigned char* w_src = a.W + (unsigned long long)w_src_row * row_bytes;
    const float* x_src[kXLoads];
#pragma unroll
    for (int p = 0; p < kXLoads; ++p)
      x_src[p] = a.x + (unsigned long long)lesser(t0 + x_token + 32 * p, a.n_tokens - 1) * a.cols + x_col;

    float acc[TM][4], squares[kXLoads];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
#pragma unroll
    for (int p = 0; p < kXLoads; ++p) squares[p] = 0.0f;

    __syncthreads();  // the previous item's epilogue is done with the shared tile, sh.norm and sh.last
    if (c_begin < c_end) {
      typename Format::Raw raw = Format::load(w_src, c_begin + w_col);
      float4 xv[kXLoads];
#pragma unroll
      for (int p = 0; p < kXLoads; ++p) xv[p] = *reinterpret_cast<const float4*>(x_src[p] + c_begin);
      float4 gv = {1.0f, 1.0f, 1.0f, 1.0f};
      if (kNorm) gv = *reinterpret_cast<const float4*>(a.g + c_begin + x_col);

      for (int c0 = c_begin; c0 < c_end; c0 += kStepCols) {
        __syncthreads();  // every thread is done reading the previous step's tiles
        float w[8];
        Format::decode(raw, c0 + w_col, w);
        sh.tile.step.ws[w_row * kShared4 + (w_col >> 2)] = float4{w[0], w[1], w[2], w[3]};
        sh.tile.step.ws[w_row * kShared4 + (w_col >> 2) + 1] = float4{w[4], w[5], w[6], w[7]};
#pragma unroll
        for (int p = 0; p < kXLoads; ++p) {
          float4 v = xv[p];
          if (kNorm) {
            squares[p] = squares4(v, squares[p]);
            v.x *= gv.x, v.y *= gv.y, v.z *= gv.z, v.w *= gv.w;
          }
          sh.tile.step.xs[(x_token + 32 * p) * kShared4 + (x_col >> 2)] = v;
        }
        __syncthreads();

        const int next = lesser(c0 + kStepCols, c_end - kStepCols);  // the last step reloads itself
        raw = Format::load(w_src, next + w_col);
#pragma unroll
        for (int p = 0; p < kXLoads; ++p) {
          // Member by member: a whole-struct copy into the array kept it in scratch memory on AMD (clang-22).
          const float4 v = *reinterpret_cast<const float4*>(x_src[p] + next);
          xv[p].x = v.x, xv[p].y = v.y, xv[p].z = v.z, xv[p].w = v.w;
        }
        if (kNorm) {
          const float4 v = *reinterpret_cast<const float4*>(a.g + next + x_col);
          gv.x = v.x, gv.y = v.y, gv.z = v.z, gv.w = v.w;
        }

#pragma unroll
        for (int k4 = 0; k4 < kStepCols / 4; ++k4) {
          float4 xa[TM], wb[4];
#pragma unroll
          for (int i = 0; i < TM; ++i) xa[i] = sh.tile.step.xs[(tm + 16 * i) * kShared4 + k4];
#pragma unroll
          for (int j = 0; j < 4; ++j) wb[j] = sh.tile.step.ws[(tn + 16 * j) * kShared4 + k4];
#pragma unroll
          for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              float s = fmaf(xa[i].x, wb[j].x, acc[i][j]);
              s = fmaf(xa[i].y, wb[j].y, s);
              s = fmaf(xa[i].z, wb[j].z, s);
              acc[i][j] = fmaf(xa[i].w, wb[j].w, s);
            }
        }
      }
    }

    // Each token's sum of squares over this item's columns: the 8 lanes that loaded its slices.
    if (kNorm) {
#pragma unroll
      for (int p = 0; p < kXLoads; ++p) {
        float s = squares[p];
        s += __shfl_xor(s, 1);
        s += __shfl_xor(s, 2);
        s += __shfl_xor(s, 4);
        squares[p] = s;
      }
    }

    if (a.splits > 1) {
      float* part = partials + ((unsigned long long)tile * a.splits + split) * kPartFloats;
      float4* mine = reinterpret_cast<float4*>(part) + tid * TM;
#pragma unroll
      for (int i = 0; i < TM; ++i) mine[i] = float4{acc[i][0], acc[i][1], acc[i][2], acc[i][3]};
      if (kNorm && (tid & 7) == 0) {
#pragma unroll
        for (int p = 0; p < kXLoads; ++p) part[kTileTokens * kTileRows + x_token + 32 * p] = squares[p];
      }
      // Publish the partial; the last of the tile's splits to arrive finishes the tile. Every thread
      // fences its own writes (AMD's fence waits for the wave's own stores only), and the counting
      // thread fences again after the barrier, so the count is seen only after every write.
      __threadfence();
      __syncthreads();
      if (tid == 0) {
        __threadfence();
        sh.last = atomicAdd(counters + tile, 1) == a.splits - 1;
      }
      __syncthreads();
      if (!sh.last) continue;  // uniform: every thread read the same flag
      __threadfence();
      combine<TM, kNorm>(partials + (unsigned long long)tile * a.splits * kPartFloats, a.splits, sh, acc, tid);
      if (tid == 0) counters[tile] = 0;  // ready for the next launch
    } else if (kNorm && (tid & 7) == 0) {
#pragma unroll
      for (int p = 0; p < kXLoads; ++p) sh.norm[x_token + 32 * p] = squares[p];
    }
    finish<E, TM>(a, sh, acc, row_tile, t0, tid);
  }
}

template <class Format, Epilogue E>
__device__ __forceinline__ void fused_matmul(const Args& a, int tile_tokens, Shared& sh) {
  rf_check_wave_size();
  switch (tile_tokens) {  // uniform: a kernel argument
    case 32: fused_tiles<Format, 2, E>(a, sh); break;
    default: fused_tiles<Format, 4, E>(a, sh); break;
  }
}

}  // namespace fmm
}  // namespace

// One set of entry points per format; blockDim 256. The shared tiles are declared in each entry, once,
// so that the three tile shapes share them.
#define RF_FUSED_MATMUL_ENTRIES(suffix, Format)                                                                       \
  extern "C" __global__ __launch_bounds__(256) void matmul_norm_rope_##suffix(                                        \
      float* q, float* k, float* v, const void* W, const float* x, const float* g, const int* positions,              \
      const float* freq_factors, void* workspace, int q_rows, int kv_rows, int cols, int n_tokens, int head_dim,      \
      int rope_dim, int tile_tokens, int splits, float eps, float theta, float freq_scale) {                          \
    __shared__ fmm::Shared sh;                                                                                         \
    const fmm::Args a = {q, k, v, static_cast<const unsigned char*>(W), x, g, positions,                               \
                         static_cast<unsigned char*>(workspace), q_rows + 2 * kv_rows, cols, n_tokens, splits, q_rows, \
                         q_rows + kv_rows, head_dim, rope_dim, eps, theta, freq_scale, freq_factors};                  \
    fmm::fused_matmul<fmm::Format, fmm::kRope>(a, tile_tokens, sh);                                                    \
  }                                                                                                                    \
  extern "C" __global__ __launch_bounds__(256) void matmul_norm_swiglu_##suffix(                                      \
      float* y, const void* W, const float* x, const float* g, void* workspace, int rows, int cols, int n_tokens,     \
      int tile_tokens, int splits, float eps) {                                                                       \
    __shared__ fmm::Shared sh;                                                                                         \
    const fmm::Args a = {y, y, y, static_cast<const unsigned char*>(W), x, g, nullptr,                                 \
                         static_cast<unsigned char*>(workspace), rows, cols, n_tokens, splits, 0, 0, 2, 0, eps, 1.0f,  \
                         1.0f};                                                                                        \
    fmm::fused_matmul<fmm::Format, fmm::kSwiglu>(a, tile_tokens, sh);                                                  \
  }                                                                                                                    \
  extern "C" __global__ __launch_bounds__(256) void matmul_add_##suffix(                                              \
      float* y, const void* W, const float* x, void* workspace, int rows, int cols, int n_tokens, int tile_tokens,    \
      int splits) {                                                                                                    \
    __shared__ fmm::Shared sh;                                                                                         \
    const fmm::Args a = {y, y, y, static_cast<const unsigned char*>(W), x, nullptr, nullptr,                           \
                         static_cast<unsigned char*>(workspace), rows, cols, n_tokens, splits, 0, 0, 2, 0, 0.0f, 1.0f, \
                         1.0f};                                                                                        \
    fmm::fused_matmul<fmm::Format, fmm::kAdd>(a, tile_tokens, sh);                                                     \
  }                                                                                                                    \
  extern "C" __global__ __launch_bounds__(256) void matmul_norm_##suffix(                                             \
      float* y, const void* W, const float* x, const float* g, void* workspace, int rows, int cols, int n_tokens,     \
      int tile_tokens, int splits, float eps) {                                                                       \
    __shared__ fmm::Shared sh;                                                                                         \
    const fmm::Args a = {y, y, y, static_cast<const unsigned char*>(W), x, g, nullptr,                                 \
                         static_cast<unsigned char*>(workspace), rows, cols, n_tokens, splits, 0, 0, 2, 0, eps, 1.0f,  \
                         1.0f};                                                                                        \
    fmm::fused_matmul<fmm::Format, fmm::kStore>(a, tile_tokens, sh);                                                   \
  }

RF_FUSED_MATMUL_ENTRIES(q4_1, Q4_1)
RF_FUSED_MATMUL_ENTRIES(q5_0, Q5_0)
RF_FUSED_MATMUL_ENTRIES(q5_1, Q5_1)
RF_FUSED_MATMUL_ENTRIES(q8_0, Q8_0)
RF_FUSED_MATMUL_ENTRIES(f16, F16)
RF_FUSED_MATMUL_ENTRIES(bf16, BF16)
RF_FUSED_MATMUL_ENTRIES(f32, F32)

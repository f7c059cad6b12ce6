// Part of the fused_qmatvec op (kernels/fused_qmatvec.hip includes it after qmatvec_formats.h, whose formats and
// int8 dot products it uses; built and hashed with it: hipcore/runtime/kernels.py source_files): x (times the
// norm's g) quantized once per workgroup into shared memory, and tile_dot, a warp's rows of one or two
// matrices against it, split over 2 or 4 warps where asked.
#pragma once

namespace {
namespace fq {

using q8::XSlice;

enum WeightType { kQ4_K = 0, kQ5_K = 1, kQ6_K = 2, kQ8_0 = 3, kQ4_0 = 4, kQ4_1 = 5, kQ5_0 = 6, kQ5_1 = 7, kMXFP4 = 8 };

constexpr int kMaxBatchPerPass = 8;  // a decode step's tokens (FUSED_QMATVEC_MAX_TOKENS): one pass over W

// g over a slice's columns (run a in gv[0..3], run b in gv[4..7]): loaded once for every token of a pass.
static __device__ __forceinline__ void load_slice(const float* __restrict__ p, int col_a, int col_b, float4 v[8]) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    v[k] = *reinterpret_cast<const float4*>(p + col_a + 4 * k);
    v[4 + k] = *reinterpret_cast<const float4*>(p + col_b + 4 * k);
  }
}

// The slice of x (times g, given as gv, when normalizing) quantized, and ss += x^2 over the slice's columns.
template <bool NORM>
static __device__ __forceinline__ XSlice quantize_xg(const float* __restrict__ x, const float4 gv[8], int col_a,
                                                     int col_b, float& ss) {
  float4 v[8];
  load_slice(x, col_a, col_b, v);
  if (NORM) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float4 gk = gv[k];
      ss = fmaf(v[k].x, v[k].x, ss);
      ss = fmaf(v[k].y, v[k].y, ss);
      ss = fmaf(v[k].z, v[k].z, ss);
      ss = fmaf(v[k].w, v[k].w, ss);
      v[k] = {v[k].x * gk.x, v[k].y * gk.y, v[k].z * gk.z, v[k].w * gk.w};
    }
  }
  return q8::quantize_values(v);
}

// x (times g when normalizing) quantized once per workgroup, for one chunk of slices and every token of a
// pass, in shared memory: each warp then reads the codes of its slices (40 bytes a slice and token) instead
// of re-reading and re-quantizing 32 floats of x (and of g) per slice and token, which cost more traffic
// and instructions than the weights themselves. Run a's and run b's codes lie in separate arrays, so that
// the lanes' 16-byte loads fall on consecutive 16-byte words (no bank conflicts).
constexpr int kBlockThreads = 256;                   // the entries' launch bounds; the launcher's block
constexpr int kMaxWarps = kBlockThreads / 32;
constexpr int kStageSliceTokens = 512;               // 20 KiB: a chunk is 512 / NB slices of NB tokens
constexpr int kMaxPartials = 4;                      // M * ROWS * NB of a split tile_dot (the residual's, one token)
struct Stage {
  uint4 codes_a[kStageSliceTokens], codes_b[kStageSliceTokens];
  float d[kStageSliceTokens];
  int sums[kStageSliceTokens];                       // sum_a in the low 16 bits, sum_b in the high (|sum| <= 2032)
  float ss[kMaxWarps][kMaxBatchPerPass];             // each warp's sums of x^2, per token
  float partial[kMaxWarps][kMaxPartials];            // a split row group's sums, per warp (tile_dot, KS > 1)
  // What the codes hold when x fits one chunk (a whole staging): the x, type code and tokens they were
  // staged from, and the block's sums of x^2 per token. A workgroup that takes several tiles of one matrix
  // (or of matrices of one type) stages x once: the staging is a barrier-bound phase with no weight
  // loads in flight, and it re-read x and g from L2 for every tile. Reset by every entry (reset_key).
  const float* key_x;
  int key_type, key_tokens;
  float ss_total[kMaxBatchPerPass];
};

// Every thread of the block calls it before the first tile_dot: the barrier makes the reset seen by all, so
// that a workgroup never reads a key a workgroup before it on this SM left in the shared memory.
static __device__ __forceinline__ void reset_key(Stage& st) {
  if (threadIdx.x == 0) st.key_x = nullptr;
  __syncthreads();
}

// Slices c0 .. c0 + n - 1 of the NB tokens quantized into st (slice i of token b at b * chunk + i) by the
// threads of the block together; ss[b] += x[b]^2 over the columns this thread quantized. Tokens past
// `tokens` repeat the last one (a pass of NB tokens carries fewer; their results are not written).
template <class Format, int NB, bool NORM>
__device__ __forceinline__ void stage_chunk(Stage& st, const float* __restrict__ x, const float* __restrict__ g, int cols,
                                            int tokens, int c0, int n, float ss[NB]) {
  constexpr int chunk = kStageSliceTokens / NB;
  for (int i = (int)threadIdx.x; i < n; i += (int)blockDim.x) {
    int col_a, col_b;
    Format::columns(c0 + i, col_a, col_b);
    // g once for the slice, not once per token: in a batched pass the staging's reads of x and g from L2
    // rival the weights' own traffic (every workgroup stages the whole of x).
    float4 gv[8];
    if (NORM) load_slice(g, col_a, col_b, gv);
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const int t = b < tokens ? b : tokens - 1;
      const XSlice s = quantize_xg<NORM>(x + (unsigned long long)t * cols, gv, col_a, col_b, ss[b]);
      const int j = b * chunk + i;
      uint4 a, c;
      a.x = (unsigned int)s.xq[0], a.y = (unsigned int)s.xq[1], a.z = (unsigned int)s.xq[2], a.w = (unsigned int)s.xq[3];
      c.x = (unsigned int)s.xq[4], c.y = (unsigned int)s.xq[5], c.z = (unsigned int)s.xq[6], c.w = (unsigned int)s.xq[7];
      st.codes_a[j] = a;
      st.codes_b[j] = c;
      st.d[j] = s.d;
      st.sums[j] = (int)(((unsigned int)s.sum_a & 0xffffu) | ((unsigned int)s.sum_b << 16));
    }
  }
}

static __device__ __forceinline__ XSlice staged_slice(const Stage& st, int j) {
  const uint4 a = st.codes_a[j], c = st.codes_b[j];
  XSlice s;
  s.xq[0] = (int)a.x, s.xq[1] = (int)a.y, s.xq[2] = (int)a.z, s.xq[3] = (int)a.w;
  s.xq[4] = (int)c.x, s.xq[5] = (int)c.y, s.xq[6] = (int)c.z, s.xq[7] = (int)c.w;
  s.d = st.d[j];
  const int sums = st.sums[j];
  s.sum_a = (int)(signed short)(unsigned short)(sums & 0xffff);
  s.sum_b = sums >> 16;  // arithmetic: the high half's sign
  return s;
}

// out[m][r][b] = row r0 + r of matrix W[m] times quantized (x * g)[b], in every lane of the warp; ss[b] =
// sum of x[b]^2 over the row (when NORM), in every thread. Every thread of the block calls it (barriers):
// the block stages x chunk by chunk, then each warp walks its ROWS rows of each of the M matrices (all of
// one format) over the chunk's slices, their loads in flight together. A warp whose rows start past
// `rows` stages with the others and reads no weights; rows past `rows` read the last row again (their
// results are not to be written).
// Split (KS > 1): the KS warps of a row group (adjacent warps, `part` 0 .. KS - 1) share its rows, each
// taking every KS-th run of 32 slices, and their sums meet in shared memory, added in part order (the same
// result every run); part 0's warp holds them. A product of few rows (an 8B's o and down: 128 tiles of 32
// rows for 132 SMs) otherwise leaves too few loads in flight per SM to cover DRAM latency. KS is a template
// argument: with a run-time stride the unsplit products lost ~15% (measured on an H100, gate|up).
// UNROLL: the slice loop unrolled (2: the next slice's loads may issue before this slice's products); the
// one-token head's on NVIDIA only (fused_qmatvec.hip: kHeadUnroll).
template <class Format, int NB, int ROWS, int M, bool NORM, int KS = 1, int UNROLL = 1>
__device__ __forceinline__ void tile_dot(Stage& st, int type, const unsigned char* const W[M], int rows, int r0,
                                         const float* __restrict__ x, const float* __restrict__ g, int cols, int tokens,
                                         float out[M][ROWS][NB], float ss[NB], int part = 0) {
  constexpr int chunk = kStageSliceTokens / NB;
  const int lane = (int)threadIdx.x % WARP_SIZE;
  const int slices = cols / 32;
  const unsigned long long row_bytes = Format::row_bytes(cols);
  const bool reads = r0 < rows;  // uniform across the warp
  const unsigned char* w[M][ROWS];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < ROWS; ++r) w[m][r] = W[m] + (unsigned long long)(r0 + r < rows ? r0 + r : rows - 1) * row_bytes;
  float acc[M][ROWS][NB], sq[NB];
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    sq[b] = 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < ROWS; ++r) acc[m][r][b] = 0.0f;
  }
  const bool whole = slices <= chunk;  // uniform: x in one staging, kept while the key holds
  // The lines of the warp's first 32 slices of each of its rows are prefetched into L2 before it waits for
  // the kernel ahead (the entries are programmatic launches that defer their wait to here: the weights are
  // what no kernel writes) and before x is staged, so that the first DRAM round trip overlaps the kernel
  // ahead's end and the staging instead of following them. Into L2, not registers: holding the loads across
  // the staging took the one-token entries from ~106 to 255 registers (one workgroup per SM, not two).
  {
    const int s0 = part * WARP_SIZE;  // the first slice this warp loads (the lanes' i0), a multiple of 32
    const int s1 = s0 + WARP_SIZE < slices ? s0 + WARP_SIZE : slices;
    if (reads && s0 < slices) {
      const unsigned long long begin = (unsigned long long)s0 * row_bytes / slices;  // exact: s0 % 8 == 0
      const unsigned long long end = (unsigned long long)s1 * row_bytes / slices;
      const int lines = (int)((end - begin + 127) / 128) + 1;  // +1: begin need not start a line
      // One prefetch a lane: lane l takes line l % per_row of row group member l / per_row (a loop over
      // every row and line cost the entries ~20 registers and spills).
      constexpr int kMembers = M * ROWS, kPerRow = WARP_SIZE / kMembers;
      const int member = lane / kPerRow, line = lane % kPerRow;
      const unsigned char* p = nullptr;
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
          if (member == m * ROWS + r) p = w[m][r];
      if (p != nullptr && line < lines) rf_prefetch_l2(p + begin + 128ull * line);
    }
  }
  rf_grid_dependency_sync();  // x and everything but the weights: written by the kernel ahead
  for (int c0 = 0; c0 < slices; c0 += chunk) {
    const int n = slices - c0 < chunk ? slices - c0 : chunk;
    // Uniform: every thread reads the same key, which only a staging writes, between two of its barriers that
    // every thread meets. When the codes are kept, the warps go on to their next rows without a barrier: the
    // block's warps need not wait for its slowest at every tile, and no warp's loads drain there (a one-token
    // gate|up takes 3-4 tiles a workgroup, the head ~15). A split row group (KS > 1) still meets its warps
    // here: their partial sums of the tile before must be read before they are overwritten.
    const bool kept = whole && st.key_x == x && st.key_type == type && st.key_tokens == tokens;
    if (KS > 1 || !kept) __syncthreads();  // every warp is done with the previous chunk's codes (and partials)
    // One staging site, so that the kernel's code does not grow by a second inlined copy of it.
    if (!kept) {
      stage_chunk<Format, NB, NORM>(st, x, g, cols, tokens, c0, n, sq);
      if (NORM && whole) {  // the block's sums of squares, kept with the codes
#pragma unroll
        for (int b = 0; b < NB; ++b) {
          const float s = rf_warp_sum(sq[b]);
          if (lane == 0) st.ss[(int)threadIdx.x / WARP_SIZE][b] = s;
        }
      }
      __syncthreads();
      if (threadIdx.x == 0) {  // every thread read the old key before the barrier above
        if (NORM && whole) {
          const int warps = (int)blockDim.x / WARP_SIZE;
#pragma unroll
          for (int b = 0; b < NB; ++b) {
            float t = 0.0f;
            for (int k = 0; k < warps; ++k) t += st.ss[k][b];
            st.ss_total[b] = t;
          }
        }
        st.key_x = whole ? x : nullptr, st.key_type = type, st.key_tokens = tokens;
      }
      __syncthreads();  // the codes, the key and the sums of squares, seen by every thread
    }
    if (!reads) continue;
#pragma unroll UNROLL
    for (int i = lane + part * WARP_SIZE; i < n; i += WARP_SIZE * KS) {
      typename Format::Raw raw[M][ROWS];
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < ROWS; ++r) raw[m][r] = Format::load(w[m][r], c0 + i);
      // Decoded once (the scale bits, the nibbles: most of a slice's work), applied to every token.
      typename Format::Decoded dec[M][ROWS];
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < ROWS; ++r) dec[m][r] = Format::decode(raw[m][r], c0 + i);
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const XSlice xs = staged_slice(st, b * chunk + i);
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
          for (int r = 0; r < ROWS; ++r) acc[m][r][b] = fmaf(xs.d, Format::apply(dec[m][r], xs), acc[m][r][b]);
      }
    }
  }
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < ROWS; ++r) out[m][r][b] = rf_warp_sum(acc[m][r][b]);
  if constexpr (KS > 1) {  // every thread passes the barrier; part 0's warp adds its group's sums
    static_assert(M * ROWS * NB <= kMaxPartials, "Stage::partial holds a warp's sums");
    const int warp = (int)threadIdx.x / WARP_SIZE;
    if (lane == 0) {
#pragma unroll
      for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
          for (int r = 0; r < ROWS; ++r) st.partial[warp][(b * M + m) * ROWS + r] = out[m][r][b];
    }
    __syncthreads();  // the next writes to partial come after the next tile's first barrier
    if (part == 0) {
#pragma unroll
      for (int b = 0; b < NB; ++b)
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
          for (int r = 0; r < ROWS; ++r) {
            float sum = out[m][r][b];
#pragma unroll
            for (int p = 1; p < KS; ++p) sum += st.partial[warp + p][(b * M + m) * ROWS + r];
            out[m][r][b] = sum;
          }
    }
  }
  if (NORM && whole) {
#pragma unroll
    for (int b = 0; b < NB; ++b) ss[b] = st.ss_total[b];  // written before the staging's last barrier
  } else if (NORM) {  // the block's sums of squares: each thread's, over its warp, then over the warps
    const int warp = (int)threadIdx.x / WARP_SIZE, warps = (int)blockDim.x / WARP_SIZE;
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const float s = rf_warp_sum(sq[b]);
      if (lane == 0) st.ss[warp][b] = s;
    }
    __syncthreads();
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      float t = 0.0f;
      for (int k = 0; k < warps; ++k) t += st.ss[k][b];
      ss[b] = t;
    }
  }
}

// The formats an entry reads (its type switch): the K-quants with Q8_0 and Q4_0 (the `_1` and `_n` entries), or the
// 32-element blocks with a min or a fifth bit with Q8_0 and Q4_0 (the one-token `_1b` entries). One switch of all
// eight raised the spills of the one-token entries at 128 registers (qmatvec_norm_swiglu_split_1: 36 -> 504
// bytes of spill loads) and slowed the K-quant products on an NVIDIA H200 (Llama-3.1-8B shapes, Q4_K_M: gate|up
// 23.96 -> 24.60 us, q|k|v 10.24 -> 10.93); a call out of line instead raised the entries' registers (q|k|v to
// 170: one workgroup an SM). MXFP4 has entries of its own (the `_1m` and `_nm` entries, every matrix MXFP4): no switch.
enum TypeSet { kKQuantTypes = 0, kBlock32Types = 1, kMXFP4Types = 2 };

// tile_dot for matrices whose format is known only at run time (uniform across the block), one of TYPES's.
template <int NB, int ROWS, int M, bool NORM, int KS = 1, int UNROLL = 1, int TYPES = kKQuantTypes>
__device__ __forceinline__ void typed_tile_dot(int type, Stage& st, const unsigned char* const W[M], int rows, int r0,
                                               const float* x, const float* g, int cols, int tokens,
                                               float out[M][ROWS][NB], float ss[NB], int part = 0) {
  if constexpr (TYPES == kMXFP4Types) {
    tile_dot<q8::MXFP4Format, NB, ROWS, M, NORM, KS, UNROLL>(st, type, W, rows, r0, x, g, cols, tokens, out, ss, part);
    return;
  }
  if constexpr (TYPES == kBlock32Types) {
    switch (type) {
      case kQ4_1: tile_dot<q8::Q4_1Format, NB, ROWS, M, NORM, KS, UNROLL>(st, type, W, rows, r0, x, g, cols, tokens, out, ss, part); break;
      case kQ5_0: tile_dot<q8::Q5_0Format, NB, ROWS, M, NORM, KS, UNROLL>(st, type, W, rows, r0, x, g, cols, tokens, out, ss, part); break;
      case kQ5_1: tile_dot<q8::Q5_1Format, NB, ROWS, M, NORM, KS, UNROLL>(st, type, W, rows, r0, x, g, cols, tokens, out, ss, part); break;
      case kQ8_0: tile_dot<q8::Q8_0Format, NB, ROWS, M, NORM, KS, UNROLL>(st, type, W, rows, r0, x, g, cols, tokens, out, ss, part); break;
      default: tile_dot<q8::Q4_0Format, NB, ROWS, M, NORM, KS, UNROLL>(st, type, W, rows, r0, x, g, cols, tokens, out, ss, part); break;
    }
    return;
  }
  switch (type) {
    case kQ4_K: tile_dot<q8::Q4_KFormat, NB, ROWS, M, NORM, KS, UNROLL>(st, type, W, rows, r0, x, g, cols, tokens, out, ss, part); break;
    case kQ5_K: tile_dot<q8::Q5_KFormat, NB, ROWS, M, NORM, KS, UNROLL>(st, type, W, rows, r0, x, g, cols, tokens, out, ss, part); break;
    case kQ6_K: tile_dot<q8::Q6_KFormat, NB, ROWS, M, NORM, KS, UNROLL>(st, type, W, rows, r0, x, g, cols, tokens, out, ss, part); break;
    case kQ8_0: tile_dot<q8::Q8_0Format, NB, ROWS, M, NORM, KS, UNROLL>(st, type, W, rows, r0, x, g, cols, tokens, out, ss, part); break;
    default: tile_dot<q8::Q4_0Format, NB, ROWS, M, NORM, KS, UNROLL>(st, type, W, rows, r0, x, g, cols, tokens, out, ss, part); break;
  }
}

// The block's tiles: a tile is ROWS rows per row group of one matrix, `groups` row groups (at most, and by
// default, warps / KS) and groups * ROWS rows in all; a row group is KS adjacent warps (tile_dot), `group` its
// index in the block and `part` the warp's in the group. A warp whose group is `groups` or past it reads no
// weights (active() is false) but stages x and meets every barrier with the others: fewer groups a tile
// make more, smaller tiles, so that a launch of a few hundred tiles spreads its bytes evenly over the SMs
// (hipcore/ops/fused_qmatvec.py: tile_groups).
struct Tiles {
  int warp, lane, tile_rows, group, part, groups;
  template <int ROWS, int KS = 1>
  static __device__ __forceinline__ Tiles of(int groups = 0) {
    const int warp = (int)threadIdx.x / WARP_SIZE, all = (int)blockDim.x / WARP_SIZE / KS;
    const int g = groups > 0 && groups < all ? groups : all;
    return {warp, (int)threadIdx.x % WARP_SIZE, g * ROWS, warp / KS, warp % KS, g};
  }
  __device__ __forceinline__ int count(int rows) const { return (rows + tile_rows - 1) / tile_rows; }
  __device__ __forceinline__ bool active() const { return group < groups; }
};

}  // namespace fq
}  // namespace

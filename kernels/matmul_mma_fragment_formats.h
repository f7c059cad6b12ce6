// Part of the matmul_mma op and of moe_experts_mma (kernels/matmul_mma_fragments.h and kernels/moe_experts_mma.hip
// include it; built and hashed with each: hipcore/runtime/kernels.py source_files): how NVIDIA's fragment path reads
// each block format straight into a lane's mma.sync A fragments (the lanes' k order, each format's load and decode),
// the K-quants' here and the 32-element formats' in matmul_mma_block32_fragments.h. Needs matmul_mma_formats.h.
#pragma once
#include "hip_compat.h"
#include "matrix_cores.h"  // rf_mma: one warp's 16x16x16 f16 tile on the matrix cores

namespace {
namespace mmq {

#if RF_MMA_KIND == RF_MMA_NV_M16N8K16
// ---- Decode batches on NVIDIA: the weights' fragments decoded in registers -----------------------------
// mma_tiles stages each step's decoded weights in shared memory for the warps' fragment loads: per step of a
// 32-token tile, 16 KB written and 32 KB read back for 4.6 KB of Q4_K weights, two barriers, and the loads
// of the steps ahead in registers the staging holds back. Here each warp owns 16 rows of the tile and all
// its tokens (one 16 x 8 product per token tile and k-substep), and each lane decodes the weights of its
// own A fragments straight from its loads: no shared weight tile at all. The fragments' k order is ours to
// choose as long as x follows it: lane 4 g + t takes bytes 8t .. 8t + 7 of a row's 32 code bytes of the
// step (rows g and g + 8), whose low nibbles are columns 8t .. 8t + 7 of the step's first half and high
// nibbles the same of its second; k-substep s (0 .. 3) gives the lane's k positions 2t, 2t + 1, 2t + 8,
// 2t + 9 to columns 8t + 4 (s % 2) + 0 .. 3 of half s / 2 (frag_column). x follows in one of two ways:
// - 32-token tiles stage x per step in shared memory in that order (stream_x_position), rounded to f16
//   once, so a lane's B fragment of a token is one 8-byte load; two barriers a step.
// - 8-token tiles (a batch of at most 8) read x straight from memory: the lane's four columns are adjacent
//   in x too, so its B fragment is one 16-byte load rounded to f16 in registers, and the eight warps of a
//   workgroup share it through the cache. No shared memory and no barrier in the loop: each warp runs at
//   its own pace. Measured on an H100 against the staged entry
//   (docs/history/2026-11-27-fragment-path-kquant-batches.md), 8 tokens: gate/up 41.1
//   -> 31.0 us, q/o 16.5 -> 12.2; Q6_K gains only over short splits (v 11.4 -> 9.1, but the 8B's down 45.5
//   -> 51.1: hipcore/ops/matmul_mma.py DIRECT_Q6K_MAX_SPLIT_STEPS); at 32 tokens every warp rounding every
//   x value cost more than the barriers (gate/up 108 us against 42).
// Q4_K, Q5_K and Q6_K here; Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 in matmul_mma_block32_fragments.h. Prompt tiles
// keep mma_tiles.
constexpr int kStreamTokens = 32;
constexpr int kStreamStride = 80;  // halves per token of the x tile: a half-warp's 8-byte loads hit 32 banks
constexpr int kDirectTokens = 8;

// The step column of lane t's four weights (and x values) in k-substep s: 32 (s / 2) + 8 t + 4 (s % 2).
static __device__ __forceinline__ int frag_column(int s, int t) { return 32 * (s >> 1) + 8 * t + 4 * (s & 1); }

// Where tile column col (0 .. 63) of a step sits in a token's row of the staged x tile: k-substep s, lane
// t, position i at 16 s + 4 t + i (the inverse of frag_column).
static __device__ __forceinline__ int stream_x_position(int col) {
  const int half = col >> 5, c = col & 31;
  return 16 * (2 * half + ((c >> 2) & 1)) + 4 * (c >> 3) + (c & 3);
}

// Q4_K / Q5_K: a lane's 8 code bytes of the step's chunk j (and Q5_K's 8 matching bytes of fifth bits),
// with the super-block's 16 header bytes.
template <bool kFiveBit>
struct WideFragments {
  typedef Wide<kFiveBit> Step;
  static constexpr int kDepth = kFiveBit ? 2 : 3;  // steps of loads in flight per lane, within 128 registers (staged)
  static constexpr int kCombineFloats = 64;        // combine_splits' partial floats a thread loads a round trip
  static constexpr bool kWeightsBeforeWait = true;  // the first steps' loads overlap the kernel ahead
  struct Raw {
    uint4 head;
    uint2 q, h;
  };
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int c0, int t) {
    const unsigned char* b = row + (c0 >> 8) * Step::kBlockBytes;
    const int j = (c0 & 255) >> 6;
    Raw r;
    r.head = *reinterpret_cast<const uint4*>(b);
    r.q = *reinterpret_cast<const uint2*>(b + Step::kQsOffset + 32 * j + 8 * t);
    r.h = kFiveBit ? *reinterpret_cast<const uint2*>(b + rf_blocks::Q5_K::kQhAt + 8 * t) : uint2{0u, 0u};
    return r;
  }
  // pairs[2 s + e]: pair e of k-substep s (code bytes 0..3 feed substeps 0 and 2, bytes 4..7 1 and 3).
  static __device__ __forceinline__ void decode(const Raw& r, int c0, unsigned int pairs[8]) {
    const int j = (c0 & 255) >> 6;
    const KPairScales k = k_pair_scales(r.head, j);
    decode_k_word<kFiveBit>(r.q.x, r.h.x, j, k, pairs + 0, pairs + 4);
    decode_k_word<kFiveBit>(r.q.y, r.h.y, j, k, pairs + 2, pairs + 6);
  }
  // A lane's whole super-block at once (the direct entry: superblock_item): the header, Q5_K's fifth bits and the
  // 8 code bytes of each of its four steps, so that a row's 128 code bytes are asked for together.
  struct Block {
    uint4 head;
    uint2 h, q[4];
  };
  static __device__ __forceinline__ Block load_block(const unsigned char* __restrict__ row, int sb, int t) {
    const unsigned char* b = row + (sb >> 8) * Step::kBlockBytes;
    Block k;
    k.head = *reinterpret_cast<const uint4*>(b);
    k.h = kFiveBit ? *reinterpret_cast<const uint2*>(b + rf_blocks::Q5_K::kQhAt + 8 * t) : uint2{0u, 0u};
#pragma unroll
    for (int j = 0; j < 4; ++j) k.q[j] = *reinterpret_cast<const uint2*>(b + Step::kQsOffset + 32 * j + 8 * t);
    return k;
  }
};

// Q6_K: a lane's 8 bytes of ql and of qh (l = 8t .. 8t + 7 of both runs), the two runs' scales, d.
struct Wide6Fragments {
  typedef Wide6 Step;
  static constexpr int kDepth = 2;
  static constexpr int kCombineFloats = 64;
  static constexpr bool kWeightsBeforeWait = true;
  struct Raw {
    unsigned int ql[3], qh[3];
    int scale_a, scale_b, shift;
    unsigned short d;
  };
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ row, int c0, int t) {
    const int k = c0 >> 6, h = (k >> 1) & 1, u = k & 1;
    typedef rf_blocks::Q6_K B;
    const unsigned char* b = row + (k >> 2) * B::kBytes;
    Raw r;
    r.shift = load_aligned_words<2>(b + 64 * h + 32 * u + 8 * t, r.ql);  // both at even offsets: one shift
    load_aligned_words<2>(b + B::kQhAt + 32 * h + 8 * t, r.qh);
    r.scale_a = (int)(signed char)b[B::kScalesAt + 8 * h + 2 * u + (t >> 1)];  // scales of 16 elements: l / 16
    r.scale_b = (int)(signed char)b[B::kScalesAt + 8 * h + 2 * u + 4 + (t >> 1)];
    r.d = *reinterpret_cast<const unsigned short*>(b + B::kDAt);
    return r;
  }
  static __device__ __forceinline__ void decode(const Raw& r, int c0, unsigned int pairs[8]) {
    const int u = (c0 >> 6) & 1;
    const float d = rf_f16_to_float(r.d);
    const unsigned int scale_a = f16_pair(d * (float)r.scale_a), scale_b = f16_pair(d * (float)r.scale_b);
    unsigned int ql[2], qh[2];
    shift_words<2>(r.ql, r.shift, ql);
    shift_words<2>(r.qh, r.shift, qh);
    decode_q6_word(ql[0], qh[0], u, scale_a, scale_b, pairs + 0, pairs + 4);
    decode_q6_word(ql[1], qh[1], u, scale_a, scale_b, pairs + 2, pairs + 6);
  }
};

// The fragment format of a step shape (the K-quants only).
template <class Step>
struct Fragments;
template <>
struct Fragments<Wide<false>> {
  typedef WideFragments<false> Format;
};
template <>
struct Fragments<Wide<true>> {
  typedef WideFragments<true> Format;
};
template <>
struct Fragments<Wide6> {
  typedef Wide6Fragments Format;
};

#endif

}  // namespace mmq
}  // namespace

#include "matmul_mma_block32_fragments.h"  // the same for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, F16, BF16

// Part of the paged_attention op (kernels/paged_attention.hip includes it; built and hashed with it:
// hipcore/runtime/kernels.py source_files): the kernel's constants and the KV cache formats, each a
// lane's raw words of a row and how they decode to floats (block_formats.h's primitives).
#pragma once
#include "block_formats.h"  // the layouts and their decode primitives

namespace rf_paged_attention {

constexpr int kChunk = 8;                   // row elements per lane
constexpr int kMaxWarps = 4;                // warps per workgroup (the kernel's launch bounds)
constexpr int kMaxGroupHeads = 4;           // query heads served by one workgroup
constexpr int kMaxHeadDim = 256;            // kChunk * 32: a key per 32 lanes at most
constexpr int kMaxSplits = 64;              // splits of one token's keys per head chunk
constexpr int kMinKeysPerSplit = 128;       // the launcher sizes its slots with the same figures
constexpr int kSpreadMaxContext = 512;      // one workgroup per query head up to this context ...
constexpr int kSpreadMaxWorkgroups = 64;    // ... in launches of at most this many (token, query head) pairs
constexpr float kLog2e = 1.4426950408889634f;

// ---- KV formats: the raw words of one lane's 8 elements, loaded apart from decoding them ---------
// lane_offset: where a lane's words start in a row; lane_aux: a second per-lane constant for load.

// The 16-bit formats' rows: a lane's 8 elements are one 16-byte word; F16Kv and BF16Kv differ only in decode.
struct Halves16Kv {
  typedef uint4 Raw;
  static constexpr int kUnroll = 4;
  static __device__ __forceinline__ unsigned int row_bytes(int head_dim) { return (unsigned int)head_dim * 2; }
  static __device__ __forceinline__ int lane_offset(int chunk) { return 16 * chunk; }
  static __device__ __forceinline__ int lane_aux(int) { return 0; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ p, int) {
    return *reinterpret_cast<const uint4*>(p);
  }
};

struct F16Kv : Halves16Kv {
  static __device__ __forceinline__ void decode(const Raw r, float v[kChunk]) {
    const unsigned int w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = rf_f16_to_float((unsigned short)(w[i] & 0xffffu));
      v[2 * i + 1] = rf_f16_to_float((unsigned short)(w[i] >> 16));
    }
  }
};

struct BF16Kv : Halves16Kv {
  static __device__ __forceinline__ void decode(const Raw r, float v[kChunk]) {
    const unsigned int w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = rf_uint_as_float(w[i] << 16);
      v[2 * i + 1] = rf_uint_as_float(w[i] & 0xffff0000u);
    }
  }
};

struct F32Kv {
  struct Raw {
    float4 a, b;
  };
  static constexpr int kUnroll = 2;  // twice the bytes per key: half the keys in flight, same registers
  static __device__ __forceinline__ unsigned int row_bytes(int head_dim) { return (unsigned int)head_dim * 4; }
  static __device__ __forceinline__ int lane_offset(int chunk) { return 32 * chunk; }
  static __device__ __forceinline__ int lane_aux(int) { return 0; }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ p, int) {
    const float4* f = reinterpret_cast<const float4*>(p);
    return {f[0], f[1]};
  }
  static __device__ __forceinline__ void decode(const Raw r, float v[kChunk]) {
    v[0] = r.a.x; v[1] = r.a.y; v[2] = r.a.z; v[3] = r.a.w;
    v[4] = r.b.x; v[5] = r.b.y; v[6] = r.b.z; v[7] = r.b.w;
  }
};

// Q8_0 (block_format_q8_0.h): chunk c is qs[8(c%4) .. 8(c%4)+7] of block c/4. A lane's words start at its
// block (the scale); lane_aux is where its 8 quants sit in the block.
struct Q8_0Kv {
  typedef rf_blocks::Q8_0 B;
  struct Raw {
    unsigned short d, q[4];
  };
  // 2: five 16-bit words per key, unpacked into registers each, spill on AMD at 4 with two tiles in flight.
  static constexpr int kUnroll = 2;
  static __device__ __forceinline__ unsigned int row_bytes(int head_dim) { return (unsigned int)(head_dim / B::kValues) * B::kBytes; }
  static __device__ __forceinline__ int lane_offset(int chunk) { return (chunk >> 2) * B::kBytes; }
  static __device__ __forceinline__ int lane_aux(int chunk) { return B::kQsAt + 8 * (chunk & 3); }
  static __device__ __forceinline__ Raw load(const unsigned char* __restrict__ p, int aux) {
    const unsigned short* q = reinterpret_cast<const unsigned short*>(p + aux);
    return {*reinterpret_cast<const unsigned short*>(p), {q[0], q[1], q[2], q[3]}};
  }
  static __device__ __forceinline__ void decode(const Raw r, float v[kChunk]) { B::decode8(rf_f16_to_float(r.d), r.q, v); }
};

}  // namespace rf_paged_attention

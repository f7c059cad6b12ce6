// Part of the matmul_mma op (kernels/matmul_mma.hip includes it after its constants, load_partial and lesser_of,
// which this part uses; built and hashed with it: hipcore/runtime/kernels.py source_files): a launch's shape and
// where its tiles go, and the epilogues that combine a tile's partial results: the residual add, split-K and the
// SwiGLU pairs.
#pragma once

#include "hip_compat.h"
#include "gated_activation.h"  // the pairs' SwiGLU, the up product's SwiGLU or GeGLU

namespace {
namespace mmq {

// The launch's shape and where its results go.
// x is float32, or f16 for the x16 and swiglu entries. With a SwiGLU pair (the swiglu entries) W and y are the
// gate's, W_up and y_up the up projection's (y and y_up: float32 scratch), h16 the f16 result.
struct Launch {
  float* y;
  const unsigned char* W;
  const void* x;
  unsigned char* workspace;  // counters, then the partial tiles (splits > 1 only)
  int rows, cols, n_tokens, splits, accumulate;
  float* y_up;
  const unsigned char* W_up;
  unsigned short* h16;
};

// y[t, r] = v, or y[t, r] += v (the residual connection), where the tile's element exists.
static __device__ __forceinline__ void store_result(const Launch& a, int r, int t, float v) {
  if (t < a.n_tokens && r < a.rows) {
    float* out = a.y + (unsigned long long)t * a.rows + r;
    *out = a.accumulate ? *out + v : v;
  }
}

// Split-K: a workgroup's share of a tile (kAcc accumulators per thread, kTileRows x TN in all) is added to
// the others' by the last of the tile's splits to arrive. Each writes its accumulators to the workspace,
// slot k of every thread side by side (coalesced), and counts itself in the tile's counter; the last reads
// its own slots of every split back in split order (the same order whoever arrives last: a replay equals its
// eager twin bit for bit), so no fragment layout is involved, and sets the counter back to zero for the next
// launch. Returns whether this workgroup holds the whole tile in acc (uniform across the workgroup).
// kBatch > 1: the last workgroup runs the sum alone, often on an otherwise idle GPU, so its L2 round trips are the
// launch's tail; it loads kBatch splits' partials before it adds any of them (the same sum, in split order), one
// round trip per kBatch splits where a 16-way split took 16. It costs the registers of kBatch * kAcc loads, which
// the fragment path's K-quant entries have to spare (hipcore/ops/matmul_mma.py measures it); light entries would
// lose occupancy (the F16 fragment entry went from 64 to 118 registers at 64 loads), so they keep 1.
template <int kBatch = 1, int kAcc>
__device__ __forceinline__ bool combine_splits(float (&acc)[kAcc], const Launch& a, int tile, int split, int tid, int* last) {
  constexpr unsigned long long kPartFloats = (unsigned long long)kAcc * kThreads;
  const int splits = a.splits;
  int* counters = reinterpret_cast<int*>(a.workspace);
  float* partials = reinterpret_cast<float*>(a.workspace + kCounterBytes);
  float* part = partials + ((unsigned long long)tile * splits + split) * kPartFloats + tid;
#pragma unroll
  for (int e = 0; e < kAcc; ++e) part[e * kThreads] = acc[e];
  // Publish the partial. Every thread fences its own writes (AMD's fence waits for the wave's own stores
  // only), and the counting thread fences again after the barrier, so the count is seen only after every write.
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    __threadfence();
    *last = atomicAdd(counters + tile, 1) == splits - 1;
  }
  __syncthreads();
  if (!*last) return false;  // uniform: every thread read the same flag
  __threadfence();
  const float* mine = partials + (unsigned long long)tile * splits * kPartFloats + tid;
#pragma unroll
  for (int e = 0; e < kAcc; ++e) acc[e] = 0.0f;
  if constexpr (kBatch == 1) {
    for (int s = 0; s < splits; ++s) {  // in split order
      const float* src = mine + (unsigned long long)s * kPartFloats;
#pragma unroll
      for (int e = 0; e < kAcc; ++e) acc[e] += load_partial(src + e * kThreads);
    }
  } else {  // kBatch splits' partials loaded before any is added: one round trip per kBatch splits
    for (int s0 = 0; s0 < splits; s0 += kBatch) {
      float part_of[kBatch][kAcc];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const float* src = mine + (unsigned long long)lesser_of(s0 + b, splits - 1) * kPartFloats;
#pragma unroll
        for (int e = 0; e < kAcc; ++e) part_of[b][e] = load_partial(src + e * kThreads);
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (s0 + b < splits) {  // uniform
#pragma unroll
          for (int e = 0; e < kAcc; ++e) acc[e] += part_of[b][e];
        }
      }
    }
  }
  if (tid == 0) counters[tile] = 0;  // ready for the next launch
  return true;
}

// SwiGLU pairs: the gate's and the up projection's tiles of one place are two items of one launch (so
// that the two products share its waves: a prompt step's 896 gate tiles alone leave the last of four waves
// 40% full on an H100), each stored to its own float32 scratch. The second of the pair to finish reads both
// tiles back from L2 (load_partial; its own too, row by row, coalesced, with no accumulator held), writes
// silu(gate) * up as f16 into h16 (the down product's x, which it would round to f16 anyway) and sets the
// tile's counter back to zero. Needs splits == 1 and at most kCounterBytes / 4 tiles (the launcher's
// checks); silu as silu_mul.hip computes it (gated_activation.h). kInPlace: the result goes to a.y as float32, over
// the gate's tile (the fragment path's pairs: the down product after them reads float32 x), and `tile` is the
// pair's counter.
template <int TN, bool kInPlace = false>
__device__ __forceinline__ void swiglu_pair(const Launch& a, int tile, int r0, int t0, int tid, int* last) {
  int* counters = reinterpret_cast<int*>(a.workspace);
  __threadfence();  // as combine_splits: every thread's writes, then the count
  __syncthreads();
  if (tid == 0) {
    __threadfence();
    *last = atomicAdd(counters + tile, 1) == 1;
  }
  __syncthreads();
  if (!*last) return;  // uniform
  __threadfence();
  const int rows = lesser_of(kTileRows, a.rows - r0), tokens = lesser_of(TN, a.n_tokens - t0);
#pragma unroll 8  // 16 loads in flight; a whole unroll held all 64 and cost the kernel 65 registers
  for (int k = tid; k < kTileRows * TN; k += kThreads) {
    const int r = k % kTileRows, t = k / kTileRows;
    if (r < rows && t < tokens) {
      const unsigned long long i = (unsigned long long)(t0 + t) * a.rows + r0 + r;
      const float g = load_partial(a.y + i);
      const float u = load_partial(a.y_up + i);
      if constexpr (kInPlace)
        a.y[i] = rf_silu_gated(g, u);
      else
        a.h16[i] = rf_float_to_f16(rf_silu_gated(g, u));
    }
  }
  if (tid == 0) counters[tile] = 0;  // the pair's counter, ready for the next launch
}

}  // namespace mmq
}  // namespace

// Part of moe_experts.hip: the grouped path for prompts and batches, where many (token, slot) pairs share an expert.
// A workgroup takes one expert and a tile of kTileRows rows; it gathers the pairs that chose its expert (a scan of ids
// into shared memory, kSegment pairs at a time: no sort, no workspace, no host synchronization), quantizes their inputs
// (a quantized type's) into shared memory once, as many pairs a pass as kMaxStagedSlices holds, and its warps walk the
// tile's rows, each slice of the weights decoded once for up to kGroup pairs. The weights of an expert are thus read
// once per kGroup of its pairs instead of once per pair, and each input quantized once a workgroup instead of once a
// row (which made this path compute-bound: 466 us for gpt-oss-20b's gate|up at 8 tokens on an H100, against 187 for
// the per-pair path). An input wider than the staged slices hold is quantized in the loop. The order in which pairs
// are gathered (atomics) changes nothing: each pair's result is computed alone, with the per-pair path's arithmetic.
//   moe_gate_up_grouped_<type>: h as moe_gate_up_<type>'s.
//   moe_down_grouped_<type>:    terms[t, j] = weights[t, j] (down_e . h[t, j] + bias_e), float32 [tokens, k, hidden];
//                               moe_sum_slots_f32 then adds sum_j terms[t, j] into out in slot order.
#pragma once

namespace {
namespace moe {

constexpr int kGroup = 2;        // pairs a warp multiplies at once, inputs quantized in the loop (4 held Q6_K's gate|up
                                 // past 256 VGPRs on AMD)
constexpr int kGroupRows = 1;    // rows (of gate and of up, or of down) a warp walks together there: 2 kept 16
                                 // accumulators and the decoded slices of 4 rows live, which spilled on every AMD
                                 // target. gate|up takes __launch_bounds__(256), down (256, 2): nvcc held down's float
                                 // types to 64 registers and spilled without the second, CDNA spilled Q6_K's gate|up
constexpr int kStagedGroup = 2;  // pairs a warp multiplies at once, inputs staged (a pass's pairs past it: the same rows again, from L1)
constexpr int kStagedGateUpRows = 1, kStagedDownRows = 2;  // rows a warp walks together, inputs staged
constexpr int kTileRows = 64;    // rows of one expert a workgroup takes
constexpr int kSegment = 2048;   // pairs gathered at a time (8 KiB of shared memory)

struct Gathered {
  int pairs[kSegment];
  int count;
};

// The pairs in [begin, end) whose id is `expert`, into g (all threads of the block call it).
static __device__ __forceinline__ void gather(Gathered& g, const int* __restrict__ ids, int begin, int end, int expert) {
  if (threadIdx.x == 0) g.count = 0;
  __syncthreads();
  for (int p = begin + (int)threadIdx.x; p < end; p += (int)blockDim.x)
    if (ids[p] == expert) g.pairs[atomicAdd(&g.count, 1)] = p;
  __syncthreads();
}

// The loops of a grouped entry, written out in each (a lambda body was not inlined: its captures went to the stack on
// NVIDIA and spilled scalar registers on CDNA): for every workgroup item (expert e, rows [r_begin, r_end)) and every
// segment of pairs, the pairs that chose e gathered into g (n of them).
#define RF_MOE_FOR_EACH_EXPERT_TILE(pairs, rows)                                                                     \
  __shared__ Gathered g;                                                                                            \
  const int tiles = ((rows) + kTileRows - 1) / kTileRows;                                                           \
  for (int item = (int)blockIdx.x; item < n_expert * tiles; item += (int)gridDim.x)                                 \
    for (int begin = 0, e = item / tiles, r_begin = (item % tiles) * kTileRows,                                     \
             r_end = r_begin + kTileRows < (rows) ? r_begin + kTileRows : (rows);                                   \
         begin < (pairs); begin += kSegment)                                                                        \
      for (int n = (gather(g, ids, begin, begin + kSegment < (pairs) ? begin + kSegment : (pairs), e), g.count), once = 1; \
           once; once = 0, __syncthreads()) /* every warp is done with g before the next gather */

// gate|up of rows [r_begin, r_end) of expert e (its first row `expert`) for the np pairs g.pairs[p0 ..): R rows of gate
// and of up and NB pairs a warp at once; kStaged: the pairs' x quantized in `staged`, pair p0 + i's from i * slices.
template <class P, int R, int NB, bool kStaged>
__device__ __forceinline__ void gate_up_rows(float* __restrict__ h, const float* __restrict__ x,
                                             const unsigned char* gate, const unsigned char* up,
                                             const typename P::Staged& staged, const Gathered& g, int p0, int np,
                                             int slices, unsigned long long expert, int r_begin, int r_end,
                                             const float* __restrict__ gate_bias, const float* __restrict__ up_bias,
                                             int k, int ff, int hidden, int activation) {
  const unsigned long long row_bytes = P::row_bytes(hidden);
  const int lane = (int)threadIdx.x % WARP_SIZE, warp = (int)threadIdx.x / WARP_SIZE;
  const int warps = (int)blockDim.x / WARP_SIZE;
  for (int r0 = r_begin + warp * R; r0 < r_end; r0 += warps * R) {  // uniform across the warp
    const unsigned char* w[2 * R];
#pragma unroll
    for (int r = 0; r < R; ++r) {  // rows past the end read the last row again and are not written
      const unsigned long long row = expert + (unsigned long long)(r0 + r < ff ? r0 + r : ff - 1);
      w[r] = gate + row * row_bytes;
      w[R + r] = up + row * row_bytes;
    }
    for (int c = 0; c < np; c += NB) {
      int pair[NB], at[NB];
      const float* xs[NB];
#pragma unroll
      for (int b = 0; b < NB; ++b) {  // past the last pair: the first again, not written
        const int i = c + b < np ? c + b : c;
        pair[b] = g.pairs[p0 + i], at[b] = i * slices;
        xs[b] = x + (unsigned long long)(pair[b] / k) * hidden;
      }
      float acc[2 * R][NB];
#pragma unroll
      for (int r = 0; r < 2 * R; ++r)
#pragma unroll
        for (int b = 0; b < NB; ++b) acc[r][b] = 0.0f;
      if (kStaged)
        P::template rows_batched_staged<2 * R, NB, P::kGateUpInFlight>(w, staged, at, xs, hidden, acc);
      else
        P::template rows_batched<2 * R, NB>(w, xs, hidden, acc);
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int b = 0; b < NB; ++b) {
          float gv = rf_warp_sum(acc[r][b]), uv = rf_warp_sum(acc[R + r][b]);
          if (lane == r * NB + b && r0 + r < ff && c + b < np) {
            const unsigned long long bias = expert + (unsigned long long)(r0 + r);
            if (gate_bias) gv += gate_bias[bias];
            if (up_bias) uv += up_bias[bias];
            h[(unsigned long long)pair[b] * ff + r0 + r] = activation ? rf_swiglu_oai_gated(gv, uv) : rf_silu_gated(gv, uv);
          }
        }
    }
  }
}

// down of rows [r_begin, r_end) of expert e for the np pairs g.pairs[p0 ..), as gate_up_rows: each pair's weighted
// term into terms.
template <class P, int R, int NB, bool kStaged>
__device__ __forceinline__ void down_rows(float* __restrict__ terms, const float* __restrict__ h,
                                          const unsigned char* down, const typename P::Staged& staged,
                                          const Gathered& g, int p0, int np, int slices, unsigned long long expert,
                                          int r_begin, int r_end, const float* __restrict__ weights,
                                          const float* __restrict__ down_bias, int hidden, int ff) {
  const unsigned long long row_bytes = P::row_bytes(ff);
  const int lane = (int)threadIdx.x % WARP_SIZE, warp = (int)threadIdx.x / WARP_SIZE;
  const int warps = (int)blockDim.x / WARP_SIZE;
  for (int r0 = r_begin + warp * R; r0 < r_end; r0 += warps * R) {  // uniform across the warp
    const unsigned char* w[R];
#pragma unroll
    for (int r = 0; r < R; ++r)
      w[r] = down + (expert + (unsigned long long)(r0 + r < hidden ? r0 + r : hidden - 1)) * row_bytes;
    for (int c = 0; c < np; c += NB) {
      int pair[NB], at[NB];
      const float* hs[NB];
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const int i = c + b < np ? c + b : c;
        pair[b] = g.pairs[p0 + i], at[b] = i * slices;
        hs[b] = h + (unsigned long long)pair[b] * ff;
      }
      float acc[R][NB];
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int b = 0; b < NB; ++b) acc[r][b] = 0.0f;
      if (kStaged)
        P::template rows_batched_staged<R, NB, P::kDownInFlight>(w, staged, at, hs, ff, acc);
      else
        P::template rows_batched<R, NB>(w, hs, ff, acc);
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int b = 0; b < NB; ++b) {
          float y = rf_warp_sum(acc[r][b]);
          if (lane == r * NB + b && r0 + r < hidden && c + b < np) {
            if (down_bias) y += down_bias[expert + (unsigned long long)(r0 + r)];
            terms[(unsigned long long)pair[b] * hidden + r0 + r] = weights[pair[b]] * y;
          }
        }
    }
  }
}

// The pairs a staged pass holds: inputs of `slices` slices each in kMaxStagedSlices; 0 where the type multiplies its
// input unquantized or one input is wider (quantized in the loop, every pair in one pass).
template <class P>
__device__ __forceinline__ int staged_pairs(int slices) {
  return P::kStages && slices <= kMaxStagedSlices ? kMaxStagedSlices / slices : 0;
}

// The inputs of pairs g.pairs[p0 .. p0 + np) quantized into staged (pair p0 + i's from i * slices), by every thread of
// the workgroup, between barriers (the pass before is done with staged; every slice is in before any warp reads).
// Pair p's input starts at base + (p / per) * cols: x for gate|up (per = k), h for down (per = 1).
template <class P>
__device__ __forceinline__ void stage_pairs(typename P::Staged& staged, const Gathered& g, int p0, int np, int slices,
                                            const float* __restrict__ base, int per, int cols) {
  __syncthreads();
  for (int i = (int)threadIdx.x; i < np * slices; i += (int)blockDim.x) {
    const int b = i / slices;
    P::stage_slice(staged, i, base + (unsigned long long)(g.pairs[p0 + b] / per) * cols, i - b * slices);
  }
  __syncthreads();
}

template <class P>
__device__ __forceinline__ void gate_up_grouped(float* __restrict__ h, const float* __restrict__ x, const void* gate_,
                                                const void* up_, const int* __restrict__ ids,
                                                const float* __restrict__ gate_bias, const float* __restrict__ up_bias,
                                                int tokens, int k, int ff, int hidden, int n_expert, int activation) {
  rf_check_wave_size();
  __shared__ typename P::Staged staged;
  const unsigned char* gate = static_cast<const unsigned char*>(gate_);
  const unsigned char* up = static_cast<const unsigned char*>(up_);
  const int slices = hidden / 32, cap = staged_pairs<P>(slices);
  RF_MOE_FOR_EACH_EXPERT_TILE(tokens * k, ff) {
    const unsigned long long expert = (unsigned long long)e * ff;
    if (cap == 0) {  // uniform: the workgroup's
      gate_up_rows<P, kGroupRows, kGroup, false>(h, x, gate, up, staged, g, 0, n, 0, expert, r_begin, r_end, gate_bias,
                                                 up_bias, k, ff, hidden, activation);
    } else {
      for (int p0 = 0; p0 < n; p0 += cap) {
        const int np = n - p0 < cap ? n - p0 : cap;
        stage_pairs<P>(staged, g, p0, np, slices, x, k, hidden);
        gate_up_rows<P, kStagedGateUpRows, kStagedGroup, true>(h, x, gate, up, staged, g, p0, np, slices, expert,
                                                               r_begin, r_end, gate_bias, up_bias, k, ff, hidden,
                                                               activation);
      }
    }
  }
}

template <class P>
__device__ __forceinline__ void down_grouped(float* __restrict__ terms, const float* __restrict__ h, const void* down_,
                                             const int* __restrict__ ids, const float* __restrict__ weights,
                                             const float* __restrict__ down_bias, int tokens, int k, int hidden, int ff,
                                             int n_expert) {
  rf_check_wave_size();
  __shared__ typename P::Staged staged;
  const unsigned char* down = static_cast<const unsigned char*>(down_);
  const int slices = ff / 32, cap = staged_pairs<P>(slices);
  RF_MOE_FOR_EACH_EXPERT_TILE(tokens * k, hidden) {
    const unsigned long long expert = (unsigned long long)e * hidden;
    if (cap == 0) {  // uniform: the workgroup's
      down_rows<P, kGroupRows, kGroup, false>(terms, h, down, staged, g, 0, n, 0, expert, r_begin, r_end, weights,
                                              down_bias, hidden, ff);
    } else {
      for (int p0 = 0; p0 < n; p0 += cap) {
        const int np = n - p0 < cap ? n - p0 : cap;
        stage_pairs<P>(staged, g, p0, np, slices, h, 1, ff);
        down_rows<P, kStagedDownRows, kStagedGroup, true>(terms, h, down, staged, g, p0, np, slices, expert, r_begin,
                                                          r_end, weights, down_bias, hidden, ff);
      }
    }
  }
}

#undef RF_MOE_FOR_EACH_EXPERT_TILE

}  // namespace moe
}  // namespace

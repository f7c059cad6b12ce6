// Part of moe_experts.hip: the grouped path for prompts and batches, where many (token, slot) pairs share an expert.
// A workgroup takes one expert and a tile of kTileRows rows; it gathers the pairs that chose its expert (a scan of ids
// into shared memory, kSegment pairs at a time: no sort, no workspace, no host synchronization), and its warps walk the
// tile's rows kRows at a time, each slice of the weights decoded once for up to kGroup pairs. The weights of an
// expert are thus read once per kGroup of its pairs instead of once per pair. The order in which pairs are gathered
// (atomics) changes nothing: each pair's result is computed alone, with the same arithmetic as the per-pair path.
//   moe_gate_up_grouped_<type>: h as moe_gate_up_<type>'s.
//   moe_down_grouped_<type>:    terms[t, j] = weights[t, j] (down_e . h[t, j] + bias_e), float32 [tokens, k, hidden];
//                               moe_sum_slots_f32 then adds sum_j terms[t, j] into out in slot order.
#pragma once

namespace {
namespace moe {

constexpr int kGroup = 2;        // pairs a warp multiplies at once (4 held Q6_K's gate|up past 256 VGPRs on AMD)
constexpr int kGroupRows = 1;    // rows (of gate and of up, or of down) a warp walks together: 2 kept 16 accumulators
                                 // and the decoded slices of 4 rows live, which spilled on every AMD target. gate|up
                                 // takes __launch_bounds__(256), down (256, 2): nvcc held down's float types to 64
                                 // registers and spilled without the second, CDNA spilled Q6_K's gate|up with it
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

template <class P>
__device__ __forceinline__ void gate_up_grouped(float* __restrict__ h, const float* __restrict__ x, const void* gate_,
                                                const void* up_, const int* __restrict__ ids,
                                                const float* __restrict__ gate_bias, const float* __restrict__ up_bias,
                                                int tokens, int k, int ff, int hidden, int n_expert, int activation) {
  rf_check_wave_size();
  const unsigned char* gate = static_cast<const unsigned char*>(gate_);
  const unsigned char* up = static_cast<const unsigned char*>(up_);
  const unsigned long long row_bytes = P::row_bytes(hidden);
  const int lane = (int)threadIdx.x % WARP_SIZE, warp = (int)threadIdx.x / WARP_SIZE;
  const int warps = (int)blockDim.x / WARP_SIZE;
  RF_MOE_FOR_EACH_EXPERT_TILE(tokens * k, ff) {
    const unsigned long long expert = (unsigned long long)e * ff;
    for (int r0 = r_begin + warp * kGroupRows; r0 < r_end; r0 += warps * kGroupRows) {  // uniform across the warp
      const unsigned char* w[2 * kGroupRows];
#pragma unroll
      for (int r = 0; r < kGroupRows; ++r) {  // rows past the end read the last row again and are not written
        const unsigned long long row = expert + (unsigned long long)(r0 + r < ff ? r0 + r : ff - 1);
        w[r] = gate + row * row_bytes;
        w[kGroupRows + r] = up + row * row_bytes;
      }
      for (int c = 0; c < n; c += kGroup) {
        int pair[kGroup];
        const float* xs[kGroup];
#pragma unroll
        for (int b = 0; b < kGroup; ++b) {  // past the last pair: the first again, not written
          pair[b] = g.pairs[c + b < n ? c + b : c];
          xs[b] = x + (unsigned long long)(pair[b] / k) * hidden;
        }
        float acc[2 * kGroupRows][kGroup];
#pragma unroll
        for (int r = 0; r < 2 * kGroupRows; ++r)
#pragma unroll
          for (int b = 0; b < kGroup; ++b) acc[r][b] = 0.0f;
        P::template rows_batched<2 * kGroupRows, kGroup>(w, xs, hidden, acc);
#pragma unroll
        for (int r = 0; r < kGroupRows; ++r)
#pragma unroll
          for (int b = 0; b < kGroup; ++b) {
            float gv = rf_warp_sum(acc[r][b]), uv = rf_warp_sum(acc[kGroupRows + r][b]);
            if (lane == r * kGroup + b && r0 + r < ff && c + b < n) {
              const unsigned long long bias = expert + (unsigned long long)(r0 + r);
              if (gate_bias) gv += gate_bias[bias];
              if (up_bias) uv += up_bias[bias];
              h[(unsigned long long)pair[b] * ff + r0 + r] = activation ? rf_swiglu_oai_gated(gv, uv) : rf_silu_gated(gv, uv);
            }
          }
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
  const unsigned char* down = static_cast<const unsigned char*>(down_);
  const unsigned long long row_bytes = P::row_bytes(ff);
  const int lane = (int)threadIdx.x % WARP_SIZE, warp = (int)threadIdx.x / WARP_SIZE;
  const int warps = (int)blockDim.x / WARP_SIZE;
  RF_MOE_FOR_EACH_EXPERT_TILE(tokens * k, hidden) {
    const unsigned long long expert = (unsigned long long)e * hidden;
    for (int r0 = r_begin + warp * kGroupRows; r0 < r_end; r0 += warps * kGroupRows) {
      const unsigned char* w[kGroupRows];
#pragma unroll
      for (int r = 0; r < kGroupRows; ++r)
        w[r] = down + (expert + (unsigned long long)(r0 + r < hidden ? r0 + r : hidden - 1)) * row_bytes;
      for (int c = 0; c < n; c += kGroup) {
        int pair[kGroup];
        const float* hs[kGroup];
#pragma unroll
        for (int b = 0; b < kGroup; ++b) {
          pair[b] = g.pairs[c + b < n ? c + b : c];
          hs[b] = h + (unsigned long long)pair[b] * ff;
        }
        float acc[kGroupRows][kGroup];
#pragma unroll
        for (int r = 0; r < kGroupRows; ++r)
#pragma unroll
          for (int b = 0; b < kGroup; ++b) acc[r][b] = 0.0f;
        P::template rows_batched<kGroupRows, kGroup>(w, hs, ff, acc);
#pragma unroll
        for (int r = 0; r < kGroupRows; ++r)
#pragma unroll
          for (int b = 0; b < kGroup; ++b) {
            float y = rf_warp_sum(acc[r][b]);
            if (lane == r * kGroup + b && r0 + r < hidden && c + b < n) {
              if (down_bias) y += down_bias[expert + (unsigned long long)(r0 + r)];
              terms[(unsigned long long)pair[b] * hidden + r0 + r] = weights[pair[b]] * y;
            }
          }
      }
    }
  }
}

#undef RF_MOE_FOR_EACH_EXPERT_TILE

}  // namespace moe
}  // namespace

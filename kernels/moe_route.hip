// A mixture-of-experts router's choice (hipcore/ops/moe_route.py): per token, the k largest of n_expert logits
// (n_expert <= 256, k <= 32), largest first, equal logits lower index first, and their weights:
//   mode 0 (softmax_topk, qwen3moe): softmax over all experts, the chosen probabilities, divided by their sum
//          when `normalize`;
//   mode 1 (topk_softmax, gpt-oss):  softmax over the k chosen logits.
// One warp a token, the logits in registers (256 / WARP_SIZE a lane); k rounds of a warp-wide arg-max, each
// marking its winner taken in the owning lane. NaN logits count as -inf. No host synchronization and a launch
// shape fixed by the token count: capturable in the decode graph.
#include "hip_compat.h"

namespace {
constexpr int kMaxExperts = 256;
constexpr int kPerLane = kMaxExperts / WARP_SIZE;

// (value, expert) of b replaces a's when larger, or equal with a lower expert index.
static __device__ __forceinline__ bool beats(float bv, int be, float av, int ae) {
  return bv > av || (bv == av && be < ae);
}
}  // namespace

extern "C" __global__ __launch_bounds__(256) void moe_route_f32(int* __restrict__ ids, float* __restrict__ weights,
                                                               const float* __restrict__ logits, int tokens,
                                                               int n_expert, int k, int mode, int normalize) {
  rf_check_wave_size();
  const int lane = (int)threadIdx.x % WARP_SIZE;
  const int warps = (int)blockDim.x / WARP_SIZE;
  for (int t = (int)blockIdx.x * warps + (int)threadIdx.x / WARP_SIZE; t < tokens; t += (int)gridDim.x * warps) {
    const float* row = logits + (unsigned long long)t * n_expert;
    float v[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + i * WARP_SIZE;
      const float x = e < n_expert ? row[e] : -RF_INFINITY;
      v[i] = x == x ? x : -RF_INFINITY;
    }
    unsigned int taken = 0;  // bit i: this lane's expert lane + i * WARP_SIZE is chosen
    float mine = -RF_INFINITY;  // lane j < k: the j-th choice's logit and expert
    int mine_id = 0;
    float top = -RF_INFINITY;  // the largest logit (the first round's, every lane's): every softmax subtracts it
    for (int j = 0; j < k; ++j) {
      float best = -RF_INFINITY;
      int best_e = 0x7fffffff;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int e = lane + i * WARP_SIZE;
        if (e < n_expert && !((taken >> i) & 1u) && beats(v[i], e, best, best_e)) best = v[i], best_e = e;
      }
#pragma unroll
      for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        const float other = __shfl_xor(best, offset);
        const int other_e = __shfl_xor(best_e, offset);
        if (beats(other, other_e, best, best_e)) best = other, best_e = other_e;
      }
      if (best_e % WARP_SIZE == lane) taken |= 1u << (best_e / WARP_SIZE);
      if (lane == j) mine = best, mine_id = best_e;
      if (j == 0) top = best;
    }
    float w;
    if (mode == 0) {
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i)
        if (lane + i * WARP_SIZE < n_expert) sum += expf(v[i] - top);
      sum = rf_warp_sum(sum);
      w = lane < k ? expf(mine - top) / sum : 0.0f;
      if (normalize) w /= rf_warp_sum(w);
    } else {
      w = lane < k ? expf(mine - top) : 0.0f;
      w /= rf_warp_sum(w);
    }
    if (lane < k) {
      ids[(unsigned long long)t * k + lane] = mine_id;
      weights[(unsigned long long)t * k + lane] = w;
    }
  }
}

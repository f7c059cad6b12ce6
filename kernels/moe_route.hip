// A mixture-of-experts router's choice (hipcore/ops/moe_route.py): per token, the k largest of n_expert logits
// (n_expert <= 256, k <= 32; plus the router's bias where one is given, as add_bias.hip adds it: the same bits),
// largest first, equal logits lower index first, and their weights:
//   mode 0 (softmax_topk, qwen3moe): softmax over all experts, the chosen probabilities, divided by their sum
//          when `normalize`;
//   mode 1 (topk_softmax, gpt-oss):  softmax over the k chosen logits.
// One warp a token, the logits in registers (256 / WARP_SIZE a lane). NaN logits count as -inf. No host
// synchronization and a launch shape fixed by the token count: capturable in the decode graph.
// Up to kMaxListK choices (every model's k): each lane sorts its logits into a list of the best K (4 or 8), and
// log2(WARP_SIZE) butterfly steps merge each lane's list with its partner's, keeping the best K (a bitonic merge),
// until every lane holds the token's top K in order. k rounds of a warp-wide arg-max take a round's shuffles and a
// rescan of the lane's logits per choice, one after another: Qwen3-30B-A3B's 8 of 128 took 3.40 us a launch on an
// NVIDIA H100, the router's bias add (128 floats) 1.05. More choices keep the rounds. The order is the same strict
// one either way (larger first, equal logits lower index first): the same choices and weights, to the bit.
#include "hip_compat.h"

namespace {
constexpr int kMaxExperts = 256;
constexpr int kPerLane = kMaxExperts / WARP_SIZE;

constexpr int kMaxListK = 8;
constexpr int kPadding = 0x7fffffff;  // the expert index of a list's empty places and of slots past n_expert

// (value, expert) of b replaces a's when larger, or equal with a lower expert index.
static __device__ __forceinline__ bool beats(float bv, int be, float av, int ae) {
  return bv > av || (bv == av && be < ae);
}

// Places a and b in order: the better of the two at a.
static __device__ __forceinline__ void order(float& av, int& ae, float& bv, int& be) {
  const bool swap = beats(bv, be, av, ae);
  const float v = swap ? bv : av;
  const int e = swap ? be : ae;
  bv = swap ? av : bv;
  be = swap ? ae : be;
  av = v;
  ae = e;
}

// A bitonic sequence of K (a power of two) sorted best first.
template <int K>
__device__ __forceinline__ void bitonic_merge(float v[K], int e[K]) {
#pragma unroll
  for (int stride = K / 2; stride > 0; stride /= 2)
#pragma unroll
    for (int i = 0; i < K; ++i)
      if ((i & stride) == 0) order(v[i], e[i], v[i + stride], e[i + stride]);
}

// K values sorted best first (a bitonic sorting network).
template <int K>
__device__ __forceinline__ void bitonic_sort(float v[K], int e[K]) {
#pragma unroll
  for (int size = 2; size <= K; size *= 2)
#pragma unroll
    for (int stride = size / 2; stride > 0; stride /= 2)
#pragma unroll
      for (int i = 0; i < K; ++i) {
        const int j = i + stride;
        if ((i & stride) != 0) continue;
        if ((i & size) == 0) order(v[i], e[i], v[j], e[j]);
        else order(v[j], e[j], v[i], e[i]);
      }
}

// The best K of two lists sorted best first, into a (sorted): b reversed against a leaves a bitonic sequence.
template <int K>
__device__ __forceinline__ void keep_best(float av[K], int ae[K], const float bv[K], const int be[K]) {
#pragma unroll
  for (int i = 0; i < K; ++i)
    if (beats(bv[K - 1 - i], be[K - 1 - i], av[i], ae[i])) av[i] = bv[K - 1 - i], ae[i] = be[K - 1 - i];
  bitonic_merge<K>(av, ae);
}

// The token's best K (value, expert) in every lane, best first, from the lane's logits v (slot i: expert
// lane + i * WARP_SIZE; slots past n_expert are padding).
template <int K>
__device__ __forceinline__ void warp_top(const float v[kPerLane], int lane, int n_expert, float top_v[K], int top_e[K]) {
#pragma unroll
  for (int c = 0; c < (kPerLane + K - 1) / K; ++c) {  // the lane's slots a list of K at a time
    float cv[K];
    int ce[K];
#pragma unroll
    for (int i = 0; i < K; ++i) {
      const int slot = c * K + i, e = lane + slot * WARP_SIZE;
      const bool real = slot < kPerLane && e < n_expert;
      cv[i] = real ? v[slot < kPerLane ? slot : 0] : -RF_INFINITY;
      ce[i] = real ? e : kPadding;
    }
    bitonic_sort<K>(cv, ce);
    if (c == 0) {
#pragma unroll
      for (int i = 0; i < K; ++i) top_v[i] = cv[i], top_e[i] = ce[i];
    } else {
      keep_best<K>(top_v, top_e, cv, ce);
    }
  }
#pragma unroll
  for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
    // keep_best against the partner lane's list, taken a pair of places (i, K - 1 - i) at a time: its values at
    // both places are read before either is replaced (fewer registers than a copy of the whole list)
#pragma unroll
    for (int i = 0; i < K / 2; ++i) {
      const int j = K - 1 - i;
      const float pv_i = __shfl_xor(top_v[i], offset), pv_j = __shfl_xor(top_v[j], offset);
      const int pe_i = __shfl_xor(top_e[i], offset), pe_j = __shfl_xor(top_e[j], offset);
      if (beats(pv_j, pe_j, top_v[i], top_e[i])) top_v[i] = pv_j, top_e[i] = pe_j;
      if (beats(pv_i, pe_i, top_v[j], top_e[j])) top_v[j] = pv_i, top_e[j] = pe_i;
    }
    bitonic_merge<K>(top_v, top_e);
  }
}

// Lane j < k: the token's j-th choice (mine, mine_id), from K choices held in every lane; top: the first's logit.
template <int K>
__device__ __forceinline__ void choose_by_lists(const float v[kPerLane], int lane, int n_expert, float& mine,
                                                int& mine_id, float& top) {
  float top_v[K];
  int top_e[K];
  warp_top<K>(v, lane, n_expert, top_v, top_e);
#pragma unroll
  for (int i = 0; i < K; ++i)
    if (lane == i) mine = top_v[i], mine_id = top_e[i];
  top = top_v[0];
}

// The same by k rounds of a warp-wide arg-max, each marking its winner taken in the owning lane (any k).
__device__ __forceinline__ void choose_by_rounds(const float v[kPerLane], int lane, int n_expert, int k, float& mine,
                                                 int& mine_id, float& top) {
  unsigned int taken = 0;  // bit i: this lane's expert lane + i * WARP_SIZE is chosen
  for (int j = 0; j < k; ++j) {
    float best = -RF_INFINITY;
    int best_e = kPadding;
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
}
}  // namespace

extern "C" __global__ __launch_bounds__(256) void moe_route_f32(int* __restrict__ ids, float* __restrict__ weights,
                                                               const float* __restrict__ logits,
                                                               const float* __restrict__ bias, int tokens,
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
      float x = e < n_expert ? row[e] : -RF_INFINITY;
      if (bias != nullptr && e < n_expert) x += bias[e];  // as one select, nvcc spilled 8 bytes at 64 registers
      v[i] = x == x ? x : -RF_INFINITY;
    }
    float mine = -RF_INFINITY;  // lane j < k: the j-th choice's logit and expert
    int mine_id = 0;
    float top = -RF_INFINITY;  // the largest logit (every lane's): every softmax subtracts it
    if (k <= kMaxListK / 2) choose_by_lists<kMaxListK / 2>(v, lane, n_expert, mine, mine_id, top);
    else if (k <= kMaxListK) choose_by_lists<kMaxListK>(v, lane, n_expert, mine, mine_id, top);
    else choose_by_rounds(v, lane, n_expert, k, mine, mine_id, top);
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

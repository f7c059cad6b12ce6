// sample.hip's one-workgroup rows: the block's helpers (scans, the argmax, the running sums), greedy and
// whole-vocabulary rows, and llama.cpp's chain on top-k candidates (top_k_sorted over a source, then
// draw_from_sorted), which sample.hip's split rows reuse. The rules: sample.hip's header.
#pragma once
#include "hip_compat.h"

namespace {
namespace sampling {

constexpr int kMaxTopK = 1024;
constexpr int kParams = 5;

// An unsigned key ordered like the floats: a larger float gives a larger key.
static __device__ __forceinline__ unsigned int order_key(float f) {
  const unsigned int u = rf_float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// argmax.hip's rule: true when (va, ia) wins over (vb, ib).
static __device__ __forceinline__ bool argmax_wins(float va, int ia, float vb, int ib) {
  const bool a_nan = va != va, b_nan = vb != vb;
  if (a_nan || b_nan) return a_nan && (!b_nan || ia < ib);
  return va > vb || (va == vb && ia < ib);
}

// Descending by value, ascending by id among equal values.
static __device__ __forceinline__ bool comes_first(float va, int ia, float vb, int ib) {
  return va > vb || (va == vb && ia < ib);
}

struct Shared {
  float value[kMaxTopK];
  int id[kMaxTopK];
  float prefix[kMaxTopK];  // running sums, then reused
  int scan[1024];          // one slot per thread for block-wide scans
  float scan_sums[1024];   // the same for float sums
  unsigned int histogram[256];
  float best_value[RF_MAX_WARPS_PER_BLOCK];
  int best_id[RF_MAX_WARPS_PER_BLOCK];
  int count_above;  // candidates gathered with a logit above the k-th
  int last_arrival;  // split_top_k: this workgroup is its row's last
  int digit_and_need[2];
  float total;
};

// Inclusive sum over the block of one int per thread (a Hillis-Steele scan in shared memory).
static __device__ __forceinline__ int block_inclusive_scan(int v, int* scan) {
  const int t = (int)threadIdx.x, n = (int)blockDim.x;
  scan[t] = v;
  __syncthreads();
  for (int offset = 1; offset < n; offset <<= 1) {
    const int add = t >= offset ? scan[t - offset] : 0;
    __syncthreads();
    scan[t] += add;
    __syncthreads();
  }
  const int result = scan[t];
  __syncthreads();
  return result;
}

// The block's best (value, id) of every thread's, in thread 0.
static __device__ __forceinline__ void block_best(Shared& sh, float& best, int& best_index) {
  const int lane = (int)threadIdx.x % WARP_SIZE, warp = (int)threadIdx.x / WARP_SIZE;
#pragma unroll
  for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
    const float other = __shfl_xor(best, offset);
    const int other_index = __shfl_xor(best_index, offset);
    if (argmax_wins(other, other_index, best, best_index)) best = other, best_index = other_index;
  }
  if (lane == 0) sh.best_value[warp] = best, sh.best_id[warp] = best_index;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < (int)blockDim.x / WARP_SIZE; ++w)
      if (argmax_wins(sh.best_value[w], sh.best_id[w], best, best_index)) best = sh.best_value[w], best_index = sh.best_id[w];
  }
}

static __device__ __forceinline__ void consider4(const float4 v, int first, float& best, int& best_index) {
  if (argmax_wins(v.x, first, best, best_index)) best = v.x, best_index = first;
  if (argmax_wins(v.y, first + 1, best, best_index)) best = v.y, best_index = first + 1;
  if (argmax_wins(v.z, first + 2, best, best_index)) best = v.z, best_index = first + 2;
  if (argmax_wins(v.w, first + 3, best, best_index)) best = v.w, best_index = first + 3;
}

// The block's pick among x[0 .. n) (token ids first + i), in thread 0. Scalar loads one at a time left
// one block latency-bound (32 us for Llama 3's 128,256 logits on an NVIDIA H100); where x is 16-byte aligned
// each thread reads four logits a load, two loads in flight. argmax_wins orders (value, id) pairs totally, so
// the order in which a thread meets them does not change the pick.
static __device__ void block_argmax(const float* x, int first, int n, Shared& sh, float& best, int& best_index) {
  best = -RF_INFINITY;
  best_index = 0x7fffffff;
  int scalar_from = 0;
  if ((reinterpret_cast<unsigned long long>(x) & 15ull) == 0) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const int n4 = n / 4, stride = (int)blockDim.x;
    for (int i = threadIdx.x; i < n4; i += 2 * stride) {
      const bool has_second = i + stride < n4;
      const float4 a = x4[i];
      const float4 b = x4[has_second ? i + stride : i];
      consider4(a, first + 4 * i, best, best_index);
      if (has_second) consider4(b, first + 4 * (i + stride), best, best_index);
    }
    scalar_from = 4 * n4;
  }
  for (int i = scalar_from + (int)threadIdx.x; i < n; i += blockDim.x) {
    const float v = x[i];
    if (argmax_wins(v, first + i, best, best_index)) best = v, best_index = first + i;
  }
  block_best(sh, best, best_index);
}

static __device__ void greedy(int* out, const float* x, int vocab, Shared& sh) {
  float best;
  int best_index;
  block_argmax(x, 0, vocab, sh, best, best_index);
  if (threadIdx.x == 0) *out = best_index;
}

// Sums in thread order of one float per thread (a Hillis-Steele scan in sh.scan_sums): `before`, the sum of
// the threads before this one, and `total`, every thread's. The same additions in the same order for every
// caller, so the split rows' walks meet the one-workgroup rows' rounding exactly.
static __device__ __forceinline__ void scan_sums(float v, Shared& sh, float& before, float& total) {
  const int t = (int)threadIdx.x, threads = (int)blockDim.x;
  float* totals = sh.scan_sums;
  totals[t] = v;
  __syncthreads();
  for (int offset = 1; offset < threads; offset <<= 1) {
    const float add = t >= offset ? totals[t - offset] : 0.0f;
    __syncthreads();
    totals[t] += add;
    __syncthreads();
  }
  before = t > 0 ? totals[t - 1] : 0.0f;
  total = totals[threads - 1];
  __syncthreads();  // sh.scan_sums may be written again at once
}

// Running sums of `weight(i)` for i < n into sh.prefix (each thread sums a contiguous chunk, then the
// chunk totals are scanned); returns the total.
template <class Weight>
static __device__ __forceinline__ float running_sums(int n, Weight weight, Shared& sh) {
  const int t = (int)threadIdx.x, threads = (int)blockDim.x;
  const int chunk = (n + threads - 1) / threads;
  const int lo = min(t * chunk, n), hi = min(lo + chunk, n);
  float sum = 0.0f;
  for (int i = lo; i < hi; ++i) {
    sum += weight(i);
    sh.prefix[i] = sum;
  }
  // Scan the chunk totals in thread order.
  float before, total;
  scan_sums(sum, sh, before, total);
  for (int i = lo; i < hi; ++i) sh.prefix[i] += before;
  __syncthreads();
  return total;
}

// The largest logit of the row (NaNs ignored), the same value in every thread.
static __device__ float row_max(const float* x, int vocab, Shared& sh) {
  float best = -RF_INFINITY;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) best = fmaxf(best, x[i]);
#pragma unroll
  for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) best = fmaxf(best, __shfl_xor(best, offset));
  const int lane = (int)threadIdx.x % WARP_SIZE, warp = (int)threadIdx.x / WARP_SIZE;
  if (lane == 0) sh.best_value[warp] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < (int)blockDim.x / WARP_SIZE; ++w) best = fmaxf(best, sh.best_value[w]);
    sh.total = best;
  }
  __syncthreads();
  best = sh.total;
  __syncthreads();
  return best;
}

// No top-k, no top-p: min-p and temperature over every token, and the draw in token-id order. Each thread
// sums the weights of a contiguous run of ids, the run totals are scanned, and the thread whose run holds
// uniform * total walks it again to the first id whose running sum exceeds that.
static __device__ void whole_vocabulary(int* out, const float* x, int vocab, float temperature, float min_p,
                                        float uniform, Shared& sh) {
  const int t = (int)threadIdx.x, threads = (int)blockDim.x;
  const float best = row_max(x, vocab, sh);
  const float floor = min_p > 0.0f ? best + log2f(min_p) * 0.693147182f : -RF_INFINITY;  // + ln(min_p)
  const float scaled_best = best / temperature;
  const int chunk = (vocab + threads - 1) / threads;
  const int lo = min(t * chunk, vocab), hi = min(lo + chunk, vocab);
  float sum = 0.0f;
  int last_kept = -1;
  for (int i = lo; i < hi; ++i) {
    const float v = x[i];
    if (v >= floor) sum += expf(v / temperature - scaled_best), last_kept = i;
  }
  if (t == 0) sh.digit_and_need[0] = 0x7fffffff, sh.digit_and_need[1] = -1;
  float before, total;
  scan_sums(sum, sh, before, total);
  const float target = uniform * total;
  if (sum > 0.0f && before <= target && target < before + sum) {
    float running = before;
    int found = last_kept;  // rounding may leave the crossing past the run's end: its last kept token
    for (int i = lo; i < hi; ++i) {
      const float v = x[i];
      if (!(v >= floor)) continue;
      running += expf(v / temperature - scaled_best);
      if (running > target) {
        found = i;
        break;
      }
    }
    atomicMin(&sh.digit_and_need[0], found);  // two runs can both claim it at a rounding edge: lowest id
  }
  if (last_kept >= 0) atomicMax(&sh.digit_and_need[1], last_kept);
  __syncthreads();
  if (t == 0) {
    const int found = sh.digit_and_need[0];
    // None claimed: uniform * total rounded to (or past) the total; the host then takes the last candidate.
    *out = found != 0x7fffffff ? found : max(sh.digit_and_need[1], 0);
  }
}

// Where a top-k selection reads: a span of a row's logits (ids first + i), or the candidates a split row's chunks
// left in the workspace (each chunk's sorted, the chunks in id order). Among equal values the ids rise with the
// index in both, which the gather of those equal to the k-th relies on.
struct RowSpan {
  const float* x;
  int first;
  __device__ __forceinline__ float value(int i) const { return x[i]; }
  __device__ __forceinline__ int id(int i) const { return first + i; }
};

struct ChunkCandidates {
  const volatile float* values;
  const volatile int* ids;
  __device__ __forceinline__ float value(int i) const { return values[i]; }
  __device__ __forceinline__ int id(int i) const { return ids[i]; }
};

// Step 1: the k (1 <= k <= min(n, kMaxTopK)) largest of src[0 .. n) into sh.value / sh.id[0 .. k), sorted by
// (logit descending, id ascending).
template <class Source>
static __device__ __forceinline__ void top_k_sorted(const Source& src, int n, int k, Shared& sh) {
  const int t = (int)threadIdx.x, threads = (int)blockDim.x;

  // 1. Radix select of the k-th largest key: after the four passes `prefix` is that key exactly and
  //    `need` says how many of the logits equal to it belong to the top k.
  unsigned int prefix = 0, mask = 0;
  int need = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = t; i < 256; i += threads) sh.histogram[i] = 0;
    __syncthreads();
    for (int i = t; i < n; i += threads) {
      const unsigned int key = order_key(src.value(i));
      if ((key & mask) == prefix) atomicAdd(reinterpret_cast<int*>(&sh.histogram[(key >> shift) & 255u]), 1);
    }
    __syncthreads();
    if (t == 0) {
      int above = 0, digit = 255;
      for (; digit > 0; --digit) {
        const int here = (int)sh.histogram[digit];
        if (above + here >= need) break;
        above += here;
      }
      sh.digit_and_need[0] = digit;
      sh.digit_and_need[1] = need - above;
    }
    __syncthreads();
    prefix |= (unsigned int)sh.digit_and_need[0] << shift;
    mask |= 255u << shift;
    need = sh.digit_and_need[1];
    __syncthreads();
  }

  // Gather: every logit above the k-th (k - need of them, in any order: the sort orders them) ...
  if (t == 0) sh.count_above = 0;
  __syncthreads();
  for (int i = t; i < n; i += threads) {
    const float v = src.value(i);
    if (order_key(v) > prefix) {
      const int slot = atomicAdd(&sh.count_above, 1);
      sh.value[slot] = v;
      sh.id[slot] = src.id(i);
    }
  }
  __syncthreads();
  // ... and the `need` lowest ids among those equal to it, found tile by tile in index order (the source's
  // ids rise with its index among equal values).
  const int above = k - need;
  int taken = 0;
  for (int base = 0; base < n && taken < need; base += threads) {  // `taken` is uniform
    const int i = base + t;
    const float v = i < n ? src.value(i) : 0.0f;
    const bool equal = i < n && order_key(v) == prefix;
    const int rank = block_inclusive_scan(equal ? 1 : 0, sh.scan) - 1;
    if (equal && taken + rank < need) {
      sh.value[above + taken + rank] = v;
      sh.id[above + taken + rank] = src.id(i);
    }
    if (t == threads - 1) sh.digit_and_need[0] = rank + 1;
    __syncthreads();
    taken += sh.digit_and_need[0];
    __syncthreads();
  }

  // Sort the k candidates: a bitonic sort over the next power of two, padded with (-inf, max id).
  int width = 1;
  while (width < k) width <<= 1;
  for (int i = k + t; i < width; i += threads) sh.value[i] = -RF_INFINITY, sh.id[i] = 0x7fffffff;
  __syncthreads();
  for (int size = 2; size <= width; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = t; i < width; i += threads) {
        const int j = i ^ stride;
        if (j > i) {
          const bool first_in_order = comes_first(sh.value[i], sh.id[i], sh.value[j], sh.id[j]);
          const bool descending = (i & size) == 0;
          if (descending != first_in_order) {
            const float v = sh.value[i];
            const int id = sh.id[i];
            sh.value[i] = sh.value[j], sh.id[i] = sh.id[j];
            sh.value[j] = v, sh.id[j] = id;
          }
        }
      }
      __syncthreads();
    }
  }
}

// Steps 2 to 4 on the k sorted candidates in sh.value / sh.id: top-p, min-p, temperature and the draw.
static __device__ __forceinline__ void draw_from_sorted(int* out, int k, float temperature, float top_p, float min_p, float uniform,
                                       Shared& sh) {
  const int t = (int)threadIdx.x, threads = (int)blockDim.x;
  const float best = sh.value[0];
  int n = k;
  // 2. top-p on the softmax of the k candidates at temperature 1.
  if (top_p < 1.0f) {
    const float total = running_sums(k, [&](int i) { return expf(sh.value[i] - best); }, sh);
    const float threshold = top_p * total;
    int below = 0;
    for (int i = t; i < k; i += threads) below += sh.prefix[i] < threshold ? 1 : 0;
    const int count = block_inclusive_scan(below, sh.scan);
    if (t == threads - 1) sh.digit_and_need[0] = count;
    __syncthreads();
    n = min(k, sh.digit_and_need[0] + 1);
    __syncthreads();
  }
  // 3. min-p: the candidates are sorted, so the kept ones are a prefix.
  if (min_p > 0.0f) {
    const float floor = best + log2f(min_p) * 0.693147182f;  // + ln(min_p)
    int kept = 0;
    for (int i = t; i < n; i += threads) kept += sh.value[i] >= floor ? 1 : 0;
    const int count = block_inclusive_scan(kept, sh.scan);
    if (t == threads - 1) sh.digit_and_need[0] = count;
    __syncthreads();
    n = min(n, sh.digit_and_need[0]);
    __syncthreads();
  }
  // 4. Temperature and the draw.
  const float scaled_best = best / temperature;
  const float total = running_sums(n, [&](int i) { return expf(sh.value[i] / temperature - scaled_best); }, sh);
  const float target = uniform * total;
  int at_or_below = 0;
  for (int i = t; i < n; i += threads) at_or_below += sh.prefix[i] <= target ? 1 : 0;
  const int pick = block_inclusive_scan(at_or_below, sh.scan);
  if (t == threads - 1) *out = sh.id[min(pick, n - 1)];
}

static __device__ void sample_row(int* out, const float* x, const float* p, int vocab, Shared& sh) {
  const float temperature = p[0], top_p = p[2], min_p = p[3], uniform = p[4];
  if (!(temperature > 0.0f)) {
    greedy(out, x, vocab, sh);
    return;
  }
  if ((int)p[1] <= 0 && !(top_p < 1.0f)) {
    whole_vocabulary(out, x, vocab, temperature, min_p, uniform, sh);
    return;
  }
  const int k = max(1, min((int)p[1], min(vocab, kMaxTopK)));
  top_k_sorted(RowSpan{x, 0}, vocab, k, sh);
  draw_from_sorted(out, k, temperature, top_p, min_p, uniform, sh);
}

}  // namespace sampling
}  // namespace

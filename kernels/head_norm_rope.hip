// What comes between the q|k|v products and attention, in one launch where it took up to six: the biases (gpt-oss),
// the per-head norms (qwen3, gemma3), RoPE and kv_store:
//
//   head_norm_rope_f32(q, k, v, q_weight, k_weight, q_bias, k_bias, v_bias, positions, freq_factors, n_tokens,
//                      n_heads, n_kv_heads, head_dim, rope_dim, neox, eps, theta, freq_scale, k_pool, v_pool, slots,
//                      block_size, num_blocks, kv_format)
//     every head h of q [n_tokens, n_heads, head_dim] and of k [n_tokens, n_kv_heads, head_dim]:
//       h <- rope(rmsnorm(h + bias) * weight)   (q_weight, k_weight: head_dim floats each, or both null: no norm;
//                                                q_bias, k_bias, v_bias: a row's floats, heads * head_dim, or null)
//     the bias added as add_bias.hip adds it; rmsnorm as rmsnorm.hip computes it ((x * scale) * weight, scale = 1 /
//     sqrt(mean(x^2) + eps)); RoPE as rope.hip's rope_f32 (neox 0: pairs (2i, 2i + 1)) or rope_neox_f32 (neox 1:
//     pairs (i, i + rope_dim / 2)) rotates a head, the same sin/cos and frequencies; elements at and past rope_dim
//     only normalized. So the same bits as the launches it replaces.
//     kv_format 0: q and k are written in place, v too where it has a bias (kv_store stores k and v after). 1 (f16),
//     2 (bf16), 3 (f32): q in place, and k's heads and v's (its bias added) go straight into the paged cache's pools
//     at each token's slot instead, the bytes kv_store.hip would write (kv_store.py: EpilogueTarget), so that launch
//     leaves the step.
//
// One workgroup a head (grid-stride over tokens x heads: q's, then k's, then v's where they are stored or biased),
// its threads over the head's elements: the head is read into shared memory (its bias added), its squares summed
// across the workgroup where it is normalized, then each thread rotates its pairs, whose two elements other threads
// read. Workgroups of 64 threads (a whole warp on every vendor); head_dim even and at most kMaxHeadDim (the launcher
// checks).
#include "hip_compat.h"
#include "fused_qmatvec_epilogue.h"  // rope.hip's sin/cos (fq::rope_sincos) and the paged cache's layout (fq::KvTarget)

namespace {
namespace hnr {

constexpr int kMaxHeadDim = 512;

// Element e of row r (e = r % head_dim) of token t's k (or v) into the cache, rounded as kv_store.hip rounds it;
// a negative slot or one past the pool is skipped, as there.
static __device__ __forceinline__ void store_element(const fq::KvTarget& kv, bool is_v, int t, int r, float value) {
  const int slot = kv.slots[t];
  if (slot < 0 || (long long)slot >= (long long)kv.num_blocks * kv.block_size) return;
  const int block = slot / kv.block_size, offset = slot - block * kv.block_size;
  const int head = r / kv.head_dim, e = r - head * kv.head_dim;
  const unsigned long long row = ((unsigned long long)block * kv.n_kv_heads + head) * kv.block_size + offset;
  unsigned char* pool = is_v ? kv.v_pool : kv.k_pool;
  if (kv.format == 3) {
    reinterpret_cast<float*>(pool)[row * kv.head_dim + e] = value;
    return;
  }
  reinterpret_cast<unsigned short*>(pool)[row * kv.head_dim + e] =
      kv.format == 1 ? rf_float_to_f16(value) : rf_float_to_bf16(value);
}

struct Args {
  float *q, *k, *v;
  const float *q_weight, *k_weight;  // both null: no norm
  const float *q_bias, *k_bias, *v_bias;  // each null: none
  const int* positions;
  const float* freq_factors;  // rope_dim / 2 per-pair divisors of the frequency, or null
  int n_tokens, n_heads, n_kv_heads, head_dim, rope_dim, neox;
  float eps, theta, freq_scale;
  fq::KvTarget kv;
};

// Writes element e of the head: in place (q, or k without a cache target) or into the cache.
static __device__ __forceinline__ void put(const Args& a, float* row, bool to_cache, bool is_v, int t, int head, int e,
                                           float value) {
  if (to_cache) {
    store_element(a.kv, is_v, t, head * a.head_dim + e, value);
    return;
  }
  row[e] = value;
}

static __device__ __forceinline__ void head(const Args& a, float* sh, float* scratch, int t, int h) {
  const int hd = a.head_dim, tid = (int)threadIdx.x, threads = (int)blockDim.x;
  const bool is_q = h < a.n_heads, is_k = !is_q && h < a.n_heads + a.n_kv_heads, is_v = !is_q && !is_k;
  const int head_index = is_q ? h : is_k ? h - a.n_heads : h - a.n_heads - a.n_kv_heads;
  const int width = is_q ? a.n_heads * hd : a.n_kv_heads * hd;
  float* src = is_q ? a.q : is_k ? a.k : a.v;
  float* row = src + (unsigned long long)t * width + (unsigned long long)head_index * hd;
  const float* in = row;
  const float* bias = is_q ? a.q_bias : is_k ? a.k_bias : a.v_bias;
  if (bias) bias += (unsigned long long)head_index * hd;
  const bool to_cache = !is_q && a.kv.format != 0;
  if (is_v) {  // only stored, or its bias added in place: v has no norm and no RoPE
    for (int e = tid; e < hd; e += threads) {
      const float x = bias ? in[e] + bias[e] : in[e];
      if (to_cache) store_element(a.kv, true, t, head_index * hd + e, x);
      else row[e] = x;
    }
    return;
  }
  const float* w = is_q ? a.q_weight : a.k_weight;
  float sum_sq = 0.0f;
  for (int e = tid; e < hd; e += threads) {
    const float x = bias ? in[e] + bias[e] : in[e];
    sh[e] = x;
    sum_sq = fmaf(x, x, sum_sq);
  }
  float scale = 1.0f;
  if (w) {  // uniform: the launch's
    sum_sq = rf_block_sum(sum_sq, scratch);  // its barriers also order the shared writes above before the reads below
    scale = 1.0f / sqrtf(sum_sq / (float)hd + a.eps);
  } else {
    __syncthreads();
  }
  const int pairs = a.rope_dim / 2, second = a.neox ? pairs : 1;
  const float log2_step = -2.0f * log2f(a.theta) / (float)a.rope_dim;
  for (int i = tid; i < pairs; i += threads) {
    // The angle first: the division's slow path is a call, and values live across it would spill (nvcc).
    float freq = a.freq_scale * exp2f((float)i * log2_step);
    if (a.freq_factors) freq = freq / a.freq_factors[i];
    const float angle = (float)a.positions[t] * freq;
    float s, c;
    fq::rope_sincos(angle, &s, &c);
    const int e0 = a.neox ? i : 2 * i, e1 = e0 + second;
    const float x0 = w ? (sh[e0] * scale) * w[e0] : sh[e0], x1 = w ? (sh[e1] * scale) * w[e1] : sh[e1];
    put(a, row, to_cache, false, t, head_index, e0, x0 * c - x1 * s);
    put(a, row, to_cache, false, t, head_index, e1, x0 * s + x1 * c);
  }
  for (int e = a.rope_dim + tid; e < hd; e += threads)
    put(a, row, to_cache, false, t, head_index, e, w ? (sh[e] * scale) * w[e] : sh[e]);
  __syncthreads();  // the next head's reads into sh wait for this one's
}

}  // namespace hnr
}  // namespace

extern "C" __global__ __launch_bounds__(64) void head_norm_rope_f32(
    float* q, float* k, float* v, const float* q_weight, const float* k_weight, const float* q_bias,
    const float* k_bias, const float* v_bias, const int* positions, const float* freq_factors, int n_tokens,
    int n_heads, int n_kv_heads, int head_dim, int rope_dim, int neox, float eps, float theta, float freq_scale,
    void* k_pool, void* v_pool, const int* slots, int block_size, int num_blocks, int kv_format) {
  __shared__ float sh[hnr::kMaxHeadDim];
  __shared__ float scratch[RF_MAX_WARPS_PER_BLOCK];
  rf_grid_dependency_sync();  // q, k and v come from the products ahead (programmatic launch)
  const hnr::Args a = {q, k, v, q_weight, k_weight, q_bias, k_bias, v_bias, positions, freq_factors, n_tokens, n_heads,
                       n_kv_heads, head_dim, rope_dim, neox, eps, theta, freq_scale,
                       {static_cast<unsigned char*>(k_pool), static_cast<unsigned char*>(v_pool), slots, block_size,
                        num_blocks, n_kv_heads, head_dim, kv_format}};
  // v's heads where they are stored or biased in place
  const int heads = n_heads + n_kv_heads + (kv_format != 0 || v_bias ? n_kv_heads : 0);
  const int items = n_tokens * heads;  // the launcher keeps it in int32 (a 64-bit division would spill)
  for (int item = (int)blockIdx.x; item < items; item += (int)gridDim.x) {  // uniform across the block
    hnr::head(a, sh, scratch, item / heads, item % heads);
  }
}

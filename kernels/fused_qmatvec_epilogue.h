// Part of the fused_qmatvec op (kernels/fused_qmatvec.hip includes it after fused_qmatvec_tiles.h; built and
// hashed with it: hipcore/runtime/kernels.py source_files): what the products do with their sums before they are
// written. The norm's scale per token; RoPE, rotating as rope.hip's rope_f32 does (its sin/cos, its frequencies);
// and the store of k and v straight into the paged cache's pools, the bytes kv_store.hip would write.
// head_norm_rope.hip includes it too, for the same sin/cos and the cache's layout (KvTarget).
#pragma once

namespace {
namespace fq {

static __device__ __forceinline__ float norm_scale(float ss, int cols, float eps) {
  return 1.0f / sqrtf(ss / (float)cols + eps);
}

// rope.hip's sin/cos (Cody-Waite reduction, Cephes polynomials, as fused_matvec.hip copies it), so that
// the fused RoPE rotates exactly as the rope_f32 kernel does.
static __device__ __forceinline__ void rope_sincos(float angle, float* sin_out, float* cos_out) {
  const float k = rintf(angle * 0.636619772f);
  float r = fmaf(-k, 1.57079637050628662109375f, angle);
  r = fmaf(-k, -4.37113882867379e-08f, r);
  r = fmaf(-k, -1.71512451e-15f, r);
  const float z = r * r;
  const float s = fmaf(fmaf(fmaf(-1.9515295891e-4f, z, 8.3321608736e-3f), z, -1.6666654611e-1f), z * r, r);
  const float c = fmaf(fmaf(fmaf(fmaf(2.443315711809948e-5f, z, -1.388731625493765e-3f), z, 4.166664568298827e-2f), z,
                            -0.5f),
                       z, 1.0f);
  const int quadrant = (int)k & 3;
  const float s_q = (quadrant & 1) ? c : s;
  const float c_q = (quadrant & 1) ? s : c;
  *sin_out = (quadrant & 2) ? -s_q : s_q;
  *cos_out = ((quadrant + 1) & 2) ? -c_q : c_q;
}

struct Rope {
  const int* positions;
  const float* freq_factors;  // null: none
  int head_dim, rope_dim;
  float theta, freq_scale;
};

// Where k and v rows go when the epilogue stores them into the paged cache (kv_store.hip's layout: pools
// [num_blocks, n_kv_heads, block_size, head_dim], slot = block * block_size + offset; a negative slot or one
// past the pool is skipped, as there). format: 0 = not at all (the float buffers), 1 f16, 2 bf16, 3 f32.
struct KvTarget {
  unsigned char *k_pool, *v_pool;
  const int* slots;
  int block_size, num_blocks, n_kv_heads, head_dim, format;
};

// Elements e, e + 1 of row r (e = r % head_dim, even) of token t's k (or v) into the cache, rounded as
// kv_store.hip rounds them (rf_float_to_f16 / rf_float_to_bf16), so the bytes are the same.
static __device__ __forceinline__ void store_pair(const KvTarget& kv, bool is_v, int t, int r, float a, float b) {
  const int slot = kv.slots[t];
  if (slot < 0 || (long long)slot >= (long long)kv.num_blocks * kv.block_size) return;
  const int block = slot / kv.block_size, offset = slot - block * kv.block_size;
  const int head = r / kv.head_dim, e = r - head * kv.head_dim;
  const unsigned long long row = ((unsigned long long)block * kv.n_kv_heads + head) * kv.block_size + offset;
  unsigned char* pool = is_v ? kv.v_pool : kv.k_pool;
  if (kv.format == 3) {
    float* dst = reinterpret_cast<float*>(pool) + row * kv.head_dim + e;
    dst[0] = a;
    dst[1] = b;
    return;
  }
  unsigned short* dst = reinterpret_cast<unsigned short*>(pool) + row * kv.head_dim + e;
  dst[0] = kv.format == 1 ? rf_float_to_f16(a) : rf_float_to_bf16(a);
  dst[1] = kv.format == 1 ? rf_float_to_f16(b) : rf_float_to_bf16(b);
}

// Rows r, r + 1 (r even, one head) of token b rotated as rope_f32 rotates them (NORM mode).
static __device__ __forceinline__ void rotate(const Rope& p, int b, int r, float& s0, float& s1) {
  const int in_head = r % p.head_dim;
  if (in_head >= p.rope_dim) return;
  const float log2_step = -2.0f * log2f(p.theta) / (float)p.rope_dim;
  float freq = p.freq_scale * exp2f((float)(in_head / 2) * log2_step);
  if (p.freq_factors) freq = freq / p.freq_factors[in_head / 2];
  const float angle = (float)p.positions[b] * freq;
  float sn, cs;
  rope_sincos(angle, &sn, &cs);
  const float a = s0, c = s1;
  s0 = a * cs - c * sn;
  s1 = a * sn + c * cs;
}

}  // namespace fq
}  // namespace

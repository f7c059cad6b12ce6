// Part of the paged_attention op (kernels/paged_attention.hip includes it after paged_attention_formats.h;
// built and hashed with it): a warp's walk over a split's keys, tile by tile: the block-table lookups, the
// K and V loads, and the online softmax that folds a loaded tile in.
#pragma once

namespace rf_paged_attention {

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor(v, offset));
  return v;
}

// exp2 of (x - reference) where an all -inf reference counts as 0, so that -inf - -inf never occurs:
// a key slot that has seen no key yet has max -inf, and everything it holds is zero.
static __device__ __forceinline__ float safe_reference(float max_value) {
  return max_value == -RF_INFINITY ? 0.0f : max_value;
}

// A lane's constants for walking a split's keys. Slot u of the warp's tile at `base` is key
// base + u * keys_per_warp + key_slot; keys past the split's end read its last key (and are masked).
struct Walk {
  const int* __restrict__ table;          // the sequence's block table
  const unsigned char* __restrict__ k_lane;  // the KV head's rows in block 0, at this lane's words
  const unsigned char* __restrict__ v_lane;
  int aux, keys_per_warp, key_slot, last_key, block_shift, in_block_mask;
  unsigned int num_blocks, block_stride, row_bytes;
  float cap, two_over_cap;  // the capped kernels: softcap in the scores' base-2 units (softcap * log2(e)), and 2 / softcap
};

static __device__ __forceinline__ int slot_key(const Walk& w, int base, int u) {
  return min(base + u * w.keys_per_warp + w.key_slot, w.last_key);
}

// The blocks of a tile's keys, kept inside the pool whatever the table holds.
template <int U>
static __device__ __forceinline__ void fetch_blocks(const Walk& w, int base, unsigned int (&blocks)[U]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const unsigned int b = (unsigned int)w.table[slot_key(w, base, u) >> w.block_shift];
    blocks[u] = b < w.num_blocks ? b : 0u;
  }
}

// Issue the loads of a tile's K and V words (the block stride fits 32 bits: the launcher checks).
template <class KV>
static __device__ __forceinline__ void load_rows(const Walk& w, int base, const unsigned int (&blocks)[KV::kUnroll],
                                                 typename KV::Raw (&k)[KV::kUnroll], typename KV::Raw (&v)[KV::kUnroll]) {
#pragma unroll
  for (int u = 0; u < KV::kUnroll; ++u) {
    const int key = slot_key(w, base, u);
    const unsigned long long at = (unsigned long long)blocks[u] * w.block_stride +
                                  (unsigned int)(key & w.in_block_mask) * w.row_bytes;
    k[u] = KV::load(w.k_lane + at, w.aux);
    v[u] = KV::load(w.v_lane + at, w.aux);
  }
}

// Fold a loaded tile into the key slot's running max m, sum l and unnormalized output acc.
template <class KV, int NG, bool kCap>
static __device__ __forceinline__ void consume(const Walk& w, int base, int k_end, int lanes_per_key,
                                               const typename KV::Raw (&k)[KV::kUnroll],
                                               const typename KV::Raw (&v)[KV::kUnroll], const float (&qv)[NG][kChunk],
                                               float (&m)[NG], float (&l)[NG], float (&acc)[NG][kChunk]) {
  constexpr int U = KV::kUnroll;
  float s[U][NG];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    float kf[kChunk];
    KV::decode(k[u], kf);
#pragma unroll
    for (int g = 0; g < NG; ++g) {
      float d = 0.0f;
#pragma unroll
      for (int j = 0; j < kChunk; ++j) d = fmaf(qv[g][j], kf[j], d);
      s[u][g] = d;
    }
  }
  // The key's lanes sum their parts: every dot product of the tile in one pass over the offsets.
  for (int o = 1; o < lanes_per_key; o <<= 1) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int g = 0; g < NG; ++g) s[u][g] += __shfl_xor(s[u][g], o);
  }
  if (kCap) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int g = 0; g < NG; ++g) s[u][g] = rf_attention_soft_cap(s[u][g], w.cap, w.two_over_cap);
  }
  if (base + U * w.keys_per_warp > k_end) {  // the split's last tile: keys past its end weigh nothing
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + u * w.keys_per_warp + w.key_slot >= k_end)
#pragma unroll
        for (int g = 0; g < NG; ++g) s[u][g] = -RF_INFINITY;
  }
  float ref[NG];
#pragma unroll
  for (int g = 0; g < NG; ++g) {
    float mx = m[g];
#pragma unroll
    for (int u = 0; u < U; ++u) mx = fmaxf(mx, s[u][g]);
    ref[g] = safe_reference(mx);
    const float correction = exp2f(m[g] - ref[g]);
    l[g] *= correction;
#pragma unroll
    for (int j = 0; j < kChunk; ++j) acc[g][j] *= correction;
    m[g] = mx;
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    float vf[kChunk];
    KV::decode(v[u], vf);
#pragma unroll
    for (int g = 0; g < NG; ++g) {
      const float weight = exp2f(s[u][g] - ref[g]);
      l[g] += weight;
#pragma unroll
      for (int j = 0; j < kChunk; ++j) acc[g][j] = fmaf(weight, vf[j], acc[g][j]);
    }
  }
}

}  // namespace rf_paged_attention

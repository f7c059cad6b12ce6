// Part of the paged_attention op (kernels/paged_attention.hip includes it after paged_attention_plan.h; built and
// hashed with it: hipcore/runtime/kernels.py source_files): the walk of a split's keys on the matrix cores, for f16
// caches and query groups of several heads (the `_mma_d<head_dim>` entries; hipcore/ops/paged_attention.py's
// takes_matrix_cores says when the launcher picks them).
//
// The scalar walk (paged_attention_tiles.h) spends about 17 instructions on each key and query head: a dot product
// spread over 16 lanes, four levels of shuffles, the online softmax and the V update, and at long contexts that is
// its limit, not the memory. Here a workgroup serves up to MmaTile::kHeads query heads of one KV head (a group of
// 8: all of it), as the rows of one 16 x 16 matrix tile (rows past the chunk's heads hold q = 0 and are dropped),
// and each of its 4 warps takes 16 keys a step, in turn, as llama.cpp's CUDA backend does for grouped heads:
//   S (heads x 16 keys)  = q . K^T      head_dim / 16 matrix products
//   O (heads x head_dim) += P . V       head_dim / 16 more, P the step's weights as f16
// with the online softmax (base 2, log2(e) folded into q) on S's accumulators, a row's max and sum reduced over the
// lanes that hold it (matrix_cores.h's rows). A warp stages its step's K rows and V^T in its own part of shared
// memory (the products' operands come from there: ldmatrix on NVIDIA), the weights over the K rows once the scores
// are made; the next step's rows load into registers while this step's products run. Warps synchronise only among
// their own lanes (rf_warp_sync) until the merge.
// Each warp leaves its rows' (max, sum, unnormalized output) in the Merge area, which overlaps the stages, and
// paged_attention.hip's finish merges the warps and combines the splits as for the scalar walk.
// Precision: q and the weights are rounded to f16 (q scaled by scale * log2(e): the launcher bounds nothing here,
// as prompt_attention's; the weights are in [0, 1]); K and V are the pool's own f16 values; products exact, sums in f32.
#pragma once
#include "matrix_cores.h"  // rf_mma and the rows of its accumulator tile

namespace rf_paged_attention {

constexpr int kMmaKeys = 16;               // keys of a warp's step: one matrix tile of columns
constexpr int kMmaMinKeysPerSplit = 128;   // the launcher sizes its slots with the same figure
constexpr int kMergeValues = 1024;         // a warp's unnormalized outputs in the merge: heads x head_dim

template <int HD>
struct MmaTile {
  static constexpr int kTiles = HD / 16;             // matrix tiles of head_dim
  static constexpr int kQStride = HD + 8;            // halves per staged q and K row: 16-byte aligned rows whose
  static constexpr int kKStride = HD + 8;            // fragment loads start in different banks
  static constexpr int kVStride = kMmaKeys + 8;      // halves per row of V^T (one element's 16 keys)
  static constexpr int kPStride = kMmaKeys + 8;      // halves per row of the weights (staged over the K rows)
  static constexpr int kHeads = kMergeValues / HD < 16 ? kMergeValues / HD : 16;  // query heads a workgroup serves
  static constexpr int kPieces = HD / 8;             // 16-byte pieces of a row
  static constexpr int kKLoads = (kMmaKeys * kPieces + WARP_SIZE - 1) / WARP_SIZE;      // a lane's K pieces a step
  static constexpr int kVLoads = (kMmaKeys / 2 * kPieces + WARP_SIZE - 1) / WARP_SIZE;  // its pairs of V pieces
};

// The merge of a workgroup's warps (paged_attention.hip's finish), for up to kHeads query heads.
template <int kHeads>
struct Merge {
  float o[kMaxWarps][kMergeValues];  // each warp's unnormalized output, head g's at g * head_dim
  float m[kMaxWarps][kHeads];        // its running max (base 2)
  float l[kMaxWarps][kHeads];        // its sum of exponentials
  float split_weight[kHeads][kMaxSplits];  // the combining workgroup's factor per split
  int last;
};

template <int HD>
struct MmaStage {
  unsigned short k[kMmaKeys * MmaTile<HD>::kKStride];  // the step's K rows; then its weights (kPStride a row)
  unsigned short vt[HD * MmaTile<HD>::kVStride];       // the step's V, transposed: row d holds element d of each key
};

template <int HD>
struct MmaShared {
  unsigned short q[16 * MmaTile<HD>::kQStride];  // the rows' q as f16, scale * log2(e) folded in; unused rows zero
  union {
    MmaStage<HD> stage[kMaxWarps];  // each warp's own, during the walk
    Merge<MmaTile<HD>::kHeads> merge;  // after it
  } u;
};

// Where a key's row of the KV head lies in a pool (keys past the split read its last key; blocks outside the pool
// read block 0, as the scalar walk does).
struct MmaRows {
  const int* __restrict__ table;
  unsigned int num_blocks, block_stride, row_bytes;
  int block_shift, in_block_mask, last_key;
};

static __device__ __forceinline__ unsigned long long mma_row_at(const MmaRows& r, int key) {
  key = min(key, r.last_key);
  const unsigned int b = (unsigned int)r.table[key >> r.block_shift];
  return (unsigned long long)(b < r.num_blocks ? b : 0u) * r.block_stride + (unsigned int)(key & r.in_block_mask) * r.row_bytes;
}

// One step's K and V pieces in a lane's registers. Lane l loads pieces of key l % 16's K row, and of V's rows of keys
// 2 (l % 8) and 2 (l % 8) + 1 for the transposed store (a warp's lanes are a multiple of 16): three row addresses a
// lane and step, each one block-table lookup.
template <int HD>
struct MmaFetch {
  using T = MmaTile<HD>;
  static constexpr int kPairs = kMmaKeys / 2;
  uint4 k[T::kKLoads], va[T::kVLoads], vb[T::kVLoads];

  // Member by member (prompt_attention's Fetch::copy): a whole-struct copy into an array element put the array in
  // private memory on AMD (16 KB of LDS at a head of 128).
  static __device__ __forceinline__ void copy(uint4& to, const unsigned char* from) {
    const uint4 v = *reinterpret_cast<const uint4*>(from);
    to.x = v.x, to.y = v.y, to.z = v.z, to.w = v.w;
  }

  __device__ __forceinline__ void issue(const MmaRows& rows, const unsigned char* k_head, const unsigned char* v_head,
                                        int k0, int lane) {
    const unsigned char* k_row = k_head + mma_row_at(rows, k0 + lane % kMmaKeys);
    const unsigned char* va_row = v_head + mma_row_at(rows, k0 + 2 * (lane % kPairs));
    const unsigned char* vb_row = v_head + mma_row_at(rows, k0 + 2 * (lane % kPairs) + 1);
#pragma unroll
    for (int i = 0; i < T::kKLoads; ++i) {
      const int e = lane + WARP_SIZE * i;
      if (e < kMmaKeys * T::kPieces) copy(k[i], k_row + 16 * (e / kMmaKeys));
    }
#pragma unroll
    for (int i = 0; i < T::kVLoads; ++i) {
      const int e = lane + WARP_SIZE * i;
      if (e < kPairs * T::kPieces) {
        copy(va[i], va_row + 16 * (e / kPairs));
        copy(vb[i], vb_row + 16 * (e / kPairs));
      }
    }
  }

  __device__ __forceinline__ void store(MmaStage<HD>& st, int lane) const {
#pragma unroll
    for (int i = 0; i < T::kKLoads; ++i) {
      const int e = lane + WARP_SIZE * i;
      if (e < kMmaKeys * T::kPieces)
        *reinterpret_cast<uint4*>(st.k + (e % kMmaKeys) * T::kKStride + 8 * (e / kMmaKeys)) = k[i];
    }
#pragma unroll
    for (int i = 0; i < T::kVLoads; ++i) {
      const int e = lane + WARP_SIZE * i;
      if (e < kPairs * T::kPieces)
        rf_mma_store_transposed_pair(st.vt, T::kVStride, 8 * (e / kPairs), 2 * (e % kPairs), va[i], vb[i]);
    }
  }
};

// A split's keys k_begin .. k_end - 1 for the chunk's `ng` query heads from first_head: each warp's rows' max, sum
// and unnormalized output left in sh.u.merge (heads past ng dropped), the workgroup synchronised after.
template <int HD>
__device__ __forceinline__ void walk_mma(const Params& p, MmaShared<HD>& sh, const int* __restrict__ table, int token,
                                         int kv_head, int first_head, int ng, int k_begin, int k_end) {
  using T = MmaTile<HD>;
  const int tid = (int)threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE;

  const float q_scale = p.scale * kLog2e;
  for (int e = tid; e < 16 * (HD / 4); e += (int)blockDim.x) {
    const int r = e / (HD / 4), c = 4 * (e % (HD / 4));
    float4 v = {0.0f, 0.0f, 0.0f, 0.0f};
    if (r < ng) v = *reinterpret_cast<const float4*>(p.q + ((unsigned long long)token * p.n_heads + first_head + r) * HD + c);
    unsigned int* dst = reinterpret_cast<unsigned int*>(sh.q + r * T::kQStride + c);
    dst[0] = rf_floats_to_h2(v.x * q_scale, v.y * q_scale);
    dst[1] = rf_floats_to_h2(v.z * q_scale, v.w * q_scale);
  }
  __syncthreads();

  int block_shift = 0;
  while ((1 << block_shift) < p.block_size) ++block_shift;
  const unsigned int row_bytes = (unsigned int)HD * 2, head_stride = (unsigned int)p.block_size * row_bytes;
  const MmaRows rows = {table, (unsigned int)p.num_blocks, head_stride * (unsigned int)p.n_kv_heads, row_bytes,
                        block_shift, p.block_size - 1, k_end - 1};
  const unsigned char* k_head = p.k_pool + (unsigned long long)kv_head * head_stride;
  const unsigned char* v_head = p.v_pool + (unsigned long long)kv_head * head_stride;

  float o[T::kTiles][RF_MMA_ACC], m[RF_MMA_LANE_ROWS], l[RF_MMA_LANE_ROWS];
#pragma unroll
  for (int r = 0; r < RF_MMA_LANE_ROWS; ++r) m[r] = -RF_INFINITY, l[r] = 0.0f;
#pragma unroll
  for (int c = 0; c < T::kTiles; ++c)
#pragma unroll
    for (int e = 0; e < RF_MMA_ACC; ++e) o[c][e] = 0.0f;

  MmaStage<HD>& st = sh.u.stage[warp];
  MmaFetch<HD> fetch;
  constexpr int kStride = kMaxWarps * kMmaKeys;  // the workgroup's keys a step
  int k0 = k_begin + warp * kMmaKeys;            // uniform per warp, as the shuffles and matrix products need
  if (k0 < k_end) fetch.issue(rows, k_head, v_head, k0, lane);
  for (; k0 < k_end; k0 += kStride) {
    rf_warp_sync();  // the lanes are done with the previous step's stage
    fetch.store(st, lane);
    rf_warp_sync();
    if (k0 + kStride < k_end) fetch.issue(rows, k_head, v_head, k0 + kStride, lane);  // in flight during the products

    float s[RF_MMA_ACC];
#pragma unroll
    for (int e = 0; e < RF_MMA_ACC; ++e) s[e] = 0.0f;
#pragma unroll 2  // one chain of products into s: its fragments need not all be loaded at once
    for (int c = 0; c < T::kTiles; ++c) {
      RfMmaA a;
      RfMmaB b;
      rf_mma_load_a(a, sh.q + 16 * c, T::kQStride);
      rf_mma_load_b(b, st.k + 16 * c, T::kKStride);
      rf_mma(s, a, b);
    }
    float mx[RF_MMA_LANE_ROWS];
#pragma unroll
    for (int r = 0; r < RF_MMA_LANE_ROWS; ++r) mx[r] = -RF_INFINITY;
#pragma unroll
    for (int e = 0; e < RF_MMA_ACC; ++e) {
      if (k0 + rf_mma_acc_col(lane, e) >= k_end) s[e] = -RF_INFINITY;  // past the split: weighs nothing
      mx[rf_mma_lane_row_of(e)] = fmaxf(mx[rf_mma_lane_row_of(e)], s[e]);
    }
    rf_mma_reduce_rows<true>(mx);
    float ref[RF_MMA_LANE_ROWS];
#pragma unroll
    for (int r = 0; r < RF_MMA_LANE_ROWS; ++r) {
      const float m_new = fmaxf(m[r], mx[r]);
      ref[r] = safe_reference(m_new);
      mx[r] = exp2f(m[r] - ref[r]);  // the correction of what the row holds
      m[r] = m_new;
      l[r] *= mx[r];
    }
    rf_warp_sync();  // every lane has read the K rows: the weights go over them
#pragma unroll
    for (int e = 0; e < RF_MMA_ACC; ++e) {
      const int r = rf_mma_lane_row_of(e);
      const float w = exp2f(s[e] - ref[r]);
      l[r] += w;
#pragma unroll
      for (int c = 0; c < T::kTiles; ++c) o[c][e] *= mx[r];
      st.k[rf_mma_acc_row(lane, e) * T::kPStride + rf_mma_acc_col(lane, e)] = rf_float_to_f16(w);
    }
    rf_warp_sync();
    RfMmaA pa;
    rf_mma_load_a(pa, st.k, T::kPStride);
#pragma unroll
    for (int c = 0; c < T::kTiles; ++c) {
      RfMmaB b;
      rf_mma_load_b(b, st.vt + 16 * c * T::kVStride, T::kVStride);
      rf_mma(o[c], pa, b);
    }
  }
  rf_mma_reduce_rows<false>(l);

  __syncthreads();  // every warp is done with its stage: the merge area overlaps them
  Merge<T::kHeads>& mg = sh.u.merge;
#pragma unroll
  for (int e = 0; e < RF_MMA_ACC; ++e) {
    const int r = rf_mma_acc_row(lane, e);
    if (r < ng) {
#pragma unroll
      for (int c = 0; c < T::kTiles; ++c) mg.o[warp][r * HD + 16 * c + rf_mma_acc_col(lane, e)] = o[c][e];
    }
  }
#pragma unroll
  for (int lr = 0; lr < RF_MMA_LANE_ROWS; ++lr) {
    const int e = rf_mma_acc_of_lane_row(lr), r = rf_mma_acc_row(lane, e);
    if (r < ng && rf_mma_acc_col(lane, e) == 0) {  // one of the row's lanes
      mg.m[warp][r] = m[lr];
      mg.l[warp][r] = l[lr];
    }
  }
  __syncthreads();
}

}  // namespace rf_paged_attention

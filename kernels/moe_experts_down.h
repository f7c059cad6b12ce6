// Part of moe_experts.hip: down's three per-pair forms (the file's header says what each measured and where the
// launcher takes it), the same sums in the same order:
//   moe_down_<type>, slot-serial (down): a warp a token's kRows rows, its k slots walked in order;
//   moe_down_staged_<type>, slot-serial with h staged (down_staged): a workgroup a token's chunk of rows, h quantized
//     once into shared memory, each warp's kRows rows walking the slots two at a time;
//   moe_down_slots_<type>, slot-parallel (down_slots): a workgroup a token's rows, its warps the (slot, rows) units,
//     h staged in shared memory, the k terms summed in slot order from shared memory.
#pragma once

namespace {
namespace moe {

// A warp's place in the slot-serial down's grid: its first item and the stride to the next.
struct Warp {
  int lane, first, stride;
  __device__ __forceinline__ Warp() {
    const int warps = (int)blockDim.x / WARP_SIZE;
    lane = (int)threadIdx.x % WARP_SIZE;
    first = (int)blockIdx.x * warps + (int)threadIdx.x / WARP_SIZE;
    stride = (int)gridDim.x * warps;
  }
};

// Where each of kRows rows from r0 of expert e's down matrix starts (rows past the end: the last row again).
__device__ __forceinline__ void down_rows_of(const unsigned char* w[kRows], const unsigned char* down, int e, int r0,
                                             int hidden, unsigned long long row_bytes) {
  const unsigned long long expert = (unsigned long long)e * hidden;
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    w[r] = down + (expert + (unsigned long long)(r0 + r < hidden ? r0 + r : hidden - 1)) * row_bytes;
}

// total[r] += weight * (acc[r] summed over the warp + bias): one slot's term, as the slots' order has it.
__device__ __forceinline__ void add_slot_term(float total[kRows], const float acc[kRows], float weight,
                                              const float* __restrict__ down_bias, int e, int r0, int hidden) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float y = rf_warp_sum(acc[r]);
    if (down_bias && r0 + r < hidden) y += down_bias[(unsigned long long)e * hidden + (unsigned long long)(r0 + r)];
    total[r] = fmaf(weight, y, total[r]);
  }
}

// total[r] += the k slots' weighted terms of rows [r0, r0 + kRows) of token t, in slot order. kStaged: the slots'
// inputs quantized in `staged` (slot j's from j * slot_slices), two slots' rows loaded at once where both ids are in
// range (twice the loads in flight of one slot's); else one slot at a time, its h quantized here.
template <class P, bool kStaged>
__device__ __forceinline__ void walk_slots(float total[kRows], const typename P::Staged* staged, int slot_slices,
                                           const float* __restrict__ h, const unsigned char* down,
                                           const int* __restrict__ ids, const float* __restrict__ weights,
                                           const float* __restrict__ down_bias, int t, int k, int r0, int hidden,
                                           int ff, int n_expert, unsigned long long row_bytes) {
  for (int j = 0; j < k; j += kStaged ? 2 : 1) {
    const int pair = t * k + j;
    const int e0 = ids[pair], e1 = kStaged && j + 1 < k ? ids[pair + 1] : -1;
    const bool chosen0 = e0 >= 0 && e0 < n_expert, chosen1 = e1 >= 0 && e1 < n_expert;  // uniform: the warp's ids
    const float* h0 = h + (unsigned long long)pair * ff;
    if constexpr (kStaged) {
      if (chosen0 && chosen1) {
        const unsigned char* w[2 * kRows];
        down_rows_of(w, down, e0, r0, hidden, row_bytes);
        down_rows_of(w + kRows, down, e1, r0, hidden, row_bytes);
        float acc[2 * kRows];
#pragma unroll
        for (int r = 0; r < 2 * kRows; ++r) acc[r] = 0.0f;
        P::template rows_two_staged<kRows>(w, *staged, j * slot_slices, (j + 1) * slot_slices, ff, acc);
        add_slot_term(total, acc, weights[pair], down_bias, e0, r0, hidden);
        add_slot_term(total, acc + kRows, weights[pair + 1], down_bias, e1, r0, hidden);
        continue;
      }
    }
    for (int s = 0; s < (kStaged ? 2 : 1); ++s) {  // one slot (staged: at most one of two in range, or k odd)
      const int e = s ? e1 : e0;
      if (!(s ? chosen1 : chosen0)) continue;  // an id out of range reads nothing
      const unsigned char* w[kRows];
      down_rows_of(w, down, e, r0, hidden, row_bytes);
      float acc[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
      if constexpr (kStaged)
        P::template rows_staged<kRows>(w, *staged, (j + s) * slot_slices, h0 + s * ff, ff, acc);
      else
        P::template rows<kRows>(w, h0, ff, acc);
      add_slot_term(total, acc, weights[pair + s], down_bias, e, r0, hidden);
    }
  }
}

// down, slot-serial: a warp takes kRows rows of one token and walks its k slots (walk_slots), summing their weighted
// products in registers before one add into out; each warp quantizes the slices of h it reads.
template <class P>
__device__ __forceinline__ void down(float* __restrict__ out, const float* __restrict__ h, const void* down_,
                                     const int* __restrict__ ids, const float* __restrict__ weights,
                                     const float* __restrict__ down_bias, int tokens, int k, int hidden, int ff,
                                     int n_expert) {
  rf_check_wave_size();
  const Warp warp;
  const unsigned char* down = static_cast<const unsigned char*>(down_);
  const unsigned long long row_bytes = P::row_bytes(ff);
  const long long groups = (hidden + kRows - 1) / kRows;
  const long long items = (long long)tokens * groups;
  for (long long item = warp.first; item < items; item += warp.stride) {  // uniform across the warp
    const int t = (int)(item / groups), r0 = (int)(item % groups) * kRows;
    float total[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) total[r] = 0.0f;
    walk_slots<P, false>(total, nullptr, 0, h, down, ids, weights, down_bias, t, k, r0, hidden, ff, n_expert,
                         row_bytes);
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (warp.lane == r && r0 + r < hidden) out[(unsigned long long)t * hidden + r0 + r] += total[r];
  }
}

// down, slot-serial with h staged: a workgroup takes one token and a chunk of rows, quantizes the token's k slices of
// h once into shared memory (at most kMaxStagedSlices slices: the launcher checks), then each warp takes kRows rows of
// the chunk at a time and walks the slots as down() does, reading the slices from shared memory (the same bits). The
// chunk is the grid's share of a token's rows, whole units of the warps' kRows rows: the launcher sets it by the grid.
template <class P>
__device__ __forceinline__ void down_staged(float* __restrict__ out, const float* __restrict__ h, const void* down_,
                                            const int* __restrict__ ids, const float* __restrict__ weights,
                                            const float* __restrict__ down_bias, int tokens, int k, int hidden, int ff,
                                            int n_expert) {
  rf_check_wave_size();
  __shared__ typename P::Staged staged;
  const int lane = (int)threadIdx.x % WARP_SIZE, warp = (int)threadIdx.x / WARP_SIZE;
  const int unit = (int)blockDim.x / WARP_SIZE * kRows;  // rows the workgroup's warps take at once
  const int per_token = (int)gridDim.x / tokens > 1 ? (int)gridDim.x / tokens : 1;
  const int chunk = ((hidden + per_token - 1) / per_token + unit - 1) / unit * unit;
  const int chunks = (hidden + chunk - 1) / chunk, slot_slices = ff / 32;
  const unsigned char* down = static_cast<const unsigned char*>(down_);
  const unsigned long long row_bytes = P::row_bytes(ff);
  for (long long item = blockIdx.x; item < (long long)tokens * chunks; item += gridDim.x) {  // uniform: the workgroup's
    const int t = (int)(item / chunks), r_block = (int)(item % chunks) * chunk;
    const int r_end = r_block + chunk < hidden ? r_block + chunk : hidden;
    __syncthreads();  // every warp is done with the previous item's slices
    for (int i = (int)threadIdx.x; P::kStages && i < k * slot_slices; i += (int)blockDim.x) {
      const int j = i / slot_slices;
      P::stage_slice(staged, i, h + (unsigned long long)(t * k + j) * ff, i - j * slot_slices);
    }
    __syncthreads();
    for (int r0 = r_block + warp * kRows; r0 < r_end; r0 += unit) {  // uniform across the warp
      float total[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) total[r] = 0.0f;
      walk_slots<P, true>(total, &staged, slot_slices, h, down, ids, weights, down_bias, t, k, r0, hidden, ff, n_expert,
                          row_bytes);
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        if (lane == r && r0 + r < hidden) out[(unsigned long long)t * hidden + r0 + r] += total[r];
    }
  }
}

// down, slot-parallel: a workgroup takes one token and kSlotRows * groups rows, its warps the (slot, rows) units; the
// token's k slices of h are quantized once a workgroup into shared memory (passes of as many slots as it holds), each
// slot's weighted product left in shared memory and the k summed in slot order by one thread a row.
template <class P>
__device__ __forceinline__ void down_slots(float* __restrict__ out, const float* __restrict__ h, const void* down_,
                                           const int* __restrict__ ids, const float* __restrict__ weights,
                                           const float* __restrict__ down_bias, int tokens, int k, int hidden, int ff,
                                           int n_expert) {
  rf_check_wave_size();
  __shared__ typename P::Staged staged;
  __shared__ float slot_terms[kMaxSlots][kMaxBlockRows];  // slot j's down product (plus bias) for the chunk's rows
  __shared__ float slot_weight[kMaxSlots];                // its routing weight, 0 for an id out of range
  const Units units(k, kSlotRows);
  const unsigned char* down = static_cast<const unsigned char*>(down_);
  const unsigned long long row_bytes = P::row_bytes(ff);
  const int chunks = (hidden + units.block_rows - 1) / units.block_rows;
  const int slot_slices = ff / 32;  // staged slices of one slot's h
  const int slots_a_pass = P::kStages ? (kMaxStagedSlices / slot_slices < k ? kMaxStagedSlices / slot_slices : k) : k;
  for (long long item = blockIdx.x; item < (long long)tokens * chunks; item += gridDim.x) {  // uniform: the workgroup's
    const int t = (int)(item / chunks), r_block = (int)(item % chunks) * units.block_rows;
    for (int j0 = 0; j0 < k; j0 += slots_a_pass) {
      const int slots = k - j0 < slots_a_pass ? k - j0 : slots_a_pass;
      __syncthreads();  // every warp is done with the previous pass's slices
      for (int j = 0; j < slots; ++j)
        P::stage(staged, j * slot_slices, h + (unsigned long long)(t * k + j0 + j) * ff, ff);
      __syncthreads();
      for (int u = units.warp; u < slots * units.groups; u += units.warps) {  // uniform across the warp
        const int j = j0 + u % slots, group = u / slots, r0 = r_block + group * kSlotRows;
        const int pair = t * k + j, e = ids[pair];
        const bool chosen = e >= 0 && e < n_expert;
        float y[kSlotRows];
#pragma unroll
        for (int r = 0; r < kSlotRows; ++r) y[r] = 0.0f;
        if (chosen && r0 < hidden) {
          const unsigned long long expert = (unsigned long long)e * hidden;
          const unsigned char* w[kSlotRows];
#pragma unroll
          for (int r = 0; r < kSlotRows; ++r)
            w[r] = down + (expert + (unsigned long long)(r0 + r < hidden ? r0 + r : hidden - 1)) * row_bytes;
          P::template rows_staged<kSlotRows>(w, staged, (u % slots) * slot_slices, h + (unsigned long long)pair * ff,
                                             ff, y);
#pragma unroll
          for (int r = 0; r < kSlotRows; ++r) {
            y[r] = rf_warp_sum(y[r]);
            if (down_bias && r0 + r < hidden) y[r] += down_bias[expert + (unsigned long long)(r0 + r)];
          }
        }
#pragma unroll
        for (int r = 0; r < kSlotRows; ++r)
          if (units.lane == r) slot_terms[j][group * kSlotRows + r] = y[r];
        if (units.lane == 0 && group == 0) slot_weight[j] = chosen ? weights[pair] : 0.0f;
      }
    }
    __syncthreads();
    for (int r = (int)threadIdx.x; r < units.block_rows; r += (int)blockDim.x)
      if (r_block + r < hidden) {
        float total = 0.0f;
        for (int j = 0; j < k; ++j) total = fmaf(slot_weight[j], slot_terms[j][r], total);
        out[(unsigned long long)t * hidden + r_block + r] += total;
      }
  }
}

}  // namespace moe
}  // namespace

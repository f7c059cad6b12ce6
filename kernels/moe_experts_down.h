// Part of moe_experts.hip: down's two per-pair forms (the file's header says what each measured and where the launcher
// takes it), the same sums in the same order:
//   moe_down_<type>, slot-serial (down): a warp a token's kRows rows, its k slots walked in order;
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

// down, slot-serial: a warp takes kRows rows of one token and walks its k slots in order, summing their weighted
// products in registers before one add into out.
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
    for (int j = 0; j < k; ++j) {
      const int pair = t * k + j;
      const int e = ids[pair];
      if (e < 0 || e >= n_expert) continue;  // uniform: one id for the warp
      const unsigned long long expert = (unsigned long long)e * hidden;
      const unsigned char* w[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        w[r] = down + (expert + (unsigned long long)(r0 + r < hidden ? r0 + r : hidden - 1)) * row_bytes;
      float acc[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
      P::template rows<kRows>(w, h + (unsigned long long)pair * ff, ff, acc);
      const float weight = weights[pair];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float y = rf_warp_sum(acc[r]);
        if (down_bias && r0 + r < hidden) y += down_bias[expert + (unsigned long long)(r0 + r)];
        total[r] = fmaf(weight, y, total[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (warp.lane == r && r0 + r < hidden) out[(unsigned long long)t * hidden + r0 + r] += total[r];
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

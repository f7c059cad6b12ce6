// The selected experts' products of a mixture-of-experts feed-forward (hipcore/ops/moe_experts.py), one launch a
// projection for every token of the step:
//   moe_gate_up_<type>: h[t, j] = act(gate_e . x[t] + gate_bias_e, up_e . x[t] + up_bias_e), e = ids[t, j];
//   moe_down_<type>, moe_down_staged_<type>, moe_down_slots_<type>:
//     out[t] += sum_j weights[t, j] (down_e . h[t, j] + down_bias_e).
// Expert tensors are [n_expert, rows, cols] in their GGUF block format; biases float32 [n_expert, rows] or null.
//
// Work (the per-pair path, decode steps and small batches). gate|up: a workgroup takes one token and a chunk of rows,
// its warps the (slot, kRows rows) units of that chunk, kRows rows of gate and of up together (2 kRows rows' loads in
// flight, the activation in the warp); x, which the k slots share, is quantized once a workgroup into shared memory
// (Staged, a quantized type's) rather than by every warp. down has three forms, the same sums in the same order (no
// atomics, the same bits every run), the launcher choosing by how long a slot's product is and the type:
//   moe_down_<type>, slot-serial: a warp takes kRows rows of one token and walks its k slots in order, summing in
//     registers before one add into out, quantizing the slices of h it reads itself. Where a lane walks one slice of a
//     slot (Qwen3-30B-A3B's 768 columns) it measured 11.8 us a layer at one token on an H100, against 14.6-15.5 for
//     the slot-parallel forms.
//   moe_down_staged_<type>, the same with h staged (a quantized type's, k * ff / 32 <= kMaxStagedSlices): a workgroup
//     takes one token and a chunk of rows and quantizes the token's k slices of h once into shared memory; its warps
//     walk the slots as above, two slots' rows loaded at once. Each warp quantizing h again for every 2 rows was most
//     of the slot-serial form's instructions: Qwen3-30B-A3B's Q6_K down 13.1 -> 11.5 us a layer at 1 token, 61.7 ->
//     50.1 at 8 (H100, 2026-12-07; h staged alone 12.7 and 53.6, two slots alone 12.9 and 59.1).
//   moe_down_slots_<type>, slot-parallel: a workgroup takes one token and a chunk of rows, its warps the (slot,
//     kSlotRows rows) units, the token's k slices of h quantized once into shared memory, each slot's weighted
//     product left there and the k summed in slot order by one thread a row. Where a lane walks several slices of a
//     slot (gpt-oss-20b's 2,880 columns) it measured 21.3 us a layer against the slot-serial 36.1.
// Each warp reads only the rows of the experts its token selected; the grid loops over the items it does not cover.
// Quantized types (Q4_K, Q5_K, Q6_K, Q8_0, MXFP4) take qmatvec's integer path: a lane takes slices l, l + WARP_SIZE,
// ... of 32 weights, quantizes x's matching 32 values to int8 (qmatvec_formats.h's quantize_x) and forms the
// integer dot products (rf_dp4a). F16, BF16 and F32 multiply float x, 8 columns a lane a step.
// An expert id outside [0, n_expert) reads nothing and contributes 0 (the host kernels refuse it).
// down's entries ask for two workgroups an SM: without it nvcc held F16's and BF16's to 64 registers on sm_80 and
// spilled 4 bytes (gate|up's too, once it staged x: sm_80 spilled Q4_K's). The per-pair path holds at most
// kMaxStagedSlices slices of staged input (12,288 columns of x; h of a slot in moe_down_slots) and kMaxSlots slots
// (the launcher sends a wider gate|up down the grouped path, a wider down to the slot-serial form).
// Requirements the launcher checks: cols % 256 == 0 for the K-quants, % 32 otherwise; x and h 16-byte aligned;
// experts 16-byte aligned (Q4_K, Q5_K and the float types), 2-byte (Q6_K, Q8_0) or byte-aligned (MXFP4).
#include "hip_compat.h"
#include "gated_activation.h"
#include "qmatvec_formats.h"  // XSlice, quantize_x and the K-quant / Q8_0 formats
#include "mxfp4_q8_format.h"

namespace {
namespace moe {

constexpr int kRows = 2;       // rows of gate and of up a gate|up unit
constexpr int kSlotRows = 4;   // rows of down a moe_down_slots unit
constexpr int kMaxSlots = 32;
constexpr int kMaxStagedSlices = 384;  // 16.5 KiB: Qwen3-30B-A3B's x holds 64, gpt-oss-20b's x 90 and its h 4 x 90
constexpr int kMaxBlockRows = kSlotRows * (256 / 32);  // the most rows a moe_down_slots workgroup takes (256 threads)

// Quantized input slices in shared memory, a structure of arrays: a warp's lanes read consecutive slices' words
// without bank conflicts (an array of 44-byte XSlices put four lanes on each bank).
struct StagedSlices {
  int xq[8][kMaxStagedSlices];
  float d[kMaxStagedSlices];
  int sum_a[kMaxStagedSlices], sum_b[kMaxStagedSlices];
  __device__ __forceinline__ void put(int i, const q8::XSlice& s) {
#pragma unroll
    for (int w = 0; w < 8; ++w) xq[w][i] = s.xq[w];
    d[i] = s.d, sum_a[i] = s.sum_a, sum_b[i] = s.sum_b;
  }
  __device__ __forceinline__ q8::XSlice get(int i) const {
    q8::XSlice s;
#pragma unroll
    for (int w = 0; w < 8; ++w) s.xq[w] = xq[w][i];
    s.d = d[i], s.sum_a = sum_a[i], s.sum_b = sum_b[i];
    return s;
  }
};
struct NothingStaged {};

// qmatvec's integer path over N rows at once: acc[r] += w[r] . xq for this lane's slices. kGateUpInFlight,
// kDownInFlight: the slices a lane loads at once in the grouped gate|up and down (rows_batched_staged's F).
template <class Format, int kGateUpInFlight_ = 2, int kDownInFlight_ = 2>
struct Quantized {
  typedef StagedSlices Staged;
  static constexpr bool kStages = true;
  static constexpr int kGateUpInFlight = kGateUpInFlight_, kDownInFlight = kDownInFlight_;
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return Format::row_bytes(cols); }
  // x's slice `slice` quantized into s at `at`.
  static __device__ __forceinline__ void stage_slice(Staged& s, int at, const float* __restrict__ x, int slice) {
    int col_a, col_b;
    Format::columns(slice, col_a, col_b);
    s.put(at, q8::quantize_x(x, col_a, col_b));
  }
  // x's cols / 32 slices quantized into s from slice `at` on, by all threads of the workgroup.
  static __device__ __forceinline__ void stage(Staged& s, int at, const float* __restrict__ x, int cols) {
    for (int slice = (int)threadIdx.x; slice < cols / 32; slice += (int)blockDim.x) stage_slice(s, at + slice, x, slice);
  }
  // rows() with x's slices read from s (stage()d from `at` on): the same arithmetic, the same bits.
  template <int N>
  static __device__ __forceinline__ void rows_staged(const unsigned char* const w[N], const Staged& s, int at,
                                                     const float* __restrict__, int cols, float acc[N]) {
    const int lane = (int)threadIdx.x % WARP_SIZE;
    for (int slice = lane; slice < cols / 32; slice += WARP_SIZE) {
      typename Format::Raw raw[N];
#pragma unroll
      for (int r = 0; r < N; ++r) raw[r] = Format::load(w[r], slice);
      const q8::XSlice xs = s.get(at + slice);
#pragma unroll
      for (int r = 0; r < N; ++r) acc[r] = fmaf(xs.d, Format::dot(raw[r], slice, xs), acc[r]);
    }
  }
  template <int N>
  static __device__ __forceinline__ void rows(const unsigned char* const w[N], const float* __restrict__ x, int cols,
                                              float acc[N]) {
    const int lane = (int)threadIdx.x % WARP_SIZE;
    for (int slice = lane; slice < cols / 32; slice += WARP_SIZE) {
      typename Format::Raw raw[N];
#pragma unroll
      for (int r = 0; r < N; ++r) raw[r] = Format::load(w[r], slice);  // every row's loads before the first use
      int col_a, col_b;
      Format::columns(slice, col_a, col_b);
      const q8::XSlice xs = q8::quantize_x(x, col_a, col_b);
#pragma unroll
      for (int r = 0; r < N; ++r) acc[r] = fmaf(xs.d, Format::dot(raw[r], slice, xs), acc[r]);
    }
  }
  // rows_staged() for two slots at once (the staged slot-serial down): rows w[0, N) against the slices staged from
  // at0, w[N, 2N) against those from at1, every row's loads before the first use, twice rows_staged()'s bytes in
  // flight; each row's arithmetic is rows_staged()'s (the same bits).
  template <int N>
  static __device__ __forceinline__ void rows_two_staged(const unsigned char* const w[2 * N], const Staged& s, int at0,
                                                         int at1, int cols, float acc[2 * N]) {
    const int lane = (int)threadIdx.x % WARP_SIZE;
    for (int slice = lane; slice < cols / 32; slice += WARP_SIZE) {
      typename Format::Raw raw[2 * N];
#pragma unroll
      for (int r = 0; r < 2 * N; ++r) raw[r] = Format::load(w[r], slice);
      const q8::XSlice xs0 = s.get(at0 + slice);
#pragma unroll
      for (int r = 0; r < N; ++r) acc[r] = fmaf(xs0.d, Format::dot(raw[r], slice, xs0), acc[r]);
      const q8::XSlice xs1 = s.get(at1 + slice);
#pragma unroll
      for (int r = 0; r < N; ++r) acc[N + r] = fmaf(xs1.d, Format::dot(raw[N + r], slice, xs1), acc[N + r]);
    }
  }
  // The same for NB staged inputs at once (the grouped path; input b's slices from at[b] on): each slice of the N rows
  // decoded once and applied to every input, with rows_staged's arithmetic for each (the same bits). A lane loads F
  // of its slices (slice, slice + WARP_SIZE, ...) before using the first: the grouped path's warps walk one row of
  // gate and one of up (or two of down), so one slice a step left 2 x 17 bytes a lane in flight for gpt-oss-20b's
  // MXFP4. On an H100 (scripts/bench/measure_moe_experts.py, grouped, µs a layer; 2026-12-07): gpt-oss-20b's MXFP4
  // gate|up at 8 / 16 / 32 tokens 149.0 / 249.0 / 420.2 with two, 138.9 / 237.6 / 398.3 with three (its 2,880
  // columns, 90 slices: the whole row at once), 143.0 / 243.3 / 409.5 with four; its down 83.4 / 131.8 / 217.5, 80.5 /
  // 128.3 / 212.3 and 84.1 / 133.8 / 222.0; Qwen3-30B-A3B's Q4_K gate|up at 8 / 16 tokens 88.8 / 144.4 with two, 59.5
  // / 101.6 with three, but its Q6_K down 68.5 with two, 86.4 with three. So the measured gains take three
  // (Quantized's kGateUpInFlight, kDownInFlight: MXFP4's gate|up and down, Q4_K's gate|up; sm_80 spilled Q5_K's
  // gate|up with three), the rest two. The slices are taken in the same order
  // whatever the count, so the sums are the same bits; a slice past the row reads the first again and is not used.
  // (rows_staged, the per-pair path, with two measured slower: 28.7 -> 30.3 us at one token.)
  template <int N, int NB>
  static __device__ __forceinline__ void apply_staged(const typename Format::Raw raw[N], int slice, const Staged& s,
                                                      const int at[NB], float acc[N][NB]) {
    typename Format::Decoded dec[N];
#pragma unroll
    for (int r = 0; r < N; ++r) dec[r] = Format::decode(raw[r], slice);
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const q8::XSlice xs = s.get(at[b] + slice);
#pragma unroll
      for (int r = 0; r < N; ++r) acc[r][b] = fmaf(xs.d, Format::apply(dec[r], xs), acc[r][b]);
    }
  }
  template <int N, int NB, int F>
  static __device__ __forceinline__ void rows_batched_staged(const unsigned char* const w[N], const Staged& s,
                                                             const int at[NB], const float* const[NB], int cols,
                                                             float acc[N][NB]) {
    const int lane = (int)threadIdx.x % WARP_SIZE, slices = cols / 32;
    for (int slice = lane; slice < slices; slice += F * WARP_SIZE) {
      typename Format::Raw raw[F][N];
#pragma unroll
      for (int f = 0; f < F; ++f) {
        const int at_f = slice + f * WARP_SIZE < slices ? slice + f * WARP_SIZE : slice;
#pragma unroll
        for (int r = 0; r < N; ++r) raw[f][r] = Format::load(w[r], at_f);
      }
#pragma unroll
      for (int f = 0; f < F; ++f)
        if (slice + f * WARP_SIZE < slices) apply_staged<N, NB>(raw[f], slice + f * WARP_SIZE, s, at, acc);
    }
  }
  // The same with x quantized in the loop, each slice of each input once for all N rows (an input wider than
  // kMaxStagedSlices slices).
  template <int N, int NB>
  static __device__ __forceinline__ void rows_batched(const unsigned char* const w[N], const float* const x[NB], int cols,
                                                      float acc[N][NB]) {
    const int lane = (int)threadIdx.x % WARP_SIZE;
    for (int slice = lane; slice < cols / 32; slice += WARP_SIZE) {
      typename Format::Raw raw[N];
#pragma unroll
      for (int r = 0; r < N; ++r) raw[r] = Format::load(w[r], slice);
      int col_a, col_b;
      Format::columns(slice, col_a, col_b);
      typename Format::Decoded dec[N];
#pragma unroll
      for (int r = 0; r < N; ++r) dec[r] = Format::decode(raw[r], slice);
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const q8::XSlice xs = q8::quantize_x(x[b], col_a, col_b);
#pragma unroll
        for (int r = 0; r < N; ++r) acc[r][b] = fmaf(xs.d, Format::apply(dec[r], xs), acc[r][b]);
      }
    }
  }
};

// Eight weights of a float type: 16 bytes (F16, BF16) or 32 (F32) loaded, then multiplied into acc with x's eight
// values (the loads of every row first, the conversions after: fewer registers live than eight floats a row).
struct F16Elem {
  static constexpr int kBytes = 2;
  struct Raw {
    uint4 q;
  };
  static __device__ __forceinline__ Raw load(const unsigned char* p) { return {load_weights16(p)}; }
  static __device__ __forceinline__ float pair(unsigned int word, const float* x, float acc) {
    acc = fmaf(rf_f16_to_float((unsigned short)(word & 0xffffu)), x[0], acc);
    return fmaf(rf_f16_to_float((unsigned short)(word >> 16)), x[1], acc);
  }
  static __device__ __forceinline__ float fma8(const Raw r, const float x[8], float acc) {
    return pair(r.q.w, x + 6, pair(r.q.z, x + 4, pair(r.q.y, x + 2, pair(r.q.x, x, acc))));
  }
};
struct BF16Elem {
  static constexpr int kBytes = 2;
  typedef F16Elem::Raw Raw;
  static __device__ __forceinline__ Raw load(const unsigned char* p) { return {load_weights16(p)}; }
  static __device__ __forceinline__ float pair(unsigned int word, const float* x, float acc) {
    acc = fmaf(rf_uint_as_float(word << 16), x[0], acc);
    return fmaf(rf_uint_as_float(word & 0xffff0000u), x[1], acc);
  }
  static __device__ __forceinline__ float fma8(const Raw r, const float x[8], float acc) {
    return pair(r.q.w, x + 6, pair(r.q.z, x + 4, pair(r.q.y, x + 2, pair(r.q.x, x, acc))));
  }
};
struct F32Elem {
  static constexpr int kBytes = 4;
  struct Raw {
    uint4 a, b;
  };
  static __device__ __forceinline__ Raw load(const unsigned char* p) { return {load_weights16(p), load_weights16(p + 16)}; }
  static __device__ __forceinline__ float fma8(const Raw r, const float x[8], float acc) {
    acc = fmaf(rf_uint_as_float(r.a.x), x[0], acc), acc = fmaf(rf_uint_as_float(r.a.y), x[1], acc);
    acc = fmaf(rf_uint_as_float(r.a.z), x[2], acc), acc = fmaf(rf_uint_as_float(r.a.w), x[3], acc);
    acc = fmaf(rf_uint_as_float(r.b.x), x[4], acc), acc = fmaf(rf_uint_as_float(r.b.y), x[5], acc);
    acc = fmaf(rf_uint_as_float(r.b.z), x[6], acc);
    return fmaf(rf_uint_as_float(r.b.w), x[7], acc);
  }
};

template <class Elem>
struct Float {
  typedef NothingStaged Staged;  // float inputs are multiplied as they are
  static constexpr bool kStages = false;
  static constexpr int kGateUpInFlight = 1, kDownInFlight = 1;  // unused: rows_batched_staged is rows_batched
  static __device__ __forceinline__ unsigned long long row_bytes(int cols) { return (unsigned long long)cols * Elem::kBytes; }
  static __device__ __forceinline__ void stage(Staged&, int, const float* __restrict__, int) {}
  static __device__ __forceinline__ void stage_slice(Staged&, int, const float* __restrict__, int) {}
  template <int N>
  static __device__ __forceinline__ void rows_staged(const unsigned char* const w[N], const Staged&, int,
                                                     const float* __restrict__ x, int cols, float acc[N]) {
    rows<N>(w, x, cols, acc);
  }
  template <int N>
  static __device__ __forceinline__ void rows(const unsigned char* const w[N], const float* __restrict__ x, int cols,
                                              float acc[N]) {
    const int lane = (int)threadIdx.x % WARP_SIZE;
    for (int c = 8 * lane; c < cols; c += 8 * WARP_SIZE) {
      typename Elem::Raw raw[N];
#pragma unroll
      for (int r = 0; r < N; ++r) raw[r] = Elem::load(w[r] + (unsigned long long)c * Elem::kBytes);
      const float4 x0 = *reinterpret_cast<const float4*>(x + c), x1 = *reinterpret_cast<const float4*>(x + c + 4);
      const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
      for (int r = 0; r < N; ++r) acc[r] = Elem::fma8(raw[r], xv, acc[r]);
    }
  }
  template <int N, int NB, int>
  static __device__ __forceinline__ void rows_batched_staged(const unsigned char* const w[N], const Staged&,
                                                             const int[NB], const float* const x[NB], int cols,
                                                             float acc[N][NB]) {
    rows_batched<N, NB>(w, x, cols, acc);
  }
  template <int N, int NB>
  static __device__ __forceinline__ void rows_batched(const unsigned char* const w[N], const float* const x[NB], int cols,
                                                      float acc[N][NB]) {
    const int lane = (int)threadIdx.x % WARP_SIZE;
    for (int c = 8 * lane; c < cols; c += 8 * WARP_SIZE) {
      typename Elem::Raw raw[N];
#pragma unroll
      for (int r = 0; r < N; ++r) raw[r] = Elem::load(w[r] + (unsigned long long)c * Elem::kBytes);
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const float4 x0 = *reinterpret_cast<const float4*>(x[b] + c), x1 = *reinterpret_cast<const float4*>(x[b] + c + 4);
        const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int r = 0; r < N; ++r) acc[r][b] = Elem::fma8(raw[r], xv, acc[r][b]);
      }
    }
  }
};

// The (slot, row group) units of a per-pair workgroup: `groups` groups of `rows_per_unit` rows for each of the k
// slots, at least one group (more warps than slots: several groups; fewer: a warp takes several slots).
struct Units {
  int lane, warp, warps, groups, block_rows;
  __device__ __forceinline__ Units(int k, int rows_per_unit) {
    lane = (int)threadIdx.x % WARP_SIZE;
    warp = (int)threadIdx.x / WARP_SIZE;
    warps = (int)blockDim.x / WARP_SIZE;
    groups = warps >= k ? warps / k : 1;
    block_rows = groups * rows_per_unit;
  }
};

template <class P>
__device__ __forceinline__ void gate_up(float* __restrict__ h, const float* __restrict__ x, const void* gate_,
                                        const void* up_, const int* __restrict__ ids, const float* __restrict__ gate_bias,
                                        const float* __restrict__ up_bias, int tokens, int k, int ff, int hidden,
                                        int n_expert, int activation) {
  rf_check_wave_size();
  __shared__ typename P::Staged staged;
  const Units units(k, kRows);
  const unsigned char* gate = static_cast<const unsigned char*>(gate_);
  const unsigned char* up = static_cast<const unsigned char*>(up_);
  const unsigned long long row_bytes = P::row_bytes(hidden);
  const int chunks = (ff + units.block_rows - 1) / units.block_rows;
  for (long long item = blockIdx.x; item < (long long)tokens * chunks; item += gridDim.x) {  // uniform: the workgroup's
    const int t = (int)(item / chunks), r_block = (int)(item % chunks) * units.block_rows;
    const float* xt = x + (unsigned long long)t * hidden;
    __syncthreads();  // every warp is done with the previous item's slices
    P::stage(staged, 0, xt, hidden);
    __syncthreads();
    for (int u = units.warp; u < k * units.groups; u += units.warps) {  // uniform across the warp
      const int pair = t * k + u % k, r0 = r_block + (u / k) * kRows;
      if (r0 >= ff) continue;
      const int e = ids[pair];
      float* out = h + (unsigned long long)pair * ff;
      if (e < 0 || e >= n_expert) {
        if (units.lane < kRows && r0 + units.lane < ff) out[r0 + units.lane] = 0.0f;
        continue;
      }
      const unsigned long long expert = (unsigned long long)e * ff;
      const unsigned char* w[2 * kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {  // rows past the end read the last row again and are not written
        const unsigned long long row = expert + (unsigned long long)(r0 + r < ff ? r0 + r : ff - 1);
        w[r] = gate + row * row_bytes;
        w[kRows + r] = up + row * row_bytes;
      }
      float acc[2 * kRows];
#pragma unroll
      for (int r = 0; r < 2 * kRows; ++r) acc[r] = 0.0f;
      P::template rows_staged<2 * kRows>(w, staged, 0, xt, hidden, acc);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float g = rf_warp_sum(acc[r]), u_ = rf_warp_sum(acc[kRows + r]);
        if (units.lane == r && r0 + r < ff) {
          const unsigned long long b = expert + (unsigned long long)(r0 + r);
          if (gate_bias) g += gate_bias[b];
          if (up_bias) u_ += up_bias[b];
          out[r0 + r] = activation ? rf_swiglu_oai_gated(g, u_) : rf_silu_gated(g, u_);
        }
      }
    }
  }
}

}  // namespace moe
}  // namespace

#include "moe_experts_down.h"     // down, slot-serial and slot-parallel
#include "moe_experts_grouped.h"  // prompts and batches: the pairs of each expert together

#define RF_MOE_ENTRIES(suffix, Policy)                                                                                  \
  extern "C" __global__ __launch_bounds__(256, 2) void moe_gate_up_##suffix(                                            \
      float* __restrict__ h, const float* __restrict__ x, const void* __restrict__ gate, const void* __restrict__ up, \
      const int* __restrict__ ids, const float* __restrict__ gate_bias, const float* __restrict__ up_bias, int tokens, \
      int k, int ff, int hidden, int n_expert, int activation) {                                                      \
    moe::gate_up<Policy>(h, x, gate, up, ids, gate_bias, up_bias, tokens, k, ff, hidden, n_expert, activation);    \
  }                                                                                                                   \
  extern "C" __global__ __launch_bounds__(256, 2) void moe_down_##suffix(                                               \
      float* __restrict__ out, const float* __restrict__ h, const void* __restrict__ down, const int* __restrict__ ids, \
      const float* __restrict__ weights, const float* __restrict__ down_bias, int tokens, int k, int hidden, int ff,  \
      int n_expert) {                                                                                                 \
    moe::down<Policy>(out, h, down, ids, weights, down_bias, tokens, k, hidden, ff, n_expert);                       \
  }                                                                                                                   \
  extern "C" __global__ __launch_bounds__(256, 2) void moe_down_slots_##suffix(                                         \
      float* __restrict__ out, const float* __restrict__ h, const void* __restrict__ down, const int* __restrict__ ids, \
      const float* __restrict__ weights, const float* __restrict__ down_bias, int tokens, int k, int hidden, int ff,  \
      int n_expert) {                                                                                                 \
    moe::down_slots<Policy>(out, h, down, ids, weights, down_bias, tokens, k, hidden, ff, n_expert);                 \
  }                                                                                                                   \
  extern "C" __global__ __launch_bounds__(256) void moe_gate_up_grouped_##suffix(                                    \
      float* __restrict__ h, const float* __restrict__ x, const void* __restrict__ gate, const void* __restrict__ up, \
      const int* __restrict__ ids, const float* __restrict__ gate_bias, const float* __restrict__ up_bias, int tokens, \
      int k, int ff, int hidden, int n_expert, int activation) {                                                      \
    moe::gate_up_grouped<Policy>(h, x, gate, up, ids, gate_bias, up_bias, tokens, k, ff, hidden, n_expert, activation); \
  }                                                                                                                   \
  extern "C" __global__ __launch_bounds__(256, 2) void moe_down_grouped_##suffix(                                       \
      float* __restrict__ terms, const float* __restrict__ h, const void* __restrict__ down, const int* __restrict__ ids, \
      const float* __restrict__ weights, const float* __restrict__ down_bias, int tokens, int k, int hidden, int ff,  \
      int n_expert) {                                                                                                 \
    moe::down_grouped<Policy>(terms, h, down, ids, weights, down_bias, tokens, k, hidden, ff, n_expert);             \
  }

// down, slot-serial with h staged (moe_experts_down.h down_staged): the quantized types', whose h it quantizes once a
// workgroup; two workgroups an SM as the other downs.
#define RF_MOE_STAGED_DOWN_ENTRY(suffix, Policy)                                                                     \
  extern "C" __global__ __launch_bounds__(256, 2) void moe_down_staged_##suffix(                                        \
      float* __restrict__ out, const float* __restrict__ h, const void* __restrict__ down, const int* __restrict__ ids, \
      const float* __restrict__ weights, const float* __restrict__ down_bias, int tokens, int k, int hidden, int ff,  \
      int n_expert) {                                                                                                 \
    moe::down_staged<Policy>(out, h, down, ids, weights, down_bias, tokens, k, hidden, ff, n_expert);                \
  }

namespace {
namespace moe {
// the grouped path's slices in flight (rows_batched_staged): three where measured faster
typedef Quantized<q8::Q4_KFormat, 3, 2> Q4_KPolicy;
typedef Quantized<q8::MXFP4Format, 3, 3> MXFP4Policy;
}  // namespace moe
}  // namespace

RF_MOE_ENTRIES(q4_k, moe::Q4_KPolicy)
RF_MOE_ENTRIES(q5_k, moe::Quantized<q8::Q5_KFormat>)
RF_MOE_ENTRIES(q6_k, moe::Quantized<q8::Q6_KFormat>)
RF_MOE_ENTRIES(q8_0, moe::Quantized<q8::Q8_0Format>)
RF_MOE_ENTRIES(mxfp4, moe::MXFP4Policy)
RF_MOE_ENTRIES(f16, moe::Float<moe::F16Elem>)
RF_MOE_ENTRIES(bf16, moe::Float<moe::BF16Elem>)
RF_MOE_ENTRIES(f32, moe::Float<moe::F32Elem>)
RF_MOE_STAGED_DOWN_ENTRY(q4_k, moe::Quantized<q8::Q4_KFormat>)
RF_MOE_STAGED_DOWN_ENTRY(q5_k, moe::Quantized<q8::Q5_KFormat>)
RF_MOE_STAGED_DOWN_ENTRY(q6_k, moe::Quantized<q8::Q6_KFormat>)
RF_MOE_STAGED_DOWN_ENTRY(q8_0, moe::Quantized<q8::Q8_0Format>)
RF_MOE_STAGED_DOWN_ENTRY(mxfp4, moe::Quantized<q8::MXFP4Format>)

// out[t] += sum_j terms[t, j] in slot order (the grouped down's second step): grid-stride over tokens x hidden.
extern "C" __global__ __launch_bounds__(256) void moe_sum_slots_f32(float* __restrict__ out, const float* __restrict__ terms,
                                                                   int tokens, int k, int hidden) {
  const unsigned long long n = (unsigned long long)tokens * hidden;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const unsigned long long t = i / hidden, r = i % hidden;
    float total = 0.0f;
    for (int j = 0; j < k; ++j) total += terms[(t * k + j) * hidden + r];
    out[i] += total;
  }
}

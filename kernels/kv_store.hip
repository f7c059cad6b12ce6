// kv_store: write n_tokens tokens' K and V rows (float32 [n_tokens, n_kv_heads, head_dim]) into their
// cache slots, converted to the pool's format. Pools are [num_blocks, n_kv_heads, block_size, row]
// (the KvCache layout); slot = block * block_size + offset. A negative slot marks a padding token and
// is skipped; so is a slot past the pool (a kernel cannot raise; the host reference refuses it).
//
// The stored bytes equal the host codecs' (hipcore/kvcache/dtypes.py) bit for bit:
//   f16   round to nearest even (numpy's astype(float16)), overflow to infinity;
//   bf16  round to nearest even, NaN kept quiet (rf_float_to_bf16);
//   f32   a copy;
//   q8_0  ggml's quantize_row_q8_0_ref per 32 elements: d = amax / 127 and inv = 1 / d in float32,
//         q = sign(x * inv) * floor(|x * inv| + 0.5) (round half away from zero), d stored as f16.
//         Finite inputs only: a NaN is ignored by the amax here (fmaxf) but poisons it in numpy.
//
// Geometry: workgroup-stride over tokens (any grid covers them), threads over a token's elements.
// q8_0 gives each 32-element block to 32 consecutive lanes (a whole NVIDIA/RDNA warp, half a CDNA
// one), which find its amax with shuffles of width 32. Block size: a multiple of 64 up to 256.
#include "hip_compat.h"
#include "block_format_q8_0.h"  // the q8_0 rows' layout

namespace rf_kv_store {

struct F16Row {
  static __device__ __forceinline__ unsigned long long row_bytes(int head_dim) { return (unsigned long long)head_dim * 2; }
  static __device__ __forceinline__ void put(unsigned char* row, int e, float x) {
    reinterpret_cast<unsigned short*>(row)[e] = rf_float_to_f16(x);
  }
};

struct BF16Row {
  static __device__ __forceinline__ unsigned long long row_bytes(int head_dim) { return (unsigned long long)head_dim * 2; }
  static __device__ __forceinline__ void put(unsigned char* row, int e, float x) {
    reinterpret_cast<unsigned short*>(row)[e] = rf_float_to_bf16(x);
  }
};

struct F32Row {
  static __device__ __forceinline__ unsigned long long row_bytes(int head_dim) { return (unsigned long long)head_dim * 4; }
  static __device__ __forceinline__ void put(unsigned char* row, int e, float x) { reinterpret_cast<float*>(row)[e] = x; }
};

// The slot's (block, offset), or false for a padding token or a slot past the pool.
static __device__ __forceinline__ bool slot_place(int slot, int block_size, int num_blocks, int& block, int& offset) {
  if (slot < 0 || (long long)slot >= (long long)num_blocks * block_size) return false;
  block = slot / block_size;
  offset = slot - block * block_size;
  return true;
}

template <class Row>
__device__ __forceinline__ void store_elementwise(unsigned char* __restrict__ k_pool, unsigned char* __restrict__ v_pool,
                                                  const float* __restrict__ k, const float* __restrict__ v,
                                                  const int* __restrict__ slot_mapping, int n_tokens, int n_kv_heads,
                                                  int head_dim, int block_size, int num_blocks) {
  const unsigned long long row_bytes = Row::row_bytes(head_dim);
  const int row_elems = n_kv_heads * head_dim;
  for (int t = (int)blockIdx.x; t < n_tokens; t += (int)gridDim.x) {
    int block, offset;
    if (!slot_place(slot_mapping[t], block_size, num_blocks, block, offset)) continue;  // uniform over the workgroup
    const unsigned long long first_row = (unsigned long long)block * n_kv_heads * block_size + offset;
    const unsigned long long src = (unsigned long long)t * row_elems;
    for (int i = (int)threadIdx.x; i < row_elems; i += (int)blockDim.x) {
      const int head = i / head_dim, e = i - head * head_dim;
      const unsigned long long at = (first_row + (unsigned long long)head * block_size) * row_bytes;
      Row::put(k_pool + at, e, k[src + i]);
      Row::put(v_pool + at, e, v[src + i]);
    }
  }
}

constexpr int kQ8Elems = rf_blocks::Q8_0::kValues, kQ8Bytes = rf_blocks::Q8_0::kBytes;

__device__ __forceinline__ void store_q8_0(unsigned char* __restrict__ k_pool, unsigned char* __restrict__ v_pool,
                                           const float* __restrict__ k, const float* __restrict__ v,
                                           const int* __restrict__ slot_mapping, int n_tokens, int n_kv_heads,
                                           int head_dim, int block_size, int num_blocks) {
  const int blocks_per_row = head_dim / kQ8Elems;
  const unsigned long long row_bytes = (unsigned long long)blocks_per_row * kQ8Bytes;
  const int per_pool = n_kv_heads * blocks_per_row;  // quant blocks of one token in one pool
  const int lane = (int)threadIdx.x % kQ8Elems, segment = (int)threadIdx.x / kQ8Elems;
  const int segments = (int)blockDim.x / kQ8Elems;
  for (int t = (int)blockIdx.x; t < n_tokens; t += (int)gridDim.x) {
    int block, offset;
    if (!slot_place(slot_mapping[t], block_size, num_blocks, block, offset)) continue;
    const unsigned long long first_row = (unsigned long long)block * n_kv_heads * block_size + offset;
    // The trip count is the same for every lane, so the shuffles always have the whole warp; a segment
    // past the last quant block works on block 0 and writes nothing.
    for (int base = 0; base < 2 * per_pool; base += segments) {
      const bool live = base + segment < 2 * per_pool;
      const int index = live ? base + segment : 0;
      const bool is_v = index >= per_pool;
      const int in_pool = is_v ? index - per_pool : index;
      const int head = in_pool / blocks_per_row, quant_block = in_pool - head * blocks_per_row;
      const float x = (is_v ? v : k)[((unsigned long long)t * n_kv_heads + head) * head_dim + quant_block * kQ8Elems + lane];

      float amax = fabsf(x);
#pragma unroll
      for (int o = kQ8Elems / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor(amax, o, kQ8Elems));
      const float d = amax / 127.0f;
      const float inv = d != 0.0f ? 1.0f / d : 0.0f;
      const float scaled = x * inv;
      const int magnitude = min((int)(fabsf(scaled) + 0.5f), 127);  // truncation is floor here: the sum is >= 0
      const int q = scaled < 0.0f ? -magnitude : magnitude;

      if (live) {
        unsigned char* dst = (is_v ? v_pool : k_pool) + (first_row + (unsigned long long)head * block_size) * row_bytes +
                             (unsigned long long)quant_block * kQ8Bytes;
        if (lane == 0) *reinterpret_cast<unsigned short*>(dst) = rf_float_to_f16(d);
        dst[rf_blocks::Q8_0::kQsAt + lane] = (unsigned char)(signed char)q;
      }
    }
  }
}

}  // namespace rf_kv_store

#define RF_KV_STORE_ARGS                                                                                      \
  void *__restrict__ k_pool, void *__restrict__ v_pool, const float *__restrict__ k, const float *__restrict__ v, \
      const int *__restrict__ slot_mapping, int n_tokens, int n_kv_heads, int head_dim, int block_size, int num_blocks
#define RF_KV_STORE_PASS                                                                                         \
  static_cast<unsigned char*>(k_pool), static_cast<unsigned char*>(v_pool), k, v, slot_mapping, n_tokens, n_kv_heads, \
      head_dim, block_size, num_blocks

extern "C" __global__ __launch_bounds__(256) void kv_store_f16(RF_KV_STORE_ARGS) {
  rf_grid_dependency_sync();  // a programmatic launch (hipcore/ops/kv_store.py)
  rf_kv_store::store_elementwise<rf_kv_store::F16Row>(RF_KV_STORE_PASS);
}
extern "C" __global__ __launch_bounds__(256) void kv_store_bf16(RF_KV_STORE_ARGS) {
  rf_grid_dependency_sync();  // a programmatic launch (hipcore/ops/kv_store.py)
  rf_kv_store::store_elementwise<rf_kv_store::BF16Row>(RF_KV_STORE_PASS);
}
extern "C" __global__ __launch_bounds__(256) void kv_store_f32(RF_KV_STORE_ARGS) {
  rf_grid_dependency_sync();  // a programmatic launch (hipcore/ops/kv_store.py)
  rf_kv_store::store_elementwise<rf_kv_store::F32Row>(RF_KV_STORE_PASS);
}
extern "C" __global__ __launch_bounds__(256) void kv_store_q8_0(RF_KV_STORE_ARGS) {
  rf_grid_dependency_sync();  // a programmatic launch (hipcore/ops/kv_store.py)
  rf_check_wave_size();
  rf_kv_store::store_q8_0(RF_KV_STORE_PASS);
}

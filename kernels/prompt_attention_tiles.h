// Part of the prompt_attention op (kernels/prompt_attention.hip includes it; built and hashed with it): a head
// size's tile (Tile), the kernel's arguments and shared memory, and one step's K and V rows: where a key's row
// lies in a pool (Rows) and their loads into shared memory, V transposed (Fetch).
#pragma once

namespace {
namespace rf_prompt_attention {

constexpr int kRows = 16;  // a warp's query tokens: one matrix tile of rows
constexpr float kLog2e = 1.4426950408889634f;

// A head size's tile. Heads up to 128 share one layout: 4 warps (64 query tokens), 32 keys a step. A head of
// 256 (Gemma's) takes 2 row tiles (32 query tokens) and 16 keys a step: its staged q, K, V^T and weights then
// take 39 KB of shared memory (at 4 row tiles and 32 keys they would take 76 KB, past the 48 KB a static
// allocation may have on NVIDIA and the 64 KB of AMD's LDS). Each of its row tiles is held by two warps that
// both compute its scores and weights and each accumulate half of its output's columns: 16 rows of 256
// accumulators in one warp left no registers for the next step's rows in flight, and 2 warps a workgroup too few
// to hide a step's latencies (paged_attention was faster below ~8,000 query rows on an H200).
template <int HD>
struct Tile {
  static constexpr bool kWide = HD > 128;
  static constexpr int kWarps = 4;                          // the launch bounds' warps
  static constexpr int kColumnSplit = kWide ? 2 : 1;        // warps that share a row tile, each with its columns
  static constexpr int kRowWarps = kWarps / kColumnSplit;   // row tiles (16 query tokens of one head) a workgroup
  static constexpr int kKeys = kWide ? 16 : 32;             // keys per step
  static constexpr int kMaxHeadDim = kWide ? HD : 128;
  static constexpr int kQStride = kMaxHeadDim + 8;          // halves per staged q row and per K row (16-byte aligned
  static constexpr int kKStride = kMaxHeadDim + 8;          // rows whose fragment loads start in different banks)
  static constexpr int kVStride = kKeys + 8;                // halves per row of V^T (one head_dim element's keys)
  static constexpr int kPStride = kKeys + 8;                // halves per row of a row tile's weights
  static constexpr int kMaxTokens = kRowWarps * kRows;      // a workgroup's tokens (one head per row tile)
  static constexpr int kThreads = kWarps * WARP_SIZE;
};

struct Params {
  float* out;
  const float* q;
  const unsigned char* __restrict__ k_pool;
  const unsigned char* __restrict__ v_pool;
  const int* __restrict__ block_tables;
  const int* __restrict__ token_seq;
  const int* __restrict__ positions;
  int n_tokens, n_heads, n_kv_heads, head_dim, block_size, max_blocks, num_blocks, window;
  float scale;
  int out_f16;    // out holds f16 values (the o product's f16 x) instead of float32
  float softcap;  // the capped entries: S becomes softcap * tanh(S / softcap) (the others ignore it)
  const float* __restrict__ sinks;  // the _sinks entries: a logit per query head (gpt-oss); nullptr for the others
};

template <int HD>
struct Shared {
  using T = Tile<HD>;
  unsigned short q[T::kMaxTokens * T::kQStride];        // each row tile's 16 query rows, f16, scaled
  unsigned short k[T::kKeys * T::kKStride];             // the step's keys, one row each
  unsigned short vt[T::kMaxHeadDim * T::kVStride];      // the step's values, transposed: row d holds element d of
                                                        // each key
  unsigned short p[T::kRowWarps][kRows * T::kPStride];  // each row tile's weights of the step
  int seq[T::kMaxTokens];
  int pos[T::kMaxTokens];
};

static __device__ __forceinline__ int lesser(int a, int b) { return a < b ? a : b; }
static __device__ __forceinline__ int greater(int a, int b) { return a > b ? a : b; }

// Where one key's row of a KV head starts in a pool (blocks outside the pool read block 0, as paged_attention does).
struct Rows {
  const int* __restrict__ table;
  unsigned int num_blocks, block_stride, row_bytes;
  int block_shift, in_block_mask;
  unsigned long long head_offset;
  static __device__ __forceinline__ unsigned long long at(const Rows& r, int key) {
    const unsigned int b = (unsigned int)r.table[key >> r.block_shift];
    return (unsigned long long)(b < r.num_blocks ? b : 0u) * r.block_stride + r.head_offset +
           (unsigned int)(key & r.in_block_mask) * r.row_bytes;
  }
};

// Whether the next step's K and V rows are loaded while this step's products run (NVIDIA, CDNA), or in their own
// step, each piece stored as it arrives (RDNA, whose larger WMMA fragments leave no registers for them: they
// spilled; the FMA path).
#if RF_MMA_KIND == RF_MMA_NV_M16N8K16 || RF_MMA_KIND == RF_MMA_CDNA_MFMA
constexpr bool kPrefetch = true;
#else
constexpr bool kPrefetch = false;
#endif

// One step's K and V rows (keys k0 .. k0 + kKeys - 1, those past `hi` reading key hi), loaded into registers by
// `issue` and written to shared memory by `store`: K row by row, 16 bytes a load; V in pairs of keys, transposed
// (element d of keys 2i and 2i + 1 as one word of row d).
template <int HD>
struct Fetch {
  static constexpr int kKeys = Tile<HD>::kKeys, kThreads = Tile<HD>::kThreads;
  static constexpr int kKStride = Tile<HD>::kKStride, kVStride = Tile<HD>::kVStride;
  static constexpr int kChunks = HD / 8;                                     // 16-byte pieces of a row
  static constexpr int kKLoads = (kKeys * kChunks + kThreads - 1) / kThreads;  // per thread
  static constexpr int kVLoads = (kKeys / 2 * kChunks + kThreads - 1) / kThreads;
  // issue and store deal V's pieces to lanes pair by pair (pair = e % kPairs): a warp's transposed words of one
  // element then lie in consecutive words of a row of V^T, 2 (narrow) or 4 (wide) lanes a bank of shared memory.
  // Dealt piece by piece, as K's are (and as load_and_store still does: RDNA's registers took it worse), a lane's
  // row was 8 rows (96 or 160 words, whole multiples of the 32 banks) from the next lane's: 16 or 32 lanes a bank.
  static constexpr int kPairs = kKeys / 2;
  uint4 k[kKLoads], va[kVLoads], vb[kVLoads];

  // Member by member, as matmul.hip loads its prefetched x: a whole-struct copy into an array element put the
  // arrays in private memory on AMD (scratch on RDNA, LDS on CDNA).
  static __device__ __forceinline__ void copy(uint4& to, const unsigned char* from) {
    const uint4 v = *reinterpret_cast<const uint4*>(from);
    to.x = v.x, to.y = v.y, to.z = v.z, to.w = v.w;
  }

  __device__ __forceinline__ void issue(const Params& p, const Rows& rows, int k0, int hi, int tid) {
#pragma unroll
    for (int i = 0; i < kKLoads; ++i) {
      const int e = tid + kThreads * i;
      if (e < kKeys * kChunks) {
        const int key = e / kChunks, c = e % kChunks;
        copy(k[i], p.k_pool + Rows::at(rows, lesser(k0 + key, hi)) + 16 * c);
      }
    }
#pragma unroll
    for (int i = 0; i < kVLoads; ++i) {
      const int e = tid + kThreads * i;
      if (e < kKeys / 2 * kChunks) {
        const int pair = e % kPairs, c = e / kPairs;
        copy(va[i], p.v_pool + Rows::at(rows, lesser(k0 + 2 * pair, hi)) + 16 * c);
        copy(vb[i], p.v_pool + Rows::at(rows, lesser(k0 + 2 * pair + 1, hi)) + 16 * c);
      }
    }
  }

  // Both at once, a row piece at a time, with nothing held between (the kinds without prefetch).
  static __device__ __forceinline__ void load_and_store(const Params& p, const Rows& rows, int k0, int hi, int tid,
                                                        Shared<HD>& sh) {
    for (int e = tid; e < kKeys * kChunks; e += kThreads) {
      const int key = e / kChunks, c = e % kChunks;
      const uint4 v = *reinterpret_cast<const uint4*>(p.k_pool + Rows::at(rows, lesser(k0 + key, hi)) + 16 * c);
      *reinterpret_cast<uint4*>(sh.k + key * kKStride + 8 * c) = v;
    }
    for (int e = tid; e < kKeys / 2 * kChunks; e += kThreads) {
      const int pair = e / kChunks, c = e % kChunks;
      const uint4 a = *reinterpret_cast<const uint4*>(p.v_pool + Rows::at(rows, lesser(k0 + 2 * pair, hi)) + 16 * c);
      const uint4 b = *reinterpret_cast<const uint4*>(p.v_pool + Rows::at(rows, lesser(k0 + 2 * pair + 1, hi)) + 16 * c);
      transpose_pair(sh, pair, c, a, b);
    }
  }

  // Element d of the 8 of piece c of keys 2 pair and 2 pair + 1 (a and b) as one word of V^T's row 8 c + d.
  static __device__ __forceinline__ void transpose_pair(Shared<HD>& sh, int pair, int c, const uint4& a,
                                                        const uint4& b) {
    const unsigned int wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int d = 0; d < 8; ++d) {
      const unsigned int ha = (wa[d / 2] >> (16 * (d % 2))) & 0xffffu, hb = (wb[d / 2] >> (16 * (d % 2))) & 0xffffu;
      *reinterpret_cast<unsigned int*>(sh.vt + (8 * c + d) * kVStride + 2 * pair) = ha | hb << 16;
    }
  }

  __device__ __forceinline__ void store(Shared<HD>& sh, int tid) const {
#pragma unroll
    for (int i = 0; i < kKLoads; ++i) {
      const int e = tid + kThreads * i;
      if (e < kKeys * kChunks) {
        const int key = e / kChunks, c = e % kChunks;
        *reinterpret_cast<uint4*>(sh.k + key * kKStride + 8 * c) = k[i];
      }
    }
#pragma unroll
    for (int i = 0; i < kVLoads; ++i) {
      const int e = tid + kThreads * i;
      if (e < kKeys / 2 * kChunks) {
        transpose_pair(sh, e % kPairs, e / kPairs, va[i], vb[i]);
      }
    }
  }
};
}  // namespace rf_prompt_attention
}  // namespace

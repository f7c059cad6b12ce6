// A host emulation of the HIP kernel language, enough to run kernels/*.hip on the CPU in CI (where
// there is no GPU). Every GPU thread of a block is a std::thread; blocks run one after the other.
// __syncthreads is a barrier over the block; a warp's shuffles go through a per-warp array between two
// barriers over the warp, so lanes exchange values in lockstep as on the hardware. WARP_SIZE is set
// on the compiler's command line (32 or 64), so both warp widths are exercised.
//
// It checks the kernels' logic (indexing, block layouts, reductions, grid-stride loops, in-place
// use), not the vendor sections of hip_compat.h, which the build tests and the GPU tier cover.
#pragma once
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#ifndef WARP_SIZE
#error "compile with -DWARP_SIZE=32 or -DWARP_SIZE=64"
#endif

struct rf_uint3 {
  unsigned int x, y, z;
};
struct float4 {
  float x, y, z, w;
};
struct uint4 {
  unsigned int x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned int x, y;
};

inline thread_local rf_uint3 emu_thread_idx{0, 0, 0};
inline rf_uint3 emu_block_idx{0, 0, 0}, emu_block_dim{1, 1, 1}, emu_grid_dim{1, 1, 1};
inline std::barrier<>* emu_block_barrier = nullptr;

struct EmuWarp {
  std::unique_ptr<std::barrier<>> barrier;
  unsigned int slots[WARP_SIZE];
  float mma_a[WARP_SIZE][16], mma_b[WARP_SIZE][16];  // each lane's matrix-instruction operands
  const unsigned short* rows[WARP_SIZE];             // each lane's ldmatrix row address
};
inline std::vector<EmuWarp>* emu_warps = nullptr;

#define threadIdx emu_thread_idx
#define blockIdx emu_block_idx
#define blockDim emu_block_dim
#define gridDim emu_grid_dim
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static  // one instance shared by the threads of the (single) running block
#define __launch_bounds__(...)

inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }
// A device-wide fence and an atomic counter (paged attention's "last workgroup combines" step). Blocks
// run one after another here, so what one block wrote is visible to the next without more.
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
inline int atomicMax(int* p, int v) {
  std::atomic_ref<int> a(*p);
  int old = a.load();
  while (old < v && !a.compare_exchange_weak(old, v)) {}
  return old;
}
inline int atomicMin(int* p, int v) {
  std::atomic_ref<int> a(*p);
  int old = a.load();
  while (old > v && !a.compare_exchange_weak(old, v)) {}
  return old;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline int rf_lane_id() { return (int)threadIdx.x % WARP_SIZE; }

inline unsigned int emu_exchange(unsigned int v, int partner) {
  EmuWarp& warp = (*emu_warps)[threadIdx.x / WARP_SIZE];
  warp.slots[rf_lane_id()] = v;
  warp.barrier->arrive_and_wait();
  const unsigned int got = warp.slots[partner];
  warp.barrier->arrive_and_wait();
  return got;
}
inline int emu_xor_partner(int lane_mask, int width) {  // as CUDA: outside the segment, read yourself
  const int self = rf_lane_id(), partner = self ^ lane_mask;
  return partner >= ((self + width) & ~(width - 1)) ? self : partner;
}
inline unsigned int __shfl_xor(unsigned int v, int lane_mask, int width = WARP_SIZE) {
  return emu_exchange(v, emu_xor_partner(lane_mask, width));
}
inline int __shfl_xor(int v, int lane_mask, int width = WARP_SIZE) {
  return (int)emu_exchange((unsigned int)v, emu_xor_partner(lane_mask, width));
}
inline float __shfl_xor(float v, int lane_mask, int width = WARP_SIZE) {
  unsigned int u;
  std::memcpy(&u, &v, 4);
  u = emu_exchange(u, emu_xor_partner(lane_mask, width));
  std::memcpy(&v, &u, 4);
  return v;
}

inline int rf_dp4a(int a, int b, int c) {  // four signed-byte products summed into c
  for (int i = 0; i < 4; ++i) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
  return c;
}
inline unsigned int rf_float_as_uint(float f) {
  unsigned int u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float rf_uint_as_float(unsigned int u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float rf_f16_to_float(unsigned short bits) {
  _Float16 h;
  std::memcpy(&h, &bits, 2);
  return (float)h;
}
inline unsigned short rf_float_to_f16(float f) {
  const _Float16 h = (_Float16)f;
  unsigned short bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

// prmt / v_perm_b32 (hip_compat.h's rf_byte_perm): result byte i is byte (selector >> 4 i) & 7 of {hi, lo}.
inline unsigned int rf_byte_perm(unsigned int lo, unsigned int hi, unsigned int selector) {
  const unsigned long long both = ((unsigned long long)hi << 32) | lo;
  unsigned int d = 0;
  for (int i = 0; i < 4; ++i) d |= (unsigned int)((both >> (8 * ((selector >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
  return d;
}
// Packed f16 arithmetic, each lane computed in double and rounded once to f16 (exact but for a sum whose
// terms are more than 2^53 apart, where the hardware's single rounding may differ by one f16 ulp).
template <class Op>
inline unsigned int emu_h2(unsigned int a, unsigned int b, unsigned int c, Op op) {
  unsigned int d = 0;
  for (int i = 0; i < 2; ++i) {
    const int s = 16 * i;
    const double r = op((double)rf_f16_to_float((unsigned short)(a >> s)), (double)rf_f16_to_float((unsigned short)(b >> s)),
                        (double)rf_f16_to_float((unsigned short)(c >> s)));
    const _Float16 h = (_Float16)r;
    unsigned short bits;
    std::memcpy(&bits, &h, 2);
    d |= (unsigned int)bits << s;
  }
  return d;
}
inline unsigned int rf_h2_fma(unsigned int a, unsigned int b, unsigned int c) {
  return emu_h2(a, b, c, [](double x, double y, double z) { return x * y + z; });
}
inline unsigned int rf_h2_mul(unsigned int a, unsigned int b) {
  return emu_h2(a, b, 0u, [](double x, double y, double) { return x * y; });
}
inline unsigned int rf_h2_sub(unsigned int a, unsigned int b) {
  return emu_h2(a, b, 0u, [](double x, double y, double) { return x - y; });
}
inline unsigned int rf_floats_to_h2(float lo, float hi) {
  return (unsigned int)rf_float_to_f16(lo) | ((unsigned int)rf_float_to_f16(hi) << 16);
}

// ---- Matrix instructions --------------------------------------------------------------------------
// The warp-wide matrix instructions matrix_cores.h's rf_mma uses, emulated from the operand and result
// lane layouts their vendors document (not from hip_compat.h's loaders, which these check): every lane
// publishes its operand registers, then computes its own accumulators from the whole warp's, in f32 over
// exact f16 products (the hardware's own order of summation may differ by f32 roundings).
// The AMD builtins' vector types are GCC vector types here.
typedef _Float16 rf_half4 __attribute__((vector_size(8)));
typedef _Float16 rf_half8 __attribute__((vector_size(16)));
typedef _Float16 rf_half16 __attribute__((vector_size(32)));
typedef float rf_floatx4 __attribute__((vector_size(16)));
typedef float rf_floatx8 __attribute__((vector_size(32)));

// Publish `na` and `nb` operand values of this lane; compute(A, B) reads every lane's (A[lane][item]).
template <class Compute>
inline void emu_mma_exchange(const float* a, int na, const float* b, int nb, Compute compute) {
  EmuWarp& warp = (*emu_warps)[threadIdx.x / WARP_SIZE];
  const int lane = rf_lane_id();
  for (int i = 0; i < na; ++i) warp.mma_a[lane][i] = a[i];
  for (int i = 0; i < nb; ++i) warp.mma_b[lane][i] = b[i];
  warp.barrier->arrive_and_wait();
  compute(warp.mma_a, warp.mma_b);
  warp.barrier->arrive_and_wait();
}
inline void emu_require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "emulated matrix instruction: %s\n", what);
    std::abort();
  }
}

// PTX mma.m16n8k16.row.col f32.f16.f16.f32, 32 lanes, lane = 4 g + t. A (16 x 16): register r holds the
// pair k = 2t + 8 (r / 2) + {0, 1} of row g + 8 (r % 2). B (16 x 8): register r holds the pair
// k = 2t + 8 r + {0, 1} of column g. C, D (16 x 8): c0, c1 = row g, columns 2t, 2t + 1; c2, c3 = row g + 8.
inline void rf_mma_m16n8k16_f16(float c[4], const unsigned int a[4], const unsigned int b[2]) {
  emu_require(WARP_SIZE == 32, "mma.sync needs 32-lane warps");
  float av[8], bv[4];
  for (int r = 0; r < 4; ++r) av[2 * r] = rf_f16_to_float(a[r] & 0xffff), av[2 * r + 1] = rf_f16_to_float(a[r] >> 16);
  for (int r = 0; r < 2; ++r) bv[2 * r] = rf_f16_to_float(b[r] & 0xffff), bv[2 * r + 1] = rf_f16_to_float(b[r] >> 16);
  emu_mma_exchange(av, 8, bv, 4, [&](float (*A)[16], float (*B)[16]) {
    auto a_at = [&](int i, int k) { return A[4 * (i % 8) + (k % 8) / 2][2 * ((i / 8) + 2 * (k / 8)) + k % 2]; };
    auto b_at = [&](int k, int n) { return B[4 * n + (k % 8) / 2][2 * (k / 8) + k % 2]; };
    const int g = rf_lane_id() >> 2, t = rf_lane_id() & 3;
    for (int e = 0; e < 4; ++e) {
      const int i = g + 8 * (e >> 1), n = 2 * t + (e & 1);
      float s = c[e];
      for (int k = 0; k < 16; ++k) s += a_at(i, k) * b_at(k, n);
      c[e] = s;
    }
  });
}

// PTX ldmatrix.sync.aligned.m8n8.x4.b16 (PTX ISA, "Warp-level matrix load instruction: ldmatrix"): lane
// 8 i + r gives the address of row r of matrix i (8 consecutive 16-bit values, 16-byte aligned); register i
// of lane 4 g + t receives values 2t (low half) and 2t + 1 of row g of matrix i.
inline void rf_ldmatrix_x4(unsigned int r[4], const unsigned short* row) {
  emu_require(WARP_SIZE == 32, "ldmatrix needs 32-lane warps");
  emu_require(((unsigned long long)row & 15u) == 0, "ldmatrix rows must be 16-byte aligned");
  EmuWarp& warp = (*emu_warps)[threadIdx.x / WARP_SIZE];
  const int lane = rf_lane_id(), g = lane >> 2, t = lane & 3;
  warp.rows[lane] = row;
  warp.barrier->arrive_and_wait();
  for (int i = 0; i < 4; ++i) {
    const unsigned short* src = warp.rows[8 * i + g];
    r[i] = (unsigned int)src[2 * t] | ((unsigned int)src[2 * t + 1] << 16);
  }
  warp.barrier->arrive_and_wait();
}

// v_mfma_f32_16x16x16_f16, 64 lanes (AMD CDNA3 ISA, "Dependent and Independent Matrix Arithmetic"; the
// AMD matrix instruction calculator): A[i][k] is item k % 4 of lane i + 16 (k / 4); B[k][j] item k % 4 of
// lane j + 16 (k / 4); D[i][j] item i % 4 of lane j + 16 (i / 4).
inline rf_floatx4 emu_mfma_f32_16x16x16f16(rf_half4 a, rf_half4 b, rf_floatx4 c, int cbsz, int abid, int blgp) {
  emu_require(WARP_SIZE == 64, "MFMA needs 64-lane waves");
  emu_require(cbsz == 0 && abid == 0 && blgp == 0, "MFMA broadcast modifiers are not emulated");
  float av[4], bv[4];
  for (int i = 0; i < 4; ++i) av[i] = (float)a[i], bv[i] = (float)b[i];
  emu_mma_exchange(av, 4, bv, 4, [&](float (*A)[16], float (*B)[16]) {
    const int lane = rf_lane_id(), j = lane % 16;
    for (int e = 0; e < 4; ++e) {
      const int i = 4 * (lane / 16) + e;
      float s = c[e];
      for (int k = 0; k < 16; ++k) s += A[i + 16 * (k / 4)][k % 4] * B[j + 16 * (k / 4)][k % 4];
      c[e] = s;
    }
  });
  return c;
}
#define __builtin_amdgcn_mfma_f32_16x16x16f16 emu_mfma_f32_16x16x16f16

// v_wmma_f32_16x16x16_f16 on RDNA3 (gfx11), wave32 (RDNA3 ISA guide, "Wave Matrix Multiply
// Accumulate"): lane l holds all 16 k of row l % 16 of A and of column l % 16 of B, lanes 16-31
// repeating lanes 0-15 (checked: the hardware requires it); D[i][j] is item i / 2 of lane j + 16 (i % 2).
inline rf_floatx8 emu_wmma_f32_16x16x16_f16_w32(rf_half16 a, rf_half16 b, rf_floatx8 c) {
  emu_require(WARP_SIZE == 32, "WMMA _w32 needs 32-lane waves");
  float av[16], bv[16];
  for (int i = 0; i < 16; ++i) av[i] = (float)a[i], bv[i] = (float)b[i];
  emu_mma_exchange(av, 16, bv, 16, [&](float (*A)[16], float (*B)[16]) {
    const int lane = rf_lane_id(), j = lane % 16;
    for (int k = 0; k < 16; ++k)
      emu_require(A[lane][k] == A[lane ^ 16][k] && B[lane][k] == B[lane ^ 16][k], "RDNA3 WMMA halves differ");
    for (int e = 0; e < 8; ++e) {
      const int i = 2 * e + lane / 16;
      float s = c[e];
      for (int k = 0; k < 16; ++k) s += A[i][k] * B[j][k];
      c[e] = s;
    }
  });
  return c;
}
#define __builtin_amdgcn_wmma_f32_16x16x16_f16_w32 emu_wmma_f32_16x16x16_f16_w32

// v_wmma_f32_16x16x16_f16 on RDNA4 (gfx12), wave32 (RDNA4 ISA guide): A[i][k] is item k % 8 of lane
// i + 16 (k / 8), B[k][j] item k % 8 of lane j + 16 (k / 8); D[i][j] item i % 8 of lane j + 16 (i / 8).
inline rf_floatx8 emu_wmma_f32_16x16x16_f16_w32_gfx12(rf_half8 a, rf_half8 b, rf_floatx8 c) {
  emu_require(WARP_SIZE == 32, "WMMA _w32 needs 32-lane waves");
  float av[8], bv[8];
  for (int i = 0; i < 8; ++i) av[i] = (float)a[i], bv[i] = (float)b[i];
  emu_mma_exchange(av, 8, bv, 8, [&](float (*A)[16], float (*B)[16]) {
    const int lane = rf_lane_id(), j = lane % 16;
    for (int e = 0; e < 8; ++e) {
      const int i = 8 * (lane / 16) + e;
      float s = c[e];
      for (int k = 0; k < 16; ++k) s += A[i + 16 * (k / 8)][k % 8] * B[j + 16 * (k / 8)][k % 8];
      c[e] = s;
    }
  });
  return c;
}
#define __builtin_amdgcn_wmma_f32_16x16x16_f16_w32_gfx12 emu_wmma_f32_16x16x16_f16_w32_gfx12

// Run kernel() on a 1-D grid of 1-D blocks.
template <class Kernel>
void emu_launch(unsigned grid, unsigned block, Kernel kernel) {
  emu_grid_dim = {grid, 1, 1};
  emu_block_dim = {block, 1, 1};
  for (unsigned b = 0; b < grid; ++b) {
    emu_block_idx = {b, 0, 0};
    std::barrier<> block_barrier((std::ptrdiff_t)block);
    emu_block_barrier = &block_barrier;
    std::vector<EmuWarp> warps((block + WARP_SIZE - 1) / WARP_SIZE);
    for (EmuWarp& w : warps) w.barrier = std::make_unique<std::barrier<>>(WARP_SIZE);
    emu_warps = &warps;
    std::vector<std::thread> threads;
    threads.reserve(block);
    for (unsigned t = 0; t < block; ++t) threads.emplace_back([t, &kernel] {
      emu_thread_idx = {t, 0, 0};
      kernel();
    });
    for (std::thread& th : threads) th.join();
  }
}

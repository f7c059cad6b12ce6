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

inline thread_local rf_uint3 emu_thread_idx{0, 0, 0};
inline rf_uint3 emu_block_idx{0, 0, 0}, emu_block_dim{1, 1, 1}, emu_grid_dim{1, 1, 1};
inline std::barrier<>* emu_block_barrier = nullptr;

struct EmuWarp {
  std::unique_ptr<std::barrier<>> barrier;
  unsigned int slots[WARP_SIZE];
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

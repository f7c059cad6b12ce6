// Runs kernels/moe_experts_mma.hip under the host emulation (emulation.h), with the matrix-core path chosen on the
// command line (-DRF_MMA_KIND=..., -DWARP_SIZE=...), as harness_mma.cpp does:
//   harness_moe_mma moe_mma_sort <grid> <block> pairs n_expert tile ids sorted_out tiles_out
//   harness_moe_mma moe_mma_<mode>_<type>[_s64|_direct] <grid> <block> rows cols pairs x_per n_expert tile max_tiles activation
//                   W x sorted tiles bias g weights out
// sorted starts as -1 and tiles as 0x7F7F7F7F ints, so an entry the sort forgot shows; out starts as NaN: float32
// [pairs, rows], f16 bits for the up entries (h, which the down entries read as their x). A bias, g or weights file of
// "-" passes a null pointer.
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>

#include "harness_io.h"

#include "moe_experts_mma.hip"

static Bytes optional_file(const char* path) { return std::string(path) == "-" ? Bytes() : read_file(path); }
static const float* floats_or_null(const Bytes& v) { return v.empty() ? nullptr : (const float*)v.data(); }

using Products = void (*)(float*, const float*, const void*, const float*, const int*, const int*, const float*,
                          const float*, int, int, int, int, int, int, int, int);

int main(int argc, char** argv) {
  if (argc < 4) return 2;
  const std::string entry = argv[1];
  const unsigned grid = (unsigned)std::atoi(argv[2]), block = (unsigned)std::atoi(argv[3]);
  char** a = argv + 4;
  if (entry == "moe_mma_sort") {
    const int pairs = std::atoi(a[0]), n_expert = std::atoi(a[1]), tile = std::atoi(a[2]);
    Bytes ids = read_file(a[3]);
    const size_t most = (size_t)(pairs + tile - 1) / tile + (size_t)(n_expert < pairs ? n_expert : pairs);
    Guarded<int> sorted((size_t)pairs, -1);
    Guarded<int> tiles(1 + 3 * most, 0x7F7F7F7F);
    emu_launch(grid, block, [&] { moe_mma_sort(sorted.data(), tiles.data(), (const int*)ids.data(), pairs, n_expert, tile); });
    write_file(a[4], sorted.data(), sorted.size() * 4);
    write_file(a[5], tiles.data(), tiles.size() * 4);
    return 0;
  }
#define RF_MOE_MMA_TYPE(t) {"gate_" #t, moe_mma_gate_##t}, {"up_" #t, moe_mma_up_##t}, {"down_" #t, moe_mma_down_##t}
  const std::map<std::string, Products> kernels = {RF_MOE_MMA_TYPE(q4_k), RF_MOE_MMA_TYPE(q5_k), RF_MOE_MMA_TYPE(q6_k),
                                                   RF_MOE_MMA_TYPE(q8_0), RF_MOE_MMA_TYPE(mxfp4), RF_MOE_MMA_TYPE(f16),
                                                   RF_MOE_MMA_TYPE(bf16), RF_MOE_MMA_TYPE(q8_0_s64),
                                                   RF_MOE_MMA_TYPE(mxfp4_s64), RF_MOE_MMA_TYPE(f16_s64),
                                                   RF_MOE_MMA_TYPE(bf16_s64)
#if RF_MMA_KIND == RF_MMA_NV_M16N8K16  // the few-pairs tiles' entries (NVIDIA's fragments only)
                                                   , RF_MOE_MMA_TYPE(q4_k_direct), RF_MOE_MMA_TYPE(q5_k_direct),
                                                   RF_MOE_MMA_TYPE(q6_k_direct), RF_MOE_MMA_TYPE(q8_0_direct),
                                                   RF_MOE_MMA_TYPE(mxfp4_direct), RF_MOE_MMA_TYPE(f16_direct),
                                                   RF_MOE_MMA_TYPE(bf16_direct)
#endif
  };
  const std::string prefix = "moe_mma_";
  if (entry.rfind(prefix, 0) != 0 || !kernels.count(entry.substr(prefix.size()))) return 2;
  int n[8];
  for (int i = 0; i < 8; ++i) n[i] = std::atoi(a[i]);
  const int rows = n[0], pairs = n[2];
  Bytes w = read_file(a[8]), x = read_file(a[9]), sorted = read_file(a[10]), tiles = read_file(a[11]);
  Bytes bias = optional_file(a[12]), g = optional_file(a[13]), weights = optional_file(a[14]);
  const bool half_out = entry.rfind("moe_mma_up_", 0) == 0;  // exactly h's bytes: a write past them dies on the guard
  Guarded<float> out(half_out ? 0 : (size_t)pairs * rows, std::nanf(""));
  Guarded<unsigned short> out16(half_out ? (size_t)pairs * rows : 0, 0x7E00);  // an f16 NaN
  float* out_ptr = half_out ? reinterpret_cast<float*>(out16.data()) : out.data();
  emu_launch(grid, block, [&] {
    kernels.at(entry.substr(prefix.size()))(out_ptr, floats_or_null(g), w.data(), (const float*)x.data(),
                                            (const int*)sorted.data(), (const int*)tiles.data(), floats_or_null(bias),
                                            floats_or_null(weights), n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7]);
  });
  if (half_out)
    write_file(a[15], out16.data(), out16.size() * 2);
  else
    write_file(a[15], out.data(), out.size() * 4);
  return 0;
}

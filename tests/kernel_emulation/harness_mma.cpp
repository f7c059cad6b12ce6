// Runs one kernel of kernels/matmul_mma.hip under the host emulation (emulation.h), with hip_compat.h's
// matrix-core path chosen on the command line (-DRF_MMA_KIND=..., -DWARP_SIZE=...), so that the NVIDIA,
// CDNA, RDNA3 and RDNA4 fragment layouts all run against the emulated instructions:
//   harness_mma <entry> <grid> <block> <rows> <cols> <n_tokens> <tile_tokens> <W file> <x file> <y file>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "matmul_mma.hip"

static std::vector<char> read_file(const char* path) {
  std::vector<char> data;
  FILE* f = std::fopen(path, "rb");
  if (!f) std::exit(3);
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) data.insert(data.end(), buf, buf + n);
  std::fclose(f);
  return data;
}

int main(int argc, char** argv) {
  if (argc != 11) return 2;
  const std::string entry = argv[1];
  const unsigned grid = (unsigned)std::atoi(argv[2]), block = (unsigned)std::atoi(argv[3]);
  const int rows = std::atoi(argv[4]), cols = std::atoi(argv[5]), tokens = std::atoi(argv[6]), tile = std::atoi(argv[7]);
  std::vector<char> w = read_file(argv[8]), x = read_file(argv[9]);
  std::vector<float> y((size_t)rows * tokens, std::nanf(""));
  using Matmul = void (*)(float*, const void*, const float*, int, int, int, int);
  const std::map<std::string, Matmul> kernels = {
      {"matmul_mma_q4_0", matmul_mma_q4_0}, {"matmul_mma_q4_1", matmul_mma_q4_1}, {"matmul_mma_q8_0", matmul_mma_q8_0},
      {"matmul_mma_q5_0", matmul_mma_q5_0}, {"matmul_mma_q5_1", matmul_mma_q5_1},
      {"matmul_mma_q4_k", matmul_mma_q4_k}, {"matmul_mma_q5_k", matmul_mma_q5_k}, {"matmul_mma_q6_k", matmul_mma_q6_k}};
  if (!kernels.count(entry)) return 2;
  const Matmul kernel = kernels.at(entry);
  emu_launch(grid, block, [&] { kernel(y.data(), w.data(), (const float*)x.data(), rows, cols, tokens, tile); });
  FILE* f = std::fopen(argv[10], "wb");
  if (!f || std::fwrite(y.data(), 4, y.size(), f) != y.size()) return 4;
  std::fclose(f);
  return 0;
}

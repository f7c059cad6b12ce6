// Runs one entry of kernels/matvec.hip under the host emulation (emulation.h), built apart from harness.cpp so that a
// planted fault in matvec.hip rebuilds this file alone:
//   harness_matvec <entry> <grid> <block> rows cols batch W x y_out
// y starts as NaN, so a row the kernel never writes shows.
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>

#include "harness_io.h"

#include "matvec.hip"

int main(int argc, char** argv) {
  if (argc != 10) return 2;
  const std::string entry = argv[1];
  const unsigned grid = (unsigned)std::atoi(argv[2]), block = (unsigned)std::atoi(argv[3]);
  const int rows = std::atoi(argv[4]), cols = std::atoi(argv[5]), batch = std::atoi(argv[6]);
  Bytes w = read_file(argv[7]), x = read_file(argv[8]);
  Guarded<float> y((size_t)rows * batch, std::nanf(""));
  using Matvec = void (*)(float*, const void*, const float*, int, int, int);
  const std::map<std::string, Matvec> kernels = {
      {"matvec_f16", matvec_f16}, {"matvec_bf16", matvec_bf16}, {"matvec_f32", matvec_f32},
      {"matvec_split_f16", matvec_split_f16}, {"matvec_split_bf16", matvec_split_bf16},
      {"matvec_split_f32", matvec_split_f32}};
  if (!kernels.count(entry)) return 2;
  const Matvec kernel = kernels.at(entry);
  emu_launch(grid, block, [&] { kernel(y.data(), w.data(), (const float*)x.data(), rows, cols, batch); });
  write_file(argv[9], y.data(), y.size() * 4);
  return 0;
}

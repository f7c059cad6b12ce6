// Runs kernels/paged_attention.hip's matrix-core entries (paged_attention_mma.h) under the host emulation
// (emulation.h), with the matrix-core path (matrix_cores.h) chosen on the command line (-DRF_MMA_KIND=...,
// -DWARP_SIZE=...), so that the NVIDIA, CDNA, RDNA3 and RDNA4 fragment layouts and the FMA path all run against the
// emulated instructions. Arguments as harness.cpp's paged_attention entries:
//   harness_paged_attention_mma <entry> <grid> <block> <n_tokens> <n_heads> <n_kv_heads> <head_dim> <block_size>
//       <max_blocks> <num_blocks> <slots> <window> <scale> <softcap> <q> <k_pool> <v_pool> <block_tables> <token_seq>
//       <positions> <workspace_bytes> <out> <workspace_out> [sinks]
// out starts as NaN, so a row the kernel leaves unwritten shows; the workspace starts zeroed (a null pointer when its
// size is 0) and is written back, so that its counters can be checked; the `_sinks` entries take the sinks' file.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "harness_io.h"

#include "paged_attention.hip"

int main(int argc, char** argv) {
  if (argc != 24 && argc != 25) return 2;
  const std::string entry = argv[1];
  const unsigned grid = (unsigned)std::atoi(argv[2]), block = (unsigned)std::atoi(argv[3]);
  char** a = argv + 4;
  int n[9];
  for (int i = 0; i < 9; ++i) n[i] = std::atoi(a[i]);
  const float scale = std::strtof(a[9], nullptr), softcap = std::strtof(a[10], nullptr);
  Bytes q = read_file(a[11]), k_pool = read_file(a[12]), v_pool = read_file(a[13]);
  Bytes tables = read_file(a[14]), token_seq = read_file(a[15]), positions = read_file(a[16]);
  const size_t workspace_bytes = (size_t)std::atoll(a[17]);
  Guarded<float> workspace((workspace_bytes + 3) / 4, 0.0f);
  Guarded<float> out((size_t)n[0] * n[1] * n[3], std::nanf(""));
  using Attention = void (*)(float*, const float*, const void*, const void*, const int*, const int*, const int*, void*,
                             int, int, int, int, int, int, int, int, int, float, float);
  using SinksAttention = void (*)(float*, const float*, const void*, const void*, const int*, const int*, const int*,
                                  void*, int, int, int, int, int, int, int, int, int, float, float, const float*);
#define RF_ENTRY(name) {#name, name}
  const std::map<std::string, Attention> kernels = {RF_ENTRY(paged_attention_f16_mma_d32),
                                                    RF_ENTRY(paged_attention_f16_mma_d64),
                                                    RF_ENTRY(paged_attention_f16_mma_d128)};
  const std::map<std::string, SinksAttention> sink_kernels = {RF_ENTRY(paged_attention_f16_mma_d32_sinks),
                                                              RF_ENTRY(paged_attention_f16_mma_d64_sinks),
                                                              RF_ENTRY(paged_attention_f16_mma_d128_sinks)};
#undef RF_ENTRY
  const bool with_sinks = sink_kernels.count(entry) > 0;
  if ((!with_sinks && !kernels.count(entry)) || with_sinks != (argc == 25)) return 2;
  Bytes sinks = with_sinks ? read_file(a[20]) : Bytes();
  void* ws = workspace_bytes ? workspace.data() : nullptr;
  emu_launch(grid, block, [&] {
    if (with_sinks)
      sink_kernels.at(entry)(out.data(), (const float*)q.data(), k_pool.data(), v_pool.data(), (const int*)tables.data(),
                             (const int*)token_seq.data(), (const int*)positions.data(), ws, n[0], n[1], n[2], n[3],
                             n[4], n[5], n[6], n[7], n[8], scale, softcap, (const float*)sinks.data());
    else
      kernels.at(entry)(out.data(), (const float*)q.data(), k_pool.data(), v_pool.data(), (const int*)tables.data(),
                        (const int*)token_seq.data(), (const int*)positions.data(), ws, n[0], n[1], n[2], n[3], n[4],
                        n[5], n[6], n[7], n[8], scale, softcap);
  });
  write_file(a[18], out.data(), out.size() * 4);
  write_file(a[19], workspace.data(), workspace_bytes);
  return 0;
}

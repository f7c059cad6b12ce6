// Runs kernels/prompt_attention.hip under the host emulation (emulation.h), with the matrix-core path (matrix_cores.h)
// chosen on the command line (-DRF_MMA_KIND=..., -DWARP_SIZE=...), so that the NVIDIA, CDNA, RDNA3 and RDNA4
// fragment layouts and the FMA path all run against the emulated instructions:
//   harness_prompt_attention <entry> <grid> <block> <n_tokens> <n_heads> <n_kv_heads> <head_dim> <block_size>
//                            <max_blocks> <num_blocks> <window> <scale> <q> <k_pool> <v_pool> <block_tables>
//                            <token_seq> <positions> <out> [out_f16 [softcap [sinks]]]
// out starts as NaN, so a row the kernel leaves unwritten shows; with out_f16 1 it is written as f16; softcap goes
// to the entry as given (0 unless told: the capped entries need a cap); sinks (a file of n_heads floats) goes to the
// `_sinks` entries, which take it as their last argument.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "harness_io.h"

#include "prompt_attention.hip"

int main(int argc, char** argv) {
  if (argc < 20 || argc > 23) return 2;
  const int out_f16 = argc >= 21 ? std::atoi(argv[20]) : 0;
  const float softcap = argc >= 22 ? std::strtof(argv[21], nullptr) : 0.0f;
  using SinkAttention = void (*)(float*, const float*, const void*, const void*, const int*, const int*, const int*,
                                 int, int, int, int, int, int, int, int, float, int, float, const float*);
  const std::map<std::string, SinkAttention> sink_kernels = {
      {"prompt_attention_f16_d32_sinks", prompt_attention_f16_d32_sinks},
      {"prompt_attention_f16_d64_sinks", prompt_attention_f16_d64_sinks}};
  const bool with_sinks = sink_kernels.count(argv[1]) > 0;
  if (with_sinks != (argc == 23)) return 2;
  Bytes sinks = with_sinks ? read_file(argv[22]) : Bytes();
  using Attention = void (*)(float*, const float*, const void*, const void*, const int*, const int*, const int*, int,
                             int, int, int, int, int, int, int, float, int, float);
#define RF_ENTRY(name) {#name, name}
  const std::map<std::string, Attention> kernels = {
      RF_ENTRY(prompt_attention_f16_d16),         RF_ENTRY(prompt_attention_f16_d32),
      RF_ENTRY(prompt_attention_f16_d48),         RF_ENTRY(prompt_attention_f16_d64),
      RF_ENTRY(prompt_attention_f16_d80),         RF_ENTRY(prompt_attention_f16_d96),
      RF_ENTRY(prompt_attention_f16_d112),        RF_ENTRY(prompt_attention_f16_d128),
      RF_ENTRY(prompt_attention_f16_d256),        RF_ENTRY(prompt_attention_f16_d128_softcap),
      RF_ENTRY(prompt_attention_f16_d256_softcap)};
#undef RF_ENTRY
  if (!kernels.count(argv[1]) && !with_sinks) return 2;
  const unsigned grid = (unsigned)std::atoi(argv[2]), block = (unsigned)std::atoi(argv[3]);
  int n[8];
  for (int i = 0; i < 8; ++i) n[i] = std::atoi(argv[4 + i]);
  const float scale = std::strtof(argv[12], nullptr);
  Bytes q = read_file(argv[13]), k_pool = read_file(argv[14]), v_pool = read_file(argv[15]);
  Bytes tables = read_file(argv[16]), token_seq = read_file(argv[17]), positions = read_file(argv[18]);
  Guarded<float> out((size_t)n[0] * n[1] * n[3], std::nanf(""));
  emu_launch(grid, block, [&] {
    if (with_sinks)
      sink_kernels.at(argv[1])(out.data(), (const float*)q.data(), k_pool.data(), v_pool.data(),
                               (const int*)tables.data(), (const int*)token_seq.data(), (const int*)positions.data(),
                               n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7], scale, out_f16, softcap,
                               (const float*)sinks.data());
    else
      kernels.at(argv[1])(out.data(), (const float*)q.data(), k_pool.data(), v_pool.data(), (const int*)tables.data(),
                          (const int*)token_seq.data(), (const int*)positions.data(), n[0], n[1], n[2], n[3], n[4],
                          n[5], n[6], n[7], scale, out_f16, softcap);
  });
  write_file(argv[19], out.data(), out.size() * (out_f16 ? 2 : 4));  // f16: the first half of the NaN-filled floats
  return 0;
}

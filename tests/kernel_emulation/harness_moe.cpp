// Runs one entry of kernels/moe_route.hip or kernels/moe_experts.hip under the host emulation (emulation.h):
//   harness_moe moe_route_f32 <grid> <block> tokens n_expert k mode normalize logits bias ids_out weights_out
//   harness_moe moe_gate_up_<type> <grid> <block> tokens k ff hidden n_expert activation x gate up ids gate_bias
//               up_bias h_out
//   harness_moe moe_down_<type> <grid> <block> tokens k hidden ff n_expert h down ids weights down_bias out_in out_out
//   moe_down_slots_<type>, moe_down_staged_<type> (the quantized types) as moe_down_<type>.
//   moe_gate_up_grouped_<type> as moe_gate_up_<type>; moe_down_grouped_<type> as moe_down_<type>: its terms into a
//   NaN-filled workspace, then moe_sum_slots_f32 (its own grid) adds them into out.
// A bias file of "-" passes a null pointer. Outputs start as NaN (out_in for down, which adds into it).
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>

#include "harness_io.h"

#include "moe_route.hip"
#include "moe_experts.hip"

static Bytes optional_file(const char* path) {
  return std::string(path) == "-" ? Bytes() : read_file(path);
}
static const float* floats_or_null(const Bytes& v) { return v.empty() ? nullptr : (const float*)v.data(); }

using GateUp = void (*)(float*, const float*, const void*, const void*, const int*, const float*, const float*, int, int,
                        int, int, int, int);
using Down = void (*)(float*, const float*, const void*, const int*, const float*, const float*, int, int, int, int, int);

int main(int argc, char** argv) {
  if (argc < 4) return 2;
  const std::string entry = argv[1];
  const unsigned grid = (unsigned)std::atoi(argv[2]), block = (unsigned)std::atoi(argv[3]);
  char** a = argv + 4;
  if (entry == "moe_route_f32") {
    const int tokens = std::atoi(a[0]), n_expert = std::atoi(a[1]), k = std::atoi(a[2]);
    const int mode = std::atoi(a[3]), normalize = std::atoi(a[4]);
    Bytes logits = read_file(a[5]), bias = optional_file(a[6]);
    Guarded<int> ids((size_t)tokens * k, -1);
    Guarded<float> weights((size_t)tokens * k, std::nanf(""));
    emu_launch(grid, block, [&] {
      moe_route_f32(ids.data(), weights.data(), (const float*)logits.data(), floats_or_null(bias), tokens, n_expert, k,
                    mode, normalize);
    });
    write_file(a[7], ids.data(), ids.size() * 4);
    write_file(a[8], weights.data(), weights.size() * 4);
    return 0;
  }
#define RF_MOE_PAIR(t)                                                                                        \
  {#t, {moe_gate_up_##t, moe_down_##t}}, {"grouped_" #t, {moe_gate_up_grouped_##t, moe_down_grouped_##t}},  \
      {"slots_" #t, {moe_gate_up_##t, moe_down_slots_##t}}
#define RF_MOE_QUANTIZED(t) RF_MOE_PAIR(t), {"staged_" #t, {moe_gate_up_##t, moe_down_staged_##t}}
  const std::map<std::string, std::pair<GateUp, Down>> kernels = {
      RF_MOE_QUANTIZED(q4_k), RF_MOE_QUANTIZED(q5_k), RF_MOE_QUANTIZED(q6_k), RF_MOE_QUANTIZED(q8_0),
      RF_MOE_QUANTIZED(mxfp4), RF_MOE_PAIR(f16), RF_MOE_PAIR(bf16), RF_MOE_PAIR(f32)};
  const std::string gate_up_prefix = "moe_gate_up_", down_prefix = "moe_down_";
  if (entry.rfind(gate_up_prefix, 0) == 0 && kernels.count(entry.substr(gate_up_prefix.size()))) {
    const GateUp kernel = kernels.at(entry.substr(gate_up_prefix.size())).first;
    int n[6];
    for (int i = 0; i < 6; ++i) n[i] = std::atoi(a[i]);
    Bytes x = read_file(a[6]), gate = read_file(a[7]), up = read_file(a[8]), ids = read_file(a[9]);
    Bytes gate_bias = optional_file(a[10]), up_bias = optional_file(a[11]);
    Guarded<float> h((size_t)n[0] * n[1] * n[2], std::nanf(""));
    emu_launch(grid, block, [&] {
      kernel(h.data(), (const float*)x.data(), gate.data(), up.data(), (const int*)ids.data(), floats_or_null(gate_bias),
             floats_or_null(up_bias), n[0], n[1], n[2], n[3], n[4], n[5]);
    });
    write_file(a[12], h.data(), h.size() * 4);
    return 0;
  }
  if (entry.rfind(down_prefix, 0) == 0 && kernels.count(entry.substr(down_prefix.size()))) {
    const Down kernel = kernels.at(entry.substr(down_prefix.size())).second;
    int n[5];
    for (int i = 0; i < 5; ++i) n[i] = std::atoi(a[i]);
    Bytes h = read_file(a[5]), down = read_file(a[6]), ids = read_file(a[7]), weights = read_file(a[8]);
    Bytes bias = optional_file(a[9]), out = read_file(a[10]);
    if (entry.rfind("moe_down_grouped_", 0) == 0) {
      Guarded<float> terms((size_t)n[0] * n[1] * n[2], std::nanf(""));
      emu_launch(grid, block, [&] {
        kernel(terms.data(), (const float*)h.data(), down.data(), (const int*)ids.data(), (const float*)weights.data(),
               floats_or_null(bias), n[0], n[1], n[2], n[3], n[4]);
      });
      emu_launch((unsigned)((n[0] * n[2] + 255) / 256), 256,
                 [&] { moe_sum_slots_f32((float*)out.data(), terms.data(), n[0], n[1], n[2]); });
    } else {
      emu_launch(grid, block, [&] {
        kernel((float*)out.data(), (const float*)h.data(), down.data(), (const int*)ids.data(),
               (const float*)weights.data(), floats_or_null(bias), n[0], n[1], n[2], n[3], n[4]);
      });
    }
    write_file(a[11], out.data(), out.size());
    return 0;
  }
  return 2;
}

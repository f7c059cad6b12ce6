// Runs one kernel of kernels/matmul_mma.hip under the host emulation (emulation.h), with hip_compat.h's
// matrix-core path chosen on the command line (-DRF_MMA_KIND=..., -DWARP_SIZE=...), so that the NVIDIA,
// CDNA, RDNA3 and RDNA4 fragment layouts all run against the emulated instructions:
//   harness_mma <entry> <grid> <block> <rows> <cols> <n_tokens> <tile_tokens> <splits> <accumulate>
//               <workspace_bytes> <W file> <x file> <y_in file|-> <y file> <workspace_out file>
// y starts as y_in's floats (accumulate adds to them) or NaN when y_in is "-"; the workspace starts zeroed
// (a null pointer when its size is 0) and is written back so that a test can see its counters.
// An x16 entry (matmul_mma_x16_<type>) reads x as f16 from the x file. A SwiGLU pair's entry
// (matmul_mma_swiglu_<type>) reads the gate's then the up projection's weights from the W file and f16 x,
// and writes h16 (f16) then gate and up (float32), all [n_tokens, rows] and starting as 0xFF bytes (NaN), to
// the y file; splits, accumulate and y_in are not its arguments (pass 1 0 -). The x16_128 entries are x16 entries
// (tile 128). The SwiGLU's up product (matmul_mma_silu_up_<type>) reads W_up from the W file, f16 x, the gate's
// float32 product from the y_in file, and writes h16 (f16, starting as 0xFF bytes) to the y file; tile and
// accumulate are not its arguments (pass 128 0), splits is (1); the GeGLU's (matmul_mma_gelu_up_<type>) likewise.
// Both exist on NVIDIA's mma only. The attention input's q|k|v entries (matmul_mma_qkv_fragments and _direct, NVIDIA's
// mma only) take rows as "q,k,v" (three row counts), tile_tokens as the packed type codes (matmul_mma_qkv.py
// QKV_TYPE_CODES, 4 bits each, q's lowest; unused by the one-type entries matmul_mma_qkv_<fragments|direct>_<type>),
// q's, k's and v's weights one after another in the W file, and write
// y_q, y_k and y_v one after another to the y file (starting as NaN); accumulate 0 and y_in "-". The fragment
// path's SwiGLU (matmul_mma_swiglu_fragments_<type> and _direct_<type>, NVIDIA's mma only) reads the gate's then the
// up projection's weights from the W file and float32 x, and writes silu(gate) * up then the up product (float32,
// starting as NaN) to the y file; tile is not its argument, accumulate 0 and y_in "-".
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "harness_io.h"

#include "matmul_mma.hip"

int main(int argc, char** argv) {
  if (argc != 16) return 2;
  const std::string entry = argv[1];
  const unsigned grid = (unsigned)std::atoi(argv[2]), block = (unsigned)std::atoi(argv[3]);
  const int rows = std::atoi(argv[4]), cols = std::atoi(argv[5]), tokens = std::atoi(argv[6]), tile = std::atoi(argv[7]);
  const int splits = std::atoi(argv[8]), accumulate = std::atoi(argv[9]);
  const size_t workspace_bytes = (size_t)std::atoll(argv[10]);
  Bytes w = read_file(argv[11]), x = read_file(argv[12]);
#if RF_MMA_KIND == 1
  using Qkv = void (*)(float*, float*, float*, const void*, const void*, const void*, const float*, void*, int, int, int,
                       int, int, int, int);
#define RF_QKV_SINGLE(kind) \
  {"matmul_mma_qkv_fragments_" #kind, matmul_mma_qkv_fragments_##kind}, {"matmul_mma_qkv_direct_" #kind, matmul_mma_qkv_direct_##kind}
  const std::map<std::string, Qkv> qkv = {{"matmul_mma_qkv_fragments", matmul_mma_qkv_fragments},
                                          {"matmul_mma_qkv_direct", matmul_mma_qkv_direct},
                                          RF_QKV_SINGLE(q4_0), RF_QKV_SINGLE(q4_1), RF_QKV_SINGLE(q5_0),
                                          RF_QKV_SINGLE(q5_1), RF_QKV_SINGLE(q8_0), RF_QKV_SINGLE(f16),
                                          RF_QKV_SINGLE(bf16)};
  if (qkv.count(entry)) {
    int r[3];
    if (std::sscanf(argv[4], "%d,%d,%d", &r[0], &r[1], &r[2]) != 3 || accumulate) return 5;
    // The K-quants' entries: each weight's rows of its type's bytes; a one-type entry (its name ends in the type):
    // rows of the W file's bytes over all three row counts.
    const bool single = entry.rfind("_fragments") + 10 != entry.size() && entry.rfind("_direct") + 7 != entry.size();
    const int types = tile, block_bytes[3] = {144, 176, 210};  // Q4_K, Q5_K, Q6_K per 256 columns
    const size_t single_row = w.size() / ((size_t)r[0] + r[1] + r[2]);
    size_t w_at[3], y_at[3], w_end = 0, y_end = 0;
    for (int i = 0; i < 3; ++i) {
      w_at[i] = w_end, y_at[i] = y_end;
      w_end += single ? (size_t)r[i] * single_row : (size_t)r[i] * (cols / 256) * block_bytes[(types >> (4 * i)) & 15];
      y_end += (size_t)r[i] * tokens;
    }
    if (w.size() != w_end) return 5;
    Guarded<float> ys(y_end, std::nanf(""));
    Bytes workspace(workspace_bytes, 0);
    void* ws = workspace_bytes ? workspace.data() : nullptr;
    emu_launch(grid, block, [&] {
      qkv.at(entry)(ys.data() + y_at[0], ys.data() + y_at[1], ys.data() + y_at[2], w.data() + w_at[0], w.data() + w_at[1],
                    w.data() + w_at[2], (const float*)x.data(), ws, r[0], r[1], r[2], types, cols, tokens, splits);
    });
    write_file(argv[14], ys.data(), ys.size() * 4);
    write_file(argv[15], workspace.data(), workspace_bytes);
    return 0;
  }
  using SwigluFragments = void (*)(float*, float*, const void*, const void*, const float*, void*, int, int, int, int);
  const std::map<std::string, SwigluFragments> swiglu_fragments = {
      {"matmul_mma_swiglu_fragments_q4_k", matmul_mma_swiglu_fragments_q4_k},
      {"matmul_mma_swiglu_fragments_q5_k", matmul_mma_swiglu_fragments_q5_k},
      {"matmul_mma_swiglu_fragments_q6_k", matmul_mma_swiglu_fragments_q6_k},
      {"matmul_mma_swiglu_direct_q4_k", matmul_mma_swiglu_direct_q4_k},
      {"matmul_mma_swiglu_direct_q5_k", matmul_mma_swiglu_direct_q5_k},
      {"matmul_mma_swiglu_direct_q6_k", matmul_mma_swiglu_direct_q6_k}};
  if (swiglu_fragments.count(entry)) {
    const int rows = std::atoi(argv[4]);
    if (w.size() % 2 || accumulate) return 5;
    Guarded<float> out(2 * (size_t)rows * tokens, std::nanf(""));
    Bytes workspace(workspace_bytes, 0);
    void* ws = workspace_bytes ? workspace.data() : nullptr;
    emu_launch(grid, block, [&] {
      swiglu_fragments.at(entry)(out.data(), out.data() + (size_t)rows * tokens, w.data(), w.data() + w.size() / 2,
                                 (const float*)x.data(), ws, rows, cols, tokens, splits);
    });
    write_file(argv[14], out.data(), out.size() * 4);
    write_file(argv[15], workspace.data(), workspace_bytes);
    return 0;
  }
#endif
  Guarded<float> y((size_t)rows * tokens, std::nanf(""));
  if (std::string(argv[13]) != "-") {
    Bytes y_in = read_file(argv[13]);
    if (y_in.size() != y.size() * 4) return 5;
    std::memcpy(y.data(), y_in.data(), y_in.size());
  }
  Bytes workspace(workspace_bytes, 0);
  using Matmul = void (*)(float*, const void*, const float*, void*, int, int, int, int, int, int);
  const std::map<std::string, Matmul> kernels = {
      {"matmul_mma_q4_0", matmul_mma_q4_0}, {"matmul_mma_q4_1", matmul_mma_q4_1}, {"matmul_mma_q8_0", matmul_mma_q8_0},
      {"matmul_mma_q5_0", matmul_mma_q5_0}, {"matmul_mma_q5_1", matmul_mma_q5_1}, {"matmul_mma_f16", matmul_mma_f16},
      {"matmul_mma_bf16", matmul_mma_bf16}, {"matmul_mma_mxfp4", matmul_mma_mxfp4},
      {"matmul_mma_q4_k", matmul_mma_q4_k}, {"matmul_mma_q5_k", matmul_mma_q5_k}, {"matmul_mma_q6_k", matmul_mma_q6_k},
#if RF_MMA_KIND == 1  // NVIDIA's fragment path of decode batches
      {"matmul_mma_fragments_q4_k", matmul_mma_fragments_q4_k}, {"matmul_mma_fragments_q5_k", matmul_mma_fragments_q5_k},
      {"matmul_mma_fragments_q6_k", matmul_mma_fragments_q6_k}, {"matmul_mma_direct_q4_k", matmul_mma_direct_q4_k},
      {"matmul_mma_direct_q5_k", matmul_mma_direct_q5_k}, {"matmul_mma_direct_q6_k", matmul_mma_direct_q6_k},
      {"matmul_mma_fragments_q4_0", matmul_mma_fragments_q4_0}, {"matmul_mma_direct_q4_0", matmul_mma_direct_q4_0},
      {"matmul_mma_fragments_q4_1", matmul_mma_fragments_q4_1}, {"matmul_mma_direct_q4_1", matmul_mma_direct_q4_1},
      {"matmul_mma_fragments_q5_0", matmul_mma_fragments_q5_0}, {"matmul_mma_direct_q5_0", matmul_mma_direct_q5_0},
      {"matmul_mma_fragments_q5_1", matmul_mma_fragments_q5_1}, {"matmul_mma_direct_q5_1", matmul_mma_direct_q5_1},
      {"matmul_mma_fragments_q8_0", matmul_mma_fragments_q8_0}, {"matmul_mma_direct_q8_0", matmul_mma_direct_q8_0},
      {"matmul_mma_fragments_f16", matmul_mma_fragments_f16}, {"matmul_mma_direct_f16", matmul_mma_direct_f16},
      {"matmul_mma_fragments_bf16", matmul_mma_fragments_bf16}, {"matmul_mma_direct_bf16", matmul_mma_direct_bf16},
#endif
  };
  using Swiglu = void (*)(unsigned short*, float*, float*, const void*, const void*, const void*, void*, int, int, int, int);
  const std::map<std::string, Swiglu> pairs = {
      {"matmul_mma_swiglu_q4_k", matmul_mma_swiglu_q4_k}, {"matmul_mma_swiglu_q5_k", matmul_mma_swiglu_q5_k}};
  void* ws = workspace_bytes ? workspace.data() : nullptr;
  if (pairs.count(entry)) {
    const Swiglu kernel = pairs.at(entry);
    if (w.size() % 2) return 5;
    const char* w_up = w.data() + w.size() / 2;
    const size_t n = y.size();  // rows * tokens
    Guarded<unsigned char> out(n * 2 + 2 * n * 4, 0xFF);
    unsigned short* h16 = reinterpret_cast<unsigned short*>(out.data());
    float* gate = reinterpret_cast<float*>(out.data() + n * 2);
    emu_launch(grid, block, [&] { kernel(h16, gate, gate + n, w.data(), w_up, x.data(), ws, rows, cols, tokens, tile); });
    write_file(argv[14], out.data(), out.size());
    write_file(argv[15], workspace.data(), workspace_bytes);
    return 0;
  }
  using MatmulX16 = void (*)(float*, const void*, const void*, void*, int, int, int, int, int, int);
  const std::map<std::string, MatmulX16> x16 = {
      {"matmul_mma_x16_q4_k", matmul_mma_x16_q4_k}, {"matmul_mma_x16_q5_k", matmul_mma_x16_q5_k},
      {"matmul_mma_x16_q6_k", matmul_mma_x16_q6_k},
#if RF_MMA_KIND == 1  // NVIDIA's 128-token tiles
      {"matmul_mma_x16_128_q4_k", matmul_mma_x16_128_q4_k}, {"matmul_mma_x16_128_q5_k", matmul_mma_x16_128_q5_k},
      {"matmul_mma_x16_128_q6_k", matmul_mma_x16_128_q6_k},
      {"matmul_mma_x16_128_q4_0", matmul_mma_x16_128_q4_0}, {"matmul_mma_x16_128_q4_1", matmul_mma_x16_128_q4_1},
      {"matmul_mma_x16_128_q5_0", matmul_mma_x16_128_q5_0}, {"matmul_mma_x16_128_q5_1", matmul_mma_x16_128_q5_1},
      {"matmul_mma_x16_128_q8_0", matmul_mma_x16_128_q8_0}, {"matmul_mma_x16_128_f16", matmul_mma_x16_128_f16},
      {"matmul_mma_x16_128_bf16", matmul_mma_x16_128_bf16},
#endif
  };
  if (x16.count(entry)) {
    const MatmulX16 kernel = x16.at(entry);
    emu_launch(grid, block, [&] { kernel(y.data(), w.data(), x.data(), ws, rows, cols, tokens, tile, splits, accumulate); });
    write_file(argv[14], y.data(), y.size() * 4);
    write_file(argv[15], workspace.data(), workspace_bytes);
    return 0;
  }
  using SiluUp = void (*)(unsigned short*, const float*, const void*, const void*, int, int, int, int);
  const std::map<std::string, SiluUp> silu_up = {
#if RF_MMA_KIND == 1
      {"matmul_mma_silu_up_q4_k", matmul_mma_silu_up_q4_k}, {"matmul_mma_silu_up_q5_k", matmul_mma_silu_up_q5_k},
      {"matmul_mma_silu_up_q4_0", matmul_mma_silu_up_q4_0}, {"matmul_mma_silu_up_q4_1", matmul_mma_silu_up_q4_1},
      {"matmul_mma_silu_up_q5_0", matmul_mma_silu_up_q5_0}, {"matmul_mma_silu_up_q5_1", matmul_mma_silu_up_q5_1},
      {"matmul_mma_silu_up_q8_0", matmul_mma_silu_up_q8_0}, {"matmul_mma_silu_up_f16", matmul_mma_silu_up_f16},
      {"matmul_mma_silu_up_bf16", matmul_mma_silu_up_bf16},
      {"matmul_mma_gelu_up_q4_k", matmul_mma_gelu_up_q4_k}, {"matmul_mma_gelu_up_q5_k", matmul_mma_gelu_up_q5_k},
#endif
  };
  if (silu_up.count(entry)) {
    if (std::string(argv[13]) == "-") return 5;  // the gate's product is its input
    Guarded<unsigned char> h16(y.size() * 2, 0xFF);
    emu_launch(grid, block, [&] {
      silu_up.at(entry)(reinterpret_cast<unsigned short*>(h16.data()), y.data(), w.data(), x.data(), rows, cols, tokens, splits);
    });
    write_file(argv[14], h16.data(), h16.size());
    write_file(argv[15], workspace.data(), workspace_bytes);
    return 0;
  }
  if (!kernels.count(entry)) return 2;
  const Matmul kernel = kernels.at(entry);
  emu_launch(grid, block, [&] { kernel(y.data(), w.data(), (const float*)x.data(), ws, rows, cols, tokens, tile, splits, accumulate); });
  write_file(argv[14], y.data(), y.size() * 4);
  write_file(argv[15], workspace.data(), workspace_bytes);
  return 0;
}

// Runs one kernel of kernels/*.hip under the host emulation (emulation.h) and writes its output.
//   harness <entry> <grid> <block> <int and float arguments...> <input files...> <output file>
// Inputs and outputs are raw little-endian arrays, written and read by tests/test_kernels_emulated.py.
// The kernel sources are compiled as they are; only hip_compat.h's vendor sections are replaced.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "harness_io.h"

#include "add.hip"
#include "add_bias.hip"
#include "argmax.hip"
#include "embedding.hip"
#include "kv_store.hip"
#include "fused_matmul.hip"
#include "fused_matvec.hip"
#include "gelu_mul.hip"
#include "head_norm_rope.hip"
#include "sample.hip"
#include "matmul.hip"
#include "matvec.hip"
#include "paged_attention.hip"
#include "qmatvec.hip"
#include "fused_qmatvec.hip"  // shares qmatvec_formats.h with qmatvec.hip
#include "rmsnorm.hip"
#include "rope.hip"
#include "scale.hip"
#include "softcap.hip"
#include "select_rows.hip"
#include "silu_mul.hip"

static Guarded<float> nan_filled(size_t n) { return Guarded<float>(n, std::nanf("")); }

// RoPE frequency factors (or biases, norm weights): a file of floats, or "-" for none (the kernels then get a null
// pointer).
static Bytes optional_file(const char* path) {
  return std::string(path) == "-" ? Bytes() : read_file(path);
}
static const float* factors_of(const Bytes& v) {
  return v.empty() ? nullptr : (const float*)v.data();
}

// embedding.hip, select_rows.hip, kv_store.hip and paged_attention.hip; true when `entry` was one of them.
static bool run_forward_pass_ops(const std::string& entry, unsigned grid, unsigned block, char** a) {
  if (entry == "select_rows_f32") {  // n_rows width n_src_rows x rows out
    const int n_rows = std::atoi(a[0]), width = std::atoi(a[1]), n_src_rows = std::atoi(a[2]);
    Bytes x = read_file(a[3]), rows = read_file(a[4]);
    Guarded<float> out = nan_filled((size_t)n_rows * width);
    emu_launch(grid, block, [&] {
      select_rows_f32(out.data(), (const float*)x.data(), (const int*)rows.data(), n_rows, width, n_src_rows);
    });
    write_file(a[5], out.data(), out.size() * 4);
  } else if (entry.rfind("embedding_", 0) == 0) {  // n_tokens hidden vocab table ids out
    const int n_tokens = std::atoi(a[0]), hidden = std::atoi(a[1]), vocab = std::atoi(a[2]);
    Bytes table = read_file(a[3]), ids = read_file(a[4]);
    Guarded<float> out = nan_filled((size_t)n_tokens * hidden);
    using Embedding = void (*)(float*, const void*, const int*, int, int, int);
    const std::map<std::string, Embedding> kernels = {
        {"embedding_f32", embedding_f32},   {"embedding_f16", embedding_f16},   {"embedding_bf16", embedding_bf16},
        {"embedding_q4_0", embedding_q4_0}, {"embedding_q4_1", embedding_q4_1}, {"embedding_q8_0", embedding_q8_0},
        {"embedding_q5_0", embedding_q5_0}, {"embedding_q5_1", embedding_q5_1},
        {"embedding_q4_k", embedding_q4_k}, {"embedding_q5_k", embedding_q5_k}, {"embedding_q6_k", embedding_q6_k}};
    if (!kernels.count(entry)) std::exit(2);
    const Embedding kernel = kernels.at(entry);
    emu_launch(grid, block, [&] { kernel(out.data(), table.data(), (const int*)ids.data(), n_tokens, hidden, vocab); });
    write_file(a[5], out.data(), out.size() * 4);
  } else if (entry.rfind("kv_store_", 0) == 0) {
    // n_tokens n_kv_heads head_dim block_size num_blocks k v slots k_pool v_pool k_pool_out v_pool_out:
    // the pools are read, written into and written back whole, what was not to be touched included.
    const int n_tokens = std::atoi(a[0]), heads = std::atoi(a[1]), head_dim = std::atoi(a[2]);
    const int block_size = std::atoi(a[3]), num_blocks = std::atoi(a[4]);
    Bytes k = read_file(a[5]), v = read_file(a[6]), slots = read_file(a[7]);
    Bytes k_pool = read_file(a[8]), v_pool = read_file(a[9]);
    using KvStore = void (*)(void*, void*, const float*, const float*, const int*, int, int, int, int, int);
    const std::map<std::string, KvStore> kernels = {{"kv_store_f16", kv_store_f16}, {"kv_store_bf16", kv_store_bf16},
                                                    {"kv_store_f32", kv_store_f32}, {"kv_store_q8_0", kv_store_q8_0}};
    if (!kernels.count(entry)) std::exit(2);
    const KvStore kernel = kernels.at(entry);
    emu_launch(grid, block, [&] {
      kernel(k_pool.data(), v_pool.data(), (const float*)k.data(), (const float*)v.data(), (const int*)slots.data(),
             n_tokens, heads, head_dim, block_size, num_blocks);
    });
    write_file(a[10], k_pool.data(), k_pool.size());
    write_file(a[11], v_pool.data(), v_pool.size());
  } else if (entry.rfind("paged_attention_", 0) == 0) {
    // n_tokens n_heads n_kv_heads head_dim block_size max_blocks num_blocks max_splits window scale softcap q k_pool
    // v_pool block_tables token_seq positions workspace_bytes out workspace_out [sinks]: the workspace starts zeroed
    // (a null pointer when its size is 0) and is written back, so that its counters can be checked; the `_sinks`
    // entries take the sinks' file last.
    int n[9];
    for (int i = 0; i < 9; ++i) n[i] = std::atoi(a[i]);
    a += 1;  // past the window: the rest as before it
    const float scale = std::strtof(a[8], nullptr);
    const float softcap = std::strtof(a[9], nullptr);
    a += 1;  // past the soft cap: the rest as before it
    Bytes q = read_file(a[9]), k_pool = read_file(a[10]), v_pool = read_file(a[11]);
    Bytes tables = read_file(a[12]), token_seq = read_file(a[13]), positions = read_file(a[14]);
    const size_t workspace_bytes = (size_t)std::atoll(a[15]);
    Guarded<float> workspace((workspace_bytes + 3) / 4, 0.0f);
    Guarded<float> out = nan_filled((size_t)n[0] * n[1] * n[3]);
    using Attention = void (*)(float*, const float*, const void*, const void*, const int*, const int*, const int*, void*,
                               int, int, int, int, int, int, int, int, int, float, float);
    const std::map<std::string, Attention> kernels = {
        {"paged_attention_f16", paged_attention_f16}, {"paged_attention_bf16", paged_attention_bf16},
        {"paged_attention_f32", paged_attention_f32}, {"paged_attention_q8_0", paged_attention_q8_0},
        {"paged_attention_f16_softcap", paged_attention_f16_softcap},
        {"paged_attention_bf16_softcap", paged_attention_bf16_softcap},
        {"paged_attention_f32_softcap", paged_attention_f32_softcap},
        {"paged_attention_q8_0_softcap", paged_attention_q8_0_softcap}};
    using SinksAttention = void (*)(float*, const float*, const void*, const void*, const int*, const int*, const int*,
                                    void*, int, int, int, int, int, int, int, int, int, float, float, const float*);
    const std::map<std::string, SinksAttention> with_sinks = {
        {"paged_attention_f16_sinks", paged_attention_f16_sinks}, {"paged_attention_bf16_sinks", paged_attention_bf16_sinks},
        {"paged_attention_f32_sinks", paged_attention_f32_sinks}, {"paged_attention_q8_0_sinks", paged_attention_q8_0_sinks},
        {"paged_attention_f16_softcap_sinks", paged_attention_f16_softcap_sinks},
        {"paged_attention_q8_0_softcap_sinks", paged_attention_q8_0_softcap_sinks}};
    if (with_sinks.count(entry)) {
      const SinksAttention kernel = with_sinks.at(entry);
      Bytes sinks = read_file(a[18]);
      emu_launch(grid, block, [&] {
        kernel(out.data(), (const float*)q.data(), k_pool.data(), v_pool.data(), (const int*)tables.data(),
               (const int*)token_seq.data(), (const int*)positions.data(), workspace_bytes ? workspace.data() : nullptr,
               n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7], n[8], scale, softcap, (const float*)sinks.data());
      });
      write_file(a[16], out.data(), out.size() * 4);
      write_file(a[17], workspace.data(), workspace_bytes);
      return true;
    }
    if (!kernels.count(entry)) std::exit(2);
    const Attention kernel = kernels.at(entry);
    emu_launch(grid, block, [&] {
      kernel(out.data(), (const float*)q.data(), k_pool.data(), v_pool.data(), (const int*)tables.data(),
             (const int*)token_seq.data(), (const int*)positions.data(), workspace_bytes ? workspace.data() : nullptr,
             n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7], n[8], scale, softcap);
    });
    write_file(a[16], out.data(), out.size() * 4);
    write_file(a[17], workspace.data(), workspace_bytes);
  } else {
    return false;
  }
  return true;
}

// The fused_matvec.hip / fused_matmul.hip entry of a family for a weight-type suffix ("q4_1" ...).
template <class Fn>
static Fn by_type(const std::string& type, Fn q4_1, Fn q5_0, Fn q5_1, Fn q8_0, Fn f16, Fn bf16, Fn f32) {
  if (type == "q4_1") return q4_1;
  if (type == "q5_0") return q5_0;
  if (type == "q5_1") return q5_1;
  if (type == "q8_0") return q8_0;
  if (type == "f16") return f16;
  if (type == "bf16") return bf16;
  if (type == "f32") return f32;
  std::exit(2);
}
// The entry of `family` (matvec_norm_rope, matmul_add ...) for the weight type that ends `entry`.
#define BY_TYPE(family) \
  by_type(suffix(#family "_"), family##_q4_1, family##_q5_0, family##_q5_1, family##_q8_0, family##_f16, family##_bf16, \
          family##_f32)

// fused_matvec.hip; true when `entry` was one of its kernels.
static bool run_fused_matvec(const std::string& entry, unsigned grid, unsigned block, char** a) {
  auto suffix = [&](const char* family) { return entry.substr(std::string(family).size()); };
  if (entry.rfind("matvec_norm_rope_", 0) == 0) {
    // q_rows kv_rows cols batch head_dim rope_dim eps theta freq_scale W x g positions factors|- out (q|k|v per
    // batch row set)
    const int q_rows = std::atoi(a[0]), kv_rows = std::atoi(a[1]), cols = std::atoi(a[2]), batch = std::atoi(a[3]);
    const int head_dim = std::atoi(a[4]), rope_dim = std::atoi(a[5]);
    const float eps = std::strtof(a[6], nullptr), theta = std::strtof(a[7], nullptr), scale = std::strtof(a[8], nullptr);
    Bytes w = read_file(a[9]), x = read_file(a[10]), g = read_file(a[11]), pos = read_file(a[12]);
    Bytes factors = optional_file(a[13]);
    Guarded<float> q = nan_filled((size_t)batch * q_rows), k = nan_filled((size_t)batch * kv_rows),
                       v = nan_filled((size_t)batch * kv_rows);
    auto kernel = entry.find("_split_") != std::string::npos ? BY_TYPE(matvec_norm_rope_split) : BY_TYPE(matvec_norm_rope);
    emu_launch(grid, block, [&] {
      kernel(q.data(), k.data(), v.data(), w.data(), (const float*)x.data(), (const float*)g.data(),
             (const int*)pos.data(), factors_of(factors), q_rows, kv_rows, cols, batch, head_dim, rope_dim, eps, theta,
             scale);
    });
    q.insert(q.end(), k.begin(), k.end());
    q.insert(q.end(), v.begin(), v.end());
    write_file(a[14], q.data(), q.size() * 4);
  } else if (entry.rfind("matvec_norm_swiglu_", 0) == 0 || entry.rfind("matvec_norm_", 0) == 0) {
    // rows cols batch eps W x g out
    const bool swiglu = entry.rfind("matvec_norm_swiglu_", 0) == 0;
    const int rows = std::atoi(a[0]), cols = std::atoi(a[1]), batch = std::atoi(a[2]);
    const float eps = std::strtof(a[3], nullptr);
    Bytes w = read_file(a[4]), x = read_file(a[5]), g = read_file(a[6]);
    Guarded<float> y = nan_filled((size_t)rows * batch);
    auto kernel = swiglu ? (entry.find("_split_") != std::string::npos ? BY_TYPE(matvec_norm_swiglu_split)
                                                                       : BY_TYPE(matvec_norm_swiglu))
                         : BY_TYPE(matvec_norm);
    emu_launch(grid, block, [&] {
      kernel(y.data(), w.data(), (const float*)x.data(), (const float*)g.data(), rows, cols, batch, eps);
    });
    write_file(a[7], y.data(), y.size() * 4);
  } else if (entry.rfind("matvec_add_", 0) == 0) {  // rows cols batch W x y_in out
    const int rows = std::atoi(a[0]), cols = std::atoi(a[1]), batch = std::atoi(a[2]);
    Bytes w = read_file(a[3]), x = read_file(a[4]), y = read_file(a[5]);
    auto kernel = entry.find("_split_") != std::string::npos ? BY_TYPE(matvec_add_split) : BY_TYPE(matvec_add);
    emu_launch(grid, block, [&] { kernel((float*)y.data(), w.data(), (const float*)x.data(), rows, cols, batch); });
    write_file(a[6], y.data(), y.size());
  } else {
    return false;
  }
  return true;
}

// fused_qmatvec.hip (entries qmatvec_<kind>_<1|n|1b|1m|nm>); true when `entry` was one of its kernels. Weights
// are separate files, each matrix with its type code in `types` (4 bits each).
static bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() > tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
static bool run_fused_qmatvec(const std::string& entry, unsigned grid, unsigned block, char** a) {
  const bool blocks = ends_with(entry, "_1b");  // one token of the 32-element block types
  const bool mx = ends_with(entry, "_1m") || ends_with(entry, "_nm");  // MXFP4's own entries
  const bool one = ends_with(entry, "_1") || blocks || ends_with(entry, "_1m");
  const std::string kind = mx ? entry.substr(0, entry.size() - 3) : "";  // qmatvec_<kind> of an MXFP4 entry
  const bool store = entry.rfind("qmatvec_norm_rope_store_", 0) == 0;  // the harness's name for a cache target
  if (entry == "qmatvec_norm_rope_1" || entry == "qmatvec_norm_rope_n" || entry == "qmatvec_norm_rope_1b" || store ||
      kind == "qmatvec_norm_rope") {
    // [store: kv_format block_size num_blocks pool_bytes slots] then
    // types q_rows kv_rows cols batch head_dim rope_dim eps theta freq_scale Wq Wk Wv x g positions factors|- out
    // k_split tile_groups [bq bk bv]; out: q, k, v (floats; with a cache target k and v must stay NaN) and, with one,
    // the K then the V pool. Without the three bias files the kernel gets null biases.
    int kv_format = 0, block_size = 0, num_blocks = 0;
    size_t pool_bytes = 0;
    Bytes slots;
    if (store) {
      kv_format = std::atoi(a[0]), block_size = std::atoi(a[1]), num_blocks = std::atoi(a[2]);
      pool_bytes = (size_t)std::atoll(a[3]);
      slots = read_file(a[4]);
      a += 5;
    }
    const int types = std::atoi(a[0]), q_rows = std::atoi(a[1]), kv_rows = std::atoi(a[2]), cols = std::atoi(a[3]);
    const int batch = std::atoi(a[4]), head_dim = std::atoi(a[5]), rope_dim = std::atoi(a[6]);
    const float eps = std::strtof(a[7], nullptr), theta = std::strtof(a[8], nullptr), scale = std::strtof(a[9], nullptr);
    Bytes wq = read_file(a[10]), wk = read_file(a[11]), wv = read_file(a[12]), x = read_file(a[13]),
                      g = read_file(a[14]), pos = read_file(a[15]), factors = optional_file(a[16]);
    const int k_split = std::atoi(a[18]), tile_groups = std::atoi(a[19]);
    const bool biased = a[20] != nullptr;  // argv ends in a null pointer
    Bytes bq = biased ? read_file(a[20]) : Bytes(), bk = biased ? read_file(a[21]) : bq,
                      bv = biased ? read_file(a[22]) : bq;
    Guarded<float> q = nan_filled((size_t)batch * q_rows), k = nan_filled((size_t)batch * kv_rows),
                       v = nan_filled((size_t)batch * kv_rows);
    Guarded<unsigned char> pools(2 * pool_bytes, 0xA5);  // a byte no store writes by chance everywhere
    auto kernel = mx ? (one ? qmatvec_norm_rope_1m : qmatvec_norm_rope_nm)
                  : blocks ? qmatvec_norm_rope_1b : one ? qmatvec_norm_rope_1 : qmatvec_norm_rope_n;
    emu_launch(grid, block, [&] {
      kernel(q.data(), k.data(), v.data(), wq.data(), wk.data(), wv.data(), (const float*)x.data(),
             (const float*)g.data(), (const int*)pos.data(), factors_of(factors), factors_of(bq), factors_of(bk),
             factors_of(bv), types, q_rows, kv_rows, cols, batch,
             head_dim, rope_dim, eps, theta, scale, store ? pools.data() : nullptr,
             store ? pools.data() + pool_bytes : nullptr, store ? (const int*)slots.data() : nullptr, block_size,
             num_blocks, kv_format, k_split, tile_groups);
    });
    q.insert(q.end(), k.begin(), k.end());
    q.insert(q.end(), v.begin(), v.end());
    Bytes out((const char*)q.data(), (const char*)(q.data() + q.size()));
    out.insert(out.end(), pools.begin(), pools.end());
    write_file(a[17], out.data(), out.size());
  } else if (entry == "qmatvec_norm_swiglu_1" || entry == "qmatvec_norm_swiglu_n" ||
             entry == "qmatvec_norm_swiglu_split_1" || entry == "qmatvec_norm_swiglu_1b" || kind == "qmatvec_norm_swiglu") {
    // types rows cols batch eps Wg Wu x g out
    const int types = std::atoi(a[0]), rows = std::atoi(a[1]), cols = std::atoi(a[2]), batch = std::atoi(a[3]);
    const float eps = std::strtof(a[4], nullptr);
    Bytes wg = read_file(a[5]), wu = read_file(a[6]), x = read_file(a[7]), g = read_file(a[8]);
    Guarded<float> y = nan_filled((size_t)rows * batch);
    auto kernel = entry == "qmatvec_norm_swiglu_split_1" ? qmatvec_norm_swiglu_split_1
                  : mx                                    ? (one ? qmatvec_norm_swiglu_1m : qmatvec_norm_swiglu_nm)
                  : blocks                                ? qmatvec_norm_swiglu_1b
                  : one                                   ? qmatvec_norm_swiglu_1
                                                          : qmatvec_norm_swiglu_n;
    emu_launch(grid, block, [&] {
      kernel(y.data(), wg.data(), wu.data(), (const float*)x.data(), (const float*)g.data(), types, rows, cols, batch, eps);
    });
    write_file(a[9], y.data(), y.size() * 4);
  } else if (entry == "qmatvec_norm_1" || entry == "qmatvec_norm_n" || entry == "qmatvec_norm_1b" ||
             kind == "qmatvec_norm") {  // type rows cols batch eps W x g out
    const int type = std::atoi(a[0]), rows = std::atoi(a[1]), cols = std::atoi(a[2]), batch = std::atoi(a[3]);
    const float eps = std::strtof(a[4], nullptr);
    Bytes w = read_file(a[5]), x = read_file(a[6]), g = read_file(a[7]);
    Guarded<float> y = nan_filled((size_t)rows * batch);
    auto kernel = mx ? (one ? qmatvec_norm_1m : qmatvec_norm_nm) : blocks ? qmatvec_norm_1b : one ? qmatvec_norm_1 : qmatvec_norm_n;
    emu_launch(grid, block, [&] {
      kernel(y.data(), w.data(), (const float*)x.data(), (const float*)g.data(), type, rows, cols, batch, eps);
    });
    write_file(a[8], y.data(), y.size() * 4);
  } else if (entry == "qmatvec_add_1" || entry == "qmatvec_add_n" || entry == "qmatvec_add_1b" ||
             kind == "qmatvec_add") {  // type rows cols batch W x y_in out k_split
    const int type = std::atoi(a[0]), rows = std::atoi(a[1]), cols = std::atoi(a[2]), batch = std::atoi(a[3]);
    const int k_split = std::atoi(a[8]);
    Bytes w = read_file(a[4]), x = read_file(a[5]), y = read_file(a[6]);
    auto kernel = mx ? (one ? qmatvec_add_1m : qmatvec_add_nm) : blocks ? qmatvec_add_1b : one ? qmatvec_add_1 : qmatvec_add_n;
    emu_launch(grid, block, [&] {
      kernel((float*)y.data(), w.data(), (const float*)x.data(), type, rows, cols, batch, k_split);
    });
    write_file(a[7], y.data(), y.size());
  } else {
    return false;
  }
  return true;
}

// fused_matmul.hip; true when `entry` was one of its kernels. Every family takes tile_tokens, splits and
// workspace_bytes; the workspace starts zeroed (a null pointer when its size is 0) and is written back
// after the output, so that the test can check that the counters are zero again.
static bool run_fused_matmul(const std::string& entry, unsigned grid, unsigned block, char** a) {
  auto suffix = [&](const char* family) { return entry.substr(std::string(family).size()); };
  auto workspace_of = [](const char* bytes) { return Bytes((size_t)std::atoll(bytes), 0); };
  auto data = [](Bytes& v) -> void* { return v.empty() ? nullptr : v.data(); };
  if (entry.rfind("matmul_norm_rope_", 0) == 0) {
    // q_rows kv_rows cols n_tokens head_dim rope_dim tile splits eps theta freq_scale workspace_bytes
    // W x g positions factors|- out (q|k|v) workspace_out
    int n[8];
    for (int i = 0; i < 8; ++i) n[i] = std::atoi(a[i]);
    const float eps = std::strtof(a[8], nullptr), theta = std::strtof(a[9], nullptr), scale = std::strtof(a[10], nullptr);
    Bytes ws = workspace_of(a[11]);
    Bytes w = read_file(a[12]), x = read_file(a[13]), g = read_file(a[14]), pos = read_file(a[15]);
    Bytes factors = optional_file(a[16]);
    Guarded<float> q = nan_filled((size_t)n[3] * n[0]), k = nan_filled((size_t)n[3] * n[1]),
                       v = nan_filled((size_t)n[3] * n[1]);
    auto kernel = BY_TYPE(matmul_norm_rope);
    emu_launch(grid, block, [&] {
      kernel(q.data(), k.data(), v.data(), w.data(), (const float*)x.data(), (const float*)g.data(),
             (const int*)pos.data(), factors_of(factors), data(ws), n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7], eps,
             theta, scale);
    });
    q.insert(q.end(), k.begin(), k.end());
    q.insert(q.end(), v.begin(), v.end());
    write_file(a[17], q.data(), q.size() * 4);
    write_file(a[18], ws.data(), ws.size());
  } else if (entry.rfind("matmul_norm_", 0) == 0) {
    // rows cols n_tokens tile splits eps workspace_bytes W x g out workspace_out
    const bool swiglu = entry.rfind("matmul_norm_swiglu_", 0) == 0;
    const int rows = std::atoi(a[0]), cols = std::atoi(a[1]), tokens = std::atoi(a[2]);
    const int tile = std::atoi(a[3]), splits = std::atoi(a[4]);
    const float eps = std::strtof(a[5], nullptr);
    Bytes ws = workspace_of(a[6]);
    Bytes w = read_file(a[7]), x = read_file(a[8]), g = read_file(a[9]);
    Guarded<float> y = nan_filled((size_t)rows * tokens);
    auto kernel = swiglu ? BY_TYPE(matmul_norm_swiglu)
                         : BY_TYPE(matmul_norm);
    emu_launch(grid, block, [&] {
      kernel(y.data(), w.data(), (const float*)x.data(), (const float*)g.data(), data(ws), rows, cols, tokens, tile,
             splits, eps);
    });
    write_file(a[10], y.data(), y.size() * 4);
    write_file(a[11], ws.data(), ws.size());
  } else if (entry.rfind("matmul_add_", 0) == 0) {
    // rows cols n_tokens tile splits workspace_bytes W x y_in out workspace_out
    const int rows = std::atoi(a[0]), cols = std::atoi(a[1]), tokens = std::atoi(a[2]);
    const int tile = std::atoi(a[3]), splits = std::atoi(a[4]);
    Bytes ws = workspace_of(a[5]);
    Bytes w = read_file(a[6]), x = read_file(a[7]), y = read_file(a[8]);
    auto kernel = BY_TYPE(matmul_add);
    emu_launch(grid, block, [&] {
      kernel((float*)y.data(), w.data(), (const float*)x.data(), data(ws), rows, cols, tokens, tile, splits);
    });
    write_file(a[9], y.data(), y.size());
    write_file(a[10], ws.data(), ws.size());
  } else {
    return false;
  }
  return true;
}

int main(int argc, char** argv) {
  if (argc < 4) return 2;
  const std::string entry = argv[1];
  const unsigned grid = (unsigned)std::atoi(argv[2]), block = (unsigned)std::atoi(argv[3]);
  char** a = argv + 4;
  if (run_forward_pass_ops(entry, grid, block, a)) return 0;
  if (run_fused_matvec(entry, grid, block, a)) return 0;
  if (run_fused_qmatvec(entry, grid, block, a)) return 0;
  if (run_fused_matmul(entry, grid, block, a)) return 0;
  if (entry == "sample_f32") {  // vocab logits params out chunks workspace_bytes [mask] (grid = rows * chunks)
    // out: the rows' tokens, then (with a workspace) its counters, which the kernel must leave at zero.
    // mask: a file of the rows' packed token masks, or none (a null pointer).
    const int vocab = std::atoi(a[0]), chunks = std::atoi(a[4]);
    const size_t workspace_bytes = (size_t)std::atoll(a[5]);
    Bytes logits = read_file(a[1]), params = read_file(a[2]);
    const Bytes mask = argc > 10 ? optional_file(a[6]) : Bytes();
    const unsigned rows = grid / (unsigned)chunks;
    Guarded<int> out(rows, -1);
    Guarded<unsigned char> workspace(workspace_bytes, 0);
    emu_launch(grid, block, [&] {
      sample_f32(out.data(), (float*)logits.data(), (const float*)params.data(), vocab,
                 workspace_bytes ? workspace.data() : nullptr, chunks,
                 mask.empty() ? nullptr : (const unsigned*)mask.data());
    });
    if (workspace_bytes) out.insert(out.end(), (const int*)workspace.data(), (const int*)workspace.data() + rows);
    write_file(a[3], out.data(), out.size() * 4);
    return 0;
  }
  if (entry.rfind("matvec_", 0) == 0 || entry.rfind("qmatvec_", 0) == 0) {  // rows cols batch W x y
    const int rows = std::atoi(a[0]), cols = std::atoi(a[1]), batch = std::atoi(a[2]);
    Bytes w = read_file(a[3]), x = read_file(a[4]);
    Guarded<float> y = nan_filled((size_t)rows * batch);
    using Matvec = void (*)(float*, const void*, const float*, int, int, int);
    const std::map<std::string, Matvec> kernels = {
        {"matvec_q4_0", matvec_q4_0}, {"matvec_q4_1", matvec_q4_1}, {"matvec_q8_0", matvec_q8_0},
        {"matvec_q5_0", matvec_q5_0}, {"matvec_q5_1", matvec_q5_1},
        {"matvec_q4_k", matvec_q4_k}, {"matvec_q5_k", matvec_q5_k}, {"matvec_q6_k", matvec_q6_k},
        {"matvec_f16", matvec_f16},   {"matvec_bf16", matvec_bf16}, {"matvec_f32", matvec_f32},
        {"qmatvec_q4_k", qmatvec_q4_k}, {"qmatvec_q5_k", qmatvec_q5_k}, {"qmatvec_q6_k", qmatvec_q6_k},
        {"qmatvec_q8_0", qmatvec_q8_0}, {"qmatvec_q4_0", qmatvec_q4_0}, {"qmatvec_mxfp4", qmatvec_mxfp4}};
    if (!kernels.count(entry)) return 2;
    const Matvec kernel = kernels.at(entry);
    emu_launch(grid, block, [&] { kernel(y.data(), w.data(), (const float*)x.data(), rows, cols, batch); });
    write_file(a[5], y.data(), y.size() * 4);
  } else if (entry.rfind("matmul_", 0) == 0) {  // rows cols n_tokens tile_tokens W x y
    const int rows = std::atoi(a[0]), cols = std::atoi(a[1]), tokens = std::atoi(a[2]), tile = std::atoi(a[3]);
    Bytes w = read_file(a[4]), x = read_file(a[5]);
    Guarded<float> y = nan_filled((size_t)rows * tokens);
    using Matmul = void (*)(float*, const void*, const float*, int, int, int, int);
    const std::map<std::string, Matmul> kernels = {
        {"matmul_q4_0", matmul_q4_0}, {"matmul_q4_1", matmul_q4_1}, {"matmul_q8_0", matmul_q8_0},
        {"matmul_q5_0", matmul_q5_0}, {"matmul_q5_1", matmul_q5_1},
        {"matmul_q4_k", matmul_q4_k}, {"matmul_q5_k", matmul_q5_k}, {"matmul_q6_k", matmul_q6_k},
        {"matmul_f16", matmul_f16},   {"matmul_bf16", matmul_bf16}, {"matmul_f32", matmul_f32},
        {"matmul_mxfp4", matmul_mxfp4}};
    if (!kernels.count(entry)) return 2;
    const Matmul kernel = kernels.at(entry);
    emu_launch(grid, block, [&] { kernel(y.data(), w.data(), (const float*)x.data(), rows, cols, tokens, tile); });
    write_file(a[6], y.data(), y.size() * 4);
  } else if (entry == "argmax_f32") {  // n x out
    const int n = std::atoi(a[0]);
    Bytes x = read_file(a[1]);
    Guarded<int> out(grid, -1);
    emu_launch(grid, block, [&] { argmax_f32(out.data(), (const float*)x.data(), n); });
    write_file(a[2], out.data(), out.size() * 4);
  } else if (entry == "rmsnorm_f32") {  // n eps x weight out; x is normalized in place when out is "-"
    const int n = std::atoi(a[0]);
    const float eps = std::strtof(a[1], nullptr);
    Bytes x = read_file(a[2]), weight = read_file(a[3]);
    Guarded<float> out = nan_filled((size_t)grid * n);
    float* dst = std::string(a[4]) == "-" ? (float*)x.data() : out.data();
    emu_launch(grid, block, [&] { rmsnorm_f32(dst, (const float*)x.data(), (const float*)weight.data(), n, eps); });
    write_file(a[std::string(a[4]) == "-" ? 5 : 4], dst, (size_t)grid * n * 4);
  } else if (entry == "rmsnorm_add_f32") {  // n eps residual x weight out; out: the residual after the add
    const int n = std::atoi(a[0]);
    const float eps = std::strtof(a[1], nullptr);
    Bytes residual = read_file(a[2]), x = read_file(a[3]), weight = read_file(a[4]);
    emu_launch(grid, block, [&] {
      rmsnorm_add_f32((float*)residual.data(), (const float*)x.data(), (const float*)weight.data(), n, eps);
    });
    write_file(a[5], residual.data(), residual.size());
  } else if (entry == "rmsnorm_bias_f32") {  // n eps x bias weight out x_out; x_out: x after its bias
    const int n = std::atoi(a[0]);
    const float eps = std::strtof(a[1], nullptr);
    Bytes x = read_file(a[2]), bias = read_file(a[3]), weight = read_file(a[4]);
    Guarded<float> out = nan_filled((size_t)grid * n);
    emu_launch(grid, block, [&] {
      rmsnorm_bias_f32(out.data(), (float*)x.data(), (const float*)bias.data(), (const float*)weight.data(), n, eps);
    });
    write_file(a[5], out.data(), out.size() * 4);
    write_file(a[6], x.data(), x.size());
  } else if (entry == "rmsnorm_f32_f16") {  // n eps x weight out (f16)
    const int n = std::atoi(a[0]);
    const float eps = std::strtof(a[1], nullptr);
    Bytes x = read_file(a[2]), weight = read_file(a[3]);
    Guarded<unsigned short> out((size_t)grid * n, 0xFFFFu);  // NaN
    emu_launch(grid, block, [&] { rmsnorm_f32_f16(out.data(), (const float*)x.data(), (const float*)weight.data(), n, eps); });
    write_file(a[4], out.data(), out.size() * 2);
  } else if (entry == "rmsnorm_f32_and_f16" || entry == "rmsnorm_bias_f32_and_f16") {
    // n eps x bias|- weight out out16 x_out: the float32 rows, their f16 copy, x after its bias (the bias entry's)
    const int n = std::atoi(a[0]);
    const float eps = std::strtof(a[1], nullptr);
    Bytes x = read_file(a[2]), weight = read_file(a[4]);
    Guarded<float> out = nan_filled((size_t)grid * n);
    Guarded<unsigned short> out16((size_t)grid * n, 0xFFFFu);  // NaN
    if (entry == "rmsnorm_bias_f32_and_f16") {
      Bytes bias = read_file(a[3]);
      emu_launch(grid, block, [&] {
        rmsnorm_bias_f32_and_f16(out.data(), out16.data(), (float*)x.data(), (const float*)bias.data(),
                                 (const float*)weight.data(), n, eps);
      });
    } else {
      emu_launch(grid, block, [&] {
        rmsnorm_f32_and_f16(out.data(), out16.data(), (const float*)x.data(), (const float*)weight.data(), n, eps);
      });
    }
    write_file(a[5], out.data(), out.size() * 4);
    write_file(a[6], out16.data(), out16.size() * 2);
    write_file(a[7], x.data(), x.size());
  } else if (entry == "rope_f32" || entry == "rope_neox_f32") {
    // n_tokens n_heads head_dim rope_dim theta_base freq_scale x positions factors|- out
    const int tokens = std::atoi(a[0]), heads = std::atoi(a[1]), head_dim = std::atoi(a[2]), rope_dim = std::atoi(a[3]);
    const float theta = std::strtof(a[4], nullptr), scale = std::strtof(a[5], nullptr);
    Bytes x = read_file(a[6]), positions = read_file(a[7]), factors = optional_file(a[8]);
    const auto kernel = entry == "rope_f32" ? rope_f32 : rope_neox_f32;
    emu_launch(grid, block, [&] {
      kernel((float*)x.data(), (const int*)positions.data(), factors_of(factors), tokens, heads, head_dim, rope_dim,
               theta, scale);
    });
    write_file(a[9], x.data(), x.size());
  } else if (entry == "head_norm_rope_f32") {
    // n_tokens n_heads n_kv_heads head_dim rope_dim neox eps theta freq_scale kv_format block_size num_blocks
    // pool_bytes q k v q_weight|- k_weight|- q_bias|- k_bias|- v_bias|- positions factors|- slots|- out; out: q, k, v
    // (floats, in place: with a cache target k and v keep what came in) then the K and the V pool (pool_bytes each,
    // 0xA5 where nothing was stored).
    const int tokens = std::atoi(a[0]), heads = std::atoi(a[1]), kv_heads = std::atoi(a[2]), head_dim = std::atoi(a[3]);
    const int rope_dim = std::atoi(a[4]), neox = std::atoi(a[5]);
    const float eps = std::strtof(a[6], nullptr), theta = std::strtof(a[7], nullptr), scale = std::strtof(a[8], nullptr);
    const int kv_format = std::atoi(a[9]), block_size = std::atoi(a[10]), num_blocks = std::atoi(a[11]);
    const size_t pool_bytes = (size_t)std::atoll(a[12]);
    Bytes q = read_file(a[13]), k = read_file(a[14]), v = read_file(a[15]), qw = optional_file(a[16]),
          kw = optional_file(a[17]), qb = optional_file(a[18]), kb = optional_file(a[19]), vb = optional_file(a[20]),
          positions = read_file(a[21]), factors = optional_file(a[22]), slots = optional_file(a[23]);
    Guarded<unsigned char> pools(2 * pool_bytes, 0xA5);
    emu_launch(grid, block, [&] {
      head_norm_rope_f32((float*)q.data(), (float*)k.data(), (float*)v.data(), factors_of(qw), factors_of(kw),
                         factors_of(qb), factors_of(kb), factors_of(vb), (const int*)positions.data(),
                         factors_of(factors), tokens, heads, kv_heads, head_dim, rope_dim, neox, eps, theta, scale,
                         kv_format ? pools.data() : nullptr, kv_format ? pools.data() + pool_bytes : nullptr,
                         slots.empty() ? nullptr : (const int*)slots.data(), block_size, num_blocks, kv_format);
    });
    q.insert(q.end(), k.begin(), k.end());
    q.insert(q.end(), v.begin(), v.end());
    q.insert(q.end(), pools.begin(), pools.end());
    write_file(a[24], q.data(), q.size());
  } else if (entry == "add_bias_f32") {  // rows n x bias out
    const int rows = std::atoi(a[0]), n = std::atoi(a[1]);
    Bytes x = read_file(a[2]), bias = read_file(a[3]);
    emu_launch(grid, block, [&] { add_bias_f32((float*)x.data(), (const float*)bias.data(), rows, n); });
    write_file(a[4], x.data(), x.size());
  } else if (entry == "scale_f32") {  // n factor x out
    const int n = std::atoi(a[0]);
    const float factor = std::strtof(a[1], nullptr);
    Bytes x = read_file(a[2]);
    Guarded<float> out = nan_filled((size_t)n);
    emu_launch(grid, block, [&] { scale_f32(out.data(), (const float*)x.data(), n, factor); });
    write_file(a[3], out.data(), out.size() * 4);
  } else if (entry == "softcap_f32") {  // n cap x out
    const int n = std::atoi(a[0]);
    const float cap = std::strtof(a[1], nullptr);
    Bytes x = read_file(a[2]);
    Guarded<float> out = nan_filled((size_t)n);
    emu_launch(grid, block, [&] { softcap_f32(out.data(), (const float*)x.data(), n, cap); });
    write_file(a[3], out.data(), out.size() * 4);
  } else if (entry == "silu_mul_f32" || entry == "gelu_mul_f32" || entry == "add_f32") {  // n first second out
    const int n = std::atoi(a[0]);
    Bytes first = read_file(a[1]), second = read_file(a[2]);
    Guarded<float> out = nan_filled((size_t)n);
    const float* p = (const float*)first.data();
    const float* q = (const float*)second.data();
    emu_launch(grid, block, [&] {
      if (entry == "add_f32") add_f32(out.data(), p, q, n);
      else if (entry == "gelu_mul_f32") gelu_mul_f32(out.data(), p, q, n);
      else silu_mul_f32(out.data(), p, q, n);
    });
    write_file(a[3], out.data(), out.size() * 4);
  } else {
    return 2;
  }
  return 0;
}

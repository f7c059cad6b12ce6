// Part of the paged_attention op (kernels/paged_attention.hip includes it last, after its entries' macro and
// launch bounds; built and hashed with it: hipcore/runtime/kernels.py source_files): the `_sinks` entry
// points, run<KV, CAP, true> (attend adds the sink to the denominator in the merge or the combine).
#pragma once

// gpt-oss's attention sinks (attn_sinks: float32 [n_heads]): RF_PAGED_ATTENTION_KERNEL's signature and `sinks` last.
#define RF_PAGED_ATTENTION_SINKS_KERNEL(name, KV, CAP)                                                                \
  extern "C" __global__ __launch_bounds__(RF_ATTENTION_THREADS, RF_ATTENTION_MIN_BLOCKS) void name(                 \
      float* out, const float* q, const void* __restrict__ k_pool, const void* __restrict__ v_pool,                   \
      const int* __restrict__ block_tables, const int* __restrict__ token_seq, const int* __restrict__ positions,     \
      void* workspace, int n_tokens, int n_heads, int n_kv_heads, int head_dim, int block_size, int max_blocks,       \
      int num_blocks, int slots, int window, float scale, float softcap, const float* __restrict__ sinks) {           \
    rf_grid_dependency_deferred(); /* waits in run(), after prefetching its rows */                                  \
    const rf_paged_attention::Params p = {out, q, static_cast<const unsigned char*>(k_pool),                         \
                                          static_cast<const unsigned char*>(v_pool), block_tables, token_seq,         \
                                          positions, workspace, n_tokens, n_heads, n_kv_heads, head_dim, block_size,  \
                                          max_blocks, num_blocks, slots, window, scale, softcap, sinks};              \
    rf_paged_attention::run<rf_paged_attention::KV, CAP, true>(p);                                                    \
  }

RF_PAGED_ATTENTION_SINKS_KERNEL(paged_attention_f16_sinks, F16Kv, false)
RF_PAGED_ATTENTION_SINKS_KERNEL(paged_attention_bf16_sinks, BF16Kv, false)
RF_PAGED_ATTENTION_SINKS_KERNEL(paged_attention_f32_sinks, F32Kv, false)
RF_PAGED_ATTENTION_SINKS_KERNEL(paged_attention_q8_0_sinks, Q8_0Kv, false)
RF_PAGED_ATTENTION_SINKS_KERNEL(paged_attention_f16_softcap_sinks, F16Kv, true)
RF_PAGED_ATTENTION_SINKS_KERNEL(paged_attention_bf16_softcap_sinks, BF16Kv, true)
RF_PAGED_ATTENTION_SINKS_KERNEL(paged_attention_f32_softcap_sinks, F32Kv, true)
RF_PAGED_ATTENTION_SINKS_KERNEL(paged_attention_q8_0_softcap_sinks, Q8_0Kv, true)

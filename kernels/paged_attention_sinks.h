// Part of the paged_attention op (kernels/paged_attention.hip includes it last, after its entries' macro and
// launch bounds; built and hashed with it: hipcore/runtime/kernels.py source_files): the `_sinks` entry
// points, run<KV, CAP, true> (finish adds the sink to the denominator in the merge or the combine).
#pragma once

// gpt-oss's attention sinks (attn_sinks: float32 [n_heads]): RF_PAGED_ATTENTION_KERNEL's signature and `sinks` last.
#define RF_PAGED_ATTENTION_SINKS_PARAM , const float* __restrict__ sinks
#define RF_PAGED_ATTENTION_SINKS_KERNEL(name, KV, CAP) \
  RF_PAGED_ATTENTION_ENTRY(name, KV, CAP, true, 0, RF_PAGED_ATTENTION_SINKS_PARAM, sinks)

RF_PAGED_ATTENTION_SINKS_KERNEL(paged_attention_f16_sinks, F16Kv, false)
RF_PAGED_ATTENTION_SINKS_KERNEL(paged_attention_bf16_sinks, BF16Kv, false)
RF_PAGED_ATTENTION_SINKS_KERNEL(paged_attention_f32_sinks, F32Kv, false)
RF_PAGED_ATTENTION_SINKS_KERNEL(paged_attention_q8_0_sinks, Q8_0Kv, false)
RF_PAGED_ATTENTION_SINKS_KERNEL(paged_attention_f16_softcap_sinks, F16Kv, true)
RF_PAGED_ATTENTION_SINKS_KERNEL(paged_attention_bf16_softcap_sinks, BF16Kv, true)
RF_PAGED_ATTENTION_SINKS_KERNEL(paged_attention_f32_softcap_sinks, F32Kv, true)
RF_PAGED_ATTENTION_SINKS_KERNEL(paged_attention_q8_0_softcap_sinks, Q8_0Kv, true)

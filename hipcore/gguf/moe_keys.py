"""The mixture-of-experts keys of a GGUF file, read as llama.cpp reads them (src/llama-model.cpp: load_hparams and
each MoE model's load_arch_hparams), and the refusals of what rocmforge does not implement.

  <arch>.expert_count                 experts per layer (required for a MoE architecture; llama.cpp caps it at 512)
  <arch>.expert_used_count            experts each token is routed to, 1 .. expert_count (a per-layer array is
                                      refused: every layer routes the same count here)
  <arch>.expert_feed_forward_length   rows of each expert's gate and up (a per-layer array must be uniform); qwen3moe
                                      falls back to feed_forward_length / expert_used_count as llama.cpp does
  <arch>.expert_shared_count (beyond qwen2moe's one), expert_group_count > 1: refused (exit 4, named): the
                                      files of these architectures carry no others. expert_gating_func, expert_weights_norm and expert_weights_scale are
                                      not read: llama.cpp fixes them per architecture (qwen3moe: softmax, then the
                                      kept weights renormalized; gpt-oss: top-k, then a softmax over them).

A dense architecture whose file declares experts (Mixtral as "llama") and the MoE architectures llama.cpp knows
and rocmforge does not (architectures.UNSUPPORTED_MOE) are refused with exit 4 naming what is missing.
"""

from __future__ import annotations

from hipcore.gguf.architectures import ARCHITECTURES, UNSUPPORTED_MOE, Architecture
from hipcore.gguf.header import show
from hipcore.gguf.metadata_keys import MetadataKeys

MAX_EXPERTS = 512  # llama.cpp's LLAMA_MAX_EXPERTS
MOE_ARCHITECTURES = tuple(name for name, family in ARCHITECTURES.items() if family.moe)
_MAX_DIM = 1 << 24


def refuse_unsupported_moe(keys: MetadataKeys, arch: str) -> None:
    """Exit 4 for an architecture outside ARCHITECTURES that is a mixture of experts: named as such."""
    if arch in UNSUPPORTED_MOE or f"{arch}.expert_count" in keys:
        raise keys.error("general.architecture", arch, " or ".join(map(repr, MOE_ARCHITECTURES)), unsupported=True,
                         problem=f"the mixture-of-experts architecture {show(arch)} is not supported (supported "
                                 f"mixture-of-experts architectures: {', '.join(MOE_ARCHITECTURES)})")


def read_moe_keys(keys: MetadataKeys, arch: str, family: Architecture, n_layers: int, ffn: int) -> dict:
    """The ModelConfig fields of the file's experts (empty for a dense family, whose file must declare none)."""
    count_key = f"{arch}.expert_count"
    if not family.moe:
        experts = keys.uint32(count_key, default=0)
        if experts:
            raise keys.error(count_key, experts, "0 (dense models)", unsupported=True,
                             problem=f"a mixture-of-experts {arch} model ({experts} experts, e.g. Mixtral) is not "
                                     f"supported (supported mixture-of-experts architectures: "
                                     f"{', '.join(MOE_ARCHITECTURES)})")
        return {}
    experts = keys.uint32(count_key, lo=1, hi=MAX_EXPERTS)
    used_key = f"{arch}.expert_used_count"
    if isinstance(keys.metadata.get(used_key), tuple):
        raise keys.error(used_key, keys.metadata[used_key], "a uint32", unsupported=True,
                         problem="a per-layer count of routed experts is not supported")
    used = keys.uint32(used_key, lo=1, hi=experts)
    for key, what in ((f"{arch}.expert_shared_count", "shared experts"),
                      (f"{arch}.expert_group_count", "expert groups")):
        value = keys.uint32(key, default=0)
        if value > (1 if "group" in key or family.shared_expert else 0):
            raise keys.error(key, value, "0", unsupported=True, problem=f"{what} ({value}) are not supported for {arch}")
    ffn_key = f"{arch}.expert_feed_forward_length"
    default = ffn // used if arch in ("qwen3moe", "qwen2moe") and ffn // used else None  # llama.cpp's fallback
    expert_ffn = keys.uint32_or_uniform_array(ffn_key, n_layers, lo=1, hi=_MAX_DIM, default=default)
    shared_ffn = 0
    if family.shared_expert:
        shared_ffn = keys.uint32(f"{arch}.expert_shared_feed_forward_length", lo=1, hi=_MAX_DIM, default=ffn)
    return dict(n_experts=experts, n_experts_used=used, expert_ffn_size=expert_ffn, shared_ffn_size=shared_ffn,
                expert_gating=family.expert_gating, expert_weights_norm=family.expert_weights_norm,
                expert_activation=family.expert_activation, moe_biases=family.moe_biases)

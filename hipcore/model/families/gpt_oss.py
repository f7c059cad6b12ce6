"""gpt-oss (gpt-oss-20b, gpt-oss-120b; llama.cpp: src/models/openai-moe.cpp): per layer
    q, k, v = rmsnorm(x) @ [Wq; Wk; Wv]^T + [bq; bk; bv], NEOX RoPE (YaRN-scaled: hipcore/model/yarn.py)
    attn    = attention over the cache with a learned sink logit per head (attn_sinks), the even layers through the
              sliding window (ModelConfig.layer_window)
    x      += attn @ Wo^T + bo  (bo added by the feed-forward's norm launch: biased_feed_forward)
    x      += the mixture of experts on rmsnorm(x) (the norm the file calls post_attention_norm; router bias, top-k of
              the logits then a softmax over the k, expert biases, the clamped SwiGLU: hipcore/model/moe_blocks.py)
The products are the planner's; the q, k and v biases are added in fused_qmatvec's epilogue or by the head_norm_rope
launch that rotates q and k and stores k and v in the cache (no norm weights: no per-head norm; one launch a layer
where there were up to six: blocks.head_norm_rope_launch). The attention takes prompt_attention's sink entries for prompt steps on
the matrix cores (prompt_attention.takes with sinks: an f16 cache, heads of SINKS_HEAD_DIMS), paged_attention's
otherwise, which run where paged_attention.takes_sinks (every backend; check_backend refuses the model at load, by
name, on one without them)."""

from hipcore.errors import UnsupportedModelError
from hipcore.model.blocks import (Family, StepContext, _kv_store, head_norm_fused, head_norm_rope_launch,
                                  head_norm_stores_kv, positions, rope_qk)
from hipcore.model.moe_blocks import moe_feed_forward
from hipcore.model.projections import Launch
from hipcore.ops import paged_attention, prompt_attention


def check_backend(device) -> None:
    if not paged_attention.takes_sinks(device):
        raise UnsupportedModelError(f"gpt-oss: attention with sinks (attn_sinks) has no kernel on {device.backend} "
                                    "yet; the cpu backend runs it (--device cpu)")


def attention_input(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """q, k, v with their biases, then NEOX RoPE on q and k with the layer's base and the YaRN divisors: one
    head_norm_rope launch after the products (the biases the products did not add, no norm; k and v into the cache
    where head_norm_stores_kv), or add_bias and rope launches where it does not take the heads."""
    if not head_norm_fused(ctx):
        return ctx.products.attention_input(lw, t, positions(ctx), rotate=False) + rope_qk(ctx, i, lw, t)
    products = ctx.products.attention_input(lw, t, positions(ctx), rotate=False, leave_biases=True)
    biases = () if ctx.products.adds_qkv_biases(lw, t) else (lw.attn_q_bias, lw.attn_k_bias, lw.attn_v_bias)
    return products + [head_norm_rope_launch(ctx, i, t, "qkv_bias+rope" if biases else "rope", biases=biases)]


def sink_attention(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """Store k and v, then attn = attention(q, cached K, cached V) with the layer's sinks and window."""
    cfg, b, dev, st, inputs, kv = ctx.config, ctx.buffers, ctx.device, ctx.stream, ctx.inputs, ctx.cache.config
    tables, seq_of, pos = (inputs.addr(n) for n in ("block_tables", "token_seq", "positions"))
    store = [] if head_norm_stores_kv(ctx) else [_kv_store(ctx, i, t)]  # attention_input's launch stored k and v
    if not ctx.decode and prompt_attention.takes(dev.arch, t, kv.dtype, cfg.head_dim, sinks=True):
        return store + [Launch("prompt_attention+sinks", lambda: prompt_attention.launch(
            dev, st, b["attn"], b["q"], ctx.cache.k_pools[i], ctx.cache.v_pools[i], tables, seq_of, pos,
            n_tokens=t, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
            block_size=kv.block_size, max_blocks=ctx.max_blocks, num_blocks=kv.num_blocks, scale=ctx.scale,
            window=cfg.layer_window(i), sinks=lw.attn_sinks.buffer), reads=(lw.attn_sinks,))]
    return store + [Launch("attention+sinks", lambda: paged_attention.launch(
        dev, st, b["attn"], b["q"], ctx.cache.k_pools[i], ctx.cache.v_pools[i], tables, seq_of, pos,
        n_tokens=t, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
        block_size=kv.block_size, max_blocks=ctx.max_blocks, num_blocks=kv.num_blocks, scale=ctx.scale,
        kv_dtype=kv.dtype, workspace=b.get("attention_workspace"), window=cfg.layer_window(i),
        sinks=lw.attn_sinks.buffer), reads=(lw.attn_sinks,))]


def attention_output(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """x += attn @ Wo^T; its bias bo is left to biased_feed_forward's norm launch."""
    return ctx.products.residual_product("attn_output", lw.attn_output, ctx.buffers["attn"], ctx.config.q_size, t)


def biased_feed_forward(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """x += bo, added by the feed-forward's norm launch as it reads x (rmsnorm.launch_bias: one launch where there were
    two, the same bits), then the mixture of experts."""
    return moe_feed_forward(ctx, i, lw, t, residual_bias=lw.attn_output_bias)


FAMILY = Family("gpt-oss", (attention_input, sink_attention, attention_output, biased_feed_forward))

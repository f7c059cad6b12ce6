"""The blocks a model family's layer is composed of, each a list of launches for a step of t tokens.

A family (hipcore/model/families/) is a layer built from these: the llama layer is
    attention_input -> attention -> attention_output -> feed_forward -> feed_forward_output
(fused_attention_input stores k and v in the cache itself where its kernel can, and is followed by
attention_after_fused_input_for_output, which then leaves out the kv_store launch)
and a family that differs from it only in how q, k and v are made composes its own attention input and keeps the
rest: qwen3's per-head norms and NEOX RoPE take head_normed_attention_input (the products without RoPE, then one
head_norm_rope launch that also stores k and v), and qwen2's biases and NEOX RoPE take the fused input (its q and
k rows are uploaded with each NEOX pair side by side, weights.py NEOX_AS_NORM).
gemma3 takes qwen3's attention input, then the sandwich blocks at the end of this file: the o and down products,
each followed by one launch that normalizes it and adds it to the residual stream, and a GeGLU feed-forward that
the planner fuses as it fuses llama's SwiGLU where the weights allow (fused_qmatvec); gemma2 (no per-head norms)
takes the fused input as qwen2 does (its NEOX pairs side by side) with the sandwich blocks, and its logits are
capped after the head (capped_logits).
Per layer, RoPE's base and scaling and attention's window come from the config (local layers differ).
The products themselves are planned by projections.py (fused kernels where the weights and the step
allow them); the blocks here add what sits between them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hipcore.kvcache.cache import KvCache
from hipcore.model.projections import Launch, ProjectionPlanner, weight_arg
from hipcore.model.step_inputs import StepInputs
from hipcore.ops import (head_norm_rope, kernel_choice, kv_store, paged_attention, prompt_attention, rmsnorm, rope,
                         scale, softcap)
from hipcore.runtime.device import Buffer, Device, Stream


@dataclass(frozen=True)
class StepContext:
    """What the blocks of one step read: the device and stream, the runner's buffers, the KV cache and the
    step inputs, and the planner of the products."""

    device: Device
    stream: Stream | None
    config: object  # hipcore.gguf.config.ModelConfig
    buffers: dict[str, Buffer]
    cache: KvCache
    inputs: StepInputs
    products: ProjectionPlanner
    max_blocks: int
    scale: float  # attention's score scale (1/sqrt(head_dim) unless the family says otherwise)
    decode: bool = False  # every token is its own sequence's next one (attention stays on paged_attention)


# (context, layer index, layer weights, token rows) -> launches
Block = Callable[[StepContext, int, object, int], list[Launch]]


def positions(ctx: StepContext) -> int:
    return ctx.inputs.addr("positions")


# ---- the llama layer's blocks ------------------------------------------------------------------------

def _stores_kv(ctx: StepContext, lw, t: int) -> bool:
    """True when fused_attention_input's products store this step's k and v into the cache themselves."""
    return ctx.products.stores_kv(lw, t, ctx.cache.config.dtype)


def fused_attention_input(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """q, k, v = rope(rmsnorm(x) @ [Wq; Wk; Wv]^T (+ the biases, qwen2's)) in NORM mode: one fused launch where the
    weights allow, which also stores k and v in the paged cache where it can (then pair it with
    attention_after_fused_input). NEOX RoPE runs here only as NORM on reordered rows (weights.py: NEOX_AS_NORM)."""
    cfg = ctx.config
    if cfg.rope_type != "norm" or cfg.qk_norm:  # the fused kernels would silently skip these
        raise ValueError(f"{cfg.architecture}: the fused attention input computes NORM RoPE without per-head norms; "
                         "compose the family's own")
    target = kv_store.epilogue_target(ctx.cache, i, ctx.inputs.buffer) if _stores_kv(ctx, lw, t) else None
    return ctx.products.attention_input(lw, t, positions(ctx), kv_target=target)


def _kv_store(ctx: StepContext, i: int, t: int) -> Launch:
    b, dev, st = ctx.buffers, ctx.device, ctx.stream
    return ("kv_store", lambda: kv_store.launch(dev, st, ctx.cache, i, b["k"], b["v"], ctx.inputs.buffer, t))


def _takes_prompt_attention(ctx: StepContext, t: int) -> bool:
    cfg = ctx.config
    return not ctx.decode and prompt_attention.takes(ctx.device.arch, t, ctx.cache.config.dtype, cfg.head_dim,
                                                     cfg.attn_softcap)


def _attention_out_f16(ctx: StepContext, lw, t: int) -> bool:
    """The llama layer's attention writes f16 for its o product (pre_norm_layer): where prompt_attention computes
    it and the o product reads f16 (ProjectionPlanner.reads_f16)."""
    return _takes_prompt_attention(ctx, t) and ctx.products.reads_f16(lw.attn_output, t)


def _paged_attention(ctx: StepContext, i: int, t: int, out_f16: bool = False) -> Launch:
    """Attention over the paged cache: prompt steps on the matrix cores where prompt_attention takes them (out_f16:
    written as f16, there only)."""
    cfg, b, dev, st, inputs, kv = ctx.config, ctx.buffers, ctx.device, ctx.stream, ctx.inputs, ctx.cache.config
    tables, seq_of, pos = (inputs.addr(n) for n in ("block_tables", "token_seq", "positions"))
    if _takes_prompt_attention(ctx, t):
        return ("attention", lambda: prompt_attention.launch(
            dev, st, b["attn"], b["q"], ctx.cache.k_pools[i], ctx.cache.v_pools[i], tables, seq_of, pos,
            n_tokens=t, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
            block_size=kv.block_size, max_blocks=ctx.max_blocks, num_blocks=kv.num_blocks, scale=ctx.scale,
            window=cfg.layer_window(i), softcap=cfg.attn_softcap, out_f16=out_f16))
    if out_f16:
        raise ValueError("attention: only prompt_attention writes f16")
    workspace = b.get("attention_workspace")
    return ("attention", lambda: paged_attention.launch(
        dev, st, b["attn"], b["q"], ctx.cache.k_pools[i], ctx.cache.v_pools[i], tables, seq_of, pos,
        n_tokens=t, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
        block_size=kv.block_size, max_blocks=ctx.max_blocks, num_blocks=kv.num_blocks, scale=ctx.scale,
        kv_dtype=kv.dtype, workspace=workspace, window=cfg.layer_window(i), softcap=cfg.attn_softcap))


def attention(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """Store this step's k and v in the paged cache, then attn = attention(q, cached K, cached V)."""
    return [_kv_store(ctx, i, t), _paged_attention(ctx, i, t)]


def attention_after_fused_input(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """attention after fused_attention_input: the kv_store launch only where its products did not store k and v;
    attn in float32 (gemma2's, whose o product is a post-normed one)."""
    return ([] if _stores_kv(ctx, lw, t) else [_kv_store(ctx, i, t)]) + [_paged_attention(ctx, i, t)]


def attention_after_fused_input_for_output(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """attention_after_fused_input with attn written as f16 where the o product reads it so (the llama layer's:
    pre_norm_layer's attention_output must follow)."""
    stored = _stores_kv(ctx, lw, t)
    return ([] if stored else [_kv_store(ctx, i, t)]) + [_paged_attention(ctx, i, t, out_f16=_attention_out_f16(ctx, lw, t))]


def attention_for_output(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """The llama layer's attention (paired with attention_output): attention's launches, attn written as f16 where
    the o product reads it so (_attention_out_f16)."""
    return [_kv_store(ctx, i, t), _paged_attention(ctx, i, t, out_f16=_attention_out_f16(ctx, lw, t))]


def attention_output(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """x += attn @ Wo^T (attn f16 where attention_for_output or attention_after_fused_input_for_output wrote it so:
    the llama layer's attention blocks, pre_norm_layer, which this block must follow)."""
    return ctx.products.residual_product("attn_output", lw.attn_output, ctx.buffers["attn"], ctx.config.q_size, t,
                                         x_f16=_attention_out_f16(ctx, lw, t))


def feed_forward(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """gate = silu(rmsnorm(x) @ Wg^T) * (rmsnorm(x) @ Wu^T)."""
    return ctx.products.feed_forward_input(lw, t)


def feed_forward_output(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """x += h @ Wd^T, h the feed-forward's SwiGLU (where feed_forward left it)."""
    return ctx.products.feed_forward_output(lw, t)


# ---- the attention input of a layer with per-head norms (qwen3, gemma3) or biases left for RoPE (gpt-oss) -----

def head_norm_fused(ctx: StepContext) -> bool:
    """True when head_norm_rope takes the heads of this model (its head_dim): the per-head norms or the biases, and
    RoPE, in one launch."""
    return head_norm_rope.supports(ctx.config.head_dim)


def head_norm_stores_kv(ctx: StepContext) -> bool:
    """True when the head_norm_rope launch stores k and v into the cache itself (the element-wise KV formats, as for
    the products' epilogue), so that the attention block has no kv_store launch."""
    return head_norm_fused(ctx) and kernel_choice.stores_kv_in_epilogue(ctx.cache.config.dtype)


def head_norm_rope_launch(ctx: StepContext, i: int, t: int, label: str, norms=None, biases=()) -> Launch:
    """The head_norm_rope launch after the q|k|v products (where head_norm_fused): norms, q's and k's per-head norm
    Weights (None: no norm); biases, the q, k and v bias Weights the products left (none: none); RoPE in the config's
    layout with the layer's base and scaling; k and v into the cache where head_norm_stores_kv (label + "+kv_store")."""
    cfg, b, dev, st = ctx.config, ctx.buffers, ctx.device, ctx.stream
    theta, freq_scale = cfg.layer_rope(i, ctx.products.freq_scale)
    target = kv_store.epilogue_target(ctx.cache, i, ctx.inputs.buffer) if head_norm_stores_kv(ctx) else None
    q_norm, k_norm = (None, None) if norms is None else (w.buffer for w in norms)
    return Launch(label if target is None else label + "+kv_store", lambda: head_norm_rope.launch(
        dev, st, b["q"], b["k"], b["v"], q_norm, k_norm, positions(ctx), n_tokens=t, n_heads=cfg.n_heads,
        n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, rope_dim=cfg.rope_dim, eps=cfg.rms_norm_eps, theta=theta,
        freq_scale=freq_scale, freq_factors=ctx.products.freq_factors, rope_type=cfg.rope_type, kv_target=target,
        biases=tuple(w.buffer for w in biases) or None), reads=(*(norms or ()), *biases))


def head_normed_attention_input(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """q, k, v = rmsnorm(x) @ [Wq; Wk; Wv]^T, fused where the weights allow (ProjectionPlanner.attention_input without
    RoPE), then one head_norm_rope launch: every head of q and k RMS-normalized with its weight and rotated in the
    config's layout with the layer's base, k and v stored in the cache where its format allows (head_norm_stores_kv;
    pair it with attention_after_head_norm or attention_after_head_norm_for_output). Where head_norm_rope does not
    take the heads, the norms and RoPE as single ops."""
    products = ctx.products.attention_input(lw, t, positions(ctx), rotate=False)
    if not head_norm_fused(ctx):
        return products + qk_head_norm(ctx, i, lw, t) + rope_qk(ctx, i, lw, t)
    return products + [head_norm_rope_launch(ctx, i, t, "qk_norm+rope", norms=(lw.attn_q_norm, lw.attn_k_norm))]


def attention_after_head_norm(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """attention after head_normed_attention_input: the kv_store launch only where head_norm_rope did not store k
    and v; attn in float32."""
    return ([] if head_norm_stores_kv(ctx) else [_kv_store(ctx, i, t)]) + [_paged_attention(ctx, i, t)]


def attention_after_head_norm_for_output(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """attention_after_head_norm with attn written as f16 where the o product reads it so (pre_norm_layer's
    attention_output must follow)."""
    stored = head_norm_stores_kv(ctx)
    return ([] if stored else [_kv_store(ctx, i, t)]) + [_paged_attention(ctx, i, t, out_f16=_attention_out_f16(ctx, lw, t))]


# ---- the pieces of an unfused attention input ----------------------------------------------------------

def qkv_products(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """xn = rmsnorm(x); q, k, v = xn @ Wq^T, xn @ Wk^T, xn @ Wv^T (no RoPE yet)."""
    cfg, b, dev, st = ctx.config, ctx.buffers, ctx.device, ctx.stream
    plan: list[Launch] = [Launch("attn_norm", lambda: rmsnorm.launch(dev, st, b["xn"], b["x"], lw.attn_norm.buffer, t,
                                                                     cfg.hidden_size, cfg.rms_norm_eps),
                                 reads=(lw.attn_norm,))]
    for name, out, wt in (("q", b["q"], lw.attn_q), ("k", b["k"], lw.attn_k), ("v", b["v"], lw.attn_v)):
        plan.append(Launch(f"{name}_proj", lambda out=out, wt=wt: kernel_choice.project(
            dev, st, out, weight_arg(wt), b["xn"], wt.rows, wt.cols, t, weight_type=wt.fmt,
            workspace=ctx.products.workspace), reads=(wt,)))
    return plan


def qk_head_norm(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """Every head of q and of k RMS-normalized over head_dim, with its weight, in place."""
    cfg, b, dev, st = ctx.config, ctx.buffers, ctx.device, ctx.stream
    hd, eps = cfg.head_dim, cfg.rms_norm_eps
    return [Launch(f"{name}_norm", lambda out=out, w=w, heads=heads: rmsnorm.launch(dev, st, out, out, w.buffer,
                                                                                     t * heads, hd, eps), reads=(w,))
            for name, out, w, heads in (("q", b["q"], lw.attn_q_norm, cfg.n_heads),
                                        ("k", b["k"], lw.attn_k_norm, cfg.n_kv_heads))]


def rope_qk(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """RoPE on q and k in place, in the config's layout (NORM or NEOX), with the layer's base and scaling."""
    cfg, b, dev, st = ctx.config, ctx.buffers, ctx.device, ctx.stream
    pos, factors = positions(ctx), ctx.products.freq_factors
    theta, freq_scale = cfg.layer_rope(i, ctx.products.freq_scale)
    return [(f"rope_{name}", lambda out=out, heads=heads: rope.launch(
                dev, st, out, pos, t, heads, cfg.head_dim, cfg.rope_dim, theta, freq_scale,
                freq_factors=factors, rope_type=cfg.rope_type))
            for name, out, heads in (("q", b["q"], cfg.n_heads), ("k", b["k"], cfg.n_kv_heads))]


def compose(*blocks: Block) -> Block:
    """One block running `blocks` in order."""
    def run(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
        return [launch for block in blocks for launch in block(ctx, i, lw, t)]
    return run


# What runs on the embedded rows before the first layer: (context, token rows) -> launches.
InputBlock = Callable[[StepContext, int], list[Launch]]
# What runs on the logits after the output head: (context, logits rows) -> launches.
OutputBlock = Callable[[StepContext, int], list[Launch]]


@dataclass(frozen=True)
class Family:
    """A model family's forward pass: the blocks of one layer, in order, and what follows the embedding
    lookup (the lookup and the output head are shared)."""

    name: str
    layer: tuple[Block, ...]
    embedding_input: InputBlock | None = None
    logits_output: OutputBlock | None = None

    def input_launches(self, ctx: StepContext, t: int) -> list[Launch]:
        return self.embedding_input(ctx, t) if self.embedding_input is not None else []

    def output_launches(self, ctx: StepContext, r: int) -> list[Launch]:
        return self.logits_output(ctx, r) if self.logits_output is not None else []

    def layer_launches(self, ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
        return [launch for block in self.layer for launch in block(ctx, i, lw, t)]


def pre_norm_layer(attention_input: Block) -> tuple[Block, ...]:
    """The llama layer with the given attention input: pre-norm attention and a SwiGLU feed-forward,
    each added to the residual stream. fused_attention_input and head_normed_attention_input bring their own
    attention blocks (they may have stored k and v already)."""
    attend = {fused_attention_input: attention_after_fused_input_for_output,
              head_normed_attention_input: attention_after_head_norm_for_output}.get(attention_input,
                                                                                     attention_for_output)
    return (attention_input, attend, attention_output, feed_forward, feed_forward_output)


# ---- Gemma's sandwich: norms before and after attention and the feed-forward -------------------------

def scaled_embedding(ctx: StepContext, t: int) -> list[Launch]:
    """x *= embedding_scale (Gemma: sqrt(hidden_size)), on the looked-up token rows."""
    cfg, b, dev, st = ctx.config, ctx.buffers, ctx.device, ctx.stream
    return [("embedding_scale", lambda: scale.launch(dev, st, b["x"], b["x"], t * cfg.hidden_size,
                                                     cfg.embedding_scale))]


def _post_normed_residual(ctx: StepContext, name: str, wt, norm, x: Buffer, cols: int, t: int,
                          x_f16: bool = False) -> list[Launch]:
    """x_residual += rmsnorm(x @ W^T) with `norm`'s weight: the product (ProjectionPlanner.product: fused_qmatvec where
    it takes the weight; x_f16: x holds f16), then its norm added to the residual stream in one launch
    (rmsnorm.launch_add)."""
    cfg, b, dev, st = ctx.config, ctx.buffers, ctx.device, ctx.stream
    h = cfg.hidden_size
    return ctx.products.product(name, wt, x, cols, t, x_f16=x_f16) + [
        Launch(f"{name}_post_norm+residual", lambda: rmsnorm.launch_add(dev, st, b["x"], b["proj"], norm.buffer, t, h,
                                                                        cfg.rms_norm_eps), reads=(norm,))]


def post_normed_attention_output(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """x += rmsnorm(attn @ Wo^T) (post_attention_norm)."""
    return _post_normed_residual(ctx, "attn_output", lw.attn_output, lw.attn_post_norm, ctx.buffers["attn"],
                                 ctx.config.q_size, t)


def geglu_feed_forward(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """gate = gelu(rmsnorm(x) @ Wg^T) * (rmsnorm(x) @ Wu^T), GELU in its tanh form: one fused_qmatvec launch where the
    weights and the step allow, else the norm, two products and gelu_mul (ProjectionPlanner.feed_forward_input)."""
    return ctx.products.feed_forward_input(lw, t, activation="gelu")


def post_normed_feed_forward_output(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """x += rmsnorm(h @ Wd^T) (post_ffw_norm), h geglu_feed_forward's: f16 in ffn_h16 where the planner ran it on f16
    activations (ProjectionPlanner.ffn_pairs), else float32 in gate."""
    f16 = ctx.products.ffn_pairs(lw, t, activation="gelu")
    h = ctx.buffers["ffn_h16" if f16 else "gate"]
    return _post_normed_residual(ctx, "ffn_down", lw.ffn_down, lw.ffn_post_norm, h, ctx.config.ffn_size, t, x_f16=f16)


def capped_logits(ctx: StepContext, r: int) -> list[Launch]:
    """logits = f tanh(logits / f) with f = final_softcap (Gemma 2's final logit soft-capping, f = 30), in place
    on the r rows the head wrote, before anything samples from them."""
    cfg, b, dev, st = ctx.config, ctx.buffers, ctx.device, ctx.stream
    return [("final_softcap", lambda: softcap.launch(dev, st, b["logits"], b["logits"], r * cfg.vocab_size,
                                                     cfg.final_softcap))]

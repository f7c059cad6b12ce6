"""The blocks a model family's layer is composed of, each a list of launches for a step of t tokens.

A family (hipcore/model/families/) is a layer built from these: the llama layer is
    attention_input -> attention -> attention_output -> feed_forward -> feed_forward_output
and a family that differs from it only in how q, k and v are made (qwen2's biases, qwen3's per-head
norm, NEOX RoPE) composes its own attention_input from the smaller blocks below and keeps the rest.
The products themselves are planned by projections.py (fused kernels where the weights and the step
allow them); the blocks here add what sits between them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hipcore.kvcache.cache import KvCache
from hipcore.model.projections import Launch, ProjectionPlanner, weight_arg
from hipcore.model.step_inputs import StepInputs
from hipcore.ops import add_bias, kv_store, matmul_mma, paged_attention, rmsnorm, rope
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
    scale: float  # attention's 1/sqrt(head_dim)


# (context, layer index, layer weights, token rows) -> launches
Block = Callable[[StepContext, int, object, int], list[Launch]]


def positions(ctx: StepContext) -> int:
    return ctx.inputs.addr("positions")


# ---- the llama layer's blocks ------------------------------------------------------------------------

def fused_attention_input(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """q, k, v = rope(rmsnorm(x) @ [Wq; Wk; Wv]^T) in NORM mode: one fused launch where the weights allow."""
    cfg = ctx.config
    if cfg.rope_type != "norm" or cfg.qkv_bias or cfg.qk_norm:  # the fused kernels would silently skip these
        raise ValueError(f"{cfg.architecture}: the fused attention input computes NORM RoPE without biases or "
                         "per-head norms; compose the family's own")
    return ctx.products.attention_input(lw, t, positions(ctx))


def attention(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """Store this step's k and v in the paged cache, then attn = attention(q, cached K, cached V)."""
    cfg, b, dev, st, inputs, kv = ctx.config, ctx.buffers, ctx.device, ctx.stream, ctx.inputs, ctx.cache.config
    tables, seq_of, pos = (inputs.addr(n) for n in ("block_tables", "token_seq", "positions"))
    workspace = b.get("attention_workspace")
    return [
        ("kv_store", lambda: kv_store.launch(dev, st, ctx.cache, i, b["k"], b["v"], inputs.buffer, t)),
        ("attention", lambda: paged_attention.launch(
            dev, st, b["attn"], b["q"], ctx.cache.k_pools[i], ctx.cache.v_pools[i], tables, seq_of, pos,
            n_tokens=t, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
            block_size=kv.block_size, max_blocks=ctx.max_blocks, num_blocks=kv.num_blocks, scale=ctx.scale,
            kv_dtype=kv.dtype, workspace=workspace)),
    ]


def attention_output(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """x += attn @ Wo^T."""
    return ctx.products.residual_product("attn_output", lw.attn_output, ctx.buffers["attn"], ctx.config.q_size, t)


def feed_forward(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """gate = silu(rmsnorm(x) @ Wg^T) * (rmsnorm(x) @ Wu^T)."""
    return ctx.products.feed_forward_input(lw, t)


def feed_forward_output(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """x += gate @ Wd^T."""
    return ctx.products.residual_product("ffn_down", lw.ffn_down, ctx.buffers["gate"], ctx.config.ffn_size, t)


# ---- the pieces of an unfused attention input ----------------------------------------------------------

def qkv_products(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """xn = rmsnorm(x); q, k, v = xn @ Wq^T, xn @ Wk^T, xn @ Wv^T (no RoPE yet)."""
    cfg, b, dev, st = ctx.config, ctx.buffers, ctx.device, ctx.stream
    plan: list[Launch] = [("attn_norm", lambda: rmsnorm.launch(dev, st, b["xn"], b["x"], lw.attn_norm.buffer, t,
                                                               cfg.hidden_size, cfg.rms_norm_eps))]
    for name, out, wt in (("q", b["q"], lw.attn_q), ("k", b["k"], lw.attn_k), ("v", b["v"], lw.attn_v)):
        plan.append((f"{name}_proj", lambda out=out, wt=wt: matmul_mma.project(
            dev, st, out, weight_arg(wt), b["xn"], wt.rows, wt.cols, t, weight_type=wt.fmt,
            workspace=ctx.products.workspace)))
    return plan


def qkv_bias(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """q += bq, k += bk, v += bv (each row)."""
    b, dev, st = ctx.buffers, ctx.device, ctx.stream
    return [(f"{name}_bias", lambda out=out, bias=bias: add_bias.launch(dev, st, out, bias.buffer, t, bias.rows))
            for name, out, bias in (("q", b["q"], lw.attn_q_bias), ("k", b["k"], lw.attn_k_bias),
                                    ("v", b["v"], lw.attn_v_bias))]


def qk_head_norm(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """Every head of q and of k RMS-normalized over head_dim, with its weight, in place."""
    cfg, b, dev, st = ctx.config, ctx.buffers, ctx.device, ctx.stream
    hd, eps = cfg.head_dim, cfg.rms_norm_eps
    return [(f"{name}_norm", lambda out=out, w=w, heads=heads: rmsnorm.launch(dev, st, out, out, w.buffer, t * heads,
                                                                               hd, eps))
            for name, out, w, heads in (("q", b["q"], lw.attn_q_norm, cfg.n_heads),
                                        ("k", b["k"], lw.attn_k_norm, cfg.n_kv_heads))]


def rope_qk(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
    """RoPE on q and k in place, in the config's layout (NORM or NEOX)."""
    cfg, b, dev, st = ctx.config, ctx.buffers, ctx.device, ctx.stream
    pos, scale, factors = positions(ctx), ctx.products.freq_scale, ctx.products.freq_factors
    return [(f"rope_{name}", lambda out=out, heads=heads: rope.launch(
                dev, st, out, pos, t, heads, cfg.head_dim, cfg.rope_dim, cfg.rope_theta, scale,
                freq_factors=factors, rope_type=cfg.rope_type))
            for name, out, heads in (("q", b["q"], cfg.n_heads), ("k", b["k"], cfg.n_kv_heads))]


def compose(*blocks: Block) -> Block:
    """One block running `blocks` in order."""
    def run(ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
        return [launch for block in blocks for launch in block(ctx, i, lw, t)]
    return run


@dataclass(frozen=True)
class Family:
    """A model family's forward pass: the blocks of one layer, in order (embedding and output head are shared)."""

    name: str
    layer: tuple[Block, ...]

    def layer_launches(self, ctx: StepContext, i: int, lw, t: int) -> list[Launch]:
        return [launch for block in self.layer for launch in block(ctx, i, lw, t)]


def pre_norm_layer(attention_input: Block) -> tuple[Block, ...]:
    """The llama layer with the given attention input: pre-norm attention and a SwiGLU feed-forward,
    each added to the residual stream."""
    return (attention_input, attention, attention_output, feed_forward, feed_forward_output)

"""Which kernels compute a layer's projections (and the output head) for a step of t tokens, as launches.

Three ways, per product, decided by the step's size and the weight's format:
  fused_matvec  (hipcore/ops/fused_matvec.py) up to FUSED_MATVEC_MAX_TOKENS tokens: it passes over W once
                per 4 tokens, which at a few tokens is a single pass as fast as W can be read;
  fused_matmul  (hipcore/ops/fused_matmul.py) beyond: W decoded once per tile of 32/64 tokens, the
                columns split across workgroups while the tiles are few (decode batches);
  fused_qmatvec (hipcore/ops/fused_qmatvec.py) up to FUSED_QMATVEC_MAX_TOKENS tokens for the int8-activation
                types (Q4_K, Q5_K, Q6_K, Q8_0, Q4_0) when q|k|v or gate|up are separate matrices, of
                one type or several (a Q4_K_M layer: Q4_K q, k with Q6_K v): the same four launches; and
                one token of wide Q8_0, Q5_0 and Q5_1 products (qmatvec_first), concatenated or not;
  single ops    (rmsnorm, matmul_mma.project, rope, silu_mul, add) for formats no fused kernel reads,
                prompt steps of weights without the concatenated q|k|v and gate|up buffers, and on NVIDIA
                the wide Q8_0, Q5_0, Q5_1, Q4_1, F16 and BF16 products of decode batches and prompts (mma_first); their
                products run on the matrix cores from matmul_mma.min_tokens tokens where the device has them,
                else on matmul / matvec. (Their norm and RoPE stay separate launches; the residual add
                joins the product on the matrix cores, and a prompt step's K-quant feed-forward runs on
                f16 activations with gate, up and SwiGLU in one launch: ProjectionPlanner.ffn_pairs.)
Both fused families fold the norm, RoPE, SwiGLU and the residual add into the products, so a layer is
4 product launches either way; fused_qmatvec's q|k|v also stores k and v into the paged cache (f16, bf16
and f32 caches), so the kv_store launch leaves its layers' decode steps (stores_kv). The head picks by its
row count the same way.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from hipcore.ops import (add, add_bias, fused_matmul, fused_matvec, fused_qmatvec, gelu_mul, kv_store, matmul_mma,
                         matmul_mma_qkv, matmul_mma_swiglu, rmsnorm, rope, silu_mul)
from hipcore.runtime.device import Buffer, Device, Stream

# Up to this many tokens fused_matvec is faster (measured on an NVIDIA H100 80GB HBM3 with the demo
# model's shapes: scripts/bench/measure_matmul.py --fused prints both kernels per token count).
FUSED_MATVEC_MAX_TOKENS = 8
# Up to this many tokens the separate K-quant matrices take fused_qmatvec (one pass over W for up to 8
# tokens), beyond it the single ops on matmul_mma, which take the K-quants from
# matmul_mma.MMA_MIN_TOKENS_KQUANT tokens: the two limits meet (see there for the measurement). Its own
# limit, not fused_matvec's, so that it can follow such measurements. It cannot exceed
# fused_qmatvec.MAX_TOKENS_PER_PASS without a second pass over W. Where matmul_mma takes the K-quants from
# fewer tokens (its fragment path), qmatvec_limit follows it down.
FUSED_QMATVEC_MAX_TOKENS = matmul_mma.MMA_MIN_TOKENS_KQUANT - 1
HEAD_MATVEC_MAX_ROWS = 8
# The K-quant head where matmul_mma has the fragment path leaves fused_qmatvec after 4 rows: on an NVIDIA
# H200, Llama 3's Q6_K head (128256 x 4096) took fused_qmatvec 312 us at 4 rows and 895 at 6, the fragment
# path 333 at 2 and 394 at 8 (docs/history/2026-11-27-fragment-path-kquant-batches.md).
HEAD_QMATVEC_MAX_ROWS_FRAGMENTS = 4
# "0": k and v always leave the products for kv_store's launch (to measure what the epilogue store saves).
KV_EPILOGUE_ENV = "ROCMFORGE_KV_EPILOGUE"
# "0": a prompt step's feed-forward keeps float32 activations, two products and silu_mul (to measure what
# ffn_pairs saves).
SWIGLU_PAIRS_ENV = "ROCMFORGE_SWIGLU_PAIRS"

# One-token products of these types take fused_qmatvec (each matrix apart, x quantized to int8 per 32 columns,
# integer dot products) rather than fused_matvec (weights decoded to floats, FMA), which both read them.
# Measured on an NVIDIA H200, Llama-3.1-8B shapes (4 layers), tg128: Q8_0 1,225-1,233 -> 1,899-1,922 t/s (gate|up
# 57.1 -> 37.1 us, the head 236.9 -> 142.3), Q5_0 1,148-1,151 -> 1,934-1,950, Q5_1 1,198 -> 2,023-2,035 (gate|up
# 72.3 -> 36.0 us) (docs/history/2026-11-29-staged-weights-per-type.md). Only as wide as measured
# (QMATVEC_FIRST_MIN_COLS): the demo model's tied Q8_0 head has 576 columns, and with its Q4_1 layers on
# fused_qmatvec too it lost 1,903 -> 1,757 t/s; Q4_1 stays on fused_matvec (no wide Q4_1 model was measured).
# "0" in QMATVEC_FIRST_ENV: fused_matvec (to measure the difference).
QMATVEC_FIRST_TYPES = ("q8_0", "q5_0", "q5_1")
QMATVEC_FIRST_MIN_COLS = 4096
QMATVEC_FIRST_ENV = "ROCMFORGE_QMATVEC_FIRST"

# Products of the 32-element block formats that the fused families read (Q8_0, Q5_0, Q5_1, Q4_1), of F16 and of BF16
# take the single ops instead, from matmul_mma.min_tokens tokens on, where matmul_mma has its fragment path for them
# (NVIDIA sm_80+): decode batches on that path, prompts on its shared tiles, both on the matrix cores where
# fused_matmul decodes to floats and multiplies on FMA. Measured on an NVIDIA H200, Llama-3.1-8B shapes (4 layers),
# against the fused families: Q8_0 pp512 15,423 -> 45,774 t/s, 8 sequences 2,818 -> 4,641, 32 sequences 5,139 ->
# 16,460; Q5_0, Q5_1 likewise; F16 14,845 -> 64,286, 2,930 -> 6,608 and 4,767 -> 21,529
# (docs/history/2026-11-29-block32-matrix-cores.md). In matrices of MMA_FIRST_MIN_COLS columns or more: the demo
# model's narrow ones keep the fused families, measured ahead of llama.cpp there. Not on AMD: no AMD GPU has measured
# the two side by side.
# "0" in MMA_FIRST_ENV: the fused families (to measure the difference).
MMA_FIRST_MIN_COLS = QMATVEC_FIRST_MIN_COLS
MMA_FIRST_ENV = "ROCMFORGE_MMA_FIRST"

Launch = tuple[str, Callable[[], None]]  # (what it computes, the launch)


def weight_arg(w) -> Any:
    """A launcher argument for a weight: its Buffer (size-checked) or, inside a shared buffer, its address."""
    return w.buffer if w.offset == 0 else w.addr()


def separate_fusable(n_tokens: int, *weights, max_tokens: int | None = None) -> bool:
    """True when fused_qmatvec takes these separate matrices for a step of n_tokens tokens (at most
    max_tokens, FUSED_QMATVEC_MAX_TOKENS unless given)."""
    limit = FUSED_QMATVEC_MAX_TOKENS if max_tokens is None else max_tokens
    if n_tokens > limit or any(w is None for w in weights):
        return False
    if all(w.fmt in fused_qmatvec.KQUANT_TYPES for w in weights):
        return True
    # The one-token entries of the 32-element blocks (Q5_0, Q5_1, ...: fused_qmatvec.BLOCK32_TYPES) only where they
    # were measured faster than the other paths (qmatvec_first), so that a narrow model keeps what it ran on.
    return fused_qmatvec.supports(*(w.fmt for w in weights), tokens=n_tokens) and all(
        w.fmt in fused_qmatvec.KQUANT_TYPES or qmatvec_first(w.fmt, n_tokens, w.cols) for w in weights)


def qmatvec_limit(device: Device, *weights) -> int:
    """The most tokens fused_qmatvec takes these separate matrices for on `device`: FUSED_QMATVEC_MAX_TOKENS,
    or fewer where matmul_mma takes one of them from fewer (its fragment path)."""
    return min([FUSED_QMATVEC_MAX_TOKENS] + [matmul_mma.min_tokens(w.fmt, device.arch) - 1 for w in weights
                                             if w is not None])


def head_qmatvec_limit(device: Device, weight) -> int:
    """The most rows fused_qmatvec takes the head for on `device` (HEAD_QMATVEC_MAX_ROWS_FRAGMENTS where
    matmul_mma has the fragment path for its type, else HEAD_MATVEC_MAX_ROWS)."""
    if matmul_mma.has_fragment_path(device.arch, weight.fmt, 32):
        return HEAD_QMATVEC_MAX_ROWS_FRAGMENTS
    return HEAD_MATVEC_MAX_ROWS


def qmatvec_first(weight_type: str, n_tokens: int, cols: int) -> bool:
    """True when a one-token product of a type both fused families read, over `cols` columns, goes to fused_qmatvec
    (int8 activations, dp4a) rather than fused_matvec (float weights, FMA): see QMATVEC_FIRST_TYPES."""
    return (n_tokens == 1 and weight_type in QMATVEC_FIRST_TYPES and cols >= QMATVEC_FIRST_MIN_COLS
            and os.environ.get(QMATVEC_FIRST_ENV, "1") != "0")


def mma_first(weight_type: str, n_tokens: int, cols: int, arch: str) -> bool:
    """True when a product of a type the fused families read, n_tokens tokens over `cols` columns, takes the single
    ops on the matrix cores on `arch` instead (see MMA_FIRST_MIN_COLS)."""
    return (weight_type in matmul_mma.PAIR32_FRAGMENT_TYPES
            and matmul_mma.has_fragment_path(arch, weight_type, 32, cols)
            and n_tokens >= matmul_mma.min_tokens(weight_type, arch) and cols >= MMA_FIRST_MIN_COLS
            and os.environ.get(MMA_FIRST_ENV, "1") != "0")


def fused_family(weight_type: str, n_tokens: int, max_matvec_tokens: int = FUSED_MATVEC_MAX_TOKENS, *, cols: int = 0,
                 arch: str = ""):
    """The fused op module for a product of n_tokens tokens with W of weight_type and `cols` columns on `arch`, or
    None (single ops: mma_first, or formats neither family reads; or fused_qmatvec on the matrices apart:
    qmatvec_first)."""
    if not fused_matvec.supports(weight_type) or qmatvec_first(weight_type, n_tokens, cols) \
            or mma_first(weight_type, n_tokens, cols, arch):
        return None
    if n_tokens <= max_matvec_tokens:
        return fused_matvec
    return fused_matmul if fused_matmul.supports(weight_type) else None


class ProjectionPlanner:
    """Builds the launches of the products of a llama layer for one step shape. `buffers` are the runner's
    activation buffers (x, xn, proj, q, k, v, attn, gate, up, logits, matmul_workspace); freq_factors the
    model's RoPE frequency divisors (rope_freqs.weight, float32 [rope_dim / 2]) or None."""

    def __init__(self, device: Device, stream: Stream | None, config, buffers: dict[str, Buffer], freq_scale: float,
                 freq_factors: Buffer | None = None):
        self.device, self.stream, self.config, self.b = device, stream, config, buffers
        self.freq_scale, self.freq_factors = freq_scale, freq_factors
        self.workspace = buffers.get("matmul_workspace")
        self.kv_in_epilogue = os.environ.get(KV_EPILOGUE_ENV, "1") != "0"

    def _fused_kwargs(self, family, n_tokens: int) -> dict:
        if family is fused_matmul:
            return {"n_tokens": n_tokens, "workspace": self.workspace}
        return {"batch": n_tokens}

    def _separate_qkv_fusable(self, lw, t: int) -> bool:
        """True when fused_qmatvec makes q, k and v of this layer for a step of t tokens (and there is no
        concatenated q|k|v for fused_matvec / fused_matmul to take first)."""
        qkv = lw.attn_qkv
        if qkv is not None and not self.config.qkv_bias and \
                fused_family(qkv.fmt, t, cols=qkv.cols, arch=self.device.arch) is not None:
            return False
        weights = (lw.attn_q, lw.attn_k, lw.attn_v)
        return separate_fusable(t, *weights, max_tokens=qmatvec_limit(self.device, *weights)) \
            and self.config.head_dim % 4 == 0

    def stores_kv(self, lw, t: int, kv_dtype: str) -> bool:
        """True when attention_input stores k and v into the cache itself (given a kv_target): fused_qmatvec's
        epilogue for the element-wise KV formats. Then the kv_store launch is left out of the step."""
        return self.kv_in_epilogue and self._separate_qkv_fusable(lw, t) and kv_store.epilogue_fusable(kv_dtype)

    def attention_input(self, lw, t: int, positions: int, kv_target: kv_store.EpilogueTarget | None = None,
                        rotate: bool = True) -> list[Launch]:
        """q, k, v = rope(rmsnorm(x) @ [Wq; Wk; Wv]^T (+ [bq; bk; bv] where the model has biases)) in NORM mode into
        b["q"], b["k"], b["v"]. With kv_target, where stores_kv() is true, k and v go into the cache there instead of
        b["k"] and b["v"]. Biases: fused_qmatvec adds them in its epilogue; the concatenated q|k|v's kernels
        (fused_matvec, fused_matmul) add none, so a biased layer takes fused_qmatvec or the single ops.
        rotate=False: the products without RoPE (rope_dim 0 in the fused kernels), for a layer whose per-head norms
        come between them and RoPE (blocks.py: head_normed_attention_input); no kv_target then."""
        cfg, b, dev, st = self.config, self.b, self.device, self.stream
        nh, nkv, hd, h = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.hidden_size
        if not rotate and kv_target is not None:
            raise ValueError("attention_input: k and v are stored after RoPE; without it there is no kv_target")
        rope_dim = cfg.rope_dim if rotate else 0
        factors = self.freq_factors if rotate else None
        label = "attn_norm+qkv+rope" if rotate else "attn_norm+qkv"
        qkv = lw.attn_qkv
        biases = (lw.attn_q_bias, lw.attn_k_bias, lw.attn_v_bias) if cfg.qkv_bias else None
        family = fused_family(qkv.fmt, t, cols=qkv.cols, arch=dev.arch) if qkv is not None and biases is None else None
        if kv_target is not None and not self.stores_kv(lw, t, kv_target.dtype):
            raise ValueError("attention_input: k and v cannot be stored by this step's products (see stores_kv)")
        if family is not None:
            kwargs = self._fused_kwargs(family, t)
            return [(label, lambda: family.launch_norm_rope(
                dev, st, b["q"], b["k"], b["v"], weight_arg(qkv), b["x"], lw.attn_norm.buffer, positions,
                q_rows=nh * hd, kv_rows=nkv * hd, cols=h, head_dim=hd, rope_dim=rope_dim, eps=cfg.rms_norm_eps,
                theta=cfg.rope_theta, freq_scale=self.freq_scale, weight_type=qkv.fmt, freq_factors=factors,
                **kwargs))]
        if self._separate_qkv_fusable(lw, t):
            weights = [(weight_arg(w), w.fmt) for w in (lw.attn_q, lw.attn_k, lw.attn_v)]
            name = label if kv_target is None else "attn_norm+qkv+rope+kv_store"
            return [(name, lambda: fused_qmatvec.launch_norm_rope(
                dev, st, b["q"], b["k"], b["v"], weights, b["x"], lw.attn_norm.buffer, positions, q_rows=nh * hd,
                kv_rows=nkv * hd, cols=h, batch=t, head_dim=hd, rope_dim=rope_dim, eps=cfg.rms_norm_eps,
                theta=cfg.rope_theta, freq_scale=self.freq_scale, freq_factors=factors,
                kv_target=kv_target, biases=None if biases is None else [weight_arg(v) for v in biases]))]
        f16 = self.qkv_f16(lw, t)
        plan: list[Launch] = [("attn_norm", lambda: rmsnorm.launch(dev, st, b["xn"], b["x"], lw.attn_norm.buffer, t, h,
                                                                   cfg.rms_norm_eps, out_f16=f16))]
        weights = (lw.attn_q, lw.attn_k, lw.attn_v)
        one_launch = not f16 and None not in weights and matmul_mma_qkv.takes_qkv(
            dev, t, tuple(w.fmt for w in weights), h, tuple(w.rows for w in weights))
        if one_launch:  # a decode batch's three products on the fragment path: one launch (matmul_mma_qkv.launch_qkv)
            plan.append(("qkv_proj", lambda: matmul_mma_qkv.launch_qkv(
                dev, st, (b["q"], b["k"], b["v"]), tuple(weight_arg(w) for w in weights), b["xn"],
                tuple(w.rows for w in weights), h, t, weight_types=tuple(w.fmt for w in weights),
                workspace=self.workspace)))
        for name, out, wt in () if one_launch else (("q", b["q"], lw.attn_q), ("k", b["k"], lw.attn_k),
                                                    ("v", b["v"], lw.attn_v)):
            if f16:
                plan.append((f"{name}_proj", lambda out=out, wt=wt: matmul_mma.launch(
                    dev, st, out, weight_arg(wt), b["xn"], wt.rows, wt.cols, t, weight_type=wt.fmt,
                    workspace=self.workspace, x_f16=True)))
                continue
            plan.append((f"{name}_proj", lambda out=out, wt=wt: matmul_mma.project(
                dev, st, out, weight_arg(wt), b["xn"], wt.rows, wt.cols, t, weight_type=wt.fmt,
                workspace=self.workspace)))
        for name, out, bias in zip("qkv", (b["q"], b["k"], b["v"]), biases or ()):
            plan.append((f"{name}_bias", lambda out=out, bias=bias: add_bias.launch(dev, st, out, bias.buffer, t,
                                                                                    bias.rows)))
        for name, out, heads in (("q", b["q"], nh), ("k", b["k"], nkv)) if rotate else ():
            plan.append((f"rope_{name}", lambda out=out, heads=heads: rope.launch(
                dev, st, out, positions, t, heads, hd, cfg.rope_dim, cfg.rope_theta, self.freq_scale, self.freq_factors)))
        return plan

    def feed_forward_input(self, lw, t: int, activation: str = "silu") -> list[Launch]:
        """b["gate"] = silu(rmsnorm(x) @ Wg^T) * (rmsnorm(x) @ Wu^T), or with activation "gelu" GeGLU's
        gelu(...) * (...) (Gemma), which fused_qmatvec, the up product with the activation in its epilogue and the
        single ops compute (fused_matvec, fused_matmul and the f16 SwiGLU pairs have SwiGLU alone). Where
        ffn_pairs, the result is f16 in b["ffn_h16"] instead."""
        cfg, b, dev, st = self.config, self.b, self.device, self.stream
        h, f, eps = cfg.hidden_size, cfg.ffn_size, cfg.rms_norm_eps
        swiglu = activation == "silu"
        gate_up = lw.ffn_gate_up
        family = fused_family(gate_up.fmt, t, cols=gate_up.cols, arch=dev.arch) \
            if gate_up is not None and swiglu else None
        if family is not None:
            kwargs = self._fused_kwargs(family, t)
            return [("ffn_norm+gate_up+silu", lambda: family.launch_norm_swiglu(
                dev, st, b["gate"], weight_arg(gate_up), b["x"], lw.ffn_norm.buffer, rows=f, cols=h, eps=eps,
                weight_type=gate_up.fmt, **kwargs))]
        if separate_fusable(t, lw.ffn_gate, lw.ffn_up, max_tokens=qmatvec_limit(dev, lw.ffn_gate, lw.ffn_up)):
            weights = [(weight_arg(w), w.fmt) for w in (lw.ffn_gate, lw.ffn_up)]
            return [(f"ffn_norm+gate_up+{activation}", lambda: fused_qmatvec.launch_norm_swiglu(
                dev, st, b["gate"], weights, b["x"], lw.ffn_norm.buffer, rows=f, cols=h, batch=t, eps=eps,
                activation=activation))]
        if self.ffn_pairs(lw, t, activation):  # x16 = rmsnorm(x) as f16, then the products, the activation in an epilogue
            gate, up = lw.ffn_gate, lw.ffn_up
            norm = ("ffn_norm", lambda: rmsnorm.launch(dev, st, b["xn"], b["x"], lw.ffn_norm.buffer, t, h, eps,
                                                       out_f16=True))
            if matmul_mma_swiglu.silu_up_fits(dev, t, f, gate.fmt, activation):  # 128-token tiles: gate, then up+act
                return [norm,
                        ("gate_proj", lambda: matmul_mma.launch(
                            dev, st, b["gate"], weight_arg(gate), b["xn"], f, h, t, weight_type=gate.fmt, x_f16=True)),
                        (f"up_proj+{activation}", lambda: matmul_mma_swiglu.launch_silu_up(
                            dev, st, b["ffn_h16"], b["gate"], weight_arg(up), b["xn"], f, h, t, weight_type=up.fmt,
                            activation=activation))]
            return [norm,
                    ("gate_up+silu", lambda: matmul_mma_swiglu.launch_swiglu(
                        dev, st, b["ffn_h16"], b["gate"], b["up"], weight_arg(gate), weight_arg(up), b["xn"], f, h, t,
                        weight_type=gate.fmt, workspace=self.workspace))]
        plan: list[Launch] = [("ffn_norm", lambda: rmsnorm.launch(dev, st, b["xn"], b["x"], lw.ffn_norm.buffer, t, h, eps))]
        gate, up = lw.ffn_gate, lw.ffn_up
        if swiglu and None not in (gate, up) and (gate.rows, gate.cols) == (up.rows, up.cols) == (f, h) and \
                matmul_mma_swiglu.swiglu_fragments_fit(dev, t, f, h, (gate.fmt, up.fmt), self.workspace):
            # a decode batch on the fragment path: gate, up and SwiGLU in one launch (float32 h in b["gate"])
            return plan + [("gate_up+silu", lambda: matmul_mma_swiglu.launch_swiglu_fragments(
                dev, st, b["gate"], b["up"], weight_arg(gate), weight_arg(up), b["xn"], f, h, t, weight_type=gate.fmt,
                workspace=self.workspace))]
        for name, out, wt in (("gate", b["gate"], lw.ffn_gate), ("up", b["up"], lw.ffn_up)):
            plan.append((f"{name}_proj", lambda out=out, wt=wt: matmul_mma.project(
                dev, st, out, weight_arg(wt), b["xn"], wt.rows, wt.cols, t, weight_type=wt.fmt,
                workspace=self.workspace)))
        gated = silu_mul if swiglu else gelu_mul
        plan.append((f"{activation}_mul", lambda: gated.launch(dev, st, b["gate"], b["gate"], b["up"], t * f)))
        return plan

    def qkv_f16(self, lw, t: int) -> bool:
        """True when a step of t tokens on the single ops norms x to f16 for q, k and v (matmul_mma.launch with
        x_f16): all three of matmul_mma.X16_TYPES or X16_WIDE_ONLY_TYPES on the matrix cores, each taking the
        128-token tiles
        (pick_x16_tile_tokens: the 8B's, not the 1B's k and v, whose float32 path at 32-token tiles was faster
        than f16 in 64-token tiles: 14.4 against 16.1 us). ROCMFORGE_WIDE_TILES=0 keeps float32."""
        weights = (lw.attn_q, lw.attn_k, lw.attn_v)
        return None not in weights and all(self._wide_f16(w, t) for w in weights)

    def _wide_f16(self, wt, t: int) -> bool:
        """A product of `wt` in a step of t tokens on matmul_mma's 128-token tiles of f16 x: a type of
        matmul_mma.X16_TYPES or X16_WIDE_ONLY_TYPES, on the matrix cores, where pick_x16_tile_tokens picks them."""
        dev = self.device
        return (wt.fmt in matmul_mma.X16_TYPES + matmul_mma.X16_WIDE_ONLY_TYPES
                and matmul_mma.takes_matrix_cores(dev, t, wt.fmt)
                and matmul_mma.pick_x16_tile_tokens(wt.rows, t, dev.arch) == matmul_mma.WIDE_TILE_TOKENS)

    def ffn_pairs(self, lw, t: int, activation: str = "silu") -> bool:
        """True when a step of t tokens runs this layer's feed-forward as rmsnorm to f16, gate and up with the
        activation in an epilogue (h as f16 in b["ffn_h16"]) and the down product reading f16 (feed_forward_output,
        or Gemma's product before its post-norm): the gate product then the up product with the activation
        (matmul_mma_swiglu.launch_silu_up) where 128-token tiles are many (silu_up_fits), else, for SwiGLU only, one
        SwiGLU-pair launch (matmul_mma_swiglu.launch_swiglu, swiglu_fits); gate and up of one type and shape
        (silu_up_fits' SILU_UP_TYPES or, for GeGLU, GELU_UP_TYPES; swiglu_fits' SWIGLU_TYPES), down reading f16 x
        (matmul_mma.takes_f16_x), all on the matrix cores' single-op path (no fused kernel takes them at t tokens).
        ROCMFORGE_SWIGLU_PAIRS=0 turns it off."""
        gate, up, down = lw.ffn_gate, lw.ffn_up, lw.ffn_down
        if os.environ.get(SWIGLU_PAIRS_ENV, "1") == "0" or "ffn_h16" not in self.b or None in (gate, up, down):
            return False
        gate_up = lw.ffn_gate_up
        if gate_up is not None and fused_family(gate_up.fmt, t, cols=gate_up.cols, arch=self.device.arch) is not None:
            return False
        dev, f = self.device, self.config.ffn_size
        if separate_fusable(t, gate, up, max_tokens=qmatvec_limit(dev, gate, up)) or \
                separate_fusable(t, down, max_tokens=qmatvec_limit(dev, down)) or \
                fused_family(down.fmt, t, cols=down.cols, arch=dev.arch) is not None:
            return False
        return (gate.fmt == up.fmt and (gate.rows, gate.cols) == (up.rows, up.cols) == (f, self.config.hidden_size)
                and matmul_mma.takes_f16_x(dev, down.fmt, down.rows, t)
                and (matmul_mma_swiglu.silu_up_fits(dev, t, f, gate.fmt, activation)
                     or (activation == "silu" and matmul_mma_swiglu.swiglu_fits(dev, t, f, gate.fmt, self.workspace))))

    def feed_forward_output(self, lw, t: int) -> list[Launch]:
        """b["x"] += h @ Wd^T, h the feed-forward's SwiGLU: b["ffn_h16"] (f16) after a SwiGLU pair (ffn_pairs),
        else b["gate"]."""
        f = self.config.ffn_size
        if not self.ffn_pairs(lw, t):
            return self.residual_product("ffn_down", lw.ffn_down, self.b["gate"], f, t)
        b, dev, st, wt = self.b, self.device, self.stream, lw.ffn_down
        return [("ffn_down+residual", lambda: matmul_mma.launch(
            dev, st, b["x"], weight_arg(wt), b["ffn_h16"], self.config.hidden_size, f, t, weight_type=wt.fmt,
            workspace=self.workspace, accumulate=True, x_f16=True))]

    def reads_f16(self, wt, t: int) -> bool:
        """True when the residual product of `wt` (the o projection) can read its x as f16 in a step of t tokens:
        no fused kernel takes it, a type of matmul_mma.X16_TYPES or X16_WIDE_ONLY_TYPES on the matrix cores, in
        128-token tiles
        (pick_x16_tile_tokens: on an NVIDIA H100 the 8B's o product took 75 us from f16 against 108 from
        float32). The caller decides whether its x comes as f16 (blocks.py: the llama layer's attention)."""
        if wt is None or fused_family(wt.fmt, t, cols=wt.cols, arch=self.device.arch) is not None:
            return False
        return not separate_fusable(t, wt, max_tokens=qmatvec_limit(self.device, wt)) and self._wide_f16(wt, t)

    def residual_product(self, name: str, wt, x: Buffer, cols: int, t: int, x_f16: bool = False) -> list[Launch]:
        """b["x"] += x @ W^T: one fused launch, or a product and an add. x_f16: x holds f16 (only where
        reads_f16)."""
        b, dev, st, h = self.b, self.device, self.stream, self.config.hidden_size
        if x_f16:
            if not self.reads_f16(wt, t):
                raise ValueError(f"residual_product: {name} cannot read f16 x in a step of {t} tokens (see reads_f16)")
            return [(f"{name}+residual", lambda: matmul_mma.launch(
                dev, st, b["x"], weight_arg(wt), x, h, cols, t, weight_type=wt.fmt, workspace=self.workspace,
                accumulate=True, x_f16=True))]
        family = fused_family(wt.fmt, t, cols=wt.cols, arch=self.device.arch)
        if family is not None:
            kwargs = self._fused_kwargs(family, t)
            return [(f"{name}+residual", lambda: family.launch_add(
                dev, st, b["x"], weight_arg(wt), x, rows=h, cols=cols, weight_type=wt.fmt, **kwargs))]
        if separate_fusable(t, wt, max_tokens=qmatvec_limit(dev, wt)):
            return [(f"{name}+residual", lambda: fused_qmatvec.launch_add(
                dev, st, b["x"], weight_arg(wt), x, rows=h, cols=cols, batch=t, weight_type=wt.fmt))]
        if matmul_mma.takes_matrix_cores(dev, t, wt.fmt):  # the residual add in the product's epilogue
            return [(f"{name}+residual", lambda: matmul_mma.launch(
                dev, st, b["x"], weight_arg(wt), x, h, cols, t, weight_type=wt.fmt, workspace=self.workspace,
                accumulate=True))]
        return [(name, lambda: matmul_mma.project(dev, st, b["proj"], weight_arg(wt), x, h, cols, t, weight_type=wt.fmt)),
                (f"{name}_residual", lambda: add.launch(dev, st, b["x"], b["x"], b["proj"], t * h))]

    def product(self, name: str, wt, x: Buffer, cols: int, t: int, x_f16: bool = False) -> list[Launch]:
        """b["proj"] = x @ W^T, hidden_size rows (a product normalized before its residual add: Gemma's o and down):
        fused_qmatvec's residual entry storing instead of adding where it takes the weight and the step, else
        matmul_mma.project. x_f16: x holds f16 (Gemma's down after the f16 feed-forward, only where ffn_pairs with
        GeGLU): matmul_mma's f16 entry."""
        b, dev, st, h = self.b, self.device, self.stream, self.config.hidden_size
        if x_f16:
            return [(name, lambda: matmul_mma.launch(dev, st, b["proj"], weight_arg(wt), x, h, cols, t,
                                                     weight_type=wt.fmt, workspace=self.workspace, x_f16=True))]
        if separate_fusable(t, wt, max_tokens=qmatvec_limit(dev, wt)):
            return [(name, lambda: fused_qmatvec.launch_add(dev, st, b["proj"], weight_arg(wt), x, rows=h, cols=cols,
                                                            batch=t, weight_type=wt.fmt, store=True))]
        return [(name, lambda: matmul_mma.project(dev, st, b["proj"], weight_arg(wt), x, h, cols, t, weight_type=wt.fmt,
                                                  workspace=self.workspace))]

    def head(self, out_w, norm_w, rows: Buffer, r: int) -> list[Launch]:
        """b["logits"][:r] = rmsnorm(rows) @ W_out^T."""
        cfg, b, dev, st = self.config, self.b, self.device, self.stream
        h, v, eps = cfg.hidden_size, cfg.vocab_size, cfg.rms_norm_eps
        family = fused_family(out_w.fmt, r, HEAD_MATVEC_MAX_ROWS, cols=out_w.cols, arch=dev.arch)
        if family is not None:
            kwargs = self._fused_kwargs(family, r)
            return [("output_norm+head", lambda: family.launch_norm(
                dev, st, b["logits"], weight_arg(out_w), rows, norm_w.buffer, rows=v, cols=h, eps=eps,
                weight_type=out_w.fmt, **kwargs))]
        if separate_fusable(r, out_w, max_tokens=head_qmatvec_limit(dev, out_w)):
            return [("output_norm+head", lambda: fused_qmatvec.launch_norm(
                dev, st, b["logits"], weight_arg(out_w), rows, norm_w.buffer, rows=v, cols=h, batch=r, eps=eps,
                weight_type=out_w.fmt))]
        return [("output_norm", lambda: rmsnorm.launch(dev, st, b["rows"], rows, norm_w.buffer, r, h, eps)),
                ("head", lambda: matmul_mma.project(dev, st, b["logits"], weight_arg(out_w), b["rows"], v, h, r,
                                                    weight_type=out_w.fmt, workspace=self.workspace))]

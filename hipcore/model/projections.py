"""Which kernels compute a layer's projections (and the output head) for a step of t tokens, as launches; which
path each product takes is hipcore/ops/kernel_choice.py's answer.

Three ways, per product, decided by the step's size and the weight's format:
  fused_matvec  (hipcore/ops/fused_matvec.py) up to FUSED_MATVEC_MAX_TOKENS tokens: it passes over W once
                per 4 tokens, which at a few tokens is a single pass as fast as W can be read;
  fused_matmul  (hipcore/ops/fused_matmul.py) beyond: W decoded once per tile of 32/64 tokens, the
                columns split across workgroups while the tiles are few (decode batches);
  fused_qmatvec (hipcore/ops/fused_qmatvec.py) up to FUSED_QMATVEC_MAX_TOKENS tokens for the int8-activation
                types (Q4_K, Q5_K, Q6_K, Q8_0, Q4_0; MXFP4 alone) when q|k|v or gate|up are separate matrices, of
                one type or several (a Q4_K_M layer: Q4_K q, k with Q6_K v): the same four launches; and
                one token of wide Q8_0, Q5_0 and Q5_1 products (qmatvec_first), concatenated or not;
  single ops    (rmsnorm, kernel_choice.project, rope, silu_mul, add) for formats no fused kernel reads,
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

from typing import Any

from hipcore.model.launch import Launch  # the blocks import it from here with the planner
from hipcore.ops import (add, add_bias, fused_matmul, fused_qmatvec, gelu_mul, kv_store, matmul_mma, matmul_mma_qkv,
                         matmul_mma_swiglu, rmsnorm, rope, silu_mul)
from hipcore.ops import kernel_choice
from hipcore.runtime.device import Buffer, Device, Stream


def weight_arg(w) -> Any:
    """A launcher argument for a weight: its Buffer (size-checked) or, inside a shared buffer, its address."""
    return w.buffer if w.offset == 0 else w.addr()


class ProjectionPlanner:
    """Builds the launches of the products of a llama layer for one step shape. `buffers` are the runner's
    activation buffers (x, xn, proj, q, k, v, attn, gate, up, logits, matmul_workspace); freq_factors the
    model's RoPE frequency divisors (rope_freqs.weight, float32 [rope_dim / 2]) or None."""

    def __init__(self, device: Device, stream: Stream | None, config, buffers: dict[str, Buffer], freq_scale: float,
                 freq_factors: Buffer | None = None):
        self.device, self.stream, self.config, self.b = device, stream, config, buffers
        self.freq_scale, self.freq_factors = freq_scale, freq_factors
        self.workspace = buffers.get("matmul_workspace")

    def _fused_kwargs(self, family, n_tokens: int) -> dict:
        if family is fused_matmul:
            return {"n_tokens": n_tokens, "workspace": self.workspace}
        return {"batch": n_tokens}

    def _separate_qkv_fusable(self, lw, t: int) -> bool:
        """True when fused_qmatvec makes q, k and v of this layer for a step of t tokens (and there is no
        concatenated q|k|v for fused_matvec / fused_matmul to take first)."""
        qkv = lw.attn_qkv
        if qkv is not None and not self.config.qkv_bias and \
                kernel_choice.family_of(qkv, t, self.device.arch) is not None:
            return False
        weights = (lw.attn_q, lw.attn_k, lw.attn_v)
        return kernel_choice.takes_fused_qmatvec(self.device, t, *weights) \
            and self.config.head_dim % 4 == 0

    def adds_qkv_biases(self, lw, t: int) -> bool:
        """True when attention_input's products add q's, k's and v's biases themselves in a step of t tokens
        (fused_qmatvec's epilogue); else the single ops' add_bias launches do, or its caller (leave_biases)."""
        return bool(self.config.qkv_bias) and self._separate_qkv_fusable(lw, t)

    def stores_kv(self, lw, t: int, kv_dtype: str) -> bool:
        """True when attention_input stores k and v into the cache itself (given a kv_target): fused_qmatvec's
        epilogue for the element-wise KV formats. Then the kv_store launch is left out of the step."""
        return self._separate_qkv_fusable(lw, t) and kernel_choice.stores_kv_in_epilogue(kv_dtype)

    def attention_input(self, lw, t: int, positions: int, kv_target: kv_store.EpilogueTarget | None = None,
                        rotate: bool = True, leave_biases: bool = False) -> list[Launch]:
        """q, k, v = rope(rmsnorm(x) @ [Wq; Wk; Wv]^T (+ [bq; bk; bv] where the model has biases)) in NORM mode into
        b["q"], b["k"], b["v"]. With kv_target, where stores_kv() is true, k and v go into the cache there instead of
        b["k"] and b["v"]. Biases: fused_qmatvec adds them in its epilogue; the concatenated q|k|v's kernels
        (fused_matvec, fused_matmul) add none, so a biased layer takes fused_qmatvec or the single ops.
        rotate=False: the products without RoPE (rope_dim 0 in the fused kernels), for a layer whose per-head norms
        come between them and RoPE (blocks.py: head_normed_attention_input); no kv_target then. leave_biases: no
        add_bias launches where the products do not add the biases (adds_qkv_biases false): the caller adds them
        (gpt-oss: head_norm_rope with its RoPE)."""
        cfg, b, dev, st = self.config, self.b, self.device, self.stream
        nh, nkv, hd, h = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.hidden_size
        if not rotate and kv_target is not None:
            raise ValueError("attention_input: k and v are stored after RoPE; without it there is no kv_target")
        rope_dim = cfg.rope_dim if rotate else 0
        factors = self.freq_factors if rotate else None
        label = "attn_norm+qkv+rope" if rotate else "attn_norm+qkv"
        qkv = lw.attn_qkv
        biases = (lw.attn_q_bias, lw.attn_k_bias, lw.attn_v_bias) if cfg.qkv_bias else None
        family = kernel_choice.family_of(qkv, t, dev.arch) if qkv is not None and biases is None else None
        if kv_target is not None and not self.stores_kv(lw, t, kv_target.dtype):
            raise ValueError("attention_input: k and v cannot be stored by this step's products (see stores_kv)")
        if family is not None:
            kwargs = self._fused_kwargs(family, t)
            return [Launch(label, lambda: family.launch_norm_rope(
                dev, st, b["q"], b["k"], b["v"], weight_arg(qkv), b["x"], lw.attn_norm.buffer, positions,
                q_rows=nh * hd, kv_rows=nkv * hd, cols=h, head_dim=hd, rope_dim=rope_dim, eps=cfg.rms_norm_eps,
                theta=cfg.rope_theta, freq_scale=self.freq_scale, weight_type=qkv.fmt, freq_factors=factors,
                **kwargs), reads=(lw.attn_norm, qkv))]
        if self._separate_qkv_fusable(lw, t):
            weights = [(weight_arg(w), w.fmt) for w in (lw.attn_q, lw.attn_k, lw.attn_v)]
            name = label if kv_target is None else "attn_norm+qkv+rope+kv_store"
            return [Launch(name, lambda: fused_qmatvec.launch_norm_rope(
                dev, st, b["q"], b["k"], b["v"], weights, b["x"], lw.attn_norm.buffer, positions, q_rows=nh * hd,
                kv_rows=nkv * hd, cols=h, batch=t, head_dim=hd, rope_dim=rope_dim, eps=cfg.rms_norm_eps,
                theta=cfg.rope_theta, freq_scale=self.freq_scale, freq_factors=factors,
                kv_target=kv_target, biases=None if biases is None else [weight_arg(v) for v in biases]),
                reads=(lw.attn_norm, lw.attn_q, lw.attn_k, lw.attn_v, *(biases or ())))]
        f16 = self.qkv_f16(lw, t)
        plan: list[Launch] = [Launch("attn_norm", lambda: rmsnorm.launch(dev, st, b["xn"], b["x"], lw.attn_norm.buffer, t,
                                                                         h, cfg.rms_norm_eps, out_f16=f16),
                                     reads=(lw.attn_norm,))]
        weights = (lw.attn_q, lw.attn_k, lw.attn_v)
        one_launch = not f16 and None not in weights and kernel_choice.takes_qkv(
            dev, t, tuple(w.fmt for w in weights), h, tuple(w.rows for w in weights))
        if one_launch:  # a decode batch's three products on the fragment path: one launch (matmul_mma_qkv.launch_qkv)
            plan.append(Launch("qkv_proj", lambda: matmul_mma_qkv.launch_qkv(
                dev, st, (b["q"], b["k"], b["v"]), tuple(weight_arg(w) for w in weights), b["xn"],
                tuple(w.rows for w in weights), h, t, weight_types=tuple(w.fmt for w in weights),
                workspace=self.workspace), reads=weights))
        for name, out, wt in () if one_launch else (("q", b["q"], lw.attn_q), ("k", b["k"], lw.attn_k),
                                                    ("v", b["v"], lw.attn_v)):
            if f16:
                plan.append(Launch(f"{name}_proj", lambda out=out, wt=wt: matmul_mma.launch(
                    dev, st, out, weight_arg(wt), b["xn"], wt.rows, wt.cols, t, weight_type=wt.fmt,
                    workspace=self.workspace, x_f16=True), reads=(wt,)))
                continue
            plan.append(Launch(f"{name}_proj", lambda out=out, wt=wt: kernel_choice.project(
                dev, st, out, weight_arg(wt), b["xn"], wt.rows, wt.cols, t, weight_type=wt.fmt,
                workspace=self.workspace), reads=(wt,)))
        for name, out, bias in zip("qkv", (b["q"], b["k"], b["v"]), () if leave_biases else biases or ()):
            plan.append(Launch(f"{name}_bias", lambda out=out, bias=bias: add_bias.launch(dev, st, out, bias.buffer, t,
                                                                                          bias.rows), reads=(bias,)))
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
        family = kernel_choice.family_of(gate_up, t, dev.arch) \
            if gate_up is not None and swiglu else None
        if family is not None:
            kwargs = self._fused_kwargs(family, t)
            return [Launch("ffn_norm+gate_up+silu", lambda: family.launch_norm_swiglu(
                dev, st, b["gate"], weight_arg(gate_up), b["x"], lw.ffn_norm.buffer, rows=f, cols=h, eps=eps,
                weight_type=gate_up.fmt, **kwargs), reads=(lw.ffn_norm, gate_up))]
        if kernel_choice.takes_fused_qmatvec(dev, t, lw.ffn_gate, lw.ffn_up):
            weights = [(weight_arg(w), w.fmt) for w in (lw.ffn_gate, lw.ffn_up)]
            return [Launch(f"ffn_norm+gate_up+{activation}", lambda: fused_qmatvec.launch_norm_swiglu(
                dev, st, b["gate"], weights, b["x"], lw.ffn_norm.buffer, rows=f, cols=h, batch=t, eps=eps,
                activation=activation), reads=(lw.ffn_norm, lw.ffn_gate, lw.ffn_up))]
        if self.ffn_pairs(lw, t, activation):  # x16 = rmsnorm(x) as f16, then the products, the activation in an epilogue
            gate, up = lw.ffn_gate, lw.ffn_up
            norm = Launch("ffn_norm", lambda: rmsnorm.launch(dev, st, b["xn"], b["x"], lw.ffn_norm.buffer, t, h, eps,
                                                             out_f16=True), reads=(lw.ffn_norm,))
            if kernel_choice.silu_up_fits(dev, t, f, gate.fmt, activation):  # 128-token tiles: gate, then up+act
                return [norm,
                        Launch("gate_proj", lambda: matmul_mma.launch(
                            dev, st, b["gate"], weight_arg(gate), b["xn"], f, h, t, weight_type=gate.fmt, x_f16=True),
                            reads=(gate,)),
                        Launch(f"up_proj+{activation}", lambda: matmul_mma_swiglu.launch_silu_up(
                            dev, st, b["ffn_h16"], b["gate"], weight_arg(up), b["xn"], f, h, t, weight_type=up.fmt,
                            activation=activation), reads=(up,))]
            return [norm,
                    Launch("gate_up+silu", lambda: matmul_mma_swiglu.launch_swiglu(
                        dev, st, b["ffn_h16"], b["gate"], b["up"], weight_arg(gate), weight_arg(up), b["xn"], f, h, t,
                        weight_type=gate.fmt, workspace=self.workspace), reads=(gate, up))]
        plan: list[Launch] = [Launch("ffn_norm", lambda: rmsnorm.launch(dev, st, b["xn"], b["x"], lw.ffn_norm.buffer, t, h,
                                                                        eps), reads=(lw.ffn_norm,))]
        gate, up = lw.ffn_gate, lw.ffn_up
        if swiglu and None not in (gate, up) and (gate.rows, gate.cols) == (up.rows, up.cols) == (f, h) and \
                kernel_choice.swiglu_fragments_fit(dev, t, f, h, (gate.fmt, up.fmt), self.workspace):
            # a decode batch on the fragment path: gate, up and SwiGLU in one launch (float32 h in b["gate"])
            return plan + [Launch("gate_up+silu", lambda: matmul_mma_swiglu.launch_swiglu_fragments(
                dev, st, b["gate"], b["up"], weight_arg(gate), weight_arg(up), b["xn"], f, h, t, weight_type=gate.fmt,
                workspace=self.workspace), reads=(gate, up))]
        for name, out, wt in (("gate", b["gate"], lw.ffn_gate), ("up", b["up"], lw.ffn_up)):
            plan.append(Launch(f"{name}_proj", lambda out=out, wt=wt: kernel_choice.project(
                dev, st, out, weight_arg(wt), b["xn"], wt.rows, wt.cols, t, weight_type=wt.fmt,
                workspace=self.workspace), reads=(wt,)))
        gated = silu_mul if swiglu else gelu_mul
        plan.append((f"{activation}_mul", lambda: gated.launch(dev, st, b["gate"], b["gate"], b["up"], t * f)))
        return plan

    def qkv_f16(self, lw, t: int) -> bool:
        """True when a step of t tokens on the single ops norms x to f16 for q, k and v (matmul_mma.launch with
        x_f16): all three of matmul_mma.X16_TYPES or X16_WIDE_ONLY_TYPES on the matrix cores, each taking the
        128-token tiles
        (pick_x16_tile_tokens: the 8B's, not the 1B's k and v, whose float32 path at 32-token tiles was faster
        than f16 in 64-token tiles: 14.4 against 16.1 us)."""
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
        (kernel_choice.takes_f16_x), all on the matrix cores' single-op path (no fused kernel takes them at t tokens).
        """
        gate, up, down = lw.ffn_gate, lw.ffn_up, lw.ffn_down
        if "ffn_h16" not in self.b or None in (gate, up, down):
            return False
        gate_up = lw.ffn_gate_up
        if gate_up is not None and kernel_choice.family_of(gate_up, t, self.device.arch) is not None:
            return False
        dev, f = self.device, self.config.ffn_size
        if kernel_choice.takes_fused_qmatvec(dev, t, gate, up) or \
                kernel_choice.takes_fused_qmatvec(dev, t, down) or \
                kernel_choice.family_of(down, t, dev.arch) is not None:
            return False
        return (gate.fmt == up.fmt and (gate.rows, gate.cols) == (up.rows, up.cols) == (f, self.config.hidden_size)
                and kernel_choice.takes_f16_x(dev, down.fmt, down.rows, t)
                and (kernel_choice.silu_up_fits(dev, t, f, gate.fmt, activation)
                     or (activation == "silu" and kernel_choice.swiglu_fits(dev, t, f, gate.fmt, self.workspace))))

    def feed_forward_output(self, lw, t: int) -> list[Launch]:
        """b["x"] += h @ Wd^T, h the feed-forward's SwiGLU: b["ffn_h16"] (f16) after a SwiGLU pair (ffn_pairs),
        else b["gate"]."""
        f = self.config.ffn_size
        if not self.ffn_pairs(lw, t):
            return self.residual_product("ffn_down", lw.ffn_down, self.b["gate"], f, t)
        b, dev, st, wt = self.b, self.device, self.stream, lw.ffn_down
        return [Launch("ffn_down+residual", lambda: matmul_mma.launch(
            dev, st, b["x"], weight_arg(wt), b["ffn_h16"], self.config.hidden_size, f, t, weight_type=wt.fmt,
            workspace=self.workspace, accumulate=True, x_f16=True), reads=(wt,))]

    def reads_f16(self, wt, t: int) -> bool:
        """True when the residual product of `wt` (the o projection) can read its x as f16 in a step of t tokens:
        no fused kernel takes it, a type of matmul_mma.X16_TYPES or X16_WIDE_ONLY_TYPES on the matrix cores, in
        128-token tiles
        (pick_x16_tile_tokens: on an NVIDIA H100 the 8B's o product took 75 us from f16 against 108 from
        float32). The caller decides whether its x comes as f16 (blocks.py: the llama layer's attention)."""
        if wt is None or kernel_choice.family_of(wt, t, self.device.arch) is not None:
            return False
        return not kernel_choice.takes_fused_qmatvec(self.device, t, wt) and self._wide_f16(wt, t)

    def residual_product(self, name: str, wt, x: Buffer, cols: int, t: int, x_f16: bool = False) -> list[Launch]:
        """b["x"] += x @ W^T: one fused launch, or a product and an add. x_f16: x holds f16 (only where
        reads_f16)."""
        b, dev, st, h = self.b, self.device, self.stream, self.config.hidden_size
        if x_f16:
            if not self.reads_f16(wt, t):
                raise ValueError(f"residual_product: {name} cannot read f16 x in a step of {t} tokens (see reads_f16)")
            return [Launch(f"{name}+residual", lambda: matmul_mma.launch(
                dev, st, b["x"], weight_arg(wt), x, h, cols, t, weight_type=wt.fmt, workspace=self.workspace,
                accumulate=True, x_f16=True), reads=(wt,))]
        family = kernel_choice.family_of(wt, t, self.device.arch)
        if family is not None:
            kwargs = self._fused_kwargs(family, t)
            return [Launch(f"{name}+residual", lambda: family.launch_add(
                dev, st, b["x"], weight_arg(wt), x, rows=h, cols=cols, weight_type=wt.fmt, **kwargs), reads=(wt,))]
        if kernel_choice.takes_fused_qmatvec(dev, t, wt):
            return [Launch(f"{name}+residual", lambda: fused_qmatvec.launch_add(
                dev, st, b["x"], weight_arg(wt), x, rows=h, cols=cols, batch=t, weight_type=wt.fmt), reads=(wt,))]
        if matmul_mma.takes_matrix_cores(dev, t, wt.fmt):  # the residual add in the product's epilogue
            return [Launch(f"{name}+residual", lambda: matmul_mma.launch(
                dev, st, b["x"], weight_arg(wt), x, h, cols, t, weight_type=wt.fmt, workspace=self.workspace,
                accumulate=True), reads=(wt,))]
        return [Launch(name, lambda: kernel_choice.project(dev, st, b["proj"], weight_arg(wt), x, h, cols, t,
                                                           weight_type=wt.fmt), reads=(wt,)),
                (f"{name}_residual", lambda: add.launch(dev, st, b["x"], b["x"], b["proj"], t * h))]

    def product(self, name: str, wt, x: Buffer, cols: int, t: int, x_f16: bool = False) -> list[Launch]:
        """b["proj"] = x @ W^T, hidden_size rows (a product normalized before its residual add: Gemma's o and down):
        fused_qmatvec's residual entry storing instead of adding where it takes the weight and the step, else
        kernel_choice.project. x_f16: x holds f16 (Gemma's down after the f16 feed-forward, only where ffn_pairs with
        GeGLU): matmul_mma's f16 entry."""
        b, dev, st, h = self.b, self.device, self.stream, self.config.hidden_size
        if x_f16:
            return [Launch(name, lambda: matmul_mma.launch(dev, st, b["proj"], weight_arg(wt), x, h, cols, t,
                                                           weight_type=wt.fmt, workspace=self.workspace, x_f16=True),
                           reads=(wt,))]
        if kernel_choice.takes_fused_qmatvec(dev, t, wt):
            return [Launch(name, lambda: fused_qmatvec.launch_add(dev, st, b["proj"], weight_arg(wt), x, rows=h,
                                                                  cols=cols, batch=t, weight_type=wt.fmt, store=True),
                           reads=(wt,))]
        return [Launch(name, lambda: kernel_choice.project(dev, st, b["proj"], weight_arg(wt), x, h, cols, t,
                                                           weight_type=wt.fmt, workspace=self.workspace), reads=(wt,))]

    def head(self, out_w, norm_w, rows: Buffer, r: int) -> list[Launch]:
        """b["logits"][:r] = rmsnorm(rows) @ W_out^T."""
        cfg, b, dev, st = self.config, self.b, self.device, self.stream
        h, v, eps = cfg.hidden_size, cfg.vocab_size, cfg.rms_norm_eps
        family = kernel_choice.head_family(out_w, r, dev.arch)
        if family is not None:
            kwargs = self._fused_kwargs(family, r)
            return [Launch("output_norm+head", lambda: family.launch_norm(
                dev, st, b["logits"], weight_arg(out_w), rows, norm_w.buffer, rows=v, cols=h, eps=eps,
                weight_type=out_w.fmt, **kwargs), reads=(norm_w, out_w))]
        if kernel_choice.head_takes_fused_qmatvec(dev, r, out_w):
            return [Launch("output_norm+head", lambda: fused_qmatvec.launch_norm(
                dev, st, b["logits"], weight_arg(out_w), rows, norm_w.buffer, rows=v, cols=h, batch=r, eps=eps,
                weight_type=out_w.fmt), reads=(norm_w, out_w))]
        return [Launch("output_norm", lambda: rmsnorm.launch(dev, st, b["rows"], rows, norm_w.buffer, r, h, eps),
                       reads=(norm_w,)),
                Launch("head", lambda: kernel_choice.project(dev, st, b["logits"], weight_arg(out_w), b["rows"], v, h,
                                                             r, weight_type=out_w.fmt, workspace=self.workspace),
                       reads=(out_w,))]

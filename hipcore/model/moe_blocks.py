"""The mixture-of-experts feed-forward block (qwen3moe, gpt-oss), as launches for a step of t tokens.

llama.cpp's build_moe_ffn (src/llama-graph.cpp), for every token of the step:
    xn      = rmsnorm(x) * ffn_norm                         rmsnorm
    logits  = xn @ Wr^T                                     kernel_choice.project, [t, experts]
    ids, w  = the k experts of logits (+ router bias) and   moe_route (softmax_topk or topk_softmax; the bias added
              their weights                                 as it reads the logits)
    h[t, j] = act(gate_e . xn[t] (+b), up_e . xn[t] (+b))   moe_experts.launch_gate_up, e = ids[t, j]
    x      += sum_j w[t, j] (down_e . h[t, j] (+b))         moe_experts.launch_down, into the residual stream
Five launches a layer, each over every token of the step: the router's product is an
ordinary dense product (the existing matmul kernels), the experts' read only the selected experts' rows.
A step whose pairs average moe_experts_mma.min_pairs_per_expert an expert on a device with matrix cores takes
moe_experts_mma instead of the two expert launches: the pairs sorted by expert (moe_sort), then gate, up (with the
activation; h stored as f16 in moe_h) and down as matrix products of each expert's pairs, and the weighted terms
summed into the stream; the norm then writes an f16 copy of xn too (moe_xn16: gate and up read it, the router the
float32 rows), as the products round their inputs to f16 anyway. On
NVIDIA a step of a few pairs an expert (moe_experts_mma.direct_pays: 2 to 8, 4 to 16 for MXFP4; the decode batches)
takes the same launches in tiles of at most 8 pairs instead.

qwen2moe's shared expert (shared_expert) is the same two expert launches over one expert, the shared ffn_*_shexp
matrices (2-D: one expert's layout), every token routed to it (ids all 0, a buffer zeroed once) with the weight
sigmoid(ffn_gate_inp_shexp . xn) = 0.5 + 0.5 tanh(g / 2): the gate's one-row product, then scale (1/4), softcap (1/2)
and add_bias (+1/2), existing launches (llama.cpp computes silu(g) / g, the same function).

The router's logits, the chosen ids and weights live in buffers tagged "moe_router", the experts' intermediate h in
one tagged "moe_experts" (forward.activation_sizes), so that the ledger and leak checks see them apart.
"""

from __future__ import annotations

import numpy as np

from hipcore.errors import UnsupportedModelError
from hipcore.model.launch import ExpertReads
from hipcore.model.projections import Launch, weight_arg
from hipcore.ops import add_bias, kernel_choice, moe_experts, moe_experts_mma, moe_route, rmsnorm, scale, softcap

ROUTER_TAG = "moe_router"
EXPERTS_TAG = "moe_experts"


def moe_buffer_sizes(config, tokens: int) -> dict[str, tuple[int, str]]:
    """name -> (bytes, ledger tag) of the MoE block's buffers for steps of up to `tokens` token rows."""
    if not config.is_moe:
        return {}
    e, k, ff = config.n_experts, config.n_experts_used, config.expert_ffn_size
    sorted_bytes, tiles_bytes = moe_experts_mma.sort_bytes(tokens * k, e)
    sizes = {"moe_logits": (tokens * e * 4, ROUTER_TAG), "moe_ids": (tokens * k * 4, ROUTER_TAG),
             "moe_weights": (tokens * k * 4, ROUTER_TAG), "moe_h": (tokens * k * ff * 4, EXPERTS_TAG),
             # the normalized input's f16 copy that the matrix-core products read (moe_experts_mma.X_BYTES)
             "moe_xn16": (tokens * config.hidden_size * moe_experts_mma.X_BYTES, EXPERTS_TAG),
             # the pairs sorted by expert and their tiles (moe_experts_mma, prompts on the matrix cores)
             "moe_sorted": (sorted_bytes, ROUTER_TAG), "moe_tiles": (tiles_bytes, ROUTER_TAG),
             # the grouped down path's per-slot terms (moe_experts.launch_down), the shared expert's too; the
             # matrix-core path's gate product before them
             "moe_down_workspace": (moe_experts.down_workspace_bytes(tokens, k, max(config.hidden_size, ff)),
                                    EXPERTS_TAG)}
    if getattr(config, "shared_ffn_size", 0):
        sizes.update({"moe_shared_gate": (tokens * 4, ROUTER_TAG), "moe_shared_ids": (tokens * 4, ROUTER_TAG),
                      "moe_half": (4, ROUTER_TAG), "moe_shared_h": (tokens * config.shared_ffn_size * 4, EXPERTS_TAG)})
    return sizes


def init_moe_buffers(buffers: dict) -> None:
    """The shared expert's constants, once after allocation: every token routed to expert 0, and the sigmoid's 1/2."""
    if "moe_shared_ids" in buffers:
        buffers["moe_shared_ids"].fill(0)
        buffers["moe_half"].upload(np.array([0.5], dtype=np.float32))


def check_moe_weights(config, layers) -> None:
    """The expert tensors the ops take: gate and up of one format (one launch reads both), each a format
    moe_experts reads (UnsupportedModelError, exit 4, naming the tensor otherwise)."""
    if not config.is_moe:
        return
    for i, lw in enumerate(layers):
        if lw.ffn_gate_exps.fmt != lw.ffn_up_exps.fmt:
            raise UnsupportedModelError(
                f"layer {i}: ffn_gate_exps ({lw.ffn_gate_exps.fmt.upper()}) and ffn_up_exps "
                f"({lw.ffn_up_exps.fmt.upper()}) differ in type; the experts' gate|up launch reads one type")
        if config.shared_ffn_size and lw.ffn_gate_shexp.fmt != lw.ffn_up_shexp.fmt:
            raise UnsupportedModelError(f"layer {i}: ffn_gate_shexp and ffn_up_shexp differ in type; the shared "
                                        "expert's gate|up launch reads one type")
        for name in ("ffn_gate_exps", "ffn_down_exps") + (("ffn_gate_shexp", "ffn_down_shexp")
                                                           if config.shared_ffn_size else ()):
            fmt = getattr(lw, name).fmt
            if not moe_experts.supports(fmt):
                raise UnsupportedModelError(f"layer {i}: {name} in {fmt.upper()}: the expert products read "
                                            f"{', '.join(t.upper() for t in moe_experts.EXPERT_TYPES)}")


def _bias(w) -> object:
    return None if w is None else w.buffer


def moe_feed_forward(ctx, i: int, lw, t: int, residual_bias=None) -> list[Launch]:
    """x += the mixture of experts' output on rmsnorm(x) (see the module docstring): every launch of the block.
    residual_bias: a bias the block before left for x (gpt-oss's o bias), added by the norm's launch as it reads x."""
    cfg, b, dev, st = ctx.config, ctx.buffers, ctx.device, ctx.stream
    h, e, k, ff = cfg.hidden_size, cfg.n_experts, cfg.n_experts_used, cfg.expert_ffn_size
    router, gate, up, down = lw.ffn_gate_inp, lw.ffn_gate_exps, lw.ffn_up_exps, lw.ffn_down_exps
    tile = matrix_core_tile(dev.arch, cfg, t, gate, down)
    also_f16 = b["moe_xn16"] if tile else None  # the matrix-core products' f16 copy of xn
    if residual_bias is None:
        norm = Launch("ffn_norm", lambda: rmsnorm.launch(dev, st, b["xn"], b["x"], lw.ffn_norm.buffer, t, h,
                                                         cfg.rms_norm_eps, also_f16=also_f16), reads=(lw.ffn_norm,))
    else:
        norm = Launch("residual_bias+ffn_norm", lambda: rmsnorm.launch_bias(
            dev, st, b["xn"], b["x"], residual_bias.buffer, lw.ffn_norm.buffer, t, h, cfg.rms_norm_eps,
            also_f16=also_f16), reads=(residual_bias, lw.ffn_norm))
    plan: list[Launch] = [
        norm,
        Launch("moe_router", lambda: kernel_choice.project(dev, st, b["moe_logits"], weight_arg(router), b["xn"], e, h,
                                                        t, weight_type=router.fmt, workspace=ctx.products.workspace),
               reads=(router,))]
    router_bias = lw.ffn_gate_inp_bias  # added by moe_route as it reads the logits (gpt-oss)
    plan.append(Launch("moe_route", lambda: moe_route.launch(
        dev, st, b["moe_ids"], b["moe_weights"], b["moe_logits"], t, e, k, cfg.expert_gating, cfg.expert_weights_norm,
        bias=_bias(router_bias)), reads=(router_bias,)))
    if tile:
        return plan + _matrix_core_experts(ctx, lw, t, tile)
    selected = _selected(b, t * k, e)
    plan += [
        Launch("moe_gate_up", lambda: moe_experts.launch_gate_up(
            dev, st, b["moe_h"], b["xn"], weight_arg(gate), weight_arg(up), b["moe_ids"], t, k, cfg.expert_activation,
            _bias(lw.ffn_gate_exps_bias), _bias(lw.ffn_up_exps_bias), weight_type=gate.fmt, n_expert=e, ff=ff,
            hidden=h), experts=selected(gate, up, lw.ffn_gate_exps_bias, lw.ffn_up_exps_bias)),
        Launch("moe_down+residual", lambda: moe_experts.launch_down(
            dev, st, b["x"], b["moe_h"], weight_arg(down), b["moe_ids"], b["moe_weights"], t, k,
            _bias(lw.ffn_down_exps_bias), weight_type=down.fmt, n_expert=e, hidden=h, ff=ff,
            workspace=b["moe_down_workspace"]), experts=selected(down, lw.ffn_down_exps_bias))]
    return plan


def _selected(b, pairs: int, n_expert: int):
    """ExpertReads of these weights: the experts' launches read only the experts moe_route wrote in moe_ids."""
    return lambda *weights: ExpertReads(tuple(w for w in weights if w is not None), b["moe_ids"], pairs, n_expert)


def matrix_core_tile(arch: str, cfg, t: int, gate, down) -> int:
    """The pairs a tile when a step of t tokens multiplies the experts on the matrix cores (expert values within
    f16's range, and moe_experts_mma.direct_pays: DIRECT_TILE_PAIRS; else moe_experts_mma.pays: 32 or 64), or 0."""
    if not (gate.fits_f16 and down.fits_f16):
        return 0
    e, k = cfg.n_experts, cfg.n_experts_used
    types, widths = (gate.fmt, down.fmt), (cfg.hidden_size, cfg.expert_ffn_size)
    if moe_experts_mma.direct_pays(arch, t, k, e, types, widths):
        return moe_experts_mma.DIRECT_TILE_PAIRS
    if moe_experts_mma.pays(arch, t, k, e, types, widths):
        return moe_experts_mma.tile_tokens(t * k, e)
    return 0


def _matrix_core_experts(ctx, lw, t: int, tile: int) -> list[Launch]:
    """The experts' launches of a step on the matrix cores, `tile` pairs a tile (the module docstring)."""
    cfg, b, dev, st = ctx.config, ctx.buffers, ctx.device, ctx.stream
    h, e, k, ff = cfg.hidden_size, cfg.n_experts, cfg.n_experts_used, cfg.expert_ffn_size
    gate, up, down = lw.ffn_gate_exps, lw.ffn_up_exps, lw.ffn_down_exps
    pairs = t * k
    sorted_, tiles, g = b["moe_sorted"], b["moe_tiles"], b["moe_down_workspace"]
    shape = dict(pairs=pairs, n_expert=e, tile=tile)
    selected = _selected(b, pairs, e)
    return [
        ("moe_sort", lambda: moe_experts_mma.launch_sort(dev, st, sorted_, tiles, b["moe_ids"], pairs, e, tile)),
        Launch("moe_gate", lambda: moe_experts_mma.launch_products(
            dev, st, "gate", g, weight_arg(gate), b["moe_xn16"], sorted_, tiles, weight_type=gate.fmt, rows=ff,
            cols=h, x_per=k, bias=_bias(lw.ffn_gate_exps_bias), **shape), experts=selected(gate, lw.ffn_gate_exps_bias)),
        Launch("moe_up", lambda: moe_experts_mma.launch_products(
            dev, st, "up", b["moe_h"], weight_arg(up), b["moe_xn16"], sorted_, tiles, weight_type=up.fmt, rows=ff,
            cols=h, x_per=k, bias=_bias(lw.ffn_up_exps_bias), g=g, activation=cfg.expert_activation, **shape),
            experts=selected(up, lw.ffn_up_exps_bias)),
        Launch("moe_down", lambda: moe_experts_mma.launch_products(
            dev, st, "down", g, weight_arg(down), b["moe_h"], sorted_, tiles, weight_type=down.fmt, rows=h, cols=ff,
            x_per=1, bias=_bias(lw.ffn_down_exps_bias), weights=b["moe_weights"], **shape),
            experts=selected(down, lw.ffn_down_exps_bias)),
        ("moe_sum+residual", lambda: moe_experts.launch_sum_slots(dev, st, b["x"], g, t, k, h))]


def shared_expert(ctx, i: int, lw, t: int) -> list[Launch]:
    """x += sigmoid(ffn_gate_inp_shexp . xn) * down_s(silu(gate_s xn) * up_s xn), xn the feed-forward's normalized input
    (moe_feed_forward's, which must come first): qwen2moe's shared expert (see the module docstring)."""
    cfg, b, dev, st = ctx.config, ctx.buffers, ctx.device, ctx.stream
    h, ff = cfg.hidden_size, cfg.shared_ffn_size
    gate, up, down = lw.ffn_gate_shexp, lw.ffn_up_shexp, lw.ffn_down_shexp
    g = b["moe_shared_gate"]
    return [
        Launch("shared_gate", lambda: kernel_choice.project(dev, st, g, lw.ffn_gate_inp_shexp.buffer, b["xn"], 1, h, t,
                                                            weight_type="f32", workspace=ctx.products.workspace),
               reads=(lw.ffn_gate_inp_shexp,)),
        ("shared_gate/4", lambda: scale.launch(dev, st, g, g, t, 0.25)),
        ("shared_gate_tanh/2", lambda: softcap.launch(dev, st, g, g, t, 0.5)),
        ("shared_gate_sigmoid", lambda: add_bias.launch(dev, st, g, b["moe_half"], t, 1)),
        Launch("shared_gate_up", lambda: moe_experts.launch_gate_up(
            dev, st, b["moe_shared_h"], b["xn"], weight_arg(gate), weight_arg(up), b["moe_shared_ids"], t, 1, "swiglu",
            weight_type=gate.fmt, n_expert=1, ff=ff, hidden=h), reads=(gate, up)),
        Launch("shared_down+residual", lambda: moe_experts.launch_down(
            dev, st, b["x"], b["moe_shared_h"], weight_arg(down), b["moe_shared_ids"], g, t, 1,
            weight_type=down.fmt, n_expert=1, hidden=h, ff=ff, workspace=b["moe_down_workspace"]), reads=(down,))]

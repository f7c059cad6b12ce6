"""A Q4_K_M-shaped layer on the cpu backend for the projection planner's tests (tests/test_projections_kquant.py,
tests/test_projections_f16.py): Q4_K q, k, o, gate, up; Q6_K v, down and the head, kept in their GGUF blocks as a
GPU holds them, with the buffers a step of up to MAX_T tokens uses."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from hipcore.model.projections import ProjectionPlanner
from hipcore.model.weights import Weight
from support.weight_samples import random_weights

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 256, 4, 2, 64, 512, 40
TYPES = {"attn_q": "q4_k", "attn_k": "q4_k", "attn_v": "q6_k", "attn_output": "q4_k", "ffn_gate": "q4_k",
         "ffn_up": "q4_k", "ffn_down": "q6_k", "output": "q6_k"}
SHAPES = {"attn_q": (HEADS * HEAD_DIM, HIDDEN), "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN),
          "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN), "attn_output": (HIDDEN, HEADS * HEAD_DIM), "ffn_gate": (FFN, HIDDEN),
          "ffn_up": (FFN, HIDDEN), "ffn_down": (HIDDEN, FFN), "output": (VOCAB, HIDDEN)}
MAX_T = 12


@pytest.fixture
def layer(cpu_device):
    rng = np.random.default_rng(5)
    allocated = []

    def put(array):
        buf = cpu_device.allocate(max(array.nbytes, 4), "activations")
        buf.upload(np.ascontiguousarray(array))
        allocated.append(buf)
        return buf

    raw = {name: random_weights(rng, TYPES[name], *SHAPES[name]) for name in TYPES}
    weights = {name: Weight(put(raw[name]), TYPES[name], SHAPES[name]) for name in TYPES}
    norms = {name: Weight(put((1 + 0.2 * rng.standard_normal(HIDDEN)).astype(np.float32)), "f32", (HIDDEN,))
             for name in ("attn_norm", "ffn_norm", "output_norm")}
    lw = SimpleNamespace(attn_qkv=None, ffn_gate_up=None, attn_norm=norms["attn_norm"], ffn_norm=norms["ffn_norm"],
                         **{k: v for k, v in weights.items() if k != "output"})
    sizes = {"x": MAX_T * HIDDEN, "xn": MAX_T * HIDDEN, "proj": MAX_T * HIDDEN, "q": MAX_T * HEADS * HEAD_DIM,
             "k": MAX_T * KV_HEADS * HEAD_DIM, "v": MAX_T * KV_HEADS * HEAD_DIM, "attn": MAX_T * HEADS * HEAD_DIM,
             "gate": MAX_T * FFN, "up": MAX_T * FFN, "logits": MAX_T * VOCAB, "rows": MAX_T * HIDDEN}
    buffers = {name: put(np.zeros(n, np.float32)) for name, n in sizes.items()}
    buffers["matmul_workspace"] = put(np.zeros(4096, np.uint8))  # the runner's has one (counters, split partials)
    config = SimpleNamespace(n_heads=HEADS, n_kv_heads=KV_HEADS, head_dim=HEAD_DIM, hidden_size=HIDDEN, ffn_size=FFN,
                             vocab_size=VOCAB, rms_norm_eps=1e-5, rope_dim=HEAD_DIM, rope_theta=10000.0,
                             qkv_bias=False)
    planner = ProjectionPlanner(cpu_device, None, config, buffers, 1.0)
    yield SimpleNamespace(planner=planner, lw=lw, raw=raw, weights=weights, norms=norms, b=buffers, put=put, rng=rng)
    for buf in allocated:
        buf.free()


def run(plan):
    for _, launch in plan:
        launch()


def read(buf, shape):
    return buf.download(np.float32, int(np.prod(shape))).reshape(shape)

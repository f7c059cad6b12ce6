"""The llama forward pass over the paged KV cache, as a fixed sequence of op launches.

The same code runs on every backend: on the cpu backend each launch runs the op's numpy reference,
on a GPU it launches the op's HIP kernel. Buffers are allocated once, sized for the largest step
(max_step_tokens tokens, max_seqs sequences), so addresses stay fixed (what graph replay needs).

Per layer: rmsnorm -> q/k/v projections -> rope(q, k) -> kv_store -> paged attention -> output
projection + residual -> rmsnorm -> gate/up projections -> silu(gate)*up -> down projection +
residual. Then only the rows that sample go through the final norm and the output projection.
"""

from __future__ import annotations

import math

import numpy as np

from hipcore.errors import UnsupportedModelError
from hipcore.model.batch import StepBatch
from hipcore.model.weights import ModelWeights
from hipcore.ops import add, embedding, kv_store, matvec, paged_attention, rmsnorm, rope, select_rows, silu_mul
from hipcore.runtime.device import Buffer, Device


def activation_sizes(config, max_tokens: int, max_seqs: int, max_blocks: int) -> dict[str, tuple[int, str]]:
    """name -> (bytes, ledger tag) of every buffer the runner allocates. The memory plan uses this."""
    h, f, v = config.hidden_size, config.ffn_size, config.vocab_size
    q_width, kv_width = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
    t, s = max_tokens, max_seqs
    return {
        "x": (t * h * 4, "activations"), "xn": (t * h * 4, "activations"), "proj": (t * h * 4, "activations"),
        "q": (t * q_width * 4, "activations"), "k": (t * kv_width * 4, "activations"),
        "v": (t * kv_width * 4, "activations"), "attn": (t * q_width * 4, "activations"),
        "gate": (t * f * 4, "activations"), "up": (t * f * 4, "activations"),
        "rows": (s * h * 4, "activations"), "logits": (s * v * 4, "activations"),
        "token_ids": (t * 4, "scratch"), "positions": (t * 4, "scratch"), "slots": (t * 4, "scratch"),
        "token_seq": (t * 4, "scratch"), "sample_rows": (s * 4, "scratch"),
        "block_tables": (s * max_blocks * 4, "scratch"),
    }


class LlamaRunner:
    """Executes StepBatches for one model on one device; returns host logits of the sampled rows."""

    def __init__(self, device: Device, config, weights: ModelWeights, cache, *, max_step_tokens: int, max_seqs: int):
        if config.rope_scaling not in ("none", "linear"):
            raise UnsupportedModelError(f"rope scaling {config.rope_scaling!r} is not supported yet (none, linear)")
        self.device, self.config, self.weights, self.cache = device, config, weights, cache
        self.max_step_tokens, self.max_seqs = max_step_tokens, max_seqs
        self.max_blocks = -(-config.context_length // cache.config.block_size)
        self.stream = device.default_stream
        self.scale = 1.0 / math.sqrt(config.head_dim)
        self.freq_scale = 1.0 / config.rope_scaling_factor if config.rope_scaling == "linear" else 1.0
        self.buffers: dict[str, Buffer] = {}
        try:
            for name, (nbytes, tag) in activation_sizes(config, max_step_tokens, max_seqs, self.max_blocks).items():
                self.buffers[name] = device.allocate(nbytes, tag=tag, label=f"runner.{name}")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Free the activation and step-input buffers; idempotent."""
        for buf in self.buffers.values():
            if not buf.freed:
                buf.free()
        self.buffers.clear()

    # ---- one step -----------------------------------------------------------------------------

    def execute(self, batch: StepBatch) -> np.ndarray:
        t, s, r = batch.num_tokens, batch.num_seqs, int(batch.sample_rows.shape[0])
        if t > self.max_step_tokens or s > self.max_seqs:
            raise ValueError(f"step of {t} tokens / {s} sequences exceeds the runner's {self.max_step_tokens} / {self.max_seqs}")
        batch.validate(self.cache.config.block_size, self.cache.config.num_blocks)
        b = self.buffers
        tables = np.zeros((s, self.max_blocks), dtype=np.int32)
        tables[:, :batch.block_tables.shape[1]] = batch.block_tables
        for name, arr in (("token_ids", batch.token_ids), ("positions", batch.positions), ("slots", batch.slot_mapping),
                          ("token_seq", batch.token_seq_index()), ("sample_rows", batch.sample_rows),
                          ("block_tables", tables)):
            if arr.size:  # no sample rows when every sequence of the step is mid-prompt
                b[name].upload(np.ascontiguousarray(arr, dtype=np.int32), stream=self.stream)
        self.forward(t, r)
        logits = np.empty((r, self.config.vocab_size), dtype=np.float32)
        self.stream.synchronize()
        if r:
            self.device.copy_device_to_host(logits, b["logits"])
        return logits

    def forward(self, t: int, r: int) -> None:
        """Queue the whole forward pass for t tokens whose logits are wanted at r rows."""
        cfg, w, b, dev, st = self.config, self.weights, self.buffers, self.device, self.stream
        h, f = cfg.hidden_size, cfg.ffn_size
        nh, nkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        kv = self.cache.config
        embedding.launch(dev, st, b["x"], w.token_embd.buffer, b["token_ids"], t, h, cfg.vocab_size, w.token_embd.fmt)
        for i, lw in enumerate(w.layers):
            rmsnorm.launch(dev, st, b["xn"], b["x"], lw.attn_norm.buffer, t, h, cfg.rms_norm_eps)
            for out, wt in ((b["q"], lw.attn_q), (b["k"], lw.attn_k), (b["v"], lw.attn_v)):
                matvec.launch(dev, st, out, wt.buffer, b["xn"], wt.rows, wt.cols, t, weight_type=wt.fmt)
            rope.launch(dev, st, b["q"], b["positions"], t, nh, hd, cfg.rope_dim, cfg.rope_theta, self.freq_scale)
            rope.launch(dev, st, b["k"], b["positions"], t, nkv, hd, cfg.rope_dim, cfg.rope_theta, self.freq_scale)
            kv_store.launch(dev, st, self.cache, i, b["k"], b["v"], b["slots"], t)
            paged_attention.launch(
                dev, st, b["attn"], b["q"], self.cache.k_pools[i], self.cache.v_pools[i], b["block_tables"],
                b["token_seq"], b["positions"], n_tokens=t, n_heads=nh, n_kv_heads=nkv, head_dim=hd,
                block_size=kv.block_size, max_blocks=self.max_blocks, num_blocks=kv.num_blocks,
                scale=self.scale, kv_dtype=kv.dtype,
            )
            matvec.launch(dev, st, b["proj"], lw.attn_output.buffer, b["attn"], h, nh * hd, t, weight_type=lw.attn_output.fmt)
            add.launch(dev, st, b["x"], b["x"], b["proj"], t * h)
            rmsnorm.launch(dev, st, b["xn"], b["x"], lw.ffn_norm.buffer, t, h, cfg.rms_norm_eps)
            matvec.launch(dev, st, b["gate"], lw.ffn_gate.buffer, b["xn"], f, h, t, weight_type=lw.ffn_gate.fmt)
            matvec.launch(dev, st, b["up"], lw.ffn_up.buffer, b["xn"], f, h, t, weight_type=lw.ffn_up.fmt)
            silu_mul.launch(dev, st, b["gate"], b["gate"], b["up"], t * f)
            matvec.launch(dev, st, b["proj"], lw.ffn_down.buffer, b["gate"], h, f, t, weight_type=lw.ffn_down.fmt)
            add.launch(dev, st, b["x"], b["x"], b["proj"], t * h)
        if r == 0:  # a step of prompt chunks only: nothing samples, so no logits are computed
            return
        select_rows.launch(dev, st, b["rows"], b["x"], b["sample_rows"], r, h, t)
        rmsnorm.launch(dev, st, b["rows"], b["rows"], w.output_norm.buffer, r, h, cfg.rms_norm_eps)
        matvec.launch(dev, st, b["logits"], w.output.buffer, b["rows"], cfg.vocab_size, h, r, weight_type=w.output.fmt)

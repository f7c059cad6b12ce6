"""The llama forward pass in numpy, written from the definition and sharing no code with the library: a
test-side second opinion on the model (the library's own cpu backend runs the ops' references instead).

Float32 weights (dequantized once at load), float32 activations, float64 for the reductions that
are cheap (RMSNorm mean of squares, softmax sums). A prompt is evaluated in ONE batched pass
(matrix-matrix products with a causal mask); later tokens go one at a time against the cache.

Per layer, as llama.cpp builds the llama graph:
  h = x + Wo . attention(rope(Wq . rmsnorm(x)), rope(Wk . rmsnorm(x)), Wv . rmsnorm(x))
  x = h + Wdown . (silu(Wgate . rmsnorm(h)) * Wup . rmsnorm(h))
then logits = Wout . rmsnorm(x), with Wout = the token embedding when the model ties them.
Attention is grouped-query: query head h reads KV head h // (n_heads / n_kv_heads), the same
broadcast ggml's mul_mat does; scores are scaled by 1/sqrt(head_dim).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hipcore.errors import UnsupportedModelError, UsageError
from support.contiguous_kv_cache import ContiguousKvCache
from support.reference_rope import RotaryEmbedding, rope_freq_scale

LLAMA_FAMILY = ("llama", "mistral")


@dataclass
class LayerWeights:
    attn_norm: np.ndarray      # (hidden,)
    wqkv: np.ndarray           # (q_dim + 2 * kv_dim, hidden): Q, K and V stacked, one product
    wo: np.ndarray             # (hidden, q_dim)
    ffn_norm: np.ndarray       # (hidden,)
    w_gate_up: np.ndarray      # (2 * ffn, hidden): gate and up stacked, one product
    w_down: np.ndarray         # (hidden, ffn)


@dataclass
class LlamaWeights:
    token_embd: np.ndarray     # (vocab, hidden)
    layers: list[LayerWeights]
    output_norm: np.ndarray    # (hidden,)
    output: np.ndarray         # (vocab, hidden); the same array as token_embd when tied
    rope_freq_factors: np.ndarray | None = None

    @classmethod
    def from_tensors(cls, config, get, has) -> "LlamaWeights":
        """Assemble from a tensor source: get(name) -> float32 (out, in) array, has(name) -> bool."""
        def f32(name: str) -> np.ndarray:
            return np.ascontiguousarray(get(name), dtype=np.float32)

        layers = []
        for i in range(config.n_layers):
            p = f"blk.{i}."
            layers.append(LayerWeights(
                attn_norm=f32(p + "attn_norm.weight"),
                wqkv=np.concatenate([f32(p + "attn_q.weight"), f32(p + "attn_k.weight"),
                                     f32(p + "attn_v.weight")], axis=0),
                wo=f32(p + "attn_output.weight"),
                ffn_norm=f32(p + "ffn_norm.weight"),
                w_gate_up=np.concatenate([f32(p + "ffn_gate.weight"), f32(p + "ffn_up.weight")], axis=0),
                w_down=f32(p + "ffn_down.weight"),
            ))
        token_embd = f32("token_embd.weight")
        output = f32("output.weight") if has("output.weight") else token_embd
        freq_factors = f32("rope_freqs.weight") if has("rope_freqs.weight") else None
        return cls(token_embd=token_embd, layers=layers, output_norm=f32("output_norm.weight"),
                   output=output, rope_freq_factors=freq_factors)

    @property
    def nbytes(self) -> int:
        arrays = [self.token_embd, self.output_norm]
        if self.output is not self.token_embd:
            arrays.append(self.output)
        for layer in self.layers:
            arrays += [layer.attn_norm, layer.wqkv, layer.wo, layer.ffn_norm, layer.w_gate_up, layer.w_down]
        return sum(int(a.nbytes) for a in arrays)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    mean_square = np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True)
    return (x * (1.0 / np.sqrt(mean_square + eps)).astype(np.float32)) * weight


def silu(x: np.ndarray) -> np.ndarray:
    # x * sigmoid(x), written with exp(-|x|) so that no exp overflows.
    e = np.exp(-np.abs(x))
    sigmoid = np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    return (x * sigmoid).astype(np.float32)


def softmax_rows(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, IN PLACE on a float32 array (attention's biggest temporary).

    The row sums stay float32: numpy sums pairwise, so the error grows with log(length), and a
    float64 pass over the prompt's (heads x tokens x tokens) scores would cost more than the rest."""
    scores -= np.max(scores, axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= np.sum(scores, axis=-1, keepdims=True)
    return scores


class LlamaReference:
    """A llama-family model in numpy. forward() evaluates tokens against a ContiguousKvCache."""

    def __init__(self, config, weights: LlamaWeights):
        arch = str(getattr(config, "architecture", "llama")).lower()
        if arch not in LLAMA_FAMILY:
            raise UnsupportedModelError(f"architecture {arch!r} is not supported by the llama forward pass")
        if config.n_heads % config.n_kv_heads:
            raise UnsupportedModelError(
                f"{config.n_heads} query heads are not a multiple of {config.n_kv_heads} KV heads")
        self.config = config
        self.weights = weights
        self.n_heads = int(config.n_heads)
        self.n_kv_heads = int(config.n_kv_heads)
        self.head_dim = int(config.head_dim)
        self.q_dim = self.n_heads * self.head_dim
        self.kv_dim = self.n_kv_heads * self.head_dim
        self.eps = float(config.rms_norm_eps)
        self.vocab_size = int(weights.output.shape[0])
        rope_dim = int(getattr(config, "rope_dim", None) or self.head_dim)
        self.rope = RotaryEmbedding(
            rope_dim=rope_dim, theta_base=float(config.rope_theta),
            freq_scale=rope_freq_scale(getattr(config, "rope_scaling", None),
                                       getattr(config, "rope_scaling_factor", None)),
            freq_factors=weights.rope_freq_factors)
        self._check_shapes()

    @classmethod
    def from_gguf(cls, gguf_file) -> "LlamaReference":
        """Dequantize every tensor of an opened GGUFFile to float32, once."""
        names = _tensor_names(gguf_file)
        weights = LlamaWeights.from_tensors(gguf_file.config, gguf_file.dequantize, names.__contains__)
        return cls(gguf_file.config, weights)

    def new_cache(self, capacity: int | None = None, dtype=np.float32) -> ContiguousKvCache:
        return ContiguousKvCache.for_config(self.config, capacity=capacity, dtype=dtype)

    def forward(self, tokens, cache: ContiguousKvCache, *, logits_all: bool = False) -> np.ndarray:
        """Evaluate `tokens` after the cache's contents, in one batched pass.

        Returns the logits of the last token, shape (vocab,), or with logits_all=True those of
        every token, shape (len(tokens), vocab). The cache advances only if the pass completes.
        """
        tokens = self._check_tokens(tokens)
        n = tokens.shape[0]
        cache.check_room(n)
        start = cache.length
        end = start + n
        cos, sin = self.rope.tables(np.arange(start, end))
        # Additive causal mask: query i (at position start + i) sees keys at positions <= start + i.
        key_pos = np.arange(end)[None, :]
        query_pos = np.arange(start, end)[:, None]
        mask = np.where(key_pos <= query_pos, 0.0, -np.inf).astype(np.float32)

        x = self.weights.token_embd[tokens]
        for index, layer in enumerate(self.weights.layers):
            h = rms_norm(x, layer.attn_norm, self.eps)
            qkv = h @ layer.wqkv.T
            q = qkv[:, :self.q_dim].reshape(n, self.n_heads, self.head_dim)
            k = qkv[:, self.q_dim:self.q_dim + self.kv_dim].reshape(n, self.n_kv_heads, self.head_dim)
            v = qkv[:, self.q_dim + self.kv_dim:].reshape(n, self.n_kv_heads, self.head_dim)
            q = self.rope.apply(q, cos, sin)
            k = self.rope.apply(k, cos, sin)
            cache.write(index, start, k, v)
            attn = self._attention(q, cache.keys(index, end), cache.values(index, end), mask)
            x = x + attn @ layer.wo.T
            h = rms_norm(x, layer.ffn_norm, self.eps)
            gate_up = h @ layer.w_gate_up.T
            ffn = gate_up.shape[1] // 2
            x = x + (silu(gate_up[:, :ffn]) * gate_up[:, ffn:]) @ layer.w_down.T
        cache.advance(n)

        last = x if logits_all else x[-1:]
        logits = rms_norm(last, self.weights.output_norm, self.eps) @ self.weights.output.T
        return logits if logits_all else logits[0]

    def _attention(self, q: np.ndarray, keys: np.ndarray, values: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """q: (n, heads, d); keys/values: (kv_heads, S, d); returns (n, heads * d)."""
        n = q.shape[0]
        group = self.n_heads // self.n_kv_heads
        # (n, kv, group, d) -> (kv, group * n, d): head h = kv * group + g shares KV head kv.
        qg = q.reshape(n, self.n_kv_heads, group, self.head_dim).transpose(1, 2, 0, 3)
        qg = qg.reshape(self.n_kv_heads, group * n, self.head_dim)
        scores = qg @ keys.transpose(0, 2, 1)
        scores *= np.float32(1.0 / math.sqrt(self.head_dim))
        scores = scores.reshape(self.n_kv_heads, group, n, -1)
        scores += mask
        probs = softmax_rows(scores).reshape(self.n_kv_heads, group * n, -1)
        out = (probs @ values).reshape(self.n_kv_heads, group, n, self.head_dim)
        return np.ascontiguousarray(out.transpose(2, 0, 1, 3)).reshape(n, self.q_dim)

    def _check_tokens(self, tokens) -> np.ndarray:
        array = np.asarray(tokens)
        if array.ndim != 1 or array.shape[0] == 0 or not np.issubdtype(array.dtype, np.integer):
            raise UsageError(f"forward() needs a non-empty 1-D array of token ids, got shape {array.shape} "
                             f"of {array.dtype}")
        low, high = int(array.min()), int(array.max())
        if low < 0 or high >= self.weights.token_embd.shape[0]:
            bad = low if low < 0 else high
            raise UsageError(f"token id {bad} is outside the vocabulary (0..{self.weights.token_embd.shape[0] - 1})")
        return array.astype(np.int64, copy=False)

    def _check_shapes(self) -> None:
        c, w = self.config, self.weights
        hidden, ffn = int(c.hidden_size), int(c.ffn_size)
        expected = {
            "token_embd": (w.token_embd, (int(c.vocab_size), hidden)),
            "output": (w.output, (int(c.vocab_size), hidden)),
            "output_norm": (w.output_norm, (hidden,)),
        }
        if len(w.layers) != int(c.n_layers):
            raise UnsupportedModelError(f"{len(w.layers)} layers of weights for a {c.n_layers}-layer config")
        for i, layer in enumerate(w.layers):
            expected[f"blk.{i}.attn_norm"] = (layer.attn_norm, (hidden,))
            expected[f"blk.{i}.attn_qkv"] = (layer.wqkv, (self.q_dim + 2 * self.kv_dim, hidden))
            expected[f"blk.{i}.attn_output"] = (layer.wo, (hidden, self.q_dim))
            expected[f"blk.{i}.ffn_norm"] = (layer.ffn_norm, (hidden,))
            expected[f"blk.{i}.ffn_gate_up"] = (layer.w_gate_up, (2 * ffn, hidden))
            expected[f"blk.{i}.ffn_down"] = (layer.w_down, (hidden, ffn))
        for name, (array, shape) in expected.items():
            if tuple(array.shape) != shape:
                raise UnsupportedModelError(f"tensor {name} has shape {tuple(array.shape)}, expected {shape}")


def _tensor_names(gguf_file) -> set[str]:
    tensors = gguf_file.plan.tensors
    if isinstance(tensors, dict):
        return set(tensors)
    return {t.name for t in tensors}

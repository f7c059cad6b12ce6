"""Random inputs of the forward pass's lookup and attention ops (embedding tables, paged KV pools and
the steps that read them) and the error bound of the attention kernels, shared by the cpu, emulated
and GPU tests of embedding, kv_store and paged_attention.

A sample is a step of several sequences at once: each has a context of `ctx` tokens already in the
paged pools, of which its last `n_query` are this step's query tokens (1 for a decoding sequence, more
for a prompt or a prompt chunk). Every slot of the pools (the null block and unused blocks too)
holds random rows, so a kernel that reads through a wrong block table entry reads wrong values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hipcore.kvcache.dtypes import kv_dtype
from hipcore.ops import embedding, paged_attention
from support.weight_samples import random_weights

U32 = 2.0**-24  # float32 unit roundoff
U16 = 2.0**-11  # float16 unit roundoff


def random_table(rng: np.random.Generator, table_type: str, vocab: int, hidden: int) -> np.ndarray:
    """Raw [vocab, row_bytes] bytes of an embedding table: random quants with finite half scales (and
    Q4_1 / Q5_1 offsets, K-quant mins) of varied sign and size, or random finite floats, some of them f16
    subnormals."""
    if table_type in ("f32", "f16", "bf16"):
        values = rng.standard_normal((vocab, hidden)).astype(np.float32)
        values[:, ::7] *= 1e-6  # subnormal halves, tiny floats
        if table_type == "f32":
            return values.view(np.uint8)
        if table_type == "f16":
            return values.astype(np.float16).view(np.uint8)
        return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    if embedding.BLOCKS[table_type][0] == 256:  # K-quants: the matrix kernels' samples (scales at their offsets)
        return random_weights(rng, table_type, vocab, hidden)
    block_bytes = embedding.BLOCKS[table_type][1]
    blocks = rng.integers(0, 256, (vocab, hidden // 32, block_bytes), dtype=np.uint8)
    scales = (rng.standard_normal((vocab, hidden // 32, 2)) * 0.02).astype(np.float16)
    blocks[..., 0:2] = scales[..., 0:1].view(np.uint8)
    if table_type in ("q4_1", "q5_1"):  # the offset m
        blocks[..., 2:4] = scales[..., 1:2].view(np.uint8)
    return blocks.reshape(vocab, -1)


@dataclass
class PagedSample:
    kv_dtype: str
    n_heads: int
    n_kv_heads: int
    head_dim: int
    block_size: int
    num_blocks: int
    max_blocks: int
    scale: float
    q: np.ndarray  # float32 [T, n_heads, head_dim]
    k_pool: np.ndarray  # uint8 [num_blocks, n_kv_heads, block_size, row_bytes]
    v_pool: np.ndarray
    block_tables: np.ndarray  # int32 [n_seqs, max_blocks]
    token_seq: np.ndarray  # int32 [T]
    positions: np.ndarray  # int32 [T]
    window: int = 0  # sliding window in keys (0: none)
    softcap: float = 0.0  # attention logit soft cap (0: none)

    @property
    def n_tokens(self) -> int:
        return int(self.q.shape[0])

    def reference(self) -> np.ndarray:
        return paged_attention.reference(self.q, self.k_pool, self.v_pool, kv_dtype(self.kv_dtype), self.block_tables,
                                         self.token_seq, self.positions, self.scale, self.window, self.softcap)

    def keys_values(self, seq: int, ctx: int) -> tuple[np.ndarray, np.ndarray]:
        """float64 [n_kv_heads, ctx, head_dim] K and V of a sequence, decoded from the pools."""
        fmt = kv_dtype(self.kv_dtype)
        blocks = self.block_tables[seq, :-(-ctx // self.block_size)].astype(np.int64)
        out = []
        for pool in (self.k_pool, self.v_pool):
            rows = fmt.decode(pool[blocks], self.head_dim).transpose(1, 0, 2, 3).reshape(self.n_kv_heads, -1, self.head_dim)
            out.append(rows[:, :ctx].astype(np.float64))
        return out[0], out[1]

    def tolerance(self) -> np.ndarray:
        """float64 [T, n_heads, head_dim]: how far a kernel's output may be from the reference.

        The kernels decode K and V exactly (the reference decodes the same bytes), so the errors are
        the float32 arithmetic's. For a token of context c and a head with scores S_i = scale * q.k_i,
        weights p_i = softmax(S)_i:
        - each score carries at most (head_dim + 3) roundings of |q||k| products (fma chain, the lanes'
          butterfly, the folding of scale * log2(e) into q): |dS_i| <= (head_dim + 3) u scale sum|q k_i|;
          a weight depends on two scores (its own and the max), so its relative error is twice that;
        - each factor exp2(x - max) along the way (online rescales of a key slot, at most c/8 of them,
          and about 16 merges of key slots, warps and splits) rounds the difference (u * |x - max| <=
          2u max|S| in natural units) and the exponential itself (2 ulp on NVIDIA, less elsewhere): 3u;
        - the weighted sums of V add at most c/4 + 32 roundings (a key slot's own chain, then the merges).
        Together |out - ref| <= (2 dS + (c/8 + 16)(2 max|S| + 3)u + (c/4 + 32)u) * sum_i p_i |v_i|, with a
        10% margin for the second-order terms. A wrong, missing or extra key moves the output by about
        p_i |v_i|, far more at the contexts tested.
        """
        tol = np.zeros(self.q.shape, dtype=np.float64)
        for t, h, k, v, qh in self.visible_rows():
            ctx = len(k)
            scores = (k @ qh) * self.scale
            d_score = (self.head_dim + 3) * U32 * self.scale * np.abs(k * qh).sum(axis=1).max()
            if self.softcap > 0:  # the cap's slope is at most 1; its own arithmetic (the product with
                # 2 / softcap, exp2f's 2 ulp relative to the argument, the sum, the quotient, the
                # difference and the product with the cap) adds at most 8u of |S| + softcap
                scores = self.softcap * np.tanh(scores / self.softcap)
                d_score += 8 * U32 * (np.abs(scores).max() + self.softcap)
            p = np.exp(scores - scores.max())
            p /= p.sum()
            relative = (2 * d_score + (ctx / 8 + 16) * (2 * np.abs(scores).max() + 3) * U32 + (ctx / 4 + 32) * U32)
            tol[t, h] = 1.1 * relative * (p @ np.abs(v))
        return tol + 1e-30  # padding rows: exactly zero

    def visible_rows(self):
        """(token, head, K, V, q) of every real token's head: float64 K and V [keys, head_dim] of the keys the
        token sees (its window's, or all before it and itself), q [head_dim]."""
        group = self.n_heads // self.n_kv_heads
        for t in range(self.n_tokens):
            pos = int(self.positions[t])
            if pos < 0:
                continue
            keys, values = self.keys_values(int(self.token_seq[t]), pos + 1)
            first = int(paged_attention.first_visible(np.array([pos]), self.window)[0])
            for h in range(self.n_heads):
                yield t, h, keys[h // group, first:], values[h // group, first:], self.q[t, h].astype(np.float64)

    def matrix_core_tolerance(self) -> np.ndarray:
        """float64 [T, n_heads, head_dim]: how far prompt_attention (f16 cache, matrix cores) may be from the
        reference, beyond `tolerance`'s float32 bound.

        Over the float32 arithmetic `tolerance` covers (summed in another order, no more roundings; a matrix
        instruction's sums counted twice for their order and rounding): q * scale * log2(e) rounded to f16 moves
        each score by at most u16 * scale * sum|q k|, and a weight (its score and the max) by twice that,
        relatively; each weight rounded to f16 adds u16 relatively, or 2^-25 absolutely where it is an f16
        subnormal (below 2^-14), against a sum of weights of at least 1 (a soft cap, whose slope is at most 1,
        moves no score further). So
        |out - ref| <= 2 tolerance + 1.1 ((2 u16 scale max sum|q k| + u16) sum p|v| + c 2^-25 max|v|)."""
        extra = np.zeros(self.q.shape, dtype=np.float64)
        for t, h, k, v, qh in self.visible_rows():
            scores = (k @ qh) * self.scale
            if self.softcap > 0:  # the weights are the capped scores'; the cap's slope (at most 1) passes dS on
                scores = self.softcap * np.tanh(scores / self.softcap)
            p = np.exp(scores - scores.max())
            p /= p.sum()
            d_score = U16 * self.scale * np.abs(k * qh).sum(axis=1).max()
            extra[t, h] = (2 * d_score + U16) * (p @ np.abs(v)) + len(p) * 2.0**-25 * np.abs(v).max()
        return 2 * self.tolerance() + 1.1 * extra


def make_sample(rng: np.random.Generator, kv: str, n_heads: int, n_kv_heads: int, head_dim: int, block_size: int,
                seqs: list[tuple[int, int]], spare_blocks: int = 3, max_blocks: int | None = None,
                q_scale: float = 1.0, padding: int = 0) -> PagedSample:
    """Sequences (ctx, n_query) in blocks at random places of the pools, their query tokens in order, then
    `padding` padding tokens (position -1). q_scale widens the scores: larger makes attention peakier."""
    fmt = kv_dtype(kv)
    need = [-(-ctx // block_size) for ctx, _ in seqs]
    max_blocks = max_blocks or max(need)
    num_blocks = 1 + sum(need) + spare_blocks
    order = rng.permutation(np.arange(1, num_blocks))
    tables = np.zeros((len(seqs), max_blocks), np.int32)
    start = 0
    for s, n in enumerate(need):
        tables[s, :n] = order[start:start + n]
        start += n
    pools = [fmt.encode(rng.standard_normal((num_blocks, n_kv_heads, block_size, head_dim)).astype(np.float32))
             for _ in range(2)]
    token_seq = np.array([s for s, (_, n) in enumerate(seqs) for _ in range(n)] + [0] * padding, np.int32)
    positions = np.array([p for ctx, n in seqs for p in range(ctx - n, ctx)] + [-1] * padding, np.int32)
    q = (rng.standard_normal((len(token_seq), n_heads, head_dim)) * q_scale).astype(np.float32)
    scale = float(np.float32(1.0 / np.sqrt(head_dim)))  # what the kernel gets, so the reference uses it too
    return PagedSample(kv, n_heads, n_kv_heads, head_dim, block_size, num_blocks, max_blocks, scale,
                       q, pools[0], pools[1], tables, token_seq, positions)


def windowed(sample: PagedSample, window: int) -> PagedSample:
    """`sample` attended through a sliding window of `window` keys, as a sliding-window KV cache holds it:
    every block-table entry wholly before all of a sequence's windows points at the null block 0, and
    block 0 of both pools is all-ones bytes (NaN in every KV format: a float16/bfloat16/float32 NaN, or a
    Q8_0 block whose scale is NaN), so an attention that read a key outside the window would give NaN."""
    tables = sample.block_tables.copy()
    for s in range(tables.shape[0]):
        pos = sample.positions[(sample.token_seq == s) & (sample.positions >= 0)]
        if pos.size:
            first = int(paged_attention.first_visible(pos, window).min())
            tables[s, :first // sample.block_size] = 0
    pools = []
    for pool in (sample.k_pool, sample.v_pool):
        pool = pool.copy()
        pool[0] = 0xFF
        pools.append(pool)
    return PagedSample(**{**sample.__dict__, "block_tables": tables, "k_pool": pools[0], "v_pool": pools[1],
                          "window": window})

"""The forward pass's lookups and attention (embedding, select_rows, kv_store, paged_attention) run on
the CPU under the kernel-language emulation (tests/support/emulated_kernels.py) against their numpy references,
at warp 32 and 64."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.ops import embedding, kv_store, paged_attention, select_rows
from hipcore.ops.weight_formats import dequantize_rows
from hipcore.kvcache.dtypes import KV_DTYPES, kv_dtype
from support.forward_pass_samples import PagedSample, make_sample, random_table
from support.emulated_kernels import ARCH_FOR_WARP, run, write_inputs


# ---- embedding, select_rows, kv_store, paged_attention: the lookups and attention of the forward pass


def test_embedding(harnesses, warp, tmp_path):
    """Every table format, bit for bit (the decoding is exact); an id past the vocabulary gives zeros."""
    rng = np.random.default_rng([warp, 21])
    vocab, n_tokens = 37, 6
    for table_type in embedding.TABLE_TYPES:
        # an odd width where the format allows it; two super-blocks a row for the K-quants
        hidden = {1: 7, 32: 96, 256: 512}[embedding.BLOCKS[table_type][0]]
        raw = random_table(rng, table_type, vocab, hidden)
        ids = rng.integers(0, vocab, n_tokens).astype(np.int32)
        ids[-1] = vocab
        paths = write_inputs(tmp_path, table=raw, ids=ids)
        want = embedding.reference(raw, table_type, ids[:-1], vocab, hidden)
        grid, block = embedding.geometry(n_tokens, hidden)
        for g in sorted({grid, 2}):  # the launcher's grid, and one the kernel must stride over
            run(harnesses, warp, f"embedding_{table_type}", g, block, n_tokens, hidden, vocab, *paths, tmp_path / "o")
            got = np.fromfile(tmp_path / "o", np.float32).reshape(n_tokens, hidden)
            assert np.array_equal(got[:-1].view(np.uint32), want.view(np.uint32)), f"{table_type} grid {g}"
            assert np.array_equal(got[-1], np.zeros(hidden, np.float32)), table_type


def test_k_quant_tables_round_where_the_host_rounds(harnesses, warp, tmp_path):
    """Q4_K and Q5_K's d * sc * q - dmin * m is the one decode that rounds in float32: rows where it
    does (checked against the exact float64 value) and rows of zeros of either sign (every term zero)
    come out bit for bit as on the host."""
    rng = np.random.default_rng([warp, 24])
    vocab, hidden, n_tokens = 16, 256, 16
    for table_type in ("q4_k", "q5_k"):
        raw = random_table(rng, table_type, vocab, hidden)
        blocks = raw.reshape(vocab, 1, 144 if table_type == "q4_k" else 176)
        # rows 0-7: every scale and min 0, d and dmin in each of the four sign pairs: zeros of both signs
        blocks[:8, 0, 4:16] = 0
        signs = np.array([(1, 1), (1, -1), (-1, 1), (-1, -1)] * 2)
        blocks[:8, 0, 0:4] = (signs * rng.uniform(1e-3, 1e-2, (8, 2))).astype(np.float16).view(np.uint8)
        # d near 1 and dmin near 2^-12: the difference spans more than float32's 24 bits, so it rounds
        d = rng.uniform(0.5, 2.0, (8, 1)) * rng.choice([-1, 1], (8, 1))
        blocks[8:, 0, 0:2] = d.astype(np.float16).view(np.uint8)
        blocks[8:, 0, 2:4] = (d * rng.uniform(1e-4, 4e-4, (8, 1))).astype(np.float16).view(np.uint8)
        exact = dequantize_rows(raw, table_type, hidden, np.float64)
        want = embedding.reference(raw, table_type, np.arange(vocab), vocab, hidden)
        assert (want[8:] != exact[8:]).mean() > 0.3, "the sample must make the kernel round"
        assert not want[:8].any() and 0 < np.signbit(want[:8]).sum() < want[:8].size
        ids = np.arange(n_tokens, dtype=np.int32)
        paths = write_inputs(tmp_path, table=raw, ids=ids)
        run(harnesses, warp, f"embedding_{table_type}", *embedding.geometry(n_tokens, hidden), n_tokens, hidden, vocab,
            *paths, tmp_path / "o")
        got = np.fromfile(tmp_path / "o", np.float32).reshape(n_tokens, hidden)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), table_type


def test_select_rows(harnesses, warp, tmp_path):
    rng = np.random.default_rng([warp, 22])
    x = rng.standard_normal((9, 300)).astype(np.float32)
    rows = np.array([8, 0, 3, 3, -1, 9], np.int32)  # repeats; -1 and 9 are outside x and give zero rows
    paths = write_inputs(tmp_path, x=x, rows=rows)
    grid, block = select_rows.geometry(len(rows), 300)
    for g in sorted({grid, 1}):
        run(harnesses, warp, "select_rows_f32", g, block, len(rows), 300, 9, *paths, tmp_path / "o")
        got = np.fromfile(tmp_path / "o", np.float32).reshape(len(rows), 300)
        assert np.array_equal(got[:4], select_rows.reference(x, rows[:4])) and not got[4:].any()


@pytest.mark.parametrize("kv", list(KV_DTYPES))
def test_kv_store(harnesses, warp, kv, tmp_path):
    """The stored bytes equal the host codec's; padding slots (-1) and slots past the pool are skipped,
    and every byte not written keeps its old value."""
    rng = np.random.default_rng([warp, 23, len(kv)])
    fmt = kv_dtype(kv)
    for n_kv_heads, head_dim, block_size, n_tokens in [(3, 64, 16, 7), (1, 32, 1, 3), (2, 96, 8, 11)]:
        num_blocks = 2 + -(-n_tokens // block_size) * 2
        pools = [rng.integers(0, 256, (num_blocks, n_kv_heads, block_size, fmt.row_bytes(head_dim)), dtype=np.uint8)
                 for _ in range(2)]
        k, v = ((rng.standard_normal((n_tokens, n_kv_heads, head_dim)) * rng.uniform(1e-3, 1e3)).astype(np.float32)
                for _ in range(2))
        k[0, 0, :32] = 0.0  # an all-zero q8_0 block: scale 0, no division by zero
        v[0, 0, :32] = np.arange(32, dtype=np.float32) - 15.5  # q8_0: halves round away from zero
        slots = rng.choice(np.arange(block_size, num_blocks * block_size), n_tokens, replace=False).astype(np.int32)
        slots[1] = -1
        slots[-1] = num_blocks * block_size  # past the pool
        valid = (slots >= 0) & (slots < num_blocks * block_size)
        want = [pool.copy() for pool in pools]
        for pool, rows in zip(want, (k, v)):
            kv_store.reference(pool, rows[valid], slots[valid], fmt)
        paths = write_inputs(tmp_path, k=k, v=v, slots=slots, k_pool=pools[0], v_pool=pools[1])
        for g in sorted({min(n_tokens, 65535), 2}):
            run(harnesses, warp, f"kv_store_{kv}", g, kv_store.THREADS, n_tokens, n_kv_heads, head_dim, block_size,
                num_blocks, *paths, tmp_path / "ko", tmp_path / "vo")
            for name, expected in (("ko", want[0]), ("vo", want[1])):
                got = np.fromfile(tmp_path / name, np.uint8).reshape(expected.shape)
                assert np.array_equal(got, expected), f"{kv} {name} heads {n_kv_heads} head_dim {head_dim} grid {g}"


# (n_heads, n_kv_heads, head_dim, block_size, sequences as (context, query tokens), padding tokens)
ATTENTION_CASES = [
    (9, 3, 64, 16, [(1, 1), (30, 1), (100, 1), (12, 4)], 1),  # the demo model's heads: decodes, a prompt chunk
    (4, 4, 32, 8, [(70, 1), (9, 9)], 0),  # no grouping; 4 lanes per key
    (8, 2, 128, 32, [(100, 1), (33, 3)], 0),  # 4 query heads per KV head; 16 lanes per key
    (7, 1, 96, 4, [(65, 2)], 0),  # 7 query heads: chunks of 4 and 3; 12 of 16 lanes per key
    (9, 3, 64, 16, [(300, 1), (1, 1)], 1),  # a small decode launch: one workgroup per query head
    (9, 3, 64, 16, [(700, 1)], 0),  # past the spread's contexts: keys split over workgroups, then combined
    (8, 2, 64, 16, [(290, 1)] * 9, 0),  # too many tokens to spread: chunks of 4 heads, 3 splits each
]


def run_attention(harnesses, warp, tmp_path, sample, workspace: bool, positions=None, block_tables=None):
    """The kernel's output for `sample` (optionally with other positions or tables) and the workspace
    after the launch, with the launcher's geometry."""
    s = sample
    max_keys = min(s.window, s.max_blocks * s.block_size) if s.window else s.max_blocks * s.block_size
    splits = paged_attention.split_limit(s.n_tokens, s.n_heads, s.n_kv_heads, max_keys) if workspace else 1
    slots = paged_attention.slot_count(s.n_tokens, s.n_heads, s.n_kv_heads, splits)
    ws_bytes = paged_attention.workspace_bytes(s.n_tokens, s.n_heads, s.n_kv_heads, s.head_dim, slots) if splits > 1 else 0
    grid, block = paged_attention.geometry(ARCH_FOR_WARP[warp], s.n_tokens, s.n_heads, s.n_kv_heads, slots)
    paths = write_inputs(tmp_path, q=s.q, k_pool=s.k_pool, v_pool=s.v_pool,
                  tables=s.block_tables if block_tables is None else block_tables, token_seq=s.token_seq,
                  positions=s.positions if positions is None else positions)
    run(harnesses, warp, paged_attention.kernel_name(s.kv_dtype, s.softcap > 0), grid, block, s.n_tokens, s.n_heads, s.n_kv_heads, s.head_dim,
        s.block_size, s.max_blocks, s.num_blocks, slots, s.window, s.scale, s.softcap, *paths, ws_bytes, tmp_path / "o",
        tmp_path / "ws")
    got = np.fromfile(tmp_path / "o", np.float32).reshape(s.q.shape)
    return got, np.fromfile(tmp_path / "ws", np.uint8), splits


@pytest.mark.parametrize("kv", list(KV_DTYPES))
def test_paged_attention(harnesses, warp, kv, tmp_path):
    """Decode and prompt tokens of several sequences in one launch, against the reference, with and
    without splitting keys over workgroups; after a split launch the counters are back at zero."""
    rng = np.random.default_rng([warp, 24, len(kv)])
    # The emulation costs a host thread per GPU thread: f16 (the default KV dtype) gets every case, the
    # other formats, which differ only in how a row is loaded and decoded, the demo model's.
    for n_heads, n_kv_heads, head_dim, block_size, seqs, padding in ATTENTION_CASES[:None if kv == "f16" else 1]:
        sample = make_sample(rng, kv, n_heads, n_kv_heads, head_dim, block_size, seqs, padding=padding, q_scale=2.0)
        want, tol = sample.reference(), sample.tolerance()
        for workspace in (True, False) if n_heads == 9 and kv == "f16" else (True,):
            got, ws, max_splits = run_attention(harnesses, warp, tmp_path, sample, workspace)
            bad = ~(np.abs(got - want) <= tol)
            assert not bad.any(), (f"{kv} {n_heads}/{n_kv_heads}x{head_dim} splits {max_splits}: {int(bad.sum())} off, "
                                   f"worst {float((np.abs(got - want) / tol).max()):.1f} x tolerance")
            assert not got[sample.positions < 0].any(), "padding tokens give zero rows"
            if workspace and max_splits > 1:
                n_counters = sample.n_tokens * n_kv_heads * paged_attention.head_chunks(n_heads, n_kv_heads)
                assert not ws[:4 * n_counters].any(), "the counters are left at zero"


def test_paged_attention_tolerance_catches_wrong_keys(harnesses, tmp_path):
    """The bound of the tests above is tight enough to fail the mistakes an attention kernel makes:
    one key too many (an off-by-one in the causal limit), a key from the wrong block, a query head
    reading the wrong KV head."""
    rng = np.random.default_rng(25)
    sample = make_sample(rng, "f16", 8, 2, 64, 16, [(150, 1), (37, 2)], q_scale=2.0)
    want, tol = sample.reference(), sample.tolerance()
    got, _, _ = run_attention(harnesses, 32, tmp_path, sample, workspace=True)
    assert np.all(np.abs(got - want) <= tol)

    one_more, _, _ = run_attention(harnesses, 32, tmp_path, sample, True, positions=sample.positions + 1)
    unused = sorted(set(range(1, sample.num_blocks)) - set(sample.block_tables.ravel().tolist()))
    other = sample.block_tables.copy()
    other[0, 5] = unused[0]  # 16 keys of sequence 0 read from a block it does not own
    wrong_block, _, _ = run_attention(harnesses, 32, tmp_path, sample, True, block_tables=other)
    for name, bad in (("one key too many", one_more), ("a wrong block", wrong_block)):
        assert (np.abs(bad - want) > tol).any(), name
    regrouped = sample.q.reshape(sample.n_tokens, 4, 2, 64).transpose(0, 2, 1, 3).reshape(sample.q.shape)
    crossed = PagedSample(**{**sample.__dict__, "q": regrouped}).reference()  # head h reading KV head h % 2
    crossed = crossed.reshape(sample.n_tokens, 2, 4, 64).transpose(0, 2, 1, 3).reshape(sample.q.shape)
    assert (np.abs(crossed - want) > tol).any(), "a query head reading another group's KV head"

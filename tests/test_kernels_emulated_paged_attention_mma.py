"""paged_attention's matrix-core entries (kernels/paged_attention_mma.h: a group's query heads as the rows of a matrix
tile, 16 keys a warp and step) on every matrix-core path of matrix_cores.h, run on the CPU: the NVIDIA mma.sync
fragments at 32 lanes, CDNA's MFMA at 64, RDNA3's and RDNA4's WMMA at 32 and the FMA path at both widths, each against
tests/kernel_emulation/emulation.h's emulation of its instruction, against paged_attention's numpy reference within
PagedSample.matrix_core_tolerance, with the launcher's geometry (hipcore/ops/paged_attention.py's mma_chunking). The
launches are what decoding gives the kernel: one token a sequence, keys split over workgroups and combined (the
counters left at zero), a split's last step partly past its keys, groups of 8 (Qwen3-30B-A3B's and gpt-oss's), 12 and
16 (two chunks at a head of 128), heads of 32, 64 and 128, blocks of 4 to 16 (a step's 16 keys across blocks),
gpt-oss's sliding window and sinks, a prompt chunk and padding in the same launch. Planted faults (keys past the split
counted, the output not rescaled when a row's max grows, every warp walking the same keys, V's pairs transposed
crosswise) prove the comparison catches what such a kernel gets wrong."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.ops import paged_attention
from support.emulated_kernels import ARCH_FOR_WARP, MMA_KINDS, U32, build_mma_harnesses, run_mma, write_inputs
from support.forward_pass_samples import make_sample, windowed

OP = "paged_attention"

# (n_heads, n_kv_heads, head_dim, block_size, sequences as (context, query tokens), padding tokens, window)
CASES = [
    (16, 2, 128, 16, [(300, 1), (45, 1)], 0, 0),  # Qwen3-30B-A3B's group of 8 and head of 128: splits of 128 keys
    (16, 2, 64, 8, [(200, 1), (9, 3)], 1, 128),  # gpt-oss's heads of 64, its window; a prompt chunk and padding
    (24, 2, 64, 4, [(150, 1)], 0, 0),  # a group of 12: rows 12-15 unused; blocks of 4
    (16, 1, 128, 16, [(260, 1)], 0, 0),  # a group of 16 at a head of 128: two chunks of 8, each split
    (16, 1, 32, 16, [(61, 1)], 0, 0),  # a group of 16 at a head of 32: one chunk of 16
]


@pytest.fixture(scope="module")
def harnesses(tmp_path_factory):
    return build_mma_harnesses(tmp_path_factory.mktemp("kernel_emulation_paged_attention_mma"), op=OP)


def run_kernel(harness, warp: int, sample, tmp_path, sinks=None) -> tuple[np.ndarray, np.ndarray, int]:
    """The matrix-core entry's output for `sample` (NaN where it wrote nothing), its workspace after the launch and
    the most splits the launcher allows, with the launcher's geometry and a full workspace."""
    s = sample
    chunking = paged_attention.mma_chunking(s.head_dim)
    max_keys = min(s.window, s.max_blocks * s.block_size) if s.window else s.max_blocks * s.block_size
    splits = paged_attention.split_limit(s.n_tokens, s.n_heads, s.n_kv_heads, max_keys, chunking)
    slots = paged_attention.slot_count(s.n_tokens, s.n_heads, s.n_kv_heads, splits, chunking)
    ws_bytes = paged_attention.workspace_bytes(s.n_tokens, s.n_heads, s.n_kv_heads, s.head_dim, slots, chunking)
    grid, block = paged_attention.geometry(ARCH_FOR_WARP[warp], s.n_tokens, s.n_heads, s.n_kv_heads, slots)
    paths = write_inputs(tmp_path, q=s.q, k_pool=s.k_pool, v_pool=s.v_pool, tables=s.block_tables,
                         token_seq=s.token_seq, positions=s.positions,
                         **({} if sinks is None else {"sinks": np.asarray(sinks, np.float32)}))
    entry = paged_attention.kernel_name("f16", sinks=sinks is not None, mma_head_dim=s.head_dim)
    run_mma(harness, entry, grid, block, s.n_tokens, s.n_heads, s.n_kv_heads, s.head_dim, s.block_size, s.max_blocks,
            s.num_blocks, slots, s.window, s.scale, 0.0, *paths[:6], ws_bytes, tmp_path / "o", tmp_path / "ws",
            *paths[6:])
    got = np.fromfile(tmp_path / "o", np.float32).reshape(s.q.shape)
    return got, np.fromfile(tmp_path / "ws", np.uint8), splits


def case_sample(rng, case):
    n_heads, n_kv_heads, head_dim, block_size, seqs, padding, window = case
    sample = make_sample(rng, "f16", n_heads, n_kv_heads, head_dim, block_size, seqs, padding=padding, q_scale=2.0)
    return windowed(sample, window) if window else sample


def worst_excess(got, want, tol) -> float:
    """max |got - want| / tolerance (<= 1 passes; an unwritten or NaN output counts as infinitely far)."""
    return float(np.max(np.where(np.isfinite(got), np.abs(got - want) / tol, np.inf)))


@pytest.mark.parametrize("kind", list(MMA_KINDS))
def test_matrix_core_entries_match_the_reference(harnesses, kind, tmp_path):
    warp = MMA_KINDS[kind][1]
    rng = np.random.default_rng([warp, MMA_KINDS[kind][0], 51])
    split_cases = 0
    for case in CASES:
        sample = case_sample(rng, case)
        want, tol = sample.reference(), sample.matrix_core_tolerance()
        got, ws, splits = run_kernel(harnesses[kind], warp, sample, tmp_path)
        split_cases += splits > 1
        excess = worst_excess(got, want, tol)
        assert excess <= 1, f"{kind} {case[:4]} splits {splits}: worst {excess:.2f} x tolerance"
        assert not got[sample.positions < 0].any(), "padding tokens give zero rows"
        if splits > 1:
            chunks = paged_attention.head_chunks(sample.n_heads, sample.n_kv_heads,
                                                 paged_attention.mma_chunking(sample.head_dim))
            assert not ws[:4 * sample.n_tokens * sample.n_kv_heads * chunks].any(), "the counters are left at zero"
    assert split_cases >= 3, "the cases reach the split path and the combine"


@pytest.mark.parametrize("kind", ["nvidia_mma", "cdna_mfma", "rdna3_wmma"])
def test_matrix_core_sinks_entries(harnesses, kind, tmp_path):
    """The `_sinks` entries (gpt-oss): the sink joins the denominator once, in the workgroup's merge or the combine."""
    warp = MMA_KINDS[kind][1]
    rng = np.random.default_rng([warp, 52])
    for case in CASES[:2]:
        sample = case_sample(rng, case)
        sinks = (rng.standard_normal(sample.n_heads) * 2).astype(np.float32)
        sinks[0] = 30.0  # a sink far above every score: that head's output shrinks towards zero
        want = paged_attention.reference(sample.q, sample.k_pool, sample.v_pool, paged_attention.KV_DTYPES["f16"],
                                         sample.block_tables, sample.token_seq, sample.positions, sample.scale,
                                         sample.window, 0.0, sinks)
        tol = sample.matrix_core_tolerance() + 8 * U32 * np.abs(want)
        got, _, splits = run_kernel(harnesses[kind], warp, sample, tmp_path, sinks)
        assert worst_excess(got, want, tol) <= 1, f"{kind} {case[:4]} splits {splits}"
        assert (np.abs(sample.reference() - want) > tol).any()  # the sinks change the output beyond the bound


# (what is planted, old text, new text) in kernels/paged_attention_mma.h
FAULTS = [
    ("keys past the split counted", "if (k0 + rf_mma_acc_col(lane, e) >= k_end) s[e] = -RF_INFINITY;", ""),
    ("the output not rescaled", "for (int c = 0; c < T::kTiles; ++c) o[c][e] *= mx[r];", ""),
    ("every warp walking the same keys", "int k0 = k_begin + warp * kMmaKeys;", "int k0 = k_begin;"),
    ("V's pairs transposed crosswise", "T::kVStride, 8 * (e / kPairs), 2 * (e % kPairs), va[i], vb[i]",
     "T::kVStride, 8 * (e / kPairs), 2 * (e % kPairs), vb[i], va[i]"),
]


@pytest.mark.parametrize("fault, old, new", FAULTS, ids=[f[0] for f in FAULTS])
def test_planted_faults_are_caught(fault, old, new, tmp_path):
    harness = build_mma_harnesses(tmp_path, ("nvidia_mma",), kernel_edit=lambda text: text.replace(old, new),
                                  op=OP)["nvidia_mma"]
    rng = np.random.default_rng([32, 1, 51])
    sample = case_sample(rng, CASES[0])
    got, _, _ = run_kernel(harness, 32, sample, tmp_path)
    assert worst_excess(got, sample.reference(), sample.matrix_core_tolerance()) > 1, fault

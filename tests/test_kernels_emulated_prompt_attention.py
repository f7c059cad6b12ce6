"""kernels/prompt_attention.hip on every matrix-core path of matrix_cores.h, run on the CPU: the NVIDIA mma.sync
fragments at 32 lanes, CDNA's MFMA at 64, RDNA3's and RDNA4's WMMA at 32 and the FMA path at both widths, each
against tests/kernel_emulation/emulation.h's emulation of its instruction, against paged_attention's numpy
reference within PagedSample.matrix_core_tolerance. The steps mix what the forward pass gives the kernel: a
prompt chunk after cached tokens, a prompt from the start, decode tokens and padding in one launch (so that
a workgroup's tokens span sequences), groups of 1 to 8 query heads, head sizes of 1 to 8 matrix tiles and
Gemma's 16 (the wide tile: two warps a row tile, each with half the columns, and 16 keys a step), sliding
windows, Gemma 2's soft cap. Planted faults (a row reduced over too few lanes, a token that does not see itself,
runs that ignore the sequence, a window one key short, the wide tile stepping over keys, reading another warp's
columns or splitting its heads unlike the launcher, a cap left out, taken in natural units or applied after the
mask) prove the comparison catches what such a kernel gets wrong. The `_sinks` entries (gpt-oss's sink logit per query
head) against paged_attention's reference with sinks; the sink left out of the denominator, planted, is caught.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hipcore.kvcache.dtypes import kv_dtype
from hipcore.ops import paged_attention, prompt_attention
from support.emulated_kernels import ARCH_FOR_WARP, MMA_KINDS, U32, build_mma_harnesses, run_mma, write_inputs
from support.forward_pass_samples import make_sample, windowed

OP = "prompt_attention"

# (n_heads, n_kv_heads, head_dim, block_size, sequences as (context, query tokens), padding tokens, window)
CASES = [
    (8, 2, 128, 16, [(45, 40), (20, 20), (70, 1)], 3, 0),  # Llama 3's group of 4 and head of 128; mixed runs
    (2, 2, 32, 8, [(90, 70)], 0, 0),  # no grouping: one head per workgroup, 64 tokens
    (6, 3, 64, 16, [(50, 33), (9, 9)], 2, 20),  # groups of 2; a sliding window shorter than the prompt
    (8, 1, 48, 4, [(37, 37)], 0, 0),  # a group of 8: two chunks of 4 heads; 3 matrix tiles of head_dim
    (3, 1, 16, 16, [(18, 18)], 0, 0),  # a group of 3: one head per warp and workgroup; one tile of head_dim
    (4, 2, 112, 16, [(24, 20)], 1, 0),  # head sizes 112 and 80 (the entries with 7 and 5 tiles)
    (4, 1, 80, 8, [(30, 17)], 0, 12),
    (4, 2, 256, 16, [(40, 33), (5, 1)], 2, 0),  # Gemma's heads of 256 (Gemma-2-9B's group of 2): the wide tile
    (4, 1, 256, 8, [(50, 35)], 0, 18),  # the wide tile's group of 4 (Gemma 3 1B's): two chunks of 2; a window
]
# (case, soft cap): Gemma 2's capped entries at its head sizes, with caps small enough to change the weights
SOFTCAP_CASES = [((4, 2, 256, 16, [(40, 33)], 1, 0), 2.0), ((8, 2, 128, 16, [(45, 40), (20, 20)], 0, 0), 3.0)]


@pytest.fixture(scope="module")
def harnesses(tmp_path_factory):
    return build_mma_harnesses(tmp_path_factory.mktemp("kernel_emulation_prompt_attention"), op=OP)


def run_kernel(harness, warp: int, sample, tmp_path, out_f16: bool = False, sinks=None) -> np.ndarray:
    """The kernel's output for `sample` (its soft cap's entry, or with `sinks` the sink entry) with the launcher's
    geometry (NaN where it wrote nothing); out_f16: written as f16 (returned as float32 values)."""
    s = sample
    grid, block = prompt_attention.geometry(ARCH_FOR_WARP[warp], s.n_tokens, s.n_heads, s.n_kv_heads, s.head_dim)
    paths = write_inputs(tmp_path, q=s.q, k_pool=s.k_pool, v_pool=s.v_pool, tables=s.block_tables,
                         token_seq=s.token_seq, positions=s.positions,
                         **({} if sinks is None else {"sinks": np.asarray(sinks, np.float32)}))
    run_mma(harness, prompt_attention.kernel_name(s.head_dim, s.softcap > 0, sinks is not None), grid, block,
            s.n_tokens, s.n_heads, s.n_kv_heads, s.head_dim, s.block_size, s.max_blocks, s.num_blocks, s.window,
            s.scale, *paths[:6], tmp_path / "out", int(out_f16), repr(float(s.softcap)), *paths[6:])
    return np.fromfile(tmp_path / "out", np.float16 if out_f16 else np.float32).astype(np.float32).reshape(s.q.shape)


def worst_excess(harness, warp, sample, tmp_path) -> float:
    """max |got - want| / tolerance (<= 1 passes; an unwritten or NaN output counts as infinitely far)."""
    got = run_kernel(harness, warp, sample, tmp_path)
    want, tol = sample.reference(), sample.matrix_core_tolerance()
    return float(np.max(np.where(np.isfinite(got), np.abs(got - want) / tol, np.inf)))


def case_sample(rng, case, softcap: float = 0.0):
    n_heads, n_kv_heads, head_dim, block_size, seqs, padding, window = case
    sample = make_sample(rng, "f16", n_heads, n_kv_heads, head_dim, block_size, seqs, padding=padding, q_scale=2.0)
    sample = windowed(sample, window) if window else sample
    return dataclasses.replace(sample, softcap=softcap) if softcap else sample


@pytest.mark.parametrize("kind", list(MMA_KINDS))
def test_prompt_attention_matches_the_reference(harnesses, kind, tmp_path):
    warp = MMA_KINDS[kind][1]
    rng = np.random.default_rng([31, MMA_KINDS[kind][0], warp])
    for case in CASES:
        sample = case_sample(rng, case)
        got = run_kernel(harnesses[kind], warp, sample, tmp_path)
        want, tol = sample.reference(), sample.matrix_core_tolerance()
        excess = np.where(np.isfinite(got), np.abs(got - want) / tol, np.inf)
        assert excess.max() <= 1, f"{kind} {case[:3]}: worst {excess.max():.2f} x tolerance, {int((excess > 1).sum())} off"
        assert not got[sample.positions < 0].any(), f"{kind}: padding tokens give zero rows"


@pytest.mark.parametrize("kind", list(MMA_KINDS))
def test_the_capped_entries_match_the_capped_reference(harnesses, kind, tmp_path):
    """Gemma 2's soft cap: within the tolerance of the capped reference, and far from the uncapped one (the caps
    are small enough that leaving them out would show)."""
    warp = MMA_KINDS[kind][1]
    rng = np.random.default_rng([35, MMA_KINDS[kind][0], warp])
    for case, cap in SOFTCAP_CASES:
        sample = case_sample(rng, case, cap)
        got = run_kernel(harnesses[kind], warp, sample, tmp_path)
        want, tol = sample.reference(), sample.matrix_core_tolerance()
        excess = np.where(np.isfinite(got), np.abs(got - want) / tol, np.inf)
        assert excess.max() <= 1, f"{kind} {case[:3]} cap {cap}: worst {excess.max():.2f} x tolerance"
        uncapped = dataclasses.replace(sample, softcap=0.0).reference()
        assert (np.abs(uncapped - want) / tol).max() > 10, "the cap must matter at this case"


@pytest.mark.parametrize("fault,old,new,kinds,case", [
    ("a row reduced over half its lanes", "constexpr int kRowLanes = 4;", "constexpr int kRowLanes = 2;", ("nvidia_mma",), 0),
    ("a row reduced over half its lanes", "constexpr int kRowLanes = 16;", "constexpr int kRowLanes = 8;",
     ("cdna_mfma", "rdna3_wmma", "rdna4_wmma"), 0),
    ("a token that does not see itself", "key > row_last[r]", "key >= row_last[r]", ("nvidia_mma", "cdna_mfma"), 0),
    ("runs that ignore the sequence", "sh.pos[re] >= 0 && sh.seq[re] == seq", "sh.pos[re] >= 0", ("rdna4_wmma",), 0),
    ("a window one key short", "row_last[r] - key > window_keys", "row_last[r] - key >= window_keys", ("nvidia_mma",), 2),
    ("the wide tile stepping over the narrow one's 32 keys", "k0 <= hi; k0 += kKeys)", "k0 <= hi; k0 += 32)",
     ("nvidia_mma", "cdna_mfma"), 7),
    ("a column split's second warp reading the first's V columns", "sh.vt + 16 * (part * NO + c) * kVStride",
     "sh.vt + 16 * c * kVStride", ("nvidia_mma", "rdna3_wmma"), 7),
    ("the wide tile's heads a workgroup not the launcher's", "group % 2 == 0 ? 2 : 1", "group % 2 == 0 && HD < 256 ? 2 : 1",
     ("nvidia_mma",), 7),
])
def test_planted_faults_are_caught(fault, old, new, kinds, case, tmp_path):
    built = build_mma_harnesses(tmp_path, kinds, kernel_edit=lambda text: text.replace(old, new), op=OP)
    rng = np.random.default_rng(32)
    sample = case_sample(rng, CASES[case])
    for kind in kinds:
        assert worst_excess(built[kind], MMA_KINDS[kind][1], sample, tmp_path) > 1, f"{fault} not caught on {kind}"


@pytest.mark.parametrize("fault,old,new", [
    ("the cap left out", "if (kCap) {", "if (false) {"),
    ("the cap taken in natural units", "p.softcap * kLog2e : 0.0f", "p.softcap : 0.0f"),
    ("the cap after the mask (masked keys at -cap)", "s[n][e] = -RF_INFINITY;", "s[n][e] = kCap ? -cap : -RF_INFINITY;"),
])
def test_planted_cap_faults_are_caught(fault, old, new, tmp_path):
    kinds = ("nvidia_mma", "rdna3_wmma")
    built = build_mma_harnesses(tmp_path, kinds, kernel_edit=lambda text: text.replace(old, new), op=OP)
    case, cap = SOFTCAP_CASES[0]
    sample = case_sample(np.random.default_rng(36), case, cap)
    for kind in kinds:
        assert worst_excess(built[kind], MMA_KINDS[kind][1], sample, tmp_path) > 1, f"{fault} not caught on {kind}"


@pytest.mark.parametrize("kind", ["nvidia_mma", "cdna_mfma", "rdna3_wmma", "fma32"])
def test_the_f16_output_is_the_float32_output_rounded(harnesses, kind, tmp_path):
    """out_f16 (the o product's f16 x): every value is the float32 output rounded to f16, nothing else moves."""
    warp = MMA_KINDS[kind][1]
    rng = np.random.default_rng([33, warp, len(kind)])
    for case in (CASES[1], CASES[3]):
        sample = case_sample(rng, case)
        f32 = run_kernel(harnesses[kind], warp, sample, tmp_path)
        f16 = run_kernel(harnesses[kind], warp, sample, tmp_path, out_f16=True)
        assert np.array_equal(f16, f32.astype(np.float16).astype(np.float32)), f"{kind} {case[:3]}"


def test_f16_output_at_float32_offsets_is_caught(tmp_path):
    built = build_mma_harnesses(tmp_path, ("nvidia_mma",), op=OP, kernel_edit=lambda text: text.replace(
        "reinterpret_cast<unsigned short*>(p.out) + row", "reinterpret_cast<unsigned short*>(p.out + row)"))
    sample = case_sample(np.random.default_rng(34), CASES[1])
    f16 = run_kernel(built["nvidia_mma"], 32, sample, tmp_path, out_f16=True)
    assert not np.array_equal(f16, sample.reference().astype(np.float16).astype(np.float32))
    want, tol = sample.reference(), sample.matrix_core_tolerance()
    assert np.max(np.where(np.isfinite(f16), np.abs(f16 - want) / (tol + 2.0**-11 * np.abs(want)), np.inf)) > 1


# (case, sink mean): gpt-oss's heads of 64 (a group of 8: two chunks of 4 heads) with a window shorter than the prompt
# and decode tokens beside it; heads of 32 (the tiny models'), groups of 2, padding. Sinks of the scores' size, one far
# above every score (its head's rows shrink towards zero).
SINK_CASES = [(8, 1, 64, 16, [(60, 45), (20, 1)], 2, 20), (4, 2, 32, 8, [(50, 40), (9, 9)], 1, 0)]


def sinks_of(rng, n_heads: int) -> np.ndarray:
    sinks = (rng.standard_normal(n_heads) * 2 + 1).astype(np.float32)
    sinks[-1] = 30.0
    return sinks


def sink_excess(harness, warp, sample, sinks, tmp_path) -> tuple[float, np.ndarray, np.ndarray]:
    """(max |got - want| / bound, want, bound): the reference with sinks; the bound matrix_core_tolerance's (the
    sink only lowers each weight, by the same factor) plus the sink's exp and one more term in each sum."""
    got = run_kernel(harness, warp, sample, tmp_path, sinks=sinks)
    want = paged_attention.reference(sample.q, sample.k_pool, sample.v_pool, kv_dtype("f16"), sample.block_tables,
                                     sample.token_seq, sample.positions, sample.scale, sample.window, 0.0, sinks)
    tol = sample.matrix_core_tolerance() + 8 * U32 * np.abs(want)
    return float(np.max(np.where(np.isfinite(got), np.abs(got - want) / tol, np.inf))), want, tol


@pytest.mark.parametrize("kind", list(MMA_KINDS))
def test_the_sink_entries_match_the_reference_with_sinks(harnesses, kind, tmp_path):
    warp = MMA_KINDS[kind][1]
    rng = np.random.default_rng([37, MMA_KINDS[kind][0], warp])
    for case in SINK_CASES:
        sample = case_sample(rng, case)
        sinks = sinks_of(rng, case[0])
        excess, want, tol = sink_excess(harnesses[kind], warp, sample, sinks, tmp_path)
        assert excess <= 1, f"{kind} {case[:3]}: worst {excess:.2f} x tolerance"
        assert (np.abs(sample.reference() - want) / tol).max() > 10, "the sinks must matter at this case"


def test_the_sink_left_out_of_the_denominator_is_caught(tmp_path):
    old = "row_scale[r] = kept / (l[r] * kept + exp2f(sink - top));"
    new = "row_scale[r] = kept / (l[r] * kept);"
    kinds = ("nvidia_mma", "cdna_mfma")
    built = build_mma_harnesses(tmp_path, kinds, kernel_edit=lambda text: text.replace(old, new), op=OP)
    rng = np.random.default_rng(38)
    sample = case_sample(rng, SINK_CASES[0])
    sinks = sinks_of(rng, SINK_CASES[0][0])
    for kind in kinds:
        assert sink_excess(built[kind], MMA_KINDS[kind][1], sample, sinks, tmp_path)[0] > 1, f"not caught on {kind}"

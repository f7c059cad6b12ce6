"""The forward pass's lookups and attention (embedding, select_rows, paged_attention) on the cpu
backend: references against independent computations, the launch path (launcher, loader, host kernel,
device memory), the launchers' checks and the attention launcher's geometry and workspace sizing.
kv_store's host path is tested in test_kv_store.py; the other ops' in test_ops_cpu.py."""

from __future__ import annotations

import numpy as np
import pytest

from support.forward_pass_samples import make_sample, random_table
from hipcore.gguf import quants
from hipcore.kvcache.dtypes import KV_DTYPES, kv_dtype
from hipcore.ops import embedding, paged_attention, prompt_attention, select_rows
from hipcore.runtime import kernels as loader
from hipcore.runtime.errors import DeviceError


def to_device(dev, array: np.ndarray, tag: str = "activations"):
    buf = dev.allocate(max(array.nbytes, 4), tag)
    buf.upload(np.ascontiguousarray(array))
    return buf


def poisoned(dev, nbytes: int):
    buf = dev.allocate(nbytes, "activations")
    buf.fill(0xFF)  # NaN in every float: an element the kernel forgets to write shows up
    return buf


# ---- embedding ---------------------------------------------------------------------------------


@pytest.mark.parametrize("table_type", list(embedding.TABLE_TYPES))
def test_embedding_decoder_equals_gguf(table_type):
    """Our exact decoder (the reference, usable without gguf) against the gguf package's, bit for bit."""
    rng = np.random.default_rng(len(table_type))
    hidden = 512 if embedding.BLOCKS[table_type][0] == 256 else 96  # K-quants: two super-blocks a row
    raw = random_table(rng, table_type, 9, hidden)
    theirs = quants.dequantize(raw, embedding.TABLE_TYPES[table_type], (9, hidden))
    ours = embedding.decode_rows(raw, table_type, hidden)
    assert ours.dtype == np.float32 and np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


@pytest.mark.parametrize("table_type", list(embedding.TABLE_TYPES))
def test_embedding_launch(cpu_device, table_type):
    rng = np.random.default_rng([3, len(table_type)])
    vocab, hidden = 50, 256 if embedding.BLOCKS[table_type][0] == 256 else 64
    raw = random_table(rng, table_type, vocab, hidden)
    ids = rng.integers(0, vocab, 7).astype(np.int32)
    table, ids_buf, out = to_device(cpu_device, raw, "weights"), to_device(cpu_device, ids), poisoned(cpu_device, 7 * hidden * 4)
    embedding.launch(cpu_device, None, out, table, ids_buf, 7, hidden, vocab, table_type)
    want = embedding.decode_rows(raw, table_type, hidden)[ids]
    assert np.array_equal(out.download(np.float32).reshape(7, hidden), want)


def test_embedding_refuses_bad_input(cpu_device):
    raw = np.zeros((10, 34), np.uint8)
    table, out = to_device(cpu_device, raw, "weights"), poisoned(cpu_device, 2 * 32 * 4)
    with pytest.raises(DeviceError, match="token id 10 outside"):
        embedding.launch(cpu_device, None, out, table, to_device(cpu_device, np.array([1, 10], np.int32)), 2, 32, 10, "q8_0")
        cpu_device.synchronize()
    ids = to_device(cpu_device, np.array([1, 2], np.int32))
    with pytest.raises(ValueError, match="no kernel for table type 'q3_k'"):
        embedding.launch(cpu_device, None, out, table, ids, 2, 32, 10, "q3_k")
    with pytest.raises(ValueError, match="multiple of 32 elements, not 48"):
        embedding.launch(cpu_device, None, out, table, ids, 2, 48, 10, "q8_0")
    with pytest.raises(ValueError, match="q6_k rows hold a multiple of 256 elements, not 32"):
        embedding.launch(cpu_device, None, out, table, ids, 2, 32, 10, "q6_k")
    with pytest.raises(ValueError, match="table needs 680 bytes"):
        embedding.launch(cpu_device, None, out, table, ids, 2, 64, 10, "q8_0")
    with pytest.raises(ValueError, match="out needs 512 bytes"):
        embedding.launch(cpu_device, None, out, table, to_device(cpu_device, np.zeros(4, np.int32)), 4, 32, 10, "q8_0")


# ---- select_rows -------------------------------------------------------------------------------


def test_select_rows(cpu_device):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 576)).astype(np.float32)
    rows = np.array([5, 0, 5], np.int32)
    xs, out = to_device(cpu_device, x), poisoned(cpu_device, 3 * 576 * 4)
    select_rows.launch(cpu_device, None, out, xs, to_device(cpu_device, rows), 3, 576, 6)
    assert np.array_equal(out.download(np.float32).reshape(3, 576), x[[5, 0, 5]])
    with pytest.raises(ValueError, match="out and x overlap"):
        select_rows.launch(cpu_device, None, xs, xs, to_device(cpu_device, rows), 3, 576, 6)
    with pytest.raises(DeviceError, match="row index outside"):
        select_rows.launch(cpu_device, None, out, xs, to_device(cpu_device, np.array([6], np.int32)), 1, 576, 6)
        cpu_device.synchronize()


# ---- paged_attention ---------------------------------------------------------------------------


def naive_attention(sample) -> np.ndarray:
    """Token by token and head by head in float64, from contiguous K/V: the definition itself."""
    out = np.zeros(sample.q.shape, np.float64)
    group = sample.n_heads // sample.n_kv_heads
    for t in range(sample.n_tokens):
        pos = int(sample.positions[t])
        if pos < 0:
            continue
        keys, values = sample.keys_values(int(sample.token_seq[t]), pos + 1)
        for h in range(sample.n_heads):
            scores = keys[h // group] @ sample.q[t, h].astype(np.float64) * sample.scale
            p = np.exp(scores - scores.max())
            out[t, h] = (p / p.sum()) @ values[h // group]
    return out


@pytest.mark.parametrize("kv", list(KV_DTYPES))
@pytest.mark.parametrize("n_heads,n_kv_heads", [(9, 3), (4, 4), (8, 2)])
def test_paged_attention_reference_is_attention(kv, n_heads, n_kv_heads):
    """The reference (batched per sequence) equals attention computed from its definition, for decode and
    prompt tokens mixed in one step, and zero rows for padding tokens."""
    rng = np.random.default_rng([n_heads, len(kv)])
    sample = make_sample(rng, kv, n_heads, n_kv_heads, 64, 16, [(1, 1), (45, 1), (20, 7), (33, 2)], padding=2,
                         q_scale=2.0)
    got = sample.reference()
    np.testing.assert_allclose(got, naive_attention(sample), rtol=1e-5, atol=1e-6)
    assert not got[-2:].any()


def test_paged_attention_launch_with_and_without_workspace(cpu_device):
    rng = np.random.default_rng(5)
    s = make_sample(rng, "f16", 9, 3, 64, 16, [(300, 1), (20, 4)], padding=1)
    args = [to_device(cpu_device, a) for a in (s.q, s.k_pool, s.v_pool, s.block_tables, s.token_seq, s.positions)]
    sizes = dict(n_tokens=s.n_tokens, n_heads=9, n_kv_heads=3, head_dim=64, block_size=16, max_blocks=s.max_blocks,
                 num_blocks=s.num_blocks, scale=s.scale, kv_dtype="f16")
    workspace = cpu_device.allocate(paged_attention.workspace_size(s.n_tokens, 9, 3, 64, s.max_blocks * 16), "scratch")
    workspace.fill(0)
    for ws in (None, workspace):
        out = poisoned(cpu_device, s.q.nbytes)
        paged_attention.launch(cpu_device, None, out, *args, **sizes, workspace=ws)
        np.testing.assert_array_equal(out.download(np.float32).reshape(s.q.shape), s.reference())
    in_place = args[0]  # out may be q
    paged_attention.launch(cpu_device, None, in_place, *args, **sizes)
    np.testing.assert_array_equal(in_place.download(np.float32).reshape(s.q.shape), s.reference())


def test_prompt_attention_launch_computes_attention_and_checks_its_arguments(cpu_device):
    """The launcher end to end on the cpu backend (its host kernel is the reference), out in place of q too;
    what the kernel cannot take (a head size that is no multiple of 16, past 128, a pool too small) is refused."""
    rng = np.random.default_rng(6)
    s = make_sample(rng, "f16", 8, 2, 128, 16, [(300, 40), (20, 4)], padding=1)
    args = [to_device(cpu_device, a) for a in (s.q, s.k_pool, s.v_pool, s.block_tables, s.token_seq, s.positions)]
    sizes = dict(n_tokens=s.n_tokens, n_heads=8, n_kv_heads=2, head_dim=128, block_size=16, max_blocks=s.max_blocks,
                 num_blocks=s.num_blocks, scale=s.scale)
    out = poisoned(cpu_device, s.q.nbytes)
    prompt_attention.launch(cpu_device, None, out, *args, **sizes)
    np.testing.assert_array_equal(out.download(np.float32).reshape(s.q.shape), s.reference())
    out16 = poisoned(cpu_device, s.q.nbytes // 2)
    prompt_attention.launch(cpu_device, None, out16, *args, **sizes, out_f16=True)  # half the bytes
    np.testing.assert_array_equal(out16.download(np.float16).reshape(s.q.shape), s.reference().astype(np.float16))
    with pytest.raises(ValueError, match="out needs"):
        prompt_attention.launch(cpu_device, None, out16, *args, **sizes)
    with pytest.raises(ValueError, match="overlap"):  # f16 rows would land on q rows other workgroups still read
        prompt_attention.launch(cpu_device, None, args[0], *args, **sizes, out_f16=True)
    prompt_attention.launch(cpu_device, None, args[0], *args, **sizes)  # out may be q
    np.testing.assert_array_equal(args[0].download(np.float32).reshape(s.q.shape), s.reference())
    for bad, message in ((dict(head_dim=100), "no entry for head_dim 100"), (dict(head_dim=192), "no entry"),
                         (dict(head_dim=64, softcap=30.0), "no entry for head_dim 64 with a soft cap"),
                         (dict(softcap=-1.0), "softcap must be"),
                         (dict(num_blocks=s.num_blocks + 1), "v_pool needs|k_pool needs"),
                         (dict(block_size=12), "power of two")):
        with pytest.raises(ValueError, match=message):
            prompt_attention.launch(cpu_device, None, out, *args, **{**sizes, **bad})


def test_prompt_attention_takes_prompt_steps_with_matrix_cores_only():
    assert prompt_attention.takes("sm_90", 512, "f16", 128)
    assert prompt_attention.takes("gfx942", 32, "f16", 64) and prompt_attention.takes("gfx1100", 32, "f16", 96)
    assert not prompt_attention.takes("gfx1030", 512, "f16", 128)  # no matrix cores: paged_attention
    assert not prompt_attention.takes("cpu", 512, "f16", 128)
    assert not prompt_attention.takes("sm_90", 31, "f16", 128)  # too few tokens for a tile
    assert not prompt_attention.takes("sm_90", 512, "q8_0", 128)
    assert not prompt_attention.takes("sm_90", 512, "bf16", 128)
    # Gemma's heads of 256 (not on RDNA4, where that entry spills), Gemma 2's soft caps at its head sizes only
    assert prompt_attention.takes("sm_90", 512, "f16", 256) and prompt_attention.takes("gfx942", 32, "f16", 256)
    assert prompt_attention.takes("gfx1100", 512, "f16", 256) and not prompt_attention.takes("gfx1201", 512, "f16", 256)
    assert prompt_attention.takes("gfx1201", 512, "f16", 128)
    assert not prompt_attention.takes("sm_90", 512, "f16", 192) and not prompt_attention.takes("sm_90", 512, "f16", 512)
    assert prompt_attention.takes("sm_90", 512, "f16", 256, softcap=50.0)
    assert prompt_attention.takes("sm_90", 512, "f16", 128, softcap=50.0)
    assert not prompt_attention.takes("sm_90", 512, "f16", 64, softcap=50.0)
    # the geometry: 16 tokens x 4 heads a workgroup for Llama 3's groups of 4; 64 x 1 for the demo's 3; heads of
    # 256 (Gemma-2-9B's 16 over 8): 2 row tiles of 2 warps each, 16 tokens x 2 heads
    assert prompt_attention.geometry("sm_90", 512, 32, 8, 128) == (32 * 8, 128)
    assert prompt_attention.geometry("gfx942", 512, 9, 3, 64) == (8 * 3 * 3, 256)
    assert prompt_attention.geometry("sm_90", 512, 16, 8, 256) == (32 * 8, 128)
    assert prompt_attention.geometry("gfx942", 100, 4, 1, 256) == (7 * 1 * 2, 256)  # Gemma 3 1B's group of 4: 2 x 16


class RecordingKernel:
    def __init__(self):
        self.launches = []

    def launch(self, grid, block, args, stream=None):
        self.launches.append((grid, block, list(args)))


def test_paged_attention_launcher_fits_splits_to_the_workspace(cpu_device, monkeypatch):
    kernel = RecordingKernel()
    monkeypatch.setattr(paged_attention, "get_kernel", lambda *a, **kw: kernel)
    q = cpu_device.allocate(9 * 64 * 4, "activations")
    pool = cpu_device.allocate(600 * 3 * 16 * 128, "kv")
    small = cpu_device.allocate(4, "activations")
    tables = cpu_device.allocate(512 * 4, "scratch")
    sizes = dict(n_tokens=1, n_heads=9, n_kv_heads=3, head_dim=64, block_size=16, max_blocks=512, num_blocks=600,
                 scale=0.125, kv_dtype="f16")
    full = paged_attention.workspace_size(1, 9, 3, 64, 512 * 16)
    # One token of 9 heads: 3 slots at least, room for one workgroup per query head at short contexts.
    for nbytes, slots in ((None, 3), (full, 64), (paged_attention.workspace_bytes(1, 9, 3, 64, 10), 10), (300, 3)):
        workspace = None if nbytes is None else cpu_device.allocate(nbytes, "scratch")
        paged_attention.launch(cpu_device, None, q, q, pool, pool, tables, small, small, **sizes, workspace=workspace)
        grid, block, args = kernel.launches[-1]
        assert args[15] == slots and grid == 3 * slots and block == 4 * 32
        assert (args[7] == 0) == (slots == 3)  # no workspace pointer unless it splits


def test_paged_attention_geometry_and_workspace_sizes():
    # Decode of one sequence at long context: all 64 splits; no splits once the tokens fill the GPU alone.
    assert paged_attention.split_limit(1, 9, 3, 8192) == 64
    assert paged_attention.split_limit(1, 9, 3, 100) == 1  # no more than 128-key pieces of the context
    assert paged_attention.split_limit(1, 9, 3, 300) == 3
    assert paged_attention.split_limit(8, 9, 3, 8192) == 10
    assert paged_attention.split_limit(64, 9, 3, 8192) == 1
    assert paged_attention.split_limit(512, 9, 3, 8192) == 1
    assert paged_attention.head_chunks(9, 3) == 1 and paged_attention.head_chunks(28, 4) == 2
    # Small launches get a slot per query head (7 tokens x 9 heads <= 64 pairs), larger ones per chunk.
    assert paged_attention.slot_count(7, 9, 3, 1) == 3 and paged_attention.slot_count(8, 9, 3, 1) == 1
    assert paged_attention.slot_count(1, 28, 4, 2) == 7 and paged_attention.slot_count(1, 28, 4, 5) == 10
    assert paged_attention.slot_count(1, 4, 4, 1) == 1  # no grouping: nothing to spread
    assert paged_attention.split_stride(28, 4, 7) == 3
    assert paged_attention.geometry("gfx942", 2, 9, 3, 5) == (30, 256)
    assert paged_attention.geometry("sm_90", 2, 32, 8, 1) == (16, 128)
    size = paged_attention.workspace_size(512, 9, 3, 64, 8192)
    assert 0 < size < 4 << 20
    for n in (1, 7, 64, 300, 512):
        assert paged_attention.workspace_bytes(n, 9, 3, 64, paged_attention.launch_slots(n, 9, 3, 8192)) <= size
    assert paged_attention.workspace_size(64, 9, 3, 64, 128) == 0  # contexts of one piece never split


def test_paged_attention_workspace_sizing_costs_the_same_for_any_step_size():
    """Planning looped over every token count up to the step's (serve --step-tokens 1000000000 planned for
    minutes); it stops where launches stop splitting, so any step size plans in the same time, to the same size."""
    import time

    small = paged_attention.workspace_size(512, 9, 3, 64, 8192)
    t0 = time.perf_counter()
    assert paged_attention.workspace_size(10**12, 9, 3, 64, 8192) == small
    assert paged_attention.workspace_size(10**12, 32, 8, 128, 131072) == paged_attention.workspace_size(4096, 32, 8, 128, 131072)
    assert time.perf_counter() - t0 < 0.5


def test_paged_attention_launcher_refuses_bad_arguments(cpu_device):
    buf = cpu_device.allocate(1 << 16, "scratch")
    base = dict(n_tokens=1, n_heads=9, n_kv_heads=3, head_dim=64, block_size=16, max_blocks=4, num_blocks=4,
                scale=0.125, kv_dtype="f16")
    cases = [
        (dict(kv_dtype="q4_0"), "no kernel for KV dtype 'q4_0'"),
        (dict(n_heads=8), "8 query heads do not group over 3 KV heads"),
        (dict(head_dim=60), "head_dim must be a multiple of 8 up to 256"),
        (dict(head_dim=512), "head_dim must be a multiple of 8 up to 256"),
        (dict(block_size=12), "block_size must be a power of two"),
        (dict(n_tokens=0), "n_tokens must be an int"),
        (dict(num_blocks=100), "k_pool needs"),
    ]
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            paged_attention.launch(cpu_device, None, buf, buf, buf, buf, buf, buf, buf, **{**base, **change})
    with pytest.raises(ValueError, match="q at .* is not 16-byte aligned"):
        paged_attention.launch(cpu_device, None, buf, buf.addr(4), buf, buf, buf, buf, buf, **base)
    with pytest.raises(ValueError, match="workspace must be a Buffer"):
        paged_attention.launch(cpu_device, None, buf, buf, buf, buf, buf, buf, buf, **{**base, "max_blocks": 64,
                               "num_blocks": 2}, workspace=buf.addr())


def test_every_entry_has_a_host_kernel(cpu_device):
    module = cpu_device.load_module()
    for kv in KV_DTYPES:
        for softcap in (False, True):
            assert module.kernel(paged_attention.kernel_name(kv, softcap), paged_attention.SIGNATURE.replace(" ", "")).name
    for table_type in embedding.TABLE_TYPES:
        assert module.kernel(f"embedding_{table_type}", embedding.SIGNATURE).name
    assert module.kernel("select_rows_f32", select_rows.SIGNATURE).name
    assert loader.get_kernel(cpu_device, "paged_attention", "paged_attention_q8_0", "ppppppppiiiiiiiiiff")


def test_prompt_attention_launch_with_sinks(cpu_device):
    """The sink entries (gpt-oss's heads of 64) on the cpu backend: paged_attention's reference with sinks; a head size
    without a sink entry, a cap with sinks, and a sinks buffer short of n_heads floats are refused."""
    rng = np.random.default_rng(7)
    s = make_sample(rng, "f16", 8, 1, 64, 16, [(90, 40)], padding=1)
    sinks = (rng.standard_normal(8) + 1).astype(np.float32)
    args = [to_device(cpu_device, a) for a in (s.q, s.k_pool, s.v_pool, s.block_tables, s.token_seq, s.positions)]
    sizes = dict(n_tokens=s.n_tokens, n_heads=8, n_kv_heads=1, head_dim=64, block_size=16, max_blocks=s.max_blocks,
                 num_blocks=s.num_blocks, scale=s.scale)
    out = poisoned(cpu_device, s.q.nbytes)
    prompt_attention.launch(cpu_device, None, out, *args, **sizes, sinks=to_device(cpu_device, sinks))
    want = paged_attention.reference(s.q, s.k_pool, s.v_pool, kv_dtype("f16"), s.block_tables, s.token_seq,
                                     s.positions, s.scale, 0, 0.0, sinks)
    np.testing.assert_array_equal(out.download(np.float32).reshape(s.q.shape), want)
    assert not np.allclose(want, s.reference())
    assert prompt_attention.takes("sm_90", 40, "f16", 64, sinks=True) and not prompt_attention.takes(
        "gfx1030", 40, "f16", 64, sinks=True)
    for bad, message, buf in ((dict(head_dim=128), "no entry for head_dim 128 with sinks", sinks),
                              (dict(softcap=30.0), "none with both a cap and sinks", sinks),
                              ({}, "sinks needs", sinks[:4])):
        with pytest.raises(ValueError, match=message):
            prompt_attention.launch(cpu_device, None, out, *args, **{**sizes, **bad}, sinks=to_device(cpu_device, buf))

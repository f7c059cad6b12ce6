"""The forward pass's lookups and attention on a real GPU against their numpy references (run with
`pytest -m gpu tests/gpu`): embedding, select_rows, kv_store and paged_attention.

As in test_ops_gpu.py: fresh random inputs every run (the seed is in each failure message), outputs
poisoned with 0xFF bytes before every launch, the demo model's shapes (SmolLM2-135M: hidden 576,
vocabulary 49152 with a Q8_0 table, 9 query heads / 3 KV heads of 64, f16 KV blocks of 16) beside
odd ones. Lookups and kv_store are exact, so they are compared bit for bit; attention within the
float32 error bound derived in tests/support/forward_pass_samples.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from support.forward_pass_samples import make_sample, random_table
from hipcore.kvcache import KvCache, KvCacheConfig
from hipcore.kvcache.dtypes import KV_DTYPES, kv_dtype
from hipcore.ops import embedding, kv_store, paged_attention, select_rows
from hipcore.runtime import kernels as loader

pytestmark = pytest.mark.gpu

ENTRIES = {
    "embedding": [(f"embedding_{t}", embedding.SIGNATURE) for t in embedding.TABLE_TYPES],
    "select_rows": [("select_rows_f32", select_rows.SIGNATURE)],
    "kv_store": [(kv_store.kernel_name(kv), kv_store.SIGNATURE) for kv in KV_DTYPES],
    "paged_attention": [(paged_attention.kernel_name(kv, cap), paged_attention.SIGNATURE.replace(" ", ""))
                        for kv in KV_DTYPES for cap in (False, True)],
}
THREADS = {"embedding": embedding.MAX_THREADS, "select_rows": select_rows.MAX_THREADS, "kv_store": kv_store.THREADS,
           "paged_attention": None}  # attention: 4 warps, the launcher's block on this device


# ---- embedding and select_rows: exact ----------------------------------------------------------


@pytest.mark.parametrize("table_type,vocab,hidden,n_tokens", [
    ("q8_0", 49152, 576, 1), ("q8_0", 49152, 576, 512),  # the demo model's table: decode and a prompt
    ("q4_0", 1000, 576, 7), ("q4_1", 1000, 64, 33), ("f16", 300, 576, 5), ("bf16", 300, 70, 5), ("f32", 300, 7, 70000),
    # Llama-3.2-1B/3B's tied Q6_K table (128256 x 2048 / 3072), Llama-3.1-8B's untied Q4_K (x 4096)
    ("q6_k", 128256, 2048, 1), ("q6_k", 128256, 3072, 512), ("q4_k", 128256, 4096, 3), ("q5_k", 1000, 256, 9),
    ("q5_0", 262144, 640, 5), ("q5_1", 1000, 96, 33),  # Gemma 3 270M's table shape; an odd row count of blocks
])
def test_embedding(gpu, mem, rng, seed, table_type, vocab, hidden, n_tokens):
    raw = random_table(rng, table_type, vocab, hidden)
    ids = rng.integers(0, vocab, n_tokens).astype(np.int32)
    ids[0], ids[-1] = vocab - 1, 0  # both ends of the table
    out = mem.poisoned(n_tokens * hidden * 4)
    embedding.launch(gpu, None, out, mem.upload(raw, "weights"), mem.upload(ids), n_tokens, hidden, vocab, table_type)
    got = out.download(np.float32).reshape(n_tokens, hidden)
    # Every format decodes with at most one rounding to float32, the host reference's (a half times an
    # integer of at most 8 bits, plus a half for Q4_1; K-quants: see kernels/embedding.hip), so the rows
    # equal the reference bit for bit.
    want = embedding.reference(raw, table_type, ids, vocab, hidden)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"seed {seed}"


def test_embedding_gives_zero_rows_for_ids_outside_the_vocabulary(gpu, mem, rng):
    raw = random_table(rng, "q8_0", 100, 64)
    ids = np.array([5, -1, 100, 99], np.int32)
    out = mem.poisoned(4 * 64 * 4)
    embedding.launch(gpu, None, out, mem.upload(raw, "weights"), mem.upload(ids), 4, 64, 100, "q8_0")
    got = out.download(np.float32).reshape(4, 64)
    assert not got[1:3].any() and np.array_equal(got[[0, 3]], embedding.reference(raw, "q8_0", ids[[0, 3]], 100, 64))


@pytest.mark.parametrize("n_rows,width,n_src_rows", [(1, 576, 1), (64, 576, 512), (3, 1000, 7), (70000, 3, 70001)])
def test_select_rows(gpu, mem, rng, seed, n_rows, width, n_src_rows):
    x = rng.standard_normal((n_src_rows, width)).astype(np.float32)
    rows = rng.integers(0, n_src_rows, n_rows).astype(np.int32)
    rows[0] = n_src_rows - 1
    out = mem.poisoned(n_rows * width * 4)
    select_rows.launch(gpu, None, out, mem.upload(x), mem.upload(rows), n_rows, width, n_src_rows)
    assert np.array_equal(out.download(np.float32).reshape(n_rows, width), x[rows]), f"seed {seed}"


# ---- kv_store: the same bytes as the host codecs -----------------------------------------------


@pytest.mark.parametrize("kv", list(KV_DTYPES))
@pytest.mark.parametrize("n_kv_heads,head_dim,block_size,n_tokens", [(3, 64, 16, 1), (3, 64, 16, 512), (2, 128, 1, 9),
                                                                     (1, 96, 32, 70)])
def test_kv_store(gpu, rng, seed, kv, n_kv_heads, head_dim, block_size, n_tokens):
    fmt = kv_dtype(kv)
    config = KvCacheConfig(n_layers=2, n_kv_heads=n_kv_heads, head_dim=head_dim, block_size=block_size,
                           num_blocks=2 + 2 * -(-n_tokens // block_size), dtype=kv)
    shape = (config.num_blocks, n_kv_heads, block_size, config.row_bytes)
    with KvCache(gpu, config) as cache:
        # The pools start as random bytes: a write to a wrong place, or a byte written that should not
        # be, changes bytes the reference leaves alone.
        pools = [rng.integers(0, 256, shape, dtype=np.uint8) for _ in range(2)]
        cache.k_pools[1].upload(pools[0])
        cache.v_pools[1].upload(pools[1])
        k, v = ((rng.standard_normal((n_tokens, n_kv_heads, head_dim)) * rng.uniform(1e-3, 1e3, (n_tokens, 1, 1)))
                .astype(np.float32) for _ in range(2))
        k[0, 0, :32] = 0.0  # an all-zero q8_0 block
        v[0, 0, :32] = np.arange(32, dtype=np.float32) - 15.5  # q8_0 halves round away from zero
        slots = rng.choice(np.arange(block_size, config.num_slots), n_tokens, replace=False).astype(np.int32)
        if n_tokens > 2:
            slots[1] = -1  # padding
        buffers = [gpu.allocate(a.nbytes, "scratch") for a in (k, v, slots)]
        try:
            for buf, a in zip(buffers, (k, v, slots)):
                buf.upload(a)
            kv_store.launch(gpu, None, cache, 1, *buffers, n_tokens=n_tokens)
            valid = slots >= 0
            for pool, want, rows in zip((cache.k_pools[1], cache.v_pools[1]), pools, (k, v)):
                kv_store.reference(want, rows[valid], slots[valid], fmt)
                got = pool.download(np.uint8).reshape(shape)
                assert np.array_equal(got, want), f"seed {seed}: {int((got != want).sum())} bytes differ"
            assert not cache.k_pools[0].download(np.uint8).any(), "another layer's pool was written"
        finally:
            for buf in buffers:
                buf.free()


# ---- paged_attention ---------------------------------------------------------------------------


class AttentionRun:
    """A sample's inputs on the device, and launches of the attention kernel over them."""

    def __init__(self, gpu, mem, sample, workspace: bool = True):
        s = self.sample = sample
        self.gpu, self.mem = gpu, mem
        self.inputs = [mem.upload(s.q), mem.upload(s.k_pool, "kv"), mem.upload(s.v_pool, "kv"),
                       mem.upload(s.block_tables, "scratch"), mem.upload(s.token_seq, "scratch"),
                       mem.upload(s.positions, "scratch")]
        self.out = mem.poisoned(s.q.nbytes)
        self.workspace = None
        if workspace:
            size = paged_attention.workspace_size(s.n_tokens, s.n_heads, s.n_kv_heads, s.head_dim,
                                                  s.max_blocks * s.block_size)
            self.workspace = mem.poisoned(max(size, 4), "scratch")  # partial results NaN until written
            self.workspace.fill(0, nbytes=self.counter_bytes())  # the counters start at zero

    def counter_bytes(self) -> int:
        s = self.sample
        return s.n_tokens * s.n_kv_heads * paged_attention.head_chunks(s.n_heads, s.n_kv_heads) * 4

    def launch(self, stream=None) -> None:
        s = self.sample
        paged_attention.launch(self.gpu, stream, self.out, *self.inputs, n_tokens=s.n_tokens, n_heads=s.n_heads,
                               n_kv_heads=s.n_kv_heads, head_dim=s.head_dim, block_size=s.block_size,
                               max_blocks=s.max_blocks, num_blocks=s.num_blocks, scale=s.scale, kv_dtype=s.kv_dtype,
                               workspace=self.workspace, window=s.window, softcap=s.softcap)

    def check(self, seed: int, what: str = "") -> None:
        s = self.sample
        got = self.out.download(np.float32).reshape(s.q.shape)
        want, tol = s.reference(), s.tolerance()  # the bound's derivation is in forward_pass_samples.py
        err = np.abs(got - want)
        bad = ~(err <= tol)
        assert not bad.any(), (f"seed {seed} {what}: {int(bad.sum())} of {bad.size} outputs off; worst "
                               f"{float(np.nanmax(err / tol)):.1f} x tolerance at {np.argwhere(bad)[0].tolist()}")
        if self.workspace is not None:
            assert not self.workspace.download(np.uint8, self.counter_bytes()).any(), "counters left non-zero"


def decode_batch(rng, n_seqs: int, max_ctx: int) -> list[tuple[int, int]]:
    contexts = rng.integers(1, max_ctx + 1, n_seqs)
    contexts[0] = max_ctx
    return [(int(c), 1) for c in contexts]


@pytest.mark.parametrize("kv", list(KV_DTYPES))
@pytest.mark.parametrize("case", ["decode 1 x 100", "decode 1 x 600", "decode 1 x 8192", "decode 64 x 2048",
                                  "prompt 512", "prompt chunk + decodes"])
def test_paged_attention_demo_shapes(gpu, mem, rng, seed, kv, case):
    """SmolLM2's attention (9 query heads over 3 KV heads of 64, blocks of 16) in the steps the engine
    runs: decoding one sequence at short and long context, a batch of 64, a whole prompt, and a prompt
    chunk beside decoding sequences."""
    seqs = {
        "decode 1 x 100": [(100, 1)], "decode 1 x 600": [(600, 1)], "decode 1 x 8192": [(8192, 1)],
        "decode 64 x 2048": decode_batch(rng, 64, 2048), "prompt 512": [(512, 512)],
        "prompt chunk + decodes": [(700, 256), (1, 1), (3000, 1), (64, 1)],
    }[case]
    sample = make_sample(rng, kv, 9, 3, 64, 16, seqs, max_blocks=8192 // 16, q_scale=float(rng.uniform(0.5, 3)))
    run = AttentionRun(gpu, mem, sample)
    run.launch()
    run.check(seed, case)
    run.out.fill(0xFF)
    run.launch()  # again over the same workspace: the counters were reset
    run.check(seed, case + ", second launch")


@pytest.mark.parametrize("n_heads,n_kv_heads,head_dim,block_size", [
    (4, 4, 128, 16), (32, 8, 128, 16), (28, 4, 128, 32), (8, 1, 256, 8), (12, 2, 96, 1), (16, 16, 64, 256),
])
def test_paged_attention_other_shapes(gpu, mem, rng, seed, n_heads, n_kv_heads, head_dim, block_size):
    """Group sizes 1, 4, 7 (chunks of 4 and 3), 8 and 6; head_dim 64 to 256 (and 96: 12 of 16 lanes);
    blocks of 1 to 256 tokens; each with and without a workspace; padding tokens."""
    seqs = [(1, 1), (333, 1), (1500, 1), (40, 17)]
    for workspace in (True, False):
        sample = make_sample(rng, "f16", n_heads, n_kv_heads, head_dim, block_size, seqs, padding=2,
                             q_scale=float(rng.uniform(0.5, 3)))
        run = AttentionRun(gpu, mem, sample, workspace)
        run.launch()
        run.check(seed, f"workspace {workspace}")
        assert not run.out.download(np.float32).reshape(sample.q.shape)[-2:].any(), "padding rows are zero"


def test_paged_attention_replays_in_a_graph_as_contexts_grow(gpu, mem, rng, seed):
    """A captured launch reads positions and tables from device memory at every replay: as the
    sequences grow from a few keys to thousands, each replay splits their keys anew and stays right."""
    final = [(3000, 1), (200, 1), (1, 1), (1200, 1)]
    sample = make_sample(rng, "f16", 9, 3, 64, 16, final, max_blocks=4096 // 16)
    run = AttentionRun(gpu, mem, sample)
    stream = gpu.create_stream()
    run.launch(stream)  # loads the module before the capture
    stream.synchronize()
    with gpu.capture(stream) as cap:
        run.launch(stream)
    graph = cap.graph
    try:
        for length in (1, 30, 65, 500, 2999):
            positions = np.minimum(np.array([c for c, _ in final]) - 1, length - 1).astype(np.int32)
            sample.positions = positions
            run.inputs[5].upload(positions, stream=stream)
            run.out.fill(0xFF, stream=stream)
            graph.launch(stream)
            stream.synchronize()
            run.check(seed, f"replay at length {length}")
    finally:
        graph.destroy()
        stream.destroy()


# ---- the run-time compilers and the precompiled objects ----------------------------------------


def test_forward_ops_compile_at_run_time(gpu, mem, rng, seed):
    """hiprtc / nvrtc take the same sources, and the run-time compiled attention computes the same."""
    sources = loader.kernels_dir()
    modules = {}
    for op, entries in ENTRIES.items():
        image = gpu.jit_compile((sources / f"{op}.hip").read_text(), f"{op}.hip", [str(sources)], [])
        modules[op] = gpu.load_module(image, op)
        for entry, signature in entries:
            modules[op].kernel(entry, signature)
    sample = make_sample(rng, "q8_0", 9, 3, 64, 16, [(900, 1), (20, 3)])
    run = AttentionRun(gpu, mem, sample)
    s = sample
    slots = paged_attention.launch_slots(s.n_tokens, 9, 3, s.max_blocks * 16)
    grid, block = paged_attention.geometry(gpu.arch, s.n_tokens, 9, 3, slots)
    kernel = modules["paged_attention"].kernel("paged_attention_q8_0", paged_attention.SIGNATURE.replace(" ", ""))
    kernel.launch(grid, block, [run.out, *run.inputs, run.workspace, s.n_tokens, 9, 3, 64, 16, s.max_blocks,
                                s.num_blocks, slots, 0, s.scale, 0.0])  # window 0: the whole context; no soft cap
    run.check(seed, "run-time compiled")


def test_prebuilt_code_objects_load(gpu):
    """The precompiled code objects for this device load, hold every entry point, and take the blocks
    the launchers use."""
    available = loader.available_code_objects(gpu.arch)
    assert set(ENTRIES) <= set(available), (
        f"no current precompiled code objects for {gpu.arch} in {loader.prebuilt_dir()} (have: {available}); "
        "build them with `python -m rocmforge_kernels.build` and bring kernels/prebuilt along")
    manifest = loader.read_manifest()
    for op, entries in ENTRIES.items():
        path = loader.current_object(gpu.arch, op)
        module = gpu.load_module(path.read_bytes(), op)
        for entry, signature in entries:
            attributes = module.kernel(entry, signature).attributes()
            recorded = manifest["objects"][path.parent.name][op]["kernels"][entry]
            if gpu.backend == "cuda":
                assert attributes["registers"] == recorded["registers"], entry
            if "max_threads_per_block" in attributes:
                threads = THREADS[op] or paged_attention.geometry(gpu.arch, 1, 9, 3, 1)[1]
                assert attributes["max_threads_per_block"] >= threads, entry

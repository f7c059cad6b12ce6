"""matmul_mma's launcher decisions on the cpu backend: which archs have matrix cores, the tile choice, and
kernel_choice.project (the call a model's single-op products make) taking the matrix cores only where they exist,
for its formats, from MMA_MIN_TOKENS tokens; the cpu backend's matmul_mma kernels computing the product."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.model import projections
from hipcore.ops import matmul, matmul_mma
from support.weight_samples import random_weights


@pytest.mark.parametrize("arch,expected", [
    ("sm_80", True), ("sm_90", True), ("sm_90a", True), ("sm_120", True), ("sm_75", False), ("sm_70", False),
    ("gfx90a", True), ("gfx942", True), ("gfx950", True), ("gfx1100", True), ("gfx1151", True), ("gfx1201", True),
    ("gfx1030", False), ("gfx906", False), ("cpu", False),
])
def test_matrix_cores_by_arch(arch, expected):
    assert matmul_mma.has_matrix_cores(arch) is expected


@pytest.mark.parametrize("arch,weight_type,tile,n_tokens,expected", [
    ("sm_90", "q4_k", 32, 32, "matmul_mma_fragments_q4_k"), ("sm_80", "q6_k", 32, 9, "matmul_mma_fragments_q6_k"),
    ("sm_90a", "q5_k", 32, 8, "matmul_mma_direct_q5_k"), ("sm_90", "q4_k", 32, 1, "matmul_mma_direct_q4_k"),
    ("sm_90", "q4_k", 64, 512, "matmul_mma_q4_k"), ("sm_90", "q8_0", 32, 8, "matmul_mma_direct_q8_0"),
    ("sm_90", "q4_0", 32, 32, "matmul_mma_fragments_q4_0"), ("sm_80", "q5_1", 32, 1, "matmul_mma_direct_q5_1"),
    ("sm_90", "q8_0", 64, 512, "matmul_mma_q8_0"), ("gfx942", "q8_0", 32, 8, "matmul_mma_q8_0"),
    ("sm_75", "q4_k", 32, 8, "matmul_mma_q4_k"), ("gfx942", "q4_k", 32, 8, "matmul_mma_q4_k"),
    ("gfx1100", "q6_k", 32, 32, "matmul_mma_q6_k"),
])
def test_the_fragment_path_only_where_its_layout_exists(arch, weight_type, tile, n_tokens, expected):
    """The fragment path is written in mma.sync's fragment layout, for 32-token tiles of the K-quants and the
    32-element block formats (its direct entry up to DIRECT_MAX_TOKENS tokens): the AMD targets and 64-token tiles
    keep the shared-tile kernel; path "shared" always does, "staged" and "direct" name the fragment entries where
    they exist."""
    assert matmul_mma.entry_name(arch, weight_type, tile, n_tokens) == expected
    assert matmul_mma.entry_name(arch, weight_type, tile, n_tokens, path="shared") == f"matmul_mma_{weight_type}"
    if matmul_mma.has_fragment_path(arch, weight_type, tile):
        assert matmul_mma.entry_name(arch, weight_type, tile, 1, path="staged") == f"matmul_mma_fragments_{weight_type}"
        assert matmul_mma.entry_name(arch, weight_type, tile, 32, path="direct") == f"matmul_mma_direct_{weight_type}"
    else:
        with pytest.raises(ValueError, match="no fragment path"):
            matmul_mma.entry_name(arch, weight_type, tile, n_tokens, path="direct")
    with pytest.raises(ValueError, match="path must be"):
        matmul_mma.entry_name(arch, weight_type, tile, n_tokens, path="fragments")


def test_q6_k_takes_the_direct_entry_only_over_short_splits():
    """Measured per shape (hipcore/ops/matmul_mma.py DIRECT_Q6K_MAX_SPLIT_STEPS): Q6_K's direct entry over at
    most 8 steps a split, the staged one over more; Q4_K's direct entry over any."""
    limit = matmul_mma.DIRECT_Q6K_MAX_SPLIT_STEPS
    assert matmul_mma.entry_name("sm_90", "q6_k", 32, 8, split_steps=limit) == "matmul_mma_direct_q6_k"
    assert matmul_mma.entry_name("sm_90", "q6_k", 32, 8, split_steps=limit + 1) == "matmul_mma_fragments_q6_k"
    assert matmul_mma.entry_name("sm_90", "q4_k", 32, 8, split_steps=64) == "matmul_mma_direct_q4_k"


def test_the_launcher_counts_the_steps_of_a_split(cpu_device, monkeypatch):
    """The 8B's down (14336 columns, 8 splits: 28 steps each) takes the staged entry, its v (4096, 16: 4) the
    direct one; the head (one split of 64 steps) the staged one."""
    from hipcore.ops import fused_matmul
    from hipcore.runtime.device import Buffer

    launched = []
    monkeypatch.setattr(cpu_device, "arch", "sm_90")
    monkeypatch.setattr(matmul_mma, "get_kernel", lambda dev, op, entry, sig, programmatic=False: type(
        "K", (), {"launch": lambda self, *a, **k: launched.append(entry)})())
    monkeypatch.setattr(matmul_mma.matvec, "check_operands", lambda *a, **k: None)
    workspace = cpu_device.allocate(fused_matmul.WORKSPACE_BYTES, "scratch")
    assert isinstance(workspace, Buffer)
    try:
        for rows, cols in ((4096, 14336), (1024, 4096), (128256, 4096)):
            matmul_mma.launch(cpu_device, None, 0, 0, 0, rows, cols, 8, weight_type="q6_k", workspace=workspace)
    finally:
        workspace.free()
    assert launched == ["matmul_mma_fragments_q6_k", "matmul_mma_direct_q6_k", "matmul_mma_fragments_q6_k"]


def test_the_block_formats_split_in_steps_of_two_blocks(cpu_device, monkeypatch):
    """On the fragment path a Q8_0 step is two blocks (64 columns): the launcher splits the columns in those steps
    (the kernel would read past a split's end in steps of one), and columns that are not whole steps of two take the
    shared tiles, split in steps of one block, as does a Q8_0 W that does not start 4-byte aligned."""
    from hipcore.ops import fused_matmul

    launched = []
    monkeypatch.setattr(cpu_device, "arch", "sm_90")
    monkeypatch.setattr(matmul_mma, "get_kernel", lambda dev, op, entry, sig, programmatic=False: type(
        "K", (), {"launch": lambda self, grid, block, args, stream=None: launched.append((entry, args[8]))})())
    monkeypatch.setattr(matmul_mma.matvec, "check_operands", lambda *a, **k: None)
    workspace = cpu_device.allocate(fused_matmul.WORKSPACE_BYTES, "scratch")
    try:
        for cols in (192, 4096, 160):
            matmul_mma.launch(cpu_device, None, 0, 0x1000, 0, 128, cols, 8, weight_type="q8_0", workspace=workspace)
        # W at 2 mod 4: the fragment path reads Q8_0 in 4-byte words, so the shared tiles take it (Q4_1 has no such need)
        matmul_mma.launch(cpu_device, None, 0, 0x1002, 0, 128, 4096, 8, weight_type="q8_0", workspace=workspace)
        matmul_mma.launch(cpu_device, None, 0, 0x1002, 0, 128, 4096, 8, weight_type="q4_1", workspace=workspace)
        with pytest.raises(ValueError, match="4-byte aligned"):
            matmul_mma.launch(cpu_device, None, 0, 0x1002, 0, 128, 4096, 8, weight_type="q8_0", workspace=workspace,
                              path="direct")
    finally:
        workspace.free()
    steps = matmul_mma.MIN_SPLIT_STEPS
    assert launched == [("matmul_mma_direct_q8_0", 1), ("matmul_mma_direct_q8_0", 4096 // 64 // steps),
                        ("matmul_mma_q8_0", 160 // 32 // steps), ("matmul_mma_q8_0", 4096 // 32 // steps),
                        ("matmul_mma_direct_q4_1", 4096 // 64 // steps)]
    assert matmul_mma.step_cols("q8_0", fragments=True) == 64 and matmul_mma.step_cols("q8_0") == 32


def test_tiles_fit_the_batch_and_fill_the_device():
    assert matmul_mma.pick_tile_tokens(4096, 9) == 32
    assert matmul_mma.pick_tile_tokens(4096, 512) == 64  # 32 x 8 = 256 workgroups
    assert matmul_mma.pick_tile_tokens(1024, 512) == 32  # 8 x 8 = 64 would leave SMs idle
    with pytest.raises(ValueError, match="tile_tokens"):
        matmul_mma.geometry(4096, 512, 16)


def test_project_takes_the_matrix_cores_where_they_exist(cpu_device, monkeypatch):
    from hipcore.ops import kernel_choice, matvec

    calls = []
    monkeypatch.setattr(matmul_mma, "launch", lambda *a, **k: calls.append(("mma", a[7], k["weight_type"])))
    monkeypatch.setattr(matmul, "launch", lambda *a, **k: calls.append(("matmul", a[7], k["weight_type"])))
    monkeypatch.setattr(matvec, "launch", lambda *a, **k: calls.append(("matvec", a[7], k["weight_type"])))
    lo = matmul_mma.MMA_MIN_TOKENS
    assert matmul_mma.MMA_MIN_TOKENS_KQUANT_FRAGMENTS < matmul_mma.MMA_MIN_TOKENS_KQUANT < lo
    assert matmul_mma.min_tokens("q8_0", "gfx942") == matmul_mma.min_tokens("q8_0") == lo
    # Every type of the fragment path from fewer tokens where it exists (NVIDIA sm_80+); the K-quants elsewhere
    # from 7.
    assert matmul_mma.min_tokens("q6_k", "sm_90") == matmul_mma.MMA_MIN_TOKENS_KQUANT_FRAGMENTS
    assert matmul_mma.min_tokens("q8_0", "sm_90") == matmul_mma.MMA_MIN_TOKENS_KQUANT_FRAGMENTS
    assert matmul_mma.min_tokens("q4_k", "gfx942") == matmul_mma.min_tokens("q4_k") == matmul_mma.MMA_MIN_TOKENS_KQUANT
    for arch in ("cpu", "gfx1030", "sm_90", "gfx942"):
        monkeypatch.setattr(cpu_device, "arch", arch)
        klo, qlo = matmul_mma.min_tokens("q4_k", arch), matmul_mma.min_tokens("q8_0", arch)
        calls.clear()
        for n, wt in ((klo - 1, "q4_k"), (klo, "q4_k"), (qlo - 1, "q8_0"), (qlo, "q8_0"), (512, "q6_k"), (512, "f32")):
            kernel_choice.project(cpu_device, None, 0, 0, 0, 4, 256, n, weight_type=wt)

        def fp32(n):  # without the matrix cores: matvec up to MATVEC_MAX_TOKENS tokens, matmul beyond
            return "matvec" if n <= matmul.MATVEC_MAX_TOKENS else "matmul"

        def mma(n):
            return "mma" if matmul_mma.has_matrix_cores(arch) else fp32(n)
        assert calls == [(fp32(klo - 1), klo - 1, "q4_k"), (mma(klo), klo, "q4_k"), (fp32(qlo - 1), qlo - 1, "q8_0"),
                         (mma(qlo), qlo, "q8_0"), (mma(512), 512, "q6_k"), ("matmul", 512, "f32")], arch


def test_the_single_op_path_of_a_layer_goes_through_kernel_choice():
    source = open(projections.__file__).read()
    assert ".project(" in source and source.count(".project(") == source.count("kernel_choice.project(") == 5


def test_cpu_backend_kernel_computes_the_product(cpu_device):
    rng = np.random.default_rng(3)
    rows, cols, n = 40, 512, 12
    raw = random_weights(rng, "q6_k", rows, cols)
    x = rng.standard_normal((n, cols)).astype(np.float32)
    w, xs, y = (cpu_device.allocate(max(a, 4), "activations") for a in (raw.nbytes, x.nbytes, n * rows * 4))
    w.upload(raw), xs.upload(x)
    matmul_mma.launch(cpu_device, None, y, w, xs, rows, cols, n, weight_type="q6_k")
    got = y.download(np.float32).reshape(n, rows)
    assert np.all(np.abs(got - matmul.reference(raw, "q6_k", x, rows, cols)) <= matmul.error_bound(raw, "q6_k", x, rows, cols))
    for buf in (w, xs, y):
        buf.free()


def test_decode_batches_split_the_columns_to_fill_the_device():
    big = 1 << 26
    # Llama-3.1-8B at 32 tokens: q (32 tiles of 128 rows) in 8 splits, gate (112 tiles) in 2; a prompt of
    # 512 tokens has tiles enough (256) and stays whole, as does a launch without a workspace.
    assert matmul_mma.geometry(4096, 32, cols=4096, workspace_bytes=big)[2:] == (32, 8)
    assert matmul_mma.geometry(4096, 32, cols=4096, workspace_bytes=big)[0] == 256
    assert matmul_mma.geometry(14336, 32, cols=4096, workspace_bytes=big)[3] == 2
    assert matmul_mma.geometry(4096, 512, cols=4096, workspace_bytes=big)[3] == 1
    assert matmul_mma.geometry(4096, 32, cols=4096)[3] == 1
    # splits of at least MIN_SPLIT_STEPS steps: 512 columns are 16 steps, 4 splits at most
    assert matmul_mma.geometry(1024, 16, cols=512, workspace_bytes=big)[3] == 16 // matmul_mma.MIN_SPLIT_STEPS
    # a workspace too small for the splits' partials takes fewer splits
    need = matmul_mma.partial_bytes(32, 8, 32)
    assert matmul_mma.geometry(4096, 32, cols=4096, workspace_bytes=need - 1)[3] == 7
    with pytest.raises(ValueError, match="splits"):
        matmul_mma.geometry(4096, 32, cols=4096, workspace_bytes=big, splits=129)


def test_explicit_splits_without_the_workspace_they_need_are_refused(cpu_device):
    rows, cols, n = 256, 512, 16
    bufs = [cpu_device.allocate(size, "activations") for size in (rows * cols * 2, n * cols * 4, n * rows * 4, 4096)]
    w, xs, y, small = bufs
    with pytest.raises(ValueError, match="workspace"):
        matmul_mma.launch(cpu_device, None, y, w, xs, rows, cols, n, weight_type="q8_0", workspace=small, splits=4)
    with pytest.raises(ValueError, match="Buffer"):
        matmul_mma.launch(cpu_device, None, y, w, xs, rows, cols, n, weight_type="q8_0", workspace=12345)
    for buf in bufs:
        buf.free()


def test_cpu_backend_kernel_accumulates_into_y(cpu_device):
    rng = np.random.default_rng(4)
    rows, cols, n = 24, 256, 10
    raw = random_weights(rng, "q4_k", rows, cols)
    x = rng.standard_normal((n, cols)).astype(np.float32)
    y0 = rng.standard_normal((n, rows)).astype(np.float32)
    w, xs, y = (cpu_device.allocate(a, "activations") for a in (raw.nbytes, x.nbytes, y0.nbytes))
    w.upload(raw), xs.upload(x), y.upload(y0)
    matmul_mma.launch(cpu_device, None, y, w, xs, rows, cols, n, weight_type="q4_k", accumulate=True)
    got = y.download(np.float32).reshape(n, rows)
    want = y0 + matmul.reference(raw, "q4_k", x, rows, cols)
    assert np.all(np.abs(got - want) <= matmul.error_bound(raw, "q4_k", x, rows, cols) + 2.0**-23 * np.abs(want))
    for buf in (w, xs, y):
        buf.free()


def test_where_q_k_v_and_gate_up_take_one_launch(cpu_device, monkeypatch):
    """takes_qkv and swiglu_fragments_fit: K-quants on NVIDIA's fragment path where each product alone would take
    it (32-token tiles), with the runner's workspace; not on AMD, not with other types; Q6_K's
    SwiGLU pair at 8 tokens or fewer only over splits as short as its direct entry was measured on."""
    from hipcore.ops import fused_matmul
    from hipcore.ops.kernel_choice import swiglu_fragments_fit as fit
    from hipcore.ops.kernel_choice import takes_qkv

    workspace = cpu_device.allocate(fused_matmul.WORKSPACE_BYTES, "scratch")
    try:
        qkv_rows, q4km = (4096, 1024, 1024), ("q4_k", "q4_k", "q6_k")
        monkeypatch.setattr(cpu_device, "arch", "sm_90")
        assert takes_qkv(cpu_device, 32, q4km, 4096, qkv_rows)
        assert takes_qkv(cpu_device, 5, ("q5_k", "q5_k", "q4_k"), 4096, qkv_rows)
        assert not takes_qkv(cpu_device, 4, q4km, 4096, qkv_rows)  # below the matrix cores' batches
        assert not takes_qkv(cpu_device, 32, ("q4_k", "q4_k", "q8_0"), 4096, qkv_rows)
        assert fit(cpu_device, 32, 14336, 4096, ("q4_k", "q4_k"), workspace)
        assert fit(cpu_device, 8, 14336, 4096, ("q4_k", "q4_k"), workspace)
        assert not fit(cpu_device, 8, 14336, 4096, ("q4_k", "q5_k"), workspace)
        assert not fit(cpu_device, 32, 14336, 4096, ("q4_k", "q4_k"), None)
        assert fit(cpu_device, 32, 14336, 4096, ("q6_k", "q6_k"), workspace)
        assert not fit(cpu_device, 8, 14336, 4096, ("q6_k", "q6_k"), workspace)  # one split of 64 steps
        assert fit(cpu_device, 8, 512, 2048, ("q6_k", "q6_k"), workspace)  # 8 splits of 4 steps
        monkeypatch.setattr(cpu_device, "arch", "gfx942")
        assert not takes_qkv(cpu_device, 32, q4km, 4096, qkv_rows)
        assert not fit(cpu_device, 32, 14336, 4096, ("q4_k", "q4_k"), workspace)
    finally:
        workspace.free()

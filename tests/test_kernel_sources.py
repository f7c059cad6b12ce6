"""What a kernel's code object is built from (hipcore/runtime/kernels.py source_files / source_digest): an
edit to any file an op's source includes must make the op's prebuilt objects stale, or a measurement (or a
user) runs an object built from other code. fused_qmatvec.hip and qmatvec.hip include qmatvec_formats.h, which
includes weight_loads.h (as fused_matvec_formats.h does); fused_qmatvec, matmul_mma, silu_mul and gelu_mul include
gated_activation.h."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from hipcore.runtime.kernels import COMPAT_HEADER, compat_files, kernels_dir, op_names, source_digest, source_files

# hip_compat.h and the vendor parts it includes, first in every op's files
COMPAT = [COMPAT_HEADER, "hip_compat_nvidia.h", "hip_compat_amd_clang.h", "hip_compat_amd.h"]
# block_formats.h and the one header of each GGUF block format it includes (Q5_1's includes Q5_0's, Q5_K's Q4_K's)
BLOCK_FORMATS = ["block_formats.h", "block_format_common.h", "block_format_f16.h", "block_format_q4_0.h",
                 "block_format_q4_1.h", "block_format_q5_0.h", "block_format_q5_1.h", "block_format_q8_0.h",
                 "block_format_q4_k.h", "block_format_q5_k.h", "block_format_q6_k.h", "block_format_mxfp4.h"]
# The ops that decode GGUF blocks through block_formats.h
BLOCK_FORMAT_USERS = ("embedding", "fused_matmul", "fused_matvec", "fused_qmatvec", "matmul", "matmul_mma", "matvec",
                      "moe_experts", "paged_attention", "qmatvec")


@pytest.fixture
def sources(tmp_path) -> Path:
    """A copy of the kernel sources to edit."""
    folder = tmp_path / "kernels"
    folder.mkdir()
    for path in kernels_dir().iterdir():
        if path.suffix in (".hip", ".h"):
            shutil.copy(path, folder)
    return folder


def header_and_source_digest(op: str, folder: Path) -> str:
    """The digest of hip_compat.h's files and <op>.hip alone, written out here."""
    digest = hashlib.sha256()
    for part in (*(folder / name for name in COMPAT), folder / f"{op}.hip"):
        data = part.read_bytes()
        digest.update(f"{part.name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def test_an_op_is_built_from_the_files_it_includes():
    folder = kernels_dir()
    formats = BLOCK_FORMATS[1:]  # what block_formats.h brings, met a level below it
    assert [f.name for f in source_files("fused_qmatvec")] == [*COMPAT, "fused_qmatvec.hip", "qmatvec_formats.h",
                                                                "qmatvec_block32_formats.h", "mxfp4_q8_format.h",
                                                                "fused_qmatvec_tiles.h", "fused_qmatvec_epilogue.h",
                                                                "gated_activation.h", "block_formats.h", "weight_loads.h",
                                                                "block_format_mxfp4.h",
                                                                *(f for f in formats if f != "block_format_mxfp4.h")]
    assert [f.name for f in source_files("qmatvec")] == [*COMPAT, "qmatvec.hip", "qmatvec_formats.h", "mxfp4_q8_format.h",
                                                          "block_formats.h", "weight_loads.h", "block_format_mxfp4.h",
                                                          *(f for f in formats if f != "block_format_mxfp4.h")]
    assert [f.name for f in source_files("fused_matvec")] == [*COMPAT, "fused_matvec.hip", "fused_matvec_formats.h",
                                                               "block_formats.h", "weight_loads.h", *formats]
    assert [f.name for f in source_files("matmul_mma")] == [*COMPAT, "matmul_mma.hip", "matrix_cores.h",
                                                             "matmul_mma_formats.h", "matmul_mma_epilogues.h",
                                                             "matmul_mma_fragments.h", "matmul_mma_fragment_entries.h",
                                                             "block_formats.h", "gated_activation.h",
                                                             "matmul_mma_fragment_formats.h", *formats,
                                                             "matmul_mma_block32_fragments.h"]
    # the fragment formats' one definition, read by matmul_mma's decode batches and moe_experts_mma's few-pairs tiles
    assert [f.name for f in source_files("moe_experts_mma")] == [*COMPAT, "moe_experts_mma.hip", "matrix_cores.h",
                                                                  "matmul_mma_formats.h", "matmul_mma_fragment_formats.h",
                                                                  "gated_activation.h", "block_formats.h",
                                                                  "matmul_mma_block32_fragments.h", *formats]
    for op in ("silu_mul", "gelu_mul"):  # the gated activations' one definition
        assert [f.name for f in source_files(op)] == [*COMPAT, f"{op}.hip", "gated_activation.h"]
    assert [f.name for f in source_files("prompt_attention")] == [*COMPAT, "prompt_attention.hip", "matrix_cores.h",
                                                                   "attention_soft_cap.h", "prompt_attention_tiles.h"]
    assert [f.name for f in source_files("paged_attention")] == [*COMPAT, "paged_attention.hip",  # the cap's one
                                                                  "paged_attention_formats.h",    # definition
                                                                  "attention_soft_cap.h", "paged_attention_tiles.h",
                                                                  "paged_attention_plan.h", "paged_attention_sinks.h",
                                                                  *BLOCK_FORMATS]
    # kv_store writes q8_0 rows: Q8_0's header alone
    assert [f.name for f in source_files("kv_store")] == [*COMPAT, "kv_store.hip", "block_format_q8_0.h",
                                                           "block_format_common.h"]
    assert [f.name for f in source_files("moe_experts")] == [*COMPAT, "moe_experts.hip", "gated_activation.h",
                                                              "qmatvec_formats.h", "mxfp4_q8_format.h", "moe_experts_down.h",
                                                              "moe_experts_grouped.h",
                                                              "block_formats.h", "weight_loads.h", "block_format_mxfp4.h",
                                                              *(f for f in formats if f != "block_format_mxfp4.h")]
    assert [f.name for f in source_files("add")] == [*COMPAT, "add.hip"]
    assert [f.name for f in source_files("embedding")] == [*COMPAT, "embedding.hip", *BLOCK_FORMATS]
    assert [f.name for f in source_files("matvec")] == [*COMPAT, "matvec.hip", "matvec_formats.h", *BLOCK_FORMATS]
    # An op that includes nothing of its own is built from hip_compat.h's files and its source alone.
    alone = [op for op in op_names() if len(source_files(op)) == len(COMPAT) + 1]
    assert "rope" in alone and "fused_qmatvec" not in alone and "matmul_mma" not in alone
    assert all(source_digest(op) == header_and_source_digest(op, folder) for op in alone)


def test_an_edit_to_a_vendor_part_of_hip_compat_changes_every_ops_digest(sources):
    assert [f.name for f in compat_files(sources)] == COMPAT
    ops = ("add", "fused_qmatvec", "matmul_mma")
    for part in COMPAT[1:]:
        before = {op: source_digest(op, sources) for op in ops}
        path = sources / part
        path.write_text(path.read_text() + "\n// an edit\n")
        assert all(source_digest(op, sources) != before[op] for op in ops), part


def test_an_edit_to_an_included_file_changes_the_includers_digest(sources):
    before = {op: source_digest(op, sources) for op in ("fused_qmatvec", "qmatvec", "matvec")}
    formats = sources / "qmatvec_formats.h"
    formats.write_text(formats.read_text() + "\n// an edit\n")
    after = {op: source_digest(op, sources) for op in before}
    assert after["fused_qmatvec"] != before["fused_qmatvec"]  # the includers
    assert after["qmatvec"] != before["qmatvec"]
    assert after["matvec"] == before["matvec"]  # not an includer


def test_an_edit_two_includes_deep_changes_the_digest(sources):
    # weight_loads.h comes in through qmatvec_formats.h and fused_matvec_formats.h, not from the ops' sources
    ops = ("fused_qmatvec", "qmatvec", "fused_matvec", "matvec", "matmul_mma")
    before = {op: source_digest(op, sources) for op in ops}
    loads = sources / "weight_loads.h"
    loads.write_text(loads.read_text() + "\n// an edit\n")
    after = {op: source_digest(op, sources) for op in ops}
    assert [op for op in ops if after[op] != before[op]] == ["fused_qmatvec", "qmatvec", "fused_matvec"]


def test_includes_are_followed_through_files_and_cycles_end(sources):
    (sources / "a_part.h").write_text('#include "b_part.h"\n')
    (sources / "b_part.h").write_text('  #  include "a_part.h"\n#include "missing.h"\n#include <cstdint>\n'
                                      '#include "../escape.h"\n')
    (sources / "tmp_op.hip").write_text('#include "hip_compat.h"\n#include "a_part.h"\n')
    (sources.parent / "escape.h").write_text("outside the folder")
    assert [f.name for f in source_files("tmp_op", sources)] == [*COMPAT, "tmp_op.hip", "a_part.h", "b_part.h"]
    before = source_digest("tmp_op", sources)
    (sources / "b_part.h").write_text((sources / "b_part.h").read_text() + "// deeper edit\n")
    assert source_digest("tmp_op", sources) != before


def test_an_edit_to_a_block_format_changes_the_digest_of_every_op_that_decodes_blocks(sources):
    ops = (*BLOCK_FORMAT_USERS, "kv_store", "add", "rope")
    before = {op: source_digest(op, sources) for op in ops}
    header = sources / "block_format_q5_0.h"  # two includes deep, and through block_format_q5_1.h a third way
    header.write_text(header.read_text() + "\n// an edit\n")
    after = {op: source_digest(op, sources) for op in ops}
    assert [op for op in ops if after[op] != before[op]] == list(BLOCK_FORMAT_USERS)

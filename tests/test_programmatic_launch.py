"""Programmatic dependent launch (hip_compat.h: rf_grid_dependency_sync; runtime: GpuKernel): a kernel
launched as programmatic may start while the kernel ahead of it still runs, so each op that asks for it
(get_kernel(..., programmatic=True)) must have every entry point of its source wait first, before any
statement but its __shared__ declarations, or defer the wait (rf_grid_dependency_deferred) to the one
function DEFERRED names, which must wait before its first barrier, global store or read of anything but the
weights it prefetches. Checked on the sources, and proven on planted faults."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from hipcore.runtime.kernels import compat_files, kernels_dir, source_files
from support.kernel_source_text import braced_block

OPS_DIR = Path(__file__).parents[1] / "hipcore" / "ops"
SYNC = "rf_grid_dependency_sync()"
DEFER = "rf_grid_dependency_deferred()"
# op -> (the file and the function whose code waits for an entry that defers its wait, and what may not stand
# before the wait there: comments removed first). What the function may do before: index arithmetic and
# rf_prefetch_l2 of what it will read, from values no kernel writes: fused_qmatvec's and fused_matvec's weight
# pointers; paged_attention's positions, sequences and block tables (the host's step inputs), never q, the
# pools' data, out or the workspace.
DEFERRED = {
    "fused_qmatvec": ("fused_qmatvec_tiles.h", "tile_dot",
                      ("__syncthreads", "stage_chunk", "st.", "x[", "*x", "out[", "atomic")),
    # The fragment path's K-quant entries: the first item's weights, then the wait, then x, y and the workspace.
    "matmul_mma": ("matmul_mma_fragments.h", "fragment_item",
                   ("__syncthreads", "float4*>(x_src", "xs +", "xv[d]", "store_result", "combine_splits", "atomic",
                    "a.y", "workspace")),
    "fused_matvec": ("fused_matvec.hip", "fused_matvec",
                     ("__syncthreads", "accumulate", "fused_pass", "a.x", "x[", "finish", "atomic")),
    "paged_attention": ("paged_attention.hip", "run",
                        ("__syncthreads", "attend<", "p.q", "p.out", "rows[", "workspace", "atomic", "load_rows",
                         "sh.")),
}
# Further functions of an op that wait for its deferring entries, with DEFERRED's header and forbidden words:
# matmul_mma's direct Q4_K / Q5_K items (fragment_item hands them to superblock_item before it loads anything).
DEFERRED_ALSO = {"matmul_mma": ("superblock_item",)}


def programmatic_ops() -> dict[str, str]:
    """op (kernel source name) -> the module that launches it as programmatic."""
    found = {}
    for path in sorted(OPS_DIR.glob("*.py")):
        tree = ast.parse(path.read_text())
        constants = {t.id: n.value.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                     for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)}
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "get_kernel"):
                continue
            if not any(k.arg == "programmatic" and getattr(k.value, "value", None) is True for k in call.keywords):
                continue
            op = call.args[1]
            if isinstance(op, ast.Constant):
                name = op.value
            elif op.id in constants:
                name = constants[op.id]
            else:  # a name the module imports (matmul_mma_swiglu's OP is matmul_mma's)
                name = getattr(importlib.import_module(f"hipcore.ops.{path.stem}"), op.id)
            found[name] = path.name
    return found


def _code(source: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", source, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text).replace("\\\n", " ")


def entries_not_waiting_first(source: str, deferred: bool = False) -> list[str]:
    """The __global__ entries of `source` whose first statement (past __shared__ declarations) is not
    rf_grid_dependency_sync() (or, where `deferred`, rf_grid_dependency_deferred())."""
    text = _code(source)
    allowed = {SYNC, DEFER} if deferred else {SYNC}
    bad = []
    for match in re.finditer(r"__global__", text):
        name = re.search(r"void\s+([\w#]+)\s*\(", text[match.end():]).group(1)
        body = text[text.index("{", match.end()) + 1:]
        statements = (s.strip() for s in body.split(";"))
        first = next(s for s in statements if not s.startswith("__shared__"))
        if first not in allowed:
            bad.append(name)
    return bad


def code_before_wait(source: str, function: str) -> str | None:
    """The code of `function` in `source` from its opening brace to its first rf_grid_dependency_sync(), or
    None when the function does not wait before it ends."""
    text = _code(source)
    match = re.search(r"\b" + function + r"\s*\([^;{]*\)\s*{", text)
    assert match, f"{function} not found"
    body = braced_block(text, match.end() - 1)[1:]
    at = body.find(SYNC)
    return None if at < 0 else body[:at]


def deferred_wait_problems(source: str, function: str, forbidden: tuple[str, ...]) -> list[str]:
    """Why `function` does not wait properly for its entries: no wait, or something read or written first."""
    before = code_before_wait(source, function)
    if before is None:
        return [f"{function} never calls {SYNC}"]
    return [f"{function} uses {word!r} before it waits" for word in forbidden if word in before]


def test_the_programmatic_ops_are_the_decode_steps():
    """What a single-token decode step launches (the K-quant and the demo model's paths), the matrix cores'
    products (decode batches and prompts: matmul_mma, whose K-quant fragment entries wait once their first weights
    are loading) and the single ops between them (rmsnorm, rope, silu_mul), and prompt steps' attention (prompt_attention, which waits first; paged_attention waits once it
    has prefetched its rows), so that a change that drops one shows here."""
    assert set(programmatic_ops()) == {"embedding", "fused_matvec", "fused_qmatvec", "head_norm_rope", "kv_store",
                                       "matmul_mma", "paged_attention", "prompt_attention", "rmsnorm", "rope", "sample",
                                       "silu_mul"}


@pytest.mark.parametrize("op", sorted(programmatic_ops()))
def test_every_entry_of_a_programmatic_op_waits_first(op):
    # the op's source with the parts it includes (matmul_mma's fragment entries live in one of them)
    source = "\n".join(path.read_text() for path in source_files(op)[len(compat_files()):])
    assert source.count("__global__") >= 1
    assert entries_not_waiting_first(source, deferred=op in DEFERRED) == []
    if DEFER in _code(source):
        assert op in DEFERRED, f"{op} defers its wait but DEFERRED does not name where it waits"
        header, function, forbidden = DEFERRED[op]
        for name in (function, *DEFERRED_ALSO.get(op, ())):
            assert deferred_wait_problems((kernels_dir() / header).read_text(), name, forbidden) == []


def test_the_check_catches_a_deferred_wait_that_is_missing_or_late():
    header, function, forbidden = DEFERRED["fused_qmatvec"]
    source = (kernels_dir() / header).read_text()
    assert deferred_wait_problems(source, function, forbidden) == []
    assert "rf_prefetch_l2" in code_before_wait(source, function)  # what the deferral is for
    # planted: the wait removed; the wait moved after the first staging barrier
    assert deferred_wait_problems(source.replace(SYNC + ";", "(void)0;"), function, forbidden) == \
        [f"{function} never calls {SYNC}"]
    # (the first barrier inside tile_dot: reset_key's, ahead of it in the header, is not the function's)
    start = source.index(f" {function}(")
    without = source.replace("  " + SYNC + ";", "", 1)
    moved = without[:start] + without[start:].replace("__syncthreads();", "__syncthreads(); " + SYNC + ";", 1)
    assert moved != source and "uses '__syncthreads'" in " ".join(deferred_wait_problems(moved, function, forbidden))
    # an entry of a plain (not deferred) op may not defer
    entry = (kernels_dir() / "kv_store.hip").read_text().replace(SYNC, DEFER, 1)
    assert len(entries_not_waiting_first(entry)) == 1 and entries_not_waiting_first(entry, deferred=True) == []


def deferred_source_without_wait(op: str, prefetch: str, sync_comment: str) -> tuple[str, str, str, tuple[str, ...]]:
    """(op's deferring source with its wait line taken out, that line, the function, its forbidden words), after
    checking the source as it is: clean, and `prefetch` (what the deferral is for) before its wait."""
    header, function, forbidden = DEFERRED[op]
    source = (kernels_dir() / header).read_text()
    assert deferred_wait_problems(source, function, forbidden) == []
    assert prefetch in code_before_wait(source, function)
    sync_line = "  " + SYNC + ";  // " + sync_comment + "\n"
    assert source.count(sync_line) == 1
    return source.replace(sync_line, ""), sync_line, function, forbidden


def test_the_check_catches_attention_reading_q_or_writing_before_its_wait():
    without, sync_line, function, forbidden = deferred_source_without_wait(
        "paged_attention", "prefetch_rows", "a programmatic launch (hipcore/ops/paged_attention.py)")
    # planted: the wait after the padding rows' zeroing; the wait after the attention itself
    late = without.replace("    return;\n  }\n  if (!attends) return;", "    return;\n  }\n" + sync_line +
                           "  if (!attends) return;", 1)
    assert late != without and "uses 'rows['" in " ".join(deferred_wait_problems(late, function, forbidden))
    after = without.replace("    default: break;\n  }\n", "    default: break;\n  }\n" + sync_line, 1)
    assert after != without and "uses 'attend<'" in " ".join(deferred_wait_problems(after, function, forbidden))


def test_the_check_catches_an_entry_that_does_not_wait_first():
    source = (kernels_dir() / "kv_store.hip").read_text()
    assert entries_not_waiting_first(source) == []
    # planted: one entry loses its wait; another does its work before waiting
    dropped = source.replace("rf_grid_dependency_sync();", "", 1)
    assert len(entries_not_waiting_first(dropped)) == 1
    late = source.replace("  rf_grid_dependency_sync();  // a programmatic launch (hipcore/ops/kv_store.py)\n"
                          "  rf_check_wave_size();",
                          "  rf_check_wave_size();\n  rf_grid_dependency_sync();")
    assert late != source and entries_not_waiting_first(late) == ["kv_store_q8_0"]
    macro = (kernels_dir() / "fused_qmatvec.hip").read_text()
    assert entries_not_waiting_first(macro, deferred=True) == []
    assert entries_not_waiting_first(macro.replace(DEFER + ";", "(void)0;"), deferred=True) != []


def test_the_check_catches_fused_matvec_reading_x_before_its_wait():
    without, sync_line, function, forbidden = deferred_source_without_wait(
        "fused_matvec", "prefetch_first_step", "x, y and everything but the weights: written by the kernel ahead")
    # planted: the wait after the passes, which read x and write y
    anchor = "    }\n  }\n}\n\ntemplate <class Format, int KS = 1>"
    late = without.replace(anchor, "    }\n  }\n" + sync_line + "}\n\ntemplate <class Format, int KS = 1>", 1)
    assert late != without and SYNC in late
    assert "uses 'fused_pass'" in " ".join(deferred_wait_problems(late, function, forbidden))


def test_the_check_catches_the_fragment_path_reading_x_before_its_wait():
    """matmul_mma's K-quant fragment entries load their first weights, then wait, then x: a wait moved past the
    staged x's loads or gone is caught, and so is an entry of the op that neither waits nor defers."""
    header, function, forbidden = DEFERRED["matmul_mma"]
    source = (kernels_dir() / header).read_text()
    assert deferred_wait_problems(source, function, forbidden) == []
    assert "F::load" in code_before_wait(source, function)  # what the deferral is for
    (also,) = DEFERRED_ALSO["matmul_mma"]
    assert deferred_wait_problems(source, also, forbidden) == [] and "F::load_block" in code_before_wait(source, also)
    wait = "    rf_grid_dependency_sync();\n"
    assert source.count(wait) == 2  # fragment_item's and superblock_item's
    without = source.replace(wait, "")
    assert deferred_wait_problems(without, function, forbidden) == [f"{function} never calls {SYNC}"]
    anchor = "    const int next = lesser_of(c0 + kDepth * kStepCols, c_end - kStepCols);\n"
    assert without.count(anchor) == 1
    late = without.replace(anchor, anchor + "    rf_grid_dependency_sync();\n")
    assert "uses 'float4*>(x_src'" in " ".join(deferred_wait_problems(late, function, forbidden))
    # superblock_item's wait moved past its x loads
    x_loads = "xd[s] = *reinterpret_cast<const float4*>(x_src + Step::column(c0, frag_column(s, t)));\n"
    assert without.count(x_loads) == 1
    late = without.replace(x_loads, x_loads + "      rf_grid_dependency_sync();\n")
    assert "uses 'float4*>(x_src'" in " ".join(deferred_wait_problems(late, also, forbidden))
    entries = (kernels_dir() / "matmul_mma_fragment_entries.h").read_text()
    assert entries_not_waiting_first(entries, deferred=True) == []
    assert len(entries_not_waiting_first(entries.replace(DEFER + ";", "(void)0;", 1), deferred=True)) == 1
    entries = (kernels_dir() / "matmul_mma.hip").read_text()
    assert entries_not_waiting_first(entries, deferred=True) == []
    dropped = entries.replace("rf_grid_dependency_sync(); /* a programmatic launch */", "(void)0;", 1)
    assert len(entries_not_waiting_first(dropped, deferred=True)) == 1

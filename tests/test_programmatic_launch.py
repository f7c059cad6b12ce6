"""Programmatic dependent launch (hip_compat.h: rf_grid_dependency_sync; runtime: GpuKernel): a kernel
launched as programmatic may start while the kernel ahead of it still runs, so each op that asks for it
(get_kernel(..., programmatic=True)) must have every entry point of its source wait first, before any
statement but its __shared__ declarations. Checked on the sources, and proven on planted faults."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from hipcore.runtime.kernels import kernels_dir

OPS_DIR = Path(__file__).parents[1] / "hipcore" / "ops"
SYNC = "rf_grid_dependency_sync()"


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
            name = op.value if isinstance(op, ast.Constant) else constants[op.id]
            found[name] = path.name
    return found


def entries_not_waiting_first(source: str) -> list[str]:
    """The __global__ entries of `source` whose first statement (past __shared__ declarations) is not
    rf_grid_dependency_sync()."""
    text = re.sub(r"/\*.*?\*/", " ", source, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text).replace("\\\n", " ")
    bad = []
    for match in re.finditer(r"__global__", text):
        name = re.search(r"void\s+([\w#]+)\s*\(", text[match.end():]).group(1)
        body = text[text.index("{", match.end()) + 1:]
        statements = (s.strip() for s in body.split(";"))
        first = next(s for s in statements if not s.startswith("__shared__"))
        if first != SYNC.rstrip(";"):
            bad.append(name)
    return bad


def test_the_programmatic_ops_are_the_decode_steps():
    """What a single-token decode step launches (the K-quant and the demo model's paths), so that a change
    that drops one shows here."""
    assert set(programmatic_ops()) == {"embedding", "fused_matvec", "fused_qmatvec", "kv_store", "paged_attention",
                                       "sample"}


@pytest.mark.parametrize("op", sorted(programmatic_ops()))
def test_every_entry_of_a_programmatic_op_waits_first(op):
    source = (kernels_dir() / f"{op}.hip").read_text()
    assert source.count("__global__") >= 1
    assert entries_not_waiting_first(source) == []


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
    assert entries_not_waiting_first(macro.replace("rf_grid_dependency_sync();", "(void)0;")) != []

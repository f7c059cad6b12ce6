"""Imports run one way (docs/architecture.md, "Layers"): the checker over the whole tree, and the checker
itself shown to catch each kind of violation on planted sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.import_layers import check_module, check_tree, import_cycles, package_of, tree_modules, unlayered_modules

REPO = Path(__file__).resolve().parents[1]


def test_the_tree_has_no_import_against_the_layers():
    violations = check_tree(REPO)
    assert not violations, "imports against the layers:\n" + "\n".join(map(str, violations))


def test_the_checker_sees_the_whole_library():
    # A checker that found no modules would pass vacuously.
    assert package_of("hipcore.engine.engine") == "hipcore.engine"
    assert package_of("hipcore.gguf.file") == "hipcore.gguf"
    assert package_of("numpy") is None and package_of("hipcore") is None
    assert len(list((REPO / "hipcore").rglob("*.py"))) > 60


@pytest.mark.parametrize("module, source, why", [
    ("hipcore.ops.sample", "from hipcore.engine.sampler import SamplingParams\n", "upward"),
    ("hipcore.ops.sample", "def f():\n    from hipcore.engine import sampler\n", "upward"),  # inside a function
    ("hipcore.runtime.device", "from hipcore.errors import UsageError\n", "runtime imports nothing"),
    ("hipcore.runtime.device", "import hipcore.kvcache.cache\n", "runtime imports nothing"),
    ("hipcore.gguf.file", "from hipcore.kvcache import KvCache\n", "side by side"),
    ("hipcore.model.forward", "from hipcore.engine.request import Request\n", "upward"),
    ("profiles.leak_check", "from rocmforge_cli.common import fail\n", "upward"),
    ("hipcore.gguf.file", "from hipcore.tokenizer import tokenizer\n", "side by side"),
])
def test_a_planted_backward_import_is_caught(module, source, why):
    violations = check_module(module, source)
    assert len(violations) == 1 and why in str(violations[0]), violations


@pytest.mark.parametrize("module, source", [
    ("hipcore.engine.engine", "from hipcore.model.forward import ModelRunner\nfrom hipcore.kvcache import KvCache\n"),
    ("hipcore.ops.kv_store", "from hipcore.kvcache.cache import KvCache\nfrom hipcore.runtime.device import Device\n"),
    ("hipcore.runtime.cuda", "from hipcore.runtime.gpu_device import GpuDevice\nimport numpy\n"),
    ("rocmforge_cli.generate", "from profiles.bench import run\nfrom hipcore.engine.loader import load_model\n"),
])
def test_downward_and_own_package_imports_pass(module, source):
    assert check_module(module, source) == []


def test_every_library_module_is_in_a_layer():
    assert unlayered_modules(REPO) == []


def test_no_module_imports_one_that_imports_it_back():
    cycles = import_cycles(tree_modules(REPO))
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_a_planted_lazy_import_loop_is_caught():
    # The shape the runtime had: device.py re-exported pick_device from selection.py, which imports device.py.
    modules = {
        "hipcore.runtime.device": "def pick_device():\n    from hipcore.runtime.selection import pick_device\n",
        "hipcore.runtime.selection": "from hipcore.runtime.device import Device\n",
        "hipcore.runtime.ledger": "import numpy\n",
    }
    assert import_cycles(modules) == [["hipcore.runtime.device", "hipcore.runtime.selection", "hipcore.runtime.device"]]
    del modules["hipcore.runtime.device"]
    assert import_cycles(modules) == []

"""The tiny model the overlapped-step tests drive (tests/test_engine_overlap.py, test_engine_constrained_overlap.py):
`path`, written once a module, and `model`, loaded for each test with its KV bytes at rest as `baseline`. Imported
by name into those modules, where pytest finds them as fixtures."""

from __future__ import annotations

import pytest

from support.engine_testing import kv_bytes, load_tiny, tiny_model


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return tiny_model(tmp_path_factory)


@pytest.fixture
def model(path):
    with load_tiny(path, max_seqs=8, max_step_tokens=64, kv_blocks=64) as loaded:
        loaded.baseline = kv_bytes(loaded)
        yield loaded

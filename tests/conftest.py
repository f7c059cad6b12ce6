"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.emulated_kernels import WARPS, build_harnesses
from support.kernel_builds import build_every_op
from support.tiers import EVERYDAY_TIMEOUT_S, FULL_TIMEOUT_S, full_tier_reason
from hipcore.gguf.demo_model import INSTALL_HINT, find_demo_model


def pytest_addoption(parser):
    parser.addoption("--tier", choices=("everyday", "full"), default="everyday",
                     help="everyday (default): the tests that need no compiler and no long run; full: every test. "
                          "Test files named on the command line run whatever their tier (tests/support/tiers.py).")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark the full tier's tests `full` (before -m is applied), and leave them out of a default everyday run."""
    full = []
    for item in items:
        in_full = bool(item.get_closest_marker("full"))
        if not in_full and full_tier_reason(item.path.name, item.fixturenames):
            item.add_marker(pytest.mark.full)
            in_full = True
        if in_full:
            full.append(item)
        if not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(FULL_TIMEOUT_S if in_full else EVERYDAY_TIMEOUT_S))
    if config.getoption("--tier") == "everyday" and config.args_source == pytest.Config.ArgsSource.TESTPATHS and full:
        left_out = set(map(id, full))
        items[:] = [item for item in items if id(item) not in left_out]
        config.hook.pytest_deselected(items=full)


def pytest_report_header(config):
    if config.getoption("--tier") == "everyday" and config.args_source == pytest.Config.ArgsSource.TESTPATHS:
        return "tier: everyday (the full tier's tests are deselected; `pytest --tier full` runs every test)"
    if config.getoption("--tier") == "everyday":
        return "tier: every test of the files named (a bare `pytest` is the everyday tier)"
    return "tier: full"


@pytest.fixture(scope="session")
def demo_model_path() -> Path:
    """The real demo model (or the file ROCMFORGE_DEMO_MODEL names, as on a GPU machine where the package is
    not installed). CI installs it; a missing model is a setup error, not a skip."""
    path = Path(os.environ["ROCMFORGE_DEMO_MODEL"]) if os.environ.get("ROCMFORGE_DEMO_MODEL") else find_demo_model()
    if path is None:
        pytest.fail(f"the demo model is not installed; run: {INSTALL_HINT}", pytrace=False)
    return path


@pytest.fixture
def cpu_device():
    from hipcore.runtime.cpu import CpuDevice

    dev = CpuDevice(capacity=4 << 30)
    yield dev
    dev.close()


@pytest.fixture(scope="session")
def harnesses(tmp_path_factory) -> dict[int, Path]:
    """The kernel-emulation harness per warp width (tests/support/emulated_kernels.py), built once per test run."""
    return build_harnesses(tmp_path_factory.mktemp("kernel_emulation"))


@pytest.fixture(params=WARPS, ids=[f"warp{w}" for w in WARPS])
def warp(request) -> int:
    return request.param


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """Every op of the suite built for the default targets of each vendor whose compiler is here, once per test run
    (tests/support/kernel_builds.py): (the output folder, the build's report, its progress lines)."""
    return build_every_op(tmp_path_factory.mktemp("prebuilt"))

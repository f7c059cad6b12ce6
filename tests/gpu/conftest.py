"""Fixtures of the GPU tier's op tests: the device, a fresh seed per test (printed by the tests when
they fail, so a failure can be replayed) and device buffers freed at the end of each test."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.runtime import kernels as loader
from hipcore.runtime.selection import pick_device


@pytest.fixture(scope="module")
def gpu():
    choice = pick_device("auto")
    dev = choice.device
    if dev.backend == "cpu":
        dev.close()
        pytest.fail("the GPU tier needs a GPU; pick_device said: " + "; ".join(choice.reasons), pytrace=False)
    yield dev
    loader.forget_device(dev)
    dev.close()


@pytest.fixture
def seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**32)


@pytest.fixture
def rng(seed):
    return np.random.default_rng(seed)


class Scratch:
    """Device buffers of one test, freed at its end."""

    def __init__(self, dev):
        self.dev, self.buffers = dev, []

    def upload(self, array: np.ndarray, tag: str = "activations"):
        buf = self.dev.allocate(max(array.nbytes, 4), tag)
        buf.upload(np.ascontiguousarray(array))
        self.buffers.append(buf)
        return buf

    def poisoned(self, nbytes: int, tag: str = "activations"):
        """A buffer filled with 0xFF bytes (NaN as float32), so rows a kernel forgot to write show."""
        buf = self.dev.allocate(nbytes, tag)
        buf.fill(0xFF)
        self.buffers.append(buf)
        return buf

    def free(self):
        for buf in self.buffers:
            buf.free()


@pytest.fixture
def mem(gpu):
    scratch = Scratch(gpu)
    yield scratch
    scratch.free()

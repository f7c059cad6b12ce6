"""The kernel loader's cache goes with its device: a model loaded on a CpuDevice, then the model and the device
closed, leaves nothing that keeps the device alive (hipcore/runtime/kernels.py keeps the modules and kernels on
the device, and close() empties them). A process-wide table of them, keyed weakly by the device but holding
modules that refer to it, kept every device ever opened: the planted fault puts that table back."""

from __future__ import annotations

import gc
import weakref

from support.engine_testing import greedy, prompt_of, run_alone, tiny_model

from hipcore.engine.loader import LoadOptions, load_model
from hipcore.runtime import kernels
from hipcore.runtime.cpu import CpuDevice


def run_and_close(path, modules_after_close: list[int]) -> weakref.ref:
    """Load the tiny model on a fresh CpuDevice, run one request, close model and device: a weak reference to
    the device (the cache's module counts, before and after its close, appended to modules_after_close)."""
    device = CpuDevice(capacity=1 << 30)
    options = LoadOptions(device="cpu", max_seqs=2, max_step_tokens=64, block_size=16, kv_dtype="f32")
    with load_model(str(path), options, device=device) as model:
        run_alone(model, prompt_of(6), greedy(3))
    modules_after_close.append(kernels.cached_module_count(device))
    device.close()
    modules_after_close.append(kernels.cached_module_count(device))
    return weakref.ref(device)


def test_a_closed_cpu_device_with_a_model_run_on_it_is_collected(tmp_path_factory):
    counts: list[int] = []
    device = run_and_close(tiny_model(tmp_path_factory), counts)
    gc.collect()
    assert device() is None
    assert counts[0] >= 1 and counts[1] == 0  # the run loaded modules; close() dropped them


def test_planted_a_process_wide_cache_keeps_the_closed_device_alive(tmp_path_factory, monkeypatch):
    process_wide: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # weak keys, values referring to them

    def loaded_code_of_the_process(device):
        return process_wide.setdefault(device, ({}, {}))

    monkeypatch.setattr(kernels, "_loaded_code", loaded_code_of_the_process)
    device = run_and_close(tiny_model(tmp_path_factory), [])
    gc.collect()
    assert device() is not None

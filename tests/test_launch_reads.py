"""Every launch of a step's plan declares the weights it reads (hipcore/model/launch.py), which the decode profile's
bytes per kind and its floor rest on: on the cpu backend and stepped through GPU architectures' plans on the host
(tests/support/stand_in_gpu.py), each launch's kernels are watched for the weight addresses they are given, and those
must be exactly the ones the launch declares; a decode plan's declared weights add up to every weight uploaded. A
launch built without its declaration (planted) is caught."""

from __future__ import annotations

import numpy as np
import pytest

from hipcore.engine.loader import LoadOptions, load_model
from hipcore.model import moe_blocks
from hipcore.model.launch import declared, weight_bytes
from hipcore.runtime.cpu import CpuKernel
from hipcore.runtime.device import Buffer
from support.gemma3_models import write_gemma3_model
from support.gguf_factory import write_tiny_llama
from support.model_steps import step_batch
from support.moe_models import write_moe_model
from support.stand_in_gpu import StandInGpu, host_kernels_for_stand_ins

# The lookup reads the rows of the token table its ids name; the profile leaves it without bytes and the floor counts
# the table whole.
UNDECLARED = {"embedding"}
MODELS = ("llama-q8_0", "gemma3-f16", "qwen3moe-q4km", "gpt-oss-mxfp4", "qwen2moe-f32")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("launch-reads")
    paths = {name: write_moe_model(name, folder) for name in MODELS if "moe" in name or "gpt-oss" in name}
    paths["gemma3-f16"] = write_gemma3_model("gemma3-f16", folder)
    paths["llama-q8_0"] = write_tiny_llama(folder / "llama-q8_0.gguf", tensor_type="Q8_0", tied=False, seed=5)
    return paths


def model_weights(weights) -> list:
    """Every weight of the model (the layers' fields, the fused groups among them)."""
    found = [weights.token_embd, weights.output_norm, weights.output]
    for lw in weights.layers:
        found += [w for w in vars(lw).values() if w is not None]
    return found


def watch_pointers(monkeypatch) -> list[int]:
    """Every pointer argument the cpu backend's kernels are launched with, appended to the returned list."""
    seen: list[int] = []
    real = CpuKernel.launch

    def launch(self, grid, block, args, shared_mem=0, stream=None):
        seen.extend(a.addr() if isinstance(a, Buffer) else int(a) for kind, a in zip(self.signature, args) if kind == "p")
        return real(self, grid, block, args, shared_mem, stream)

    monkeypatch.setattr(CpuKernel, "launch", launch)
    return seen


def undeclared_reads(model, seen: list[int], plan) -> list[str]:
    """Each launch of `plan` (the step just run: its inputs are packed) run again in order, its kernels' weight
    addresses against its declaration."""
    addresses = {w.addr() for w in model_weights(model.weights)}
    wrong = []
    for entry in plan:
        launch = declared(entry)
        seen.clear()
        launch[1]()
        touched = {p for p in seen if p in addresses}
        named = {w.addr() for w in launch.reads}
        named |= {w.addr() for w in launch.experts.weights} if launch.experts else set()
        if launch.label in UNDECLARED:
            named = touched & {model.weights.token_embd.addr()}
        if touched != named:
            wrong.append(f"{launch.label}: kernels given {len(touched)} weights, {len(named)} declared")
    return wrong


def checked_steps(model, seen: list[int], decode_batch: int = 3) -> tuple[list[str], list]:
    """A prompt step of 40 tokens, then a decode step of decode_batch sequences, each followed by undeclared_reads
    of its plan. Returns what they found and the decode step's plan."""
    runner, cache = model.runner, model.cache
    rng = np.random.default_rng(3)
    runner.execute(step_batch(cache, [(1, [int(t) for t in rng.integers(0, 384, 40)], 0)]))
    wrong = undeclared_reads(model, seen, runner.launch_plan(40, 1, all_rows=False, with_sampling=False, decode=False))
    for s in range(2, decode_batch + 1):
        runner.execute(step_batch(cache, [(s, [int(9 * s)], 0)]))
    runner.execute(step_batch(cache, [(1, [7], 40)] + [(s, [int(5 * s)], 1) for s in range(2, decode_batch + 1)]))
    plan = runner.launch_plan(decode_batch, decode_batch, all_rows=True, with_sampling=False, decode=True)
    return wrong + undeclared_reads(model, seen, plan), plan


def load(path, device=None):
    opts = LoadOptions(device="cpu" if device is None else "auto", max_seqs=4, max_step_tokens=64, ctx_size=128,
                       kv_dtype="f16")
    return load_model(str(path), opts, **({} if device is None else {"device": device}))


@pytest.mark.parametrize("arch", ("cpu", "sm_90", "gfx942", "gfx1030"))
@pytest.mark.parametrize("name", MODELS)
def test_each_launch_declares_the_weights_its_kernels_read(files, monkeypatch, name, arch):
    device = None
    if arch != "cpu":
        host_kernels_for_stand_ins(monkeypatch)
        device = StandInGpu(arch=arch)
    seen = watch_pointers(monkeypatch)
    with load(files[name], device) as model:
        assert checked_steps(model, seen)[0] == []


@pytest.mark.parametrize("name", MODELS)
def test_a_decode_plan_reads_every_weight_uploaded(files, monkeypatch, name):
    """The declared weights of one decode step, each counted once (the experts whole), with the token table where the
    head does not read it and the RoPE divisors, are every byte uploaded: weight_bytes agrees with the buffers and no
    weight goes undeclared or is counted twice (a q|k|v group and its members)."""
    host_kernels_for_stand_ins(monkeypatch)
    seen = watch_pointers(monkeypatch)
    with load(files[name], StandInGpu(arch="sm_90")) as model:
        plan = checked_steps(model, seen, decode_batch=1)[1]
        read = {}
        for entry in plan:
            launch = declared(entry)
            for w in launch.reads + (launch.experts.weights if launch.experts else ()):
                read[(w.addr(), weight_bytes(w))] = weight_bytes(w)
        w = model.weights
        if w.output is not w.token_embd:
            read[(w.token_embd.addr(), weight_bytes(w.token_embd))] = weight_bytes(w.token_embd)
        divisors = w.rope_freqs.buffer.nbytes if w.rope_freqs is not None else 0
        assert sum(read.values()) + divisors == w.nbytes


def test_a_launch_without_its_declaration_is_caught(files, monkeypatch):
    """The expert launches built without their ExpertReads: their kernels read the experts the plan no longer
    declares, and nothing else is reported."""
    monkeypatch.setattr(moe_blocks, "ExpertReads", lambda *args: None)
    seen = watch_pointers(monkeypatch)
    with load(files["qwen3moe-q4km"]) as model:
        wrong = checked_steps(model, seen, decode_batch=1)[0]
    assert {line.split(":")[0] for line in wrong} == {"moe_gate_up", "moe_down+residual"}, wrong

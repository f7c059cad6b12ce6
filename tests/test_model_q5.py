"""Tiny llama models in Q5_0 and Q5_1 (every matrix, the embedding table too; and a mix with Q4_1 and
Q8_0 as real files have) load on the cpu backend, and the paged forward pass equals the numpy reference
(LlamaReference over the gguf package's dequantization) at every position; `rocmforge inspect` and
`rocmforge generate` take such files.

Tolerance: both sides decode the same weights to the same float32 values (tests/test_quants_q5.py), so
they differ only in float32 accumulation order, as test_paged_model.py's f32-KV case: the same 1e-4 on
logits of size ~4 (measured here: at most 3.6e-6). A wrong decode moves logits by O(1).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from hipcore.gguf.file import GGUFFile
from rocmforge_cli.app import app
from support.engine_testing import load_tiny, prompt_of, tiny_model
from support.llama_reference import LlamaReference
from test_paged_model import EXACT_TOLERANCE, PagedDriver

# name -> (tensor_type, embedding_type, per-tensor types)
MODELS = {
    "q5_0": ("Q5_0", "Q5_0", {}),
    "q5_1": ("Q5_1", "Q5_1", {}),
    "mixed": ("Q5_0", "Q8_0", {"attn_v": "Q5_1", "ffn_down": "Q5_1", "attn_output": "Q4_1", "output": "Q5_1"}),
}
runner = CliRunner()


def model_path(tmp_path_factory, name: str):
    tensor_type, embedding_type, tensor_types = MODELS[name]
    return tiny_model(tmp_path_factory, f"tiny_{name}.gguf", tensor_type=tensor_type, embedding_type=embedding_type,
                      tensor_types=tensor_types, tied=False)


@pytest.mark.parametrize("name", list(MODELS))
def test_paged_cpu_forward_equals_the_reference(tmp_path_factory, name):
    path = model_path(tmp_path_factory, name)
    with GGUFFile.open(path) as f:
        types = {t.name: t.type_name for t in f.plan.tensors}
        reference = LlamaReference.from_gguf(f)
    tensor_type, embedding_type, tensor_types = MODELS[name]
    assert types["token_embd.weight"] == embedding_type and types["blk.1.ffn_gate.weight"] == tensor_type
    assert all(types[f"blk.0.{part}.weight" if part != "output" else "output.weight"] == t
               for part, t in tensor_types.items())

    tokens = prompt_of(29, salt=5)
    with load_tiny(path, kv_dtype="f32", max_seqs=64, max_step_tokens=64) as model:
        driver = PagedDriver(model)
        for lo, hi in ((0, 17), (17, 18), (18, 29)):  # a prompt step, a decode step, a chunk reading both
            driver.step([(1, tokens[lo:hi])])
        paged = driver.all_logits(1)
    expected = reference.forward(np.array(tokens), reference.new_cache(len(tokens)), logits_all=True)
    assert paged.shape == expected.shape
    assert np.abs(paged - expected).max() < EXACT_TOLERANCE
    assert np.abs(expected).max() > 0.5  # logits of substance, not a model of zeros


def test_inspect_names_the_types(tmp_path_factory):
    path = model_path(tmp_path_factory, "mixed")
    result = runner.invoke(app, ["inspect", str(path), "--json"])
    assert result.exit_code == 0, result.output
    by_type = json.loads(result.stdout)["tensors"]["by_type"]
    assert {"Q5_0", "Q5_1", "Q4_1", "Q8_0", "F32"} == set(by_type)
    assert "Q5_1" in runner.invoke(app, ["inspect", str(path)]).stdout


@pytest.mark.parametrize("name", ["q5_0", "q5_1"])
def test_generate_runs_such_a_file(tmp_path_factory, name):
    path = model_path(tmp_path_factory, name)
    result = runner.invoke(app, ["generate", "--model", str(path), "--device", "cpu", "--temp", "0", "-n", "4",
                                 "--json", "hello"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert len(out["tokens"]) == 4 and out["ending"] == "length"

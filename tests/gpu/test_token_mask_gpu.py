"""A grammar's token mask in the device sampler on a real GPU (run with `pytest -m gpu tests/gpu`): sample_f32 with
a random packed mask picks, one workgroup a row and split over chunks, only allowed tokens, and the host sampler's
pick on the masked logits (up to float32 rounding at the draw); the engine's json_schema rows sample on the device
(the host's masking made to raise) and end in JSON that validates.

The model: $ROCMFORGE_DEMO_MODEL, else the installed demo model (random weights of its shape serve too).
"""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from test_model_gpu import model_path

from hipcore.engine.engine import Engine
from hipcore.engine.grammar import TokenConstraint, compile_grammar
from hipcore.engine.loader import LoadOptions, load_model
from hipcore.engine.sampler import Sampler, SamplingParams
from hipcore.ops import sample

pytestmark = pytest.mark.gpu
# bounded: a greedy row of a random model must still close the JSON within max_tokens
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.mark.parametrize("vocab", [128256, 49152])
def test_sample_with_token_mask(gpu, mem, rng, seed, vocab):
    params = np.array([[0.0, 0, 1, 0, 0], [0.8, 40, 0.95, 0.05, 0], [1.3, 200, 0.9, 0, 0], [1.0, 0, 1, 0, 0],
                       [0.8, 0, 1, 0.05, 0], [1.2, 64, 1, 0, 0], [0.0, 40, 0.95, 0.05, 0], [0.9, 40, 0.95, 0.05, 0]],
                      dtype=np.float32)
    rows = len(params)
    params[:, 4] = rng.random(rows)
    logits = (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
    allowed = rng.random((rows, vocab)) < 0.3
    allowed[6] = False
    allowed[6, rng.integers(vocab)] = True  # one allowed token: the greedy row must pick it
    allowed[7] = False
    allowed[7, np.argsort(logits[7])[:3]] = True  # only three of the smallest logits allowed
    packed = np.packbits(np.pad(allowed, ((0, 0), (0, sample.mask_words(vocab) * 32 - vocab))), axis=1,
                         bitorder="little").view(np.uint32)
    masked = np.where(allowed, logits, np.float32(-np.inf))
    params_buf, mask_buf = mem.upload(params), mem.upload(packed)
    workspace = mem.upload(np.zeros(sample.workspace_size(rows, vocab) // 4, np.int32), "scratch")
    for split in (None, workspace):
        out, logits_buf = mem.poisoned(rows * 4), mem.upload(logits)  # the kernel masks the logits in place
        sample.launch(gpu, None, out, logits_buf, params_buf, rows, vocab, split, mask_buf)
        got = out.download(np.int32)
        assert not workspace.download(np.int32)[:rows].any(), "counters left non-zero"
        for i in range(rows):
            assert allowed[i, got[i]], f"seed {seed}, row {i} split {split is not None}: token {got[i]} not allowed"
            t, k, p, m, u = (float(v) for v in params[i])
            du_max = 1e-5 if k <= 0 and p >= 1 else 2e-6
            picks = {sample.pick(masked[i], t, int(k), min(p + dp, 1.0) if p < 1 else 1.0, m,
                                 min(max(u + du, 0.0), 0.999999))
                     for du in (-du_max, 0, du_max) for dp in (-2e-6, 0, 2e-6)}
            assert int(got[i]) in picks, f"seed {seed}, row {i} split {split is not None}: {got[i]} not in {picks}"


def test_constrained_rows_sample_on_the_device(gpu, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a constrained row sampled on the host")
    monkeypatch.setattr(TokenConstraint, "mask", refuse)
    original = Sampler.sample
    monkeypatch.setattr(Sampler, "sample", lambda self, *a, **k: refuse() if self.constraint is not None
                        else original(self, *a, **k))
    grammar = compile_grammar(json_schema=SCHEMA)
    free = [SamplingParams(temperature=0.0, max_tokens=24 + i, ignore_eos=True) for i in range(6)]
    constrained = [SamplingParams(temperature=0.8, seed=7, max_tokens=64, grammar=grammar),
                   SamplingParams(temperature=0.0, max_tokens=64, grammar=grammar),
                   SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=3, max_tokens=64, grammar=grammar)]
    with load_model(model_path(), LoadOptions(max_seqs=16, ctx_size=512), device=gpu) as loaded:
        engine = Engine(loaded.runner, loaded.tokenizer, loaded.cache, max_seqs=16, max_step_tokens=256)
        jobs = free[:3] + constrained + free[3:]
        ids = [engine.submit([1, 9690, 198, 300 + i], params) for i, params in enumerate(jobs)]
        engine.run_until_idle()
        records = [engine.finished_record(i) for i in ids]
    for record in records[3:6]:
        assert record.ending.value == "eos", record.texts[0]
        jsonschema.validate(json.loads(record.texts[0]), SCHEMA)
